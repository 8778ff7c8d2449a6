"""Where ``hwb export`` writes: an output directory it can trust, written through directory
file descriptors, never through a link.

The writers (Keras's SavedModel export, ``onnx.save``, TFRecordWriter, a target's own
``export``) write by path, so they write into a private staging directory this process
creates (``mkdtemp``: 0700, ours). :meth:`OutputDir.publish` then moves the staged tree into
the output directory:

- the output directory is one this call creates, or one owned by the user and not writable by
  group or others (:func:`hwbackends.store.trust.others_can_change`). It is opened once
  (``O_DIRECTORY | O_NOFOLLOW``, :mod:`hwbackends.store.dirfd` as the store does) and every later
  step goes through that descriptor and those of directories opened from it (``O_NOFOLLOW``
  again), never through a path;
- a symbolic link where the export writes — the model directory, a top-level file, anything
  inside the model directory — is refused with :class:`ExportPathError` before anything is
  written; the link and what it points at are left as they are;
- the model directory (``NAME/``) is replaced as a whole: the new one is assembled beside it
  (``.NAME.hwb-new-…``), the old one renamed aside, the new one renamed into place and the old
  one removed (``shutil.rmtree`` by descriptor: no link followed). A model directory holding
  anything the export does not write — another model version ``2/``, which Triton would serve
  instead of ``1/`` — is refused unless ``replace`` (``hwb export --replace``);
- a top-level file (TF Serving's ``models.config``, the C library) is written under a fresh
  name (``O_CREAT | O_EXCL``) and renamed over the old one: a hard link planted there keeps
  its content.

Only the output directory's own path is resolved by the system (its parents are the user's
choice, as for any command that writes a file); from there down nothing is followed.
"""
from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HwbError
from ..store import dirfd, trust

#: Created directories: readable by the server's user, writable by this user only.
DIR_MODE = 0o755


class ExportPathError(HwbError):
    """``hwb export``'s output directory, or something in it, could be changed by someone
    else or is a link; nothing was written. The message names the path and the fix."""


