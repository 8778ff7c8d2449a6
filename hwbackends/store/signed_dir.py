"""A directory of signed entries on disk: what the artifact store, the build cache, the
profile cache and the zoo keep their records in.

An *entry* is a set of files and a JSON *record* naming each file's sha256, signed with this
user's store key (:func:`hwbackends.store.trust.sign`: ``hmac-sha256`` over the canonical JSON,
compared with :func:`hmac.compare_digest`) and bound to its key and format version. Two
layouts:

- **directory entries** (the default): ``root/ab/<key>/{<record>, files…}`` (``fanout``:
  filed under the key's first two characters), written in a private staging directory and
  renamed into place whole, so a reader sees all of an entry or none of it (the artifact
  store, the build cache);
- **record files** (``suffix=".json"``): ``root/ab/<key><suffix>`` is the record itself, and
  an entry may carry one data file beside it named ``<key>`` (the zoo's trained
  ``signal-v1.keras``, which a framework loads by path, signed by ``signal-v1.keras.hmac``).
  Each file is written privately and renamed in whole (a re-write replaces it); a reader that
  meets a new data file and an old record sees a miss (the profile cache, the zoo).

Reading (:meth:`SignedDir.read`) trusts nothing it finds: the directories on the way and
everything in the entry must be changeable only by this user (:func:`trust.check_path`,
:func:`trust.check_tree`: a symlink, another owner or a group/world-writable path is
:class:`~hwbackends.errors.StoreTrustError`, refused before a byte is read, and left in
place); the record is read through directory fds opened with ``O_NOFOLLOW``
(:mod:`hwbackends.store.dirfd`), and a record that is missing, unsigned, edited, of another format
version or for another key, or whose files are missing, extra or changed, is a *miss*: the
entry is evicted and the caller rebuilds it. An entry moved away while it is read (a prune,
another process) is a miss and is left alone.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import time
import uuid
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..errors import CacheError
from . import dirfd, trust

log = logging.getLogger("hwbackends.store")

#: A key of a fanned-out directory: the hex sha256 of what the entry is for.
HEX_KEY = re.compile(r"[0-9a-f]{64}")
#: A key of a directory that is not fanned out: a file name (no path, no leading dot).
NAME_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
STAGING = "tmp"


def file_sha256(path: Path | str, dir_fd: int | None = None) -> str:
    """The sha256 of the regular file ``path`` (relative to ``dir_fd``), opened without
    following a final symlink."""
    h = hashlib.sha256()
    fd = os.open(path, dirfd.FILE_FLAGS, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CacheError(f"{path} is not a regular file")
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def two_level(top_fd: int, rel: str, links: list[dirfd.Link]) -> Iterator[tuple[int, str]]:
    """``(fd of top/ab, name)`` for each ``top/ab/abcdef…`` directory (a key filed under its
    first two digits) in the directory ``top_fd``, by name; ``rel`` names ``top`` in reports.
    A symlink on the way is appended to ``links`` and not followed; anything else that is no
    entry is skipped with a warning (the staging directory, silently). The fd is open until
    the next item."""
    for ab in dirfd.entries(top_fd):
        where = f"{rel}/{ab.name}"
        if ab.is_symlink():
            links.append(dirfd.link_at(top_fd, ab.name, where))
            continue
        if ab.name == STAGING:
            continue
        if len(ab.name) != 2 or not ab.is_dir(follow_symlinks=False):
            log.warning("%s is not a store directory (ab/, the first two digits of a key); skipped",
                        where)
            continue
        try:
            fd = dirfd.open_dir(ab.name, top_fd)
        except FileNotFoundError:
            continue
        except dirfd.NotFollowed:  # swapped for a link since it was listed
            links.append(dirfd.link_at(top_fd, ab.name, where))
            continue
        try:
            for e in dirfd.entries(fd):
                if e.is_symlink():
                    links.append(dirfd.link_at(fd, e.name, f"{where}/{e.name}"))
                elif HEX_KEY.fullmatch(e.name) and e.name[:2] == ab.name and e.is_dir(follow_symlinks=False):
                    yield fd, e.name
                else:
                    log.warning("%s/%s is not a store entry (its name is no key); skipped", where, e.name)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class Entry:
    """One verified entry: its key, where it is (:meth:`SignedDir.path_for`: the entry
    directory, or the data file beside a record file) and its signed record (with the
    ``files`` sha256 list, format and ``hmac``)."""

    key: str
    path: Path
    record: dict[str, Any]


class _Vanished(CacheError):
    """The entry was moved or removed while it was read: absent, not invalid."""


@dataclass(eq=False)
class SignedDir:
    """Signed entries under ``root`` (see the module docstring). ``what`` names the directory
    in messages; ``version`` is the format a record must carry (in ``format_field``) to be
    read: bump it when what a record means changes, and every older entry is a miss.
    ``record`` is the record's file name in a directory entry; ``suffix`` makes the entries
    record files instead (``<key><suffix>``, see the module docstring); ``staging`` is where
    writes are staged and evictions moved first (default ``root/tmp``, the same filesystem)."""

    root: Path
    what: str
    version: int
    _: KW_ONLY
    record: str = "record.json"
    format_field: str = "format"
    fanout: bool = True
    suffix: str | None = None
    staging: Path | None = None
    signing_key: Callable[[], bytes] = trust.load_key
    _key: bytes | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.suffix is None and not self.fanout:
            raise ValueError("directory entries are filed under ab/ (fanout); a flat directory "
                             "keeps record files (suffix=)")
        self.root = Path(self.root)

    @property
    def tmp(self) -> Path:
        """Where writes are staged and evictions moved first."""
        return Path(self.staging) if self.staging is not None else self.root / STAGING

    @property
    def key(self) -> bytes:
        """The signing key (:func:`trust.load_key`), read once."""
        if self._key is None:
            self._key = self.signing_key()
        return self._key

    # -- where --------------------------------------------------------------------------------
    def check_key(self, key: Any) -> str:
        """``key`` if it names an entry here, else :class:`CacheError` (a key names a path:
        ``../`` or a slash in one would reach outside the directory)."""
        pattern = HEX_KEY if self.fanout else NAME_KEY
        if (not isinstance(key, str) or not pattern.fullmatch(key) or key == STAGING
                or (self.suffix is not None and key.endswith(self.suffix))):
            want = "64 hex digits, a sha256" if self.fanout else "a plain file name"
            raise CacheError(f"{key!r:.80} is not a {self.what} key ({want}); refused")
        return key

    def _parts(self, key: str) -> list[str]:
        """The directories from ``root`` to the entry's parent."""
        return [key[:2]] if self.fanout else []

    def path_for(self, key: str) -> Path:
        """Where the entry ``key`` is: its directory, or (record files) its data file's path."""
        self.check_key(key)
        return self.root.joinpath(*self._parts(key), key)

    def record_path(self, key: str) -> Path:
        """The record of ``key``."""
        p = self.path_for(key)
        return p / self.record if self.suffix is None else p.with_name(key + self.suffix)

    def keys(self, links: list[dirfd.Link] | None = None) -> list[str]:
        """Every entry's key (unverified: :meth:`read` verifies one), never following a link
        (one found is appended to ``links``; a ``root`` that is a link lists nothing)."""
        found = [] if links is None else links
        try:
            with dirfd.opened(self.root) as fd:
                if self.suffix is None and self.fanout:
                    return [name for _, name in two_level(fd, str(self.root), found)]
                if not self.fanout:
                    return self._record_keys(fd)
                out = []
                for ab in dirfd.entries(fd):
                    if len(ab.name) == 2 and ab.is_dir(follow_symlinks=False):
                        with contextlib.suppress(OSError):
                            sub = dirfd.open_dir(ab.name, fd)
                            try:
                                out += [k for k in self._record_keys(sub) if k[:2] == ab.name]
                            finally:
                                os.close(sub)
                return out
        except FileNotFoundError:
            return []
        except dirfd.NotFollowed as exc:
            log.warning("%s is %s; nothing in it is listed", self.root, exc.strerror)
            return []

    def _private(self, d: Path) -> Path:
        return trust.private_dir(d, f"{self.what} directory", trust.trusted_gid())

    def _is_key(self, name: str) -> bool:
        try:
            self.check_key(name)
        except CacheError:
            return False
        return True

    def _record_keys(self, fd: int) -> list[str]:
        """The keys of the record files in the directory ``fd`` (links are no records)."""
        n = len(self.suffix or "")
        return [e.name[:-n] for e in dirfd.entries(fd) if n and e.name.endswith(self.suffix or "")
                and self._is_key(e.name[:-n]) and e.is_file(follow_symlinks=False)]

    def _check_parents(self, key: str) -> None:
        """``root`` and the directories down to the entry: each as :func:`trust.check_path`
        (:class:`StoreTrustError`; :class:`FileNotFoundError` when one is absent)."""
        gid = trust.trusted_gid()
        p = self.root
        trust.check_path(p, f"{self.what} directory", gid)
        for part in self._parts(key):
            p = p / part
            trust.check_path(p, f"{self.what} directory", gid)

    # -- reading ------------------------------------------------------------------------------
    def read(self, key: str, *, touch: bool = True, hash_files: bool = True,
             check: Callable[[dict[str, Any]], None] | None = None) -> Entry | None:
        """The verified entry ``key``, or ``None`` (absent, moved away meanwhile, or invalid
        and now evicted). ``touch``: record the use first (the entry's mtime, what an LRU prune
        orders by). ``hash_files=False`` checks which files are there but not their bytes (the
        caller copies them out with :meth:`copy_out`, which hashes as it copies). ``check``
        raises :class:`CacheError` for a record its user finds invalid (evicted likewise).
        :class:`StoreTrustError` when something others could change is on the way."""
        path, rec_path = self.path_for(key), self.record_path(key)
        if not os.path.lexists(rec_path if self.suffix is not None else path):
            return None
        gid = trust.trusted_gid()
        try:
            self._check_parents(key)
            if self.suffix is None:
                trust.check_tree(path, gid)  # before any byte of the entry is read
            else:
                trust.check_path(rec_path, f"{self.what} file", gid)
                if os.path.lexists(path):
                    trust.check_path(path, f"{self.what} file", gid)
        except FileNotFoundError:
            return None  # evicted meanwhile: a miss, rebuilt by the caller
        if touch:
            with contextlib.suppress(OSError):
                os.utime(rec_path if self.suffix is not None else path, follow_symlinks=False)
        self.key  # a key problem is refused, not mistaken for a bad entry  # noqa: B018
        try:
            record = self._verify(key, hash_files)
            if check is not None:
                check(record)
        except _Vanished:
            return None
        except CacheError as exc:
            log.warning("%s entry %s is invalid (%s); removing it, it will be rebuilt",
                        self.what, key[:12], exc)
            self.evict(key)
            return None
        return Entry(key, path, record)

    def _verify(self, key: str, hash_files: bool) -> dict[str, Any]:
        """The record of ``key`` if it is signed, of this format, for this key, and its files
        are what it lists; :class:`CacheError` (invalid) or :class:`_Vanished` otherwise."""
        parts = self._parts(key) if self.suffix is not None else [*self._parts(key), key]
        try:
            with dirfd.opened(self.root, parts) as fd:
                ino = os.fstat(fd).st_ino
                raw = dirfd.read_small(fd, self.record_path(key).name)
                if raw is None:
                    there = self.path_for(key) if self.suffix is None else self.record_path(key)
                    if not os.path.lexists(there):
                        raise _Vanished("removed before its record was read")
                    raise CacheError("no readable record")
                record = self._unseal(key, raw)
                if self.suffix is None:
                    present = self._hash_tree(fd, "", hash_files)
                else:  # only the data file named for the key, and only if the record says so
                    present = {}
                    if key in record["files"]:
                        present[key] = file_sha256(key, fd) if hash_files else ""
                moved = os.lstat(self.root.joinpath(*parts)).st_ino != ino
        except (FileNotFoundError, dirfd.NotFollowed) as exc:
            raise _Vanished(f"moved or removed while it was read ({exc})") from exc
        except OSError as exc:
            raise CacheError(f"unreadable: {exc}") from exc
        if moved:
            raise _Vanished("moved while it was read")
        files = record["files"]
        if set(present) - set(files):
            raise CacheError(f"files not in the record: {', '.join(sorted(set(present) - set(files)))}")
        for rel, digest in files.items():
            if rel not in present:
                raise CacheError(f"missing file {rel}")
            if hash_files and present[rel] != digest:
                raise CacheError(f"checksum mismatch for {rel}")
        return record

    def _unseal(self, key: str, raw: bytes) -> dict[str, Any]:
        try:
            record = json.loads(raw)
        except ValueError as exc:
            raise CacheError(f"unreadable record: {exc}") from exc
        got = record.get(self.format_field) if isinstance(record, dict) else None
        if got != self.version:
            raise CacheError(f"format {got} != {self.version}")
        if not trust.verify(self.key, record):
            raise CacheError(f"the record's signature does not verify with {trust.key_path()} "
                             f"(edited, or written with another key)")
        if record.get("key") != key:
            raise CacheError(f"the record is signed for key {str(record.get('key'))[:12]}, not "
                             f"{key[:12]} (an entry moved to another key's place)")
        if not isinstance(record.get("files"), dict):
            raise CacheError("the record has no file list")
        return record

    def _hash_tree(self, fd: int, rel: str, hash_files: bool) -> dict[str, str]:
        """``{relative path: sha256}`` of every regular file under the directory ``fd`` but
        the record (``""`` for each without ``hash_files``), never following a link."""
        out: dict[str, str] = {}
        for e in dirfd.entries(fd):
            name = f"{rel}{e.name}"
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                sub = dirfd.open_dir(e.name, fd)
                try:
                    out.update(self._hash_tree(sub, name + "/", hash_files))
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                if name != self.record:
                    out[name] = file_sha256(e.name, fd) if hash_files else ""
            else:
                raise CacheError(f"{name} is not a regular file")
        return out

    def read_bytes(self, key: str, limit: int = 16 << 20) -> bytes | None:
        """The data file beside a record file (at most ``limit`` bytes), read once and checked
        against its signed record, or ``None`` (a miss, as :meth:`read`)."""
        entry = self.read(key, touch=False, hash_files=False)
        if entry is None:
            return None
        try:
            with dirfd.opened(self.root, self._parts(key)) as fd:
                data = dirfd.read_small(fd, key, limit)
        except (FileNotFoundError, dirfd.NotFollowed):
            return None
        if data is not None and hashlib.sha256(data).hexdigest() == entry.record["files"].get(key):
            return data
        log.warning("%s entry %s does not match its signed record; removing it", self.what, key)
        self.evict(key)
        return None

    def copy_out(self, entry: Entry, name: str, dest: Path) -> bool:
        """Copy the file ``name`` of ``entry`` (read with ``hash_files=False``) to ``dest``,
        hashing the bytes as they are copied: ``dest`` is replaced only by a copy that is what
        the record signs (in one read). A file that is not is evicted with its entry (a miss:
        ``False``); one removed meanwhile is a miss too."""
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}")
        try:
            ok = _copy_verified(entry.path / name, tmp, entry.record["files"].get(name))
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("%s entry %s unreadable (%s)", self.what, entry.key[:12], exc)
            ok = False
        if not ok:
            log.warning("%s entry %s does not match its signed record; removing it, it will be "
                        "rebuilt", self.what, entry.key[:12])
            self.evict(entry.key)
            return False
        os.replace(tmp, dest)
        return True

    # -- writing ------------------------------------------------------------------------------
    def stage(self) -> Path:
        """A new private directory to write an entry in (:meth:`commit` moves it into place;
        :meth:`discard` removes it). Stagings over a day old (builds that died) are swept."""
        self._private(self.root)
        self._private(self.tmp)
        self.sweep()
        d = self.tmp / uuid.uuid4().hex
        d.mkdir(mode=0o700)
        return d

    def discard(self, staged: Path) -> None:
        shutil.rmtree(staged, ignore_errors=True)

    def sweep(self, max_age: float = 24 * 3600) -> None:
        """Remove what the staging directory holds older than ``max_age`` s: stagings of
        builds that died, evictions interrupted half-way (a live build's staging is younger)."""
        now = time.time()
        try:
            with dirfd.opened(self.tmp) as fd:
                for e in dirfd.entries(fd):
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISLNK(st.st_mode) or now - st.st_mtime > max_age:
                        dirfd.remove_at(fd, e.name)  # a link: unlinked, never followed
        except FileNotFoundError:
            return
        except dirfd.NotFollowed as exc:
            log.warning("%s is %s; not swept", self.tmp, exc.strerror)

    def seal(self, key: str, record: Mapping[str, Any], files: dict[str, str]) -> dict[str, Any]:
        """``record`` as it is written: with its key, format, file list and ``hmac``, signed
        exactly as it reads back (a JSON round trip first)."""
        rec = dict(record, key=key, files=files, **{self.format_field: self.version})
        rec = json.loads(json.dumps(rec, default=str))
        rec["hmac"] = trust.sign(self.key, rec)
        return rec

    def commit(self, staged: Path, key: str, record: Mapping[str, Any]) -> dict[str, Any] | None:
        """Hash what ``staged`` (from :meth:`stage`) holds, write the signed record in it and
        rename it into place. What was staged is made private (dirs 0700, files 0600); a
        symlink or a special file is :class:`CacheError`. Returns the record, or ``None`` when
        another writer placed ``key`` first (``staged`` is removed: the first entry stands)."""
        if self.suffix is not None:
            raise TypeError("a SignedDir of record files writes with write_file()")
        self.check_key(key)
        try:
            rec = self.seal(key, record, staged_files(staged, self.record))
            _write_private(staged / self.record, json.dumps(rec, indent=1).encode())
            parent = self._private(self.root.joinpath(*self._parts(key)))
            self._check_parents(key)  # a link on the way would take the entry outside
            with dirfd.opened(self.tmp) as src, dirfd.opened(parent) as dst:
                try:
                    os.rename(staged.name, key, src_dir_fd=src, dst_dir_fd=dst)
                except OSError:  # another writer placed it first; its entry is as good
                    return None
        finally:
            shutil.rmtree(staged, ignore_errors=True)  # gone when renamed
        return rec

    def write(self, key: str, record: Mapping[str, Any],
              files: Mapping[str, bytes | Path] | None = None) -> dict[str, Any] | None:
        """Stage ``files`` (bytes, or a file to copy) and :meth:`commit` them with ``record``."""
        staged = self.stage()
        try:
            for name, data in (files or {}).items():
                parts = Path(name).parts
                if not parts or Path(name).is_absolute() or ".." in parts:
                    raise CacheError(f"{name!r:.80} is not a plain relative file name")
                (staged / name).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                if isinstance(data, Path):
                    shutil.copyfile(data, staged / name)
                else:
                    _write_private(staged / name, data)
        except BaseException:
            self.discard(staged)
            raise
        return self.commit(staged, key, record)

    def write_file(self, key: str, record: Mapping[str, Any], data: bytes | None = None) -> Path:
        """A record file for ``key`` (and ``data``, when given, as the data file beside it),
        each written privately and renamed into place, replacing what was there. Returns the
        data file's path."""
        if self.suffix is None:
            raise TypeError("write_file() is for a SignedDir of record files")
        path = self.path_for(key)
        self._private(self.root)
        self._private(self.tmp)
        parent = self._private(path.parent)
        self._check_parents(key)
        files = {} if data is None else {key: hashlib.sha256(data).hexdigest()}
        rec = self.seal(key, record, files)
        blobs = [(path.name, data)] if data is not None else []
        blobs.append((self.record_path(key).name, json.dumps(rec).encode()))
        with dirfd.opened(self.tmp) as src, dirfd.opened(parent) as dst:
            for name, blob in blobs:
                staged = f"{uuid.uuid4().hex}-{name}"
                _write_private(self.tmp / staged, blob)
                os.replace(staged, name, src_dir_fd=src, dst_dir_fd=dst)
        return path

    # -- removing -----------------------------------------------------------------------------
    def evict(self, key: str, keep: Callable[[os.stat_result], bool] | None = None) -> bool:
        """Remove the entry ``key``: renamed into the staging directory first (a reader sees
        it absent, never half of it), then removed unless ``keep`` (given the moved entry's
        ``lstat``) puts it back. Every directory on the way is opened without following a link:
        a linked ``ab/`` is not followed (``False``); a linked staging directory is
        :class:`StoreTrustError`. Returns whether it was removed."""
        self.check_key(key)
        self._private(self.root)
        self._private(self.tmp)
        try:
            with dirfd.opened(self.root, self._parts(key)) as parent, \
                    dirfd.opened(self.tmp) as trash:
                if self.suffix is None:
                    return dirfd.evict(parent, key, trash, f"evict-{uuid.uuid4().hex}", keep)
                gone = dirfd.evict(parent, key + self.suffix, trash, f"evict-{uuid.uuid4().hex}", keep)
                if gone:
                    dirfd.remove_at(parent, key)  # the data file, which no record signs now
                return gone
        except FileNotFoundError:
            return False
        except dirfd.NotFollowed as exc:
            log.warning("%s %s: %s is %s; nothing evicted there", self.what, key[:12],
                        self.root.joinpath(*self._parts(key)), exc.strerror)
            return False


