"""Content-addressed cache of a build's intermediate products, beside the artifact store.

A target's compile may build the same thing again: an FPGA precision search builds several
candidate designs, and the same design recurs when a model is retrained with its
architecture kept (hls4ml reads weights at run time, so its C-simulation library depends
only on the layer types), when an artifact is rebuilt after corruption or eviction, or when
only an option that does not reach the build changes (``synth``). ccache's idea, for any
product: the target names the product by a digest of *everything* its build reads (the
preprocessed translation units, the generated Verilog, compiler versions and flags:
:func:`digest`), and gets the file back instead of rebuilding it.

Layout: ``<store root>/build-cache/ab/abcdef…/{blob,record.json}``, written in a staging
directory and renamed into place (never half-visible), 0700/0600 like the store, the record
HMAC-signed with the store's key (:mod:`hwbackends.trust`) over the digest and the blob's
sha256. A blob that does not match its signed record (edited, truncated, written with another
key) is removed and reported as a miss: the caller builds, as without a cache.

The core activates the cache of the store a compile commits into for the duration of
``Target.compile`` (:func:`active`, in the compile worker); a plugin asks :func:`current`
(``None``: no cache, build as usual).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from . import trust
from .errors import StoreTrustError
from .store import KEY_RE, evict_at, file_sha256, private_mkdir, two_level_names

log = logging.getLogger("hwbackends.build_cache")
DIRNAME = "build-cache"
RECORD, BLOB = "record.json", "blob"


def digest(*parts: bytes | str) -> str:
    """The sha256 naming a product: of every part, each length-prefixed (no two different
    part lists hash alike)."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else bytes(p)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


@dataclass(frozen=True)
class BuildCache:
    """One store's build cache (``root``: its ``build-cache`` directory)."""

    root: Path

    def path_for(self, name: str) -> Path:
        """The directory of the product ``name`` (a digest; anything else is refused)."""
        if not isinstance(name, str) or not KEY_RE.fullmatch(name):
            raise ValueError(f"{name!r:.80} is not a build-cache digest (64 hex digits)")
        return self.root / name[:2] / name

    def fetch(self, name: str, dest: Path) -> bool:
        """Copy the product ``name`` to ``dest`` and return True, or False (absent, removed
        meanwhile by a prune or another process, or invalid and now removed). ``dest`` is
        replaced only by a complete, verified copy."""
        d = self.path_for(name)
        if not (d / RECORD).exists():
            return False
        gid = trust.trusted_gid()
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}")
        try:
            for p in (self.root, d.parent):
                trust.check_path(p, "build cache directory", gid)
            trust.check_tree(d, gid)
            with contextlib.suppress(OSError):  # a use, recorded before the read: a prune that
                os.utime(d, follow_symlinks=False)  # scanned earlier puts it back
            record = json.loads((d / RECORD).read_text())
            ok = (isinstance(record, dict) and record.get("digest") == name
                  and trust.verify(trust.load_key(), record)
                  and _copy_verified(d / BLOB, tmp, record.get("sha256")))
        except FileNotFoundError:
            return False  # pruned (or found invalid by another process) meanwhile: a miss
        except (OSError, ValueError) as exc:
            log.warning("build cache entry %s unreadable (%s); removing it", name[:12], exc)
            ok = False
        if not ok:
            log.warning("build cache entry %s does not match its signed record; removing it, "
                        "the product is rebuilt", name[:12])
            self.discard(name)
            return False
        os.replace(tmp, dest)
        return True

    def names(self) -> list[str]:
        """Every product's digest (unverified: :meth:`fetch` verifies one)."""
        return two_level_names(self.root)

    def put(self, name: str, src: Path) -> None:
        """Keep ``src`` as the product ``name`` (a second writer of the same name keeps the
        first's: both built the same thing)."""
        d = self.path_for(name)
        if d.exists():
            return
        private_mkdir(self.root)
        private_mkdir(self.root / "tmp")
        private_mkdir(d.parent)
        gid = trust.trusted_gid()
        for p in (self.root, self.root / "tmp", d.parent):  # a link here would take the product
            trust.check_path(p, "build cache directory", gid)  # out of the store
        stage = self.root / "tmp" / uuid.uuid4().hex
        stage.mkdir(mode=0o700)
        try:
            shutil.copyfile(src, stage / BLOB)
            os.chmod(stage / BLOB, 0o600)
            record = {"digest": name, "sha256": file_sha256(stage / BLOB),
                      "size": (stage / BLOB).stat().st_size, "from": src.name}
            record["hmac"] = trust.sign(trust.load_key(), record)
            fd = os.open(stage / RECORD, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            try:
                os.rename(stage, d)
            except OSError:  # another process put it first
                pass
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def discard(self, name: str, keep: Callable[[os.stat_result], bool] | None = None) -> bool:
        """Remove the product ``name`` (one its user found unusable, or pruned): renamed into
        ``tmp/`` through directory fds, never following a link, then removed unless ``keep``
        (given the moved directory's ``lstat``) puts it back (:meth:`ArtifactStore.evict`).
        The next build makes it again. Returns whether it was removed."""
        self.path_for(name)
        try:
            return evict_at(self.root, [name[:2]], name, keep)
        except StoreTrustError as exc:
            log.warning("build cache entry %s not removed: %s", name[:12], exc)
            return False


def _copy_verified(src: Path, dst: Path, sha256: Any) -> bool:
    """Copy ``src`` to a new file ``dst``, hashing the bytes as they are copied: True when they
    are ``sha256`` (the copy is what was verified, in one read), else ``dst`` is removed and
    False. :class:`FileNotFoundError` when ``src`` is gone (a reader that opened it keeps
    reading it whole even if it is removed meanwhile)."""
    h = hashlib.sha256()
    with open(src, "rb") as f:
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


_CURRENT: BuildCache | None = None


@contextlib.contextmanager
def active(root: str | Path | None) -> Iterator[BuildCache | None]:
    """While the body runs (a target's compile), :func:`current` is the cache at ``root``
    (``None``: none)."""
    global _CURRENT
    before = _CURRENT
    _CURRENT = BuildCache(Path(root)) if root else None
    try:
        yield _CURRENT
    finally:
        _CURRENT = before


def current() -> BuildCache | None:
    """The build cache of the store the running compile commits into, or ``None``."""
    return _CURRENT
