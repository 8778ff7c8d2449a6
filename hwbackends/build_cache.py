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
from typing import Iterator

from . import trust
from .store import KEY_RE, file_sha256, private_mkdir, two_level_names

log = logging.getLogger("hwbackends.build_cache")
DIRNAME = "build-cache"
_RECORD, _BLOB = "record.json", "blob"


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
        """Copy the product ``name`` to ``dest`` and return True, or False (absent, or invalid
        and now removed)."""
        d = self.path_for(name)
        if not (d / _RECORD).exists():
            return False
        gid = trust.trusted_gid()
        try:
            for p in (self.root, d.parent):
                trust.check_path(p, "build cache directory", gid)
            trust.check_tree(d, gid)
            record = json.loads((d / _RECORD).read_text())
            ok = (isinstance(record, dict) and record.get("digest") == name
                  and trust.verify(trust.load_key(), record)
                  and file_sha256(d / _BLOB) == record.get("sha256"))
        except FileNotFoundError:
            return False  # removed meanwhile (another process found it invalid)
        except (OSError, ValueError) as exc:
            log.warning("build cache entry %s unreadable (%s); removing it", name[:12], exc)
            ok = False
        if not ok:
            log.warning("build cache entry %s does not match its signed record; removing it, "
                        "the product is rebuilt", name[:12])
            self._remove(d)
            return False
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}")
        shutil.copyfile(d / _BLOB, tmp)
        os.replace(tmp, dest)
        with contextlib.suppress(OSError):
            os.utime(d)  # last used: ``hwb store prune`` removes the least recently used first
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
        stage = self.root / "tmp" / uuid.uuid4().hex
        stage.mkdir(mode=0o700)
        try:
            shutil.copyfile(src, stage / _BLOB)
            os.chmod(stage / _BLOB, 0o600)
            record = {"digest": name, "sha256": file_sha256(stage / _BLOB),
                      "size": (stage / _BLOB).stat().st_size, "from": src.name}
            record["hmac"] = trust.sign(trust.load_key(), record)
            fd = os.open(stage / _RECORD, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            private_mkdir(d.parent)
            try:
                os.rename(stage, d)
            except OSError:  # another process put it first
                pass
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def discard(self, name: str) -> None:
        """Remove the product ``name`` (one its user found unusable): the next build makes
        it again."""
        d = self.path_for(name)
        if d.exists():
            self._remove(d)

    def _remove(self, d: Path) -> None:
        private_mkdir(self.root / "tmp")
        trash = self.root / "tmp" / f"evict-{uuid.uuid4().hex}"
        try:
            os.rename(d, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)


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