@dataclass
class OutputDir:
    """An output directory opened once and checked, with a private staging directory.

    ``model_entries``: what the format writes inside ``NAME/`` (Triton: ``config.pbtxt``,
    ``configs``, ``1``); anything else found there is another version or a stranger's file."""

    path: Path
    replace: bool = False
    model_entries: frozenset[str] = frozenset({"1"})
    fd: int = -1
    real: Path = field(default_factory=Path)
    stage: Path = field(default_factory=Path)

    def __enter__(self) -> "OutputDir":
        self.fd, self.real = open_output(self.path)
        self.stage = Path(tempfile.mkdtemp(prefix="hwb-export-"))
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- checks before anything is written -----------------------------------------------------
    def _lstat(self, dir_fd: int, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def check(self, planned: dict[str, bool] | None = None) -> None:
        """Refuse (:class:`ExportPathError`) what :meth:`publish` would write through or over:
        a link where a staged file or the model directory goes, a link anywhere inside the old
        model directory, a directory where a file goes, and (without ``replace``) entries of
        the old model directory the export does not write. ``planned``: top-level name → is a
        directory, checked before anything is staged (default: what is staged)."""
        if planned is None:
            planned = {e.name: e.is_dir(follow_symlinks=False) for e in os.scandir(self.stage)}
        for name, is_dir in planned.items():
            where = self.real / name
            st = self._lstat(self.fd, name)
            if st is None:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise _link(where)
            if is_dir:
                if not stat.S_ISDIR(st.st_mode):
                    raise ExportPathError(f"{where} is a file where the export writes the model "
                                          f"directory; remove it (rm {where}) or export into "
                                          f"another directory")
                self._check_model_dir(name, where)
            elif not stat.S_ISREG(st.st_mode):  # a directory or a FIFO where a file goes
                raise ExportPathError(f"{where} is not a regular file; the export writes one "
                                      f"there: remove it or export into another directory")

    def _check_model_dir(self, name: str, where: Path) -> None:
        fd = _open_dir(name, self.fd, where)
        try:
            st = os.fstat(fd)
            why = trust.others_can_change(st)
            if why is not None:
                raise ExportPathError(f"model directory {where} {why}; the export replaces it "
                                      f"and cannot trust it: remove it or export elsewhere")
            foreign = sorted(set(os.listdir(fd)) - self.model_entries)
            link = _find_link(fd, where)
        finally:
            os.close(fd)
        if link is not None:
            raise link
        if foreign and not self.replace:
            versions = [f for f in foreign if f.isdigit()]
            what = (f"model version(s) {', '.join(v + '/' for v in versions)} that this export "
                    f"did not write (Triton and TF Serving serve the newest version by default, "
                    f"so those, not the new 1/, would answer)" if versions else
                    "entries this export does not write")
            raise ExportPathError(
                f"{where} holds {what}: {', '.join(ascii(f) for f in foreign[:10])}"
                f"{' …' if len(foreign) > 10 else ''}. Nothing was written. Pass --replace to "
                f"replace the whole model directory (replace=True), or export into another "
                f"directory")

    # -- writing --------------------------------------------------------------------------------
    def publish(self) -> list[Path]:
        """Move everything staged into the output directory (after :meth:`check`); returns the
        paths written, under the output directory's real path."""
        self.check()
        written: list[Path] = []
        for entry in sorted(os.scandir(self.stage), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                written += self._publish_dir(entry.name, Path(entry.path))
            else:
                _put_file(Path(entry.path), entry.name, self.fd)
                written.append(self.real / entry.name)
        return written

    def _publish_dir(self, name: str, src: Path) -> list[Path]:
        token = secrets.token_hex(4)
        new, old = f".{name}.hwb-new-{token}", f".{name}.hwb-old-{token}"
        os.mkdir(new, DIR_MODE, dir_fd=self.fd)
        try:
            fd = dirfd.open_dir(new, self.fd)
            try:
                rel = _copy_tree(src, fd)
            finally:
                os.close(fd)
            had_old = self._lstat(self.fd, name) is not None
            if had_old:
                os.rename(name, old, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            try:
                os.rename(new, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except OSError:
                if had_old:
                    os.rename(old, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                raise
        except BaseException:
            shutil.rmtree(new, dir_fd=self.fd, ignore_errors=True)
            raise
        if had_old:
            shutil.rmtree(old, dir_fd=self.fd, ignore_errors=True)
        return [self.real / name / r for r in rel]


def open_output(path: str | Path) -> tuple[int, Path]:
    """Create ``path`` (0755, missing parents too) or open the existing directory without
    following a link; refuse one someone else could change. Returns the descriptor and the
    directory's real path (what ``models.config`` names)."""
    p = Path(path).expanduser()
    try:
        if not os.path.lexists(p):
            os.makedirs(p.parent, DIR_MODE, exist_ok=True)
            try:
                os.mkdir(p, DIR_MODE)
            except FileExistsError:
                pass  # made meanwhile: checked like any existing one
    except OSError as exc:
        raise ExportPathError(f"cannot create the output directory {p} ({exc.strerror or exc}); "
                              f"give a directory you can write with -o") from None
    fd = _open_dir(str(p), None, p)
    try:
        why = trust.others_can_change(os.fstat(fd))
        if why is not None:
            raise ExportPathError(
                f"output directory {p} {why}: anyone who can write it could plant a link or "
                f"another model version there. Export into a directory of your own that only "
                f"you can write (chmod go-w {p}, or a new path: hwb export creates it)")
    except BaseException:
        os.close(fd)
        raise
    return fd, Path(os.path.realpath(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd")
                    else os.path.realpath(p))


def _open_dir(name: str, dir_fd: int | None, where: Path) -> int:
    try:
        return dirfd.open_dir(name, dir_fd)
    except dirfd.NotFollowed as exc:
        if exc.is_link:
            raise _link(where) from None
        raise ExportPathError(f"{where} is not a directory; give a directory with -o") from None
    except OSError as exc:
        raise ExportPathError(f"cannot open {where} ({exc.strerror or exc})") from None


def _link(where: Path, target: str | None = None) -> ExportPathError:
    if target is None:
        try:
            target = os.readlink(where)
        except OSError:
            target = "?"
    return ExportPathError(f"{where} is a symbolic link (to {target!r}); hwb export writes "
                           f"through no link and removes none. Nothing was written: remove the "
                           f"link (rm {where}) and export again, or export into another directory")


def _find_link(fd: int, where: Path) -> ExportPathError | None:
    """The refusal for the first symlink under the directory open as ``fd``, if any (the
    store's own walk by descriptor, :func:`hwbackends.store.dirfd.tree_bytes`)."""
    links: list[dirfd.Link] = []
    dirfd.tree_bytes(fd, "", links)
    return _link(where / links[0].path.lstrip("/"), links[0].target) if links else None


def _copy_tree(src: Path, dst_fd: int) -> list[Path]:
    """Copy the staged tree ``src`` into the (new, empty) directory open as ``dst_fd``."""
    out: list[Path] = []
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False):
            os.mkdir(entry.name, DIR_MODE, dir_fd=dst_fd)
            sub = dirfd.open_dir(entry.name, dst_fd)
            try:
                out += [Path(entry.name) / r for r in _copy_tree(Path(entry.path), sub)]
            finally:
                os.close(sub)
        elif entry.is_file(follow_symlinks=False):
            _write_new(Path(entry.path), entry.name, dst_fd)
            out.append(Path(entry.name))
    return out


def _write_new(src: Path, name: str, dir_fd: int) -> None:
    mode = 0o755 if os.stat(src).st_mode & 0o100 else 0o644
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                 dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as f, open(src, "rb") as s:
        shutil.copyfileobj(s, f, 1 << 20)


def _put_file(src: Path, name: str, dir_fd: int) -> None:
    """``src`` as ``name`` in ``dir_fd``: written under a fresh name, renamed over the old."""
    tmp = f".{name}.hwb-tmp-{secrets.token_hex(4)}"
    _write_new(src, tmp, dir_fd)
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise
