"""What the artifact store holds, and removing the least recently used of it (``hwb store``).

The store only grows: every (model, target, precision, options, toolchain) ever compiled stays,
with the build products its compile cached (``build-cache/``). Like ``ccache -M`` or ``pip
cache``, :func:`prune` keeps it within a size (``max_bytes``) or an age (``older_than_s``),
removing whole entries, least recently used first (an entry's directory mtime: set when it was
committed, touched on each load, :meth:`ArtifactStore.touch`). Removal goes through the
store's own eviction (:meth:`ArtifactStore.evict`, :meth:`BuildCache.discard`: renamed away
first, so a process loading the entry meanwhile sees it absent and rebuilds it, never half of
it); an entry used within the last :data:`GRACE_S` seconds is kept (a compile that has just
committed it is about to load it). A server keeps what it has loaded. The zoo's trained models
and the measured profiles are small and are kept; idle lock files and old stagings go.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import trust
from .build_cache import DIRNAME as BUILD_CACHE_DIR
from .build_cache import BuildCache
from .store import MANIFEST, ArtifactStore
from .units import fmt_bytes, parse_size

log = logging.getLogger("hwbackends.store")

#: An entry used this recently is never removed (seconds).
GRACE_S = 60.0
#: The environment variable that caps the store: after each compile commits, the least
#: recently used entries go until it holds at most this much (``20G``; unset: no cap).
MAX_SIZE_ENV = "HWB_CACHE_MAX_SIZE"
#: The store's other directories, counted in the total but never pruned.
KEPT = ("zoo", "profiles", "tmp", "locks")


@dataclass(frozen=True)
class Entry:
    """One removable thing: an artifact (``objects/``) or a build product (``build-cache/``)."""

    kind: str          # "artifact" | "build product"
    name: str          # its store key or build-cache digest
    bytes: int         # on disk (allocated blocks)
    last_used: float   # epoch seconds
    what: str          # "signal cpu.litert:int8", or the product's file name


@dataclass
class Usage:
    """What the store at ``root`` holds."""

    root: str
    entries: list[Entry] = field(default_factory=list)
    #: Bytes in each of :data:`KEPT`.
    kept: dict[str, int] = field(default_factory=dict)

    @property
    def removable_bytes(self) -> int:
        return sum(e.bytes for e in self.entries)

    @property
    def total_bytes(self) -> int:
        return self.removable_bytes + sum(self.kept.values())

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "total_bytes": self.total_bytes,
                "removable_bytes": self.removable_bytes, "kept_bytes": self.kept,
                "entries": [asdict(e) for e in self.entries]}


@dataclass
class Pruned:
    """What :func:`prune` removed (or, with ``dry_run``, would remove)."""

    removed: list[Entry]
    kept_recent: int      # entries over the limit but used within GRACE_S
    locks_removed: int
    after: Usage
    dry_run: bool
    kept_pinned: int = 0  # entries over the limit but pinned (ArtifactStore.pinned)

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "removed": [asdict(e) for e in self.removed],
                "removed_bytes": sum(e.bytes for e in self.removed),
                "kept_recent": self.kept_recent, "kept_pinned": self.kept_pinned,
                "locks_removed": self.locks_removed,
                "after": self.after.to_dict()}


def _du(p: Path) -> int:
    """Bytes allocated under ``p`` (links not followed: the store holds none)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(p):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:  # removed meanwhile
                pass
    return total


def _artifact_label(store: ArtifactStore, key: str) -> str:
    """"MODEL TARGET:PRECISION [batch N]" from the entry's manifest when its signature verifies (no file
    is hashed: a listing must not cost a read of every artifact); else says it is unverified."""
    try:
        record = json.loads((store.path_for(key) / MANIFEST).read_text())
        if isinstance(record, dict) and trust.verify(store.key, record):
            batch = record.get("batch_size")
            return (f"{record.get('model', '?')} {record.get('target', '?')}:"
                    f"{record.get('precision', '?')}" + (f" batch {batch}" if batch != 1 else ""))
    except (OSError, ValueError):
        pass
    return "(unverified: removed when next loaded)"


def _product_label(cache: BuildCache, name: str) -> str:
    try:
        record = json.loads((cache.path_for(name) / "record.json").read_text())
        return str(record.get("from", "?")) if isinstance(record, dict) else "?"
    except (OSError, ValueError):
        return "?"


def _mtime(p: Path) -> float | None:
    try:
        return os.lstat(p).st_mtime
    except OSError:
        return None


