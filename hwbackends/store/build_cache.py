"""Content-addressed cache of a build's intermediate products, beside the artifact store.

A target's compile may build the same thing again: an FPGA precision search builds several
candidate designs, and the same design recurs when a model is retrained with its
architecture kept (hls4ml reads weights at run time, so its C-simulation library depends
only on the layer types), when an artifact is rebuilt after corruption or eviction, or when
only an option that does not reach the build changes (``synth``). ccache's idea, for any
product: the target names the product by a digest of *everything* its build reads (the
preprocessed translation units, the generated Verilog, compiler versions and flags:
:func:`digest`), and gets the file back instead of rebuilding it.

Layout: ``<store root>/build-cache/ab/abcdef…/{blob,record.json}``, a signed entry
(:class:`hwbackends.store.signed_dir.SignedDir`: staged and renamed into place, never half-visible,
0700/0600 like the store, the record HMAC-signed with the store's key over the digest, the
format and the blob's sha256). A blob that does not match its signed record (edited,
truncated, written with another key, or an entry of an older format) is removed and reported
as a miss: the caller builds, as without a cache.

How a plugin reaches it: the core makes the cache of the store a compile commits into
*current* for exactly the duration of ``Target.compile`` (:func:`active`, in the compile
worker), and a plugin asks :func:`current` (``None``: no cache, build as usual). It is not an
argument because ``Target.compile(model, options, workdir)`` is the versioned plugin contract:
adding a parameter would break every plugin written against it, for a service most targets
never use. It is a :class:`contextvars.ContextVar`, not a module global: it is set only inside
:func:`active`, restored when the compile ends (however it ends), and seen only by the thread
(or task) running that compile, so two compiles into different stores in one process never
see each other's cache.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ..errors import StoreTrustError
from .signed_dir import HEX_KEY, SignedDir

log = logging.getLogger("hwbackends.store.build_cache")
DIRNAME = "build-cache"
RECORD, BLOB = "record.json", "blob"
#: The record's format (1: a signed entry with a ``files`` list; no version before it).
FORMAT = 1


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
    _dir: SignedDir = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_dir", SignedDir(self.root, "build cache", FORMAT, record=RECORD))

    def path_for(self, name: str) -> Path:
        """The directory of the product ``name`` (a digest; anything else is refused)."""
        if not isinstance(name, str) or not HEX_KEY.fullmatch(name):
            raise ValueError(f"{name!r:.80} is not a build-cache digest (64 hex digits)")
        return self._dir.path_for(name)

    def fetch(self, name: str, dest: Path) -> bool:
        """Copy the product ``name`` to ``dest`` and return True, or False (absent, removed
        meanwhile by a prune or another process, or invalid and now removed). ``dest`` is
        replaced only by a complete, verified copy (hashed as it is copied: one read)."""
        self.path_for(name)
        entry = self._dir.read(name, hash_files=False)
        return entry is not None and self._dir.copy_out(entry, BLOB, dest)

    def names(self) -> list[str]:
        """Every product's digest (unverified: :meth:`fetch` verifies one)."""
        return self._dir.keys()

    def put(self, name: str, src: Path) -> None:
        """Keep ``src`` as the product ``name`` (a second writer of the same name keeps the
        first's: both built the same thing)."""
        if self.path_for(name).exists():
            return
        self._dir.write(name, {"size": src.stat().st_size, "from": src.name}, {BLOB: src})

    def discard(self, name: str, keep: Callable[[os.stat_result], bool] | None = None) -> bool:
        """Remove the product ``name`` (one its user found unusable, or pruned): renamed away
        through directory fds, never following a link, then removed unless ``keep`` (given the
        moved directory's ``lstat``) puts it back (:meth:`SignedDir.evict`). The next build
        makes it again. Returns whether it was removed."""
        self.path_for(name)
        try:
            return self._dir.evict(name, keep)
        except StoreTrustError as exc:
            log.warning("build cache entry %s not removed: %s", name[:12], exc)
            return False


_CURRENT: contextvars.ContextVar[BuildCache | None] = contextvars.ContextVar(
    "hwbackends_build_cache", default=None)


@contextlib.contextmanager
def active(root: str | Path | None) -> Iterator[BuildCache | None]:
    """While the body runs (a target's compile), :func:`current` is the cache at ``root``
    (``None``: none), in this thread or task only."""
    token = _CURRENT.set(BuildCache(Path(root)) if root else None)
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


def current() -> BuildCache | None:
    """The build cache of the store the running compile commits into, or ``None``."""
    return _CURRENT.get()