def _write_private(path: Path, data: bytes) -> None:
    """A new file ``path`` (0600, never through a link) holding ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def staged_files(staged: Path, record_name: str) -> dict[str, str]:
    """The sha256 of every file under ``staged`` (but a record), made private on the way
    (dirs 0700, files 0600); a symlink or anything but files and directories is refused."""
    files = {}
    for p in sorted(staged.rglob("*")):
        rel = p.relative_to(staged)
        if p.is_symlink() or not (p.is_dir() or p.is_file()):
            raise CacheError(f"the entry contains {'a symlink' if p.is_symlink() else 'a special file'} "
                             f"({rel}); only regular files are kept")
        p.chmod(0o700 if p.is_dir() else 0o600)
        if p.is_file() and str(rel) != record_name:
            files[str(rel)] = file_sha256(p)
    return files


def _copy_verified(src: Path, dst: Path, sha256: Any) -> bool:
    """Copy ``src`` (not a link) to a new file ``dst``, hashing the bytes as they are copied:
    True when they are ``sha256``, else ``dst`` is removed and False.
    :class:`FileNotFoundError` when ``src`` is gone."""
    h = hashlib.sha256()
    with open(os.open(src, dirfd.FILE_FLAGS), "rb") as f:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
                    out.write(chunk)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(dst)
            raise
    if h.hexdigest() == sha256:
        return True
    os.unlink(dst)
    return False


__all__ = ["Entry", "SignedDir", "file_sha256", "staged_files", "two_level"]