def usage(store: ArtifactStore, *, labels: bool = True) -> Usage:
    """Every artifact and build product of ``store`` with its size and last use, newest first,
    and the bytes of the directories that are kept. Checks the root as every store access
    does (:class:`StoreTrustError` for a root others could change). ``labels=False`` leaves
    ``what`` empty and reads no manifest (the automatic limit needs sizes and times only)."""
    store.check_root()
    root = store.root
    out = Usage(str(root))
    cache = BuildCache(root / BUILD_CACHE_DIR)
    sources = (("artifact", store.keys(), store.path_for, lambda n: _artifact_label(store, n)),
               ("build product", cache.names(), cache.path_for, lambda n: _product_label(cache, n)))
    for kind, names, path_for, label in sources:
        for name in names:
            d = path_for(name)
            t = _mtime(d)
            if t is not None:  # None: removed meanwhile
                out.entries.append(Entry(kind, name, _du(d), t, label(name) if labels else ""))
    out.entries.sort(key=lambda e: -e.last_used)
    out.kept = {name: _du(root / name) for name in KEPT if (root / name).is_dir()}
    return out


def prune(store: ArtifactStore, *, max_bytes: int | None = None,
          older_than_s: float | None = None, dry_run: bool = False,
          now: float | None = None, labels: bool = True) -> Pruned:
    """Remove entries not used for ``older_than_s`` seconds, then the least recently used until
    the artifacts and build products take at most ``max_bytes``; entries used within
    :data:`GRACE_S` stay whatever the limits. Also removes idle lock files and stagings over a
    day old. ``dry_run``: say what would go, remove nothing."""
    if max_bytes is None and older_than_s is None:
        raise ValueError("say what to keep: a size (max_bytes) and/or an age (older_than_s)")
    if (max_bytes is not None and max_bytes < 0) or (older_than_s is not None and older_than_s < 0):
        raise ValueError(f"limits must not be negative (max_bytes={max_bytes}, "
                         f"older_than_s={older_than_s})")
    now = time.time() if now is None else now
    before = usage(store, labels=labels)
    size = before.removable_bytes
    removed: list[Entry] = []
    kept_recent = kept_pinned = 0
    for e in sorted(before.entries, key=lambda e: e.last_used):  # least recently used first
        stale = older_than_s is not None and now - e.last_used > older_than_s
        over = max_bytes is not None and size > max_bytes
        if not (stale or over):
            continue
        if now - e.last_used < GRACE_S:
            kept_recent += 1
            continue
        if e.kind == "artifact" and store.is_pinned(e.name):
            kept_pinned += 1
            continue
        removed.append(e)
        size -= e.bytes
    locks = 0
    if not dry_run:
        cache = BuildCache(store.root / BUILD_CACHE_DIR)
        for e in removed:
            if e.kind == "artifact":
                store.evict(e.name)
            else:
                cache.discard(e.name)
        store.sweep_tmp()
        locks = store.remove_idle_locks()
    if removed and not dry_run:
        after = usage(store, labels=labels)
    else:  # nothing left the entries: no second scan (the common case of the automatic cap)
        gone = {e.name for e in removed}
        after = Usage(before.root, [e for e in before.entries if e.name not in gone], before.kept)
    return Pruned(removed, kept_recent, locks, after, dry_run, kept_pinned)


def keep_within_limit(store: ArtifactStore, say: Callable[[str], None] | None = None) -> Pruned | None:
    """Prune ``store`` to :data:`MAX_SIZE_ENV` when that is set (ccache's ``max_size``):
    called after each compile commits. Never raises: a bad value or a failed prune is logged
    and the compile that called it stands."""
    limit = os.environ.get(MAX_SIZE_ENV, "").strip()
    if not limit:
        return None
    try:
        max_bytes = parse_size(limit)
    except ValueError as exc:
        log.warning("%s: %s; the store is not pruned", MAX_SIZE_ENV, exc)
        return None
    try:
        r = prune(store, max_bytes=max_bytes, labels=False)
    except Exception as exc:  # noqa: BLE001 - keeping the cap is never worth a failed compile
        log.warning("%s=%s: pruning %s failed (%s: %s); the store is left as it is",
                    MAX_SIZE_ENV, limit, store.root, type(exc).__name__, exc)
        return None
    if r.removed and say is not None:
        say(f"store over {MAX_SIZE_ENV}={limit}: removed {len(r.removed)} least recently used "
            f"entr{'y' if len(r.removed) == 1 else 'ies'} ({fmt_bytes(sum(e.bytes for e in r.removed))})")
    return r
