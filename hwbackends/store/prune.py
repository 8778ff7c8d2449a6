"""What the artifact store holds, and removing the least recently used of it (``hwb store``).

The store only grows: every (model, target, precision, options, toolchain) ever compiled stays,
with the build products its compile cached (``build-cache/``). Like ``ccache -M`` or ``pip
cache``, :func:`prune` keeps it within a size (``max_bytes``) or an age (``older_than_s``),
removing whole entries, least recently used first (an entry's directory mtime: set when it was
committed, touched on each load, :meth:`ArtifactStore.touch`). Removal goes through the
store's own eviction (:meth:`ArtifactStore.evict`, :meth:`BuildCache.discard`: renamed away
first, so a process loading the entry meanwhile sees it absent and rebuilds it, never half of
it); an entry used within the last :data:`GRACE_S` seconds is kept (a compile that has just
committed it is about to load it), and so is one pinned in this process
(:meth:`ArtifactStore.pinned`). Last use is checked again at the moment of removal, after the
rename: an entry used since the scan is put back. A server keeps what it has loaded. The zoo's
trained models and the measured profiles are small and are kept; idle lock files and old
stagings go.

No symlink in the store is followed (the walk goes through directory fds,
:mod:`hwbackends.store.dirfd`): each one found is listed in :attr:`Usage.links`; prune unlinks
those where an entry, an ``ab/`` directory, a staging or a lock belongs (the store writes
none there, and a load refuses one), and leaves one in place of a top-level directory
(``objects``, ``profiles``, …: the load that meets it says how to fix it), never reading
through it.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..units import fmt_bytes, parse_size
from . import dirfd, trust
from .artifacts import MANIFEST, ArtifactStore
from .build_cache import DIRNAME as BUILD_CACHE_DIR
from .build_cache import RECORD, BuildCache
from .signed_dir import two_level

log = logging.getLogger("hwbackends.store")

#: An entry used this recently is never removed (seconds).
GRACE_S = 60.0
#: The environment variable that caps the store: after each compile commits, the least
#: recently used entries go until it holds at most this much (``20G``; unset: no cap).
MAX_SIZE_ENV = "HWB_CACHE_MAX_SIZE"
#: The store's other directories, counted in the total but never pruned.
KEPT = ("zoo", "profiles", "tmp", "locks")
#: Where each kind of entry lives (``top/ab/abcdef…``).
SOURCES = (("artifact", "objects"), ("build product", BUILD_CACHE_DIR))


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
    #: Every symlink found (relative to the root), none followed.
    links: list[dirfd.Link] = field(default_factory=list)

    @property
    def removable_bytes(self) -> int:
        return sum(e.bytes for e in self.entries)

    @property
    def total_bytes(self) -> int:
        return self.removable_bytes + sum(self.kept.values())

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "total_bytes": self.total_bytes,
                "removable_bytes": self.removable_bytes, "kept_bytes": self.kept,
                "entries": [asdict(e) for e in self.entries],
                "links": [asdict(link) for link in self.links]}


@dataclass
class Pruned:
    """What :func:`prune` removed (or, with ``dry_run``, would remove)."""

    removed: list[Entry]
    kept_recent: int      # entries over the limit but used within GRACE_S
    locks_removed: int
    after: Usage
    dry_run: bool
    kept_pinned: int = 0  # entries over the limit but pinned (ArtifactStore.pinned)
    #: Links unlinked (never followed) where an entry, a staging or a lock belongs.
    links_removed: list[dirfd.Link] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "removed": [asdict(e) for e in self.removed],
                "removed_bytes": sum(e.bytes for e in self.removed),
                "kept_recent": self.kept_recent, "kept_pinned": self.kept_pinned,
                "locks_removed": self.locks_removed,
                "links_removed": [asdict(link) for link in self.links_removed],
                "after": self.after.to_dict()}


def _label(kind: str, efd: int, key: bytes) -> str:
    """What an entry is, from its signed record (an artifact's manifest: "MODEL
    TARGET:PRECISION [batch N]"; a build product's record: the file it was built as), read
    through the entry's fd; no file is hashed (a listing must not read every artifact)."""
    raw = dirfd.read_small(efd, MANIFEST if kind == "artifact" else RECORD)
    try:
        record = json.loads(raw) if raw is not None else None
    except ValueError:
        record = None
    if not isinstance(record, dict) or not trust.verify(key, record):
        return "(unverified: removed when next loaded)"
    if kind != "artifact":
        return str(record.get("from", "?"))
    batch = record.get("batch_size")
    return (f"{record.get('model', '?')} {record.get('target', '?')}:"
            f"{record.get('precision', '?')}" + (f" batch {batch}" if batch != 1 else ""))


def _scan(root_fd: int, kind: str, top: str, out: Usage, key: bytes | None) -> None:
    """Append each entry under ``top`` to ``out`` (sizes, last use, a label when ``key``)."""
    try:
        top_fd = dirfd.open_dir(top, root_fd)
    except FileNotFoundError:
        return
    except dirfd.NotFollowed:
        out.links.append(dirfd.link_at(root_fd, top, top))
        return
    try:
        for ab_fd, name in two_level(top_fd, top, out.links):
            try:
                efd = dirfd.open_dir(name, ab_fd)
            except OSError:  # removed, or swapped for a link, meanwhile: not followed
                continue
            try:
                t = os.fstat(efd).st_mtime
                size = dirfd.tree_bytes(efd, f"{top}/{name[:2]}/{name}", out.links)
                what = _label(kind, efd, key) if key is not None else ""
            finally:
                os.close(efd)
            out.entries.append(Entry(kind, name, size, t, what))
    finally:
        os.close(top_fd)


def _kept_bytes(root_fd: int, name: str, out: Usage) -> None:
    try:
        fd = dirfd.open_dir(name, root_fd)
    except FileNotFoundError:
        return
    except dirfd.NotFollowed as exc:
        if exc.is_link:
            out.links.append(dirfd.link_at(root_fd, name, name))
        return
    try:
        out.kept[name] = dirfd.tree_bytes(fd, name, out.links)
    finally:
        os.close(fd)


def usage(store: ArtifactStore, *, labels: bool = True) -> Usage:
    """Every artifact and build product of ``store`` with its size and last use, newest first,
    the bytes of the directories that are kept, and every symlink found (none followed: the
    walk goes through directory fds). Checks the root as every store access does
    (:class:`StoreTrustError` for a root others could change). ``labels=False`` leaves
    ``what`` empty and reads no record (the automatic limit needs sizes and times only)."""
    store.check_root()
    root = store.root
    out = Usage(str(root))
    key = store.key if labels else None
    with dirfd.opened(root) as root_fd:
        for kind, top in SOURCES:
            _scan(root_fd, kind, top, out, key)
        for name in KEPT:
            _kept_bytes(root_fd, name, out)
    out.entries.sort(key=lambda e: -e.last_used)
    return out


#: Where prune unlinks a link it finds: below these top-level directories (a link in place of
#: one of them, or of zoo/ or profiles/, is left and reported).
_LINKS_REMOVED_UNDER = ("objects/", BUILD_CACHE_DIR + "/", "tmp/", "locks/")


def _remove_links(store: ArtifactStore, links: list[dirfd.Link]) -> list[dirfd.Link]:
    """Unlink each link of ``links`` that sits where an entry, an ``ab/`` directory, a
    staging or a lock belongs (its parent opened through fds: nothing is followed), and not
    inside an entry (that goes with its entry)."""
    removed = []
    for link in links:
        parts = link.path.split("/")
        where = "/".join(parts[:-1]) + "/"
        if not where.startswith(_LINKS_REMOVED_UNDER) or len(parts) > 3:
            continue
        try:
            with dirfd.opened(store.root, parts[:-1]) as fd:
                if stat.S_ISLNK(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode):
                    os.unlink(parts[-1], dir_fd=fd)
                    removed.append(link)
        except OSError:
            continue
    return removed


def _remove(store: ArtifactStore, e: Entry, now: float) -> bool:
    """Evict ``e`` unless, at the moment of removal (after the rename), it was used since the
    scan, is within the grace period, or is pinned: then it is put back."""
    def keep(st: os.stat_result) -> bool:
        return (st.st_mtime > e.last_used or now - st.st_mtime < GRACE_S
                or (e.kind == "artifact" and store.is_pinned(e.name)))
    if e.kind == "artifact":
        return store.evict(e.name, keep)
    return BuildCache(store.root / BUILD_CACHE_DIR).discard(e.name, keep)


def prune(store: ArtifactStore, *, max_bytes: int | None = None,
          older_than_s: float | None = None, dry_run: bool = False,
          now: float | None = None, labels: bool = True) -> Pruned:
    """Remove entries not used for ``older_than_s`` seconds, then the least recently used until
    the artifacts and build products take at most ``max_bytes``; entries used within
    :data:`GRACE_S` (checked again at removal) or pinned (:meth:`ArtifactStore.pinned`) stay
    whatever the limits. Also removes idle lock files, stagings over a day old and the links
    where the store writes none. ``dry_run``: say what would go, remove nothing."""
    if max_bytes is None and older_than_s is None:
        raise ValueError("say what to keep: a size (max_bytes) and/or an age (older_than_s)")
    if (max_bytes is not None and max_bytes < 0) or (older_than_s is not None and older_than_s < 0):
        raise ValueError(f"limits must not be negative (max_bytes={max_bytes}, "
                         f"older_than_s={older_than_s})")
    now = time.time() if now is None else now
    before = usage(store, labels=labels)
    if not dry_run:  # removal renames into tmp/: refused (never followed) if it is a link
        trust.private_dir(store.root / "tmp", "store directory", trust.trusted_gid())
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
        elif e.kind == "artifact" and store.is_pinned(e.name):
            kept_pinned += 1
        elif dry_run or _remove(store, e, now):
            removed.append(e)
            size -= e.bytes
        elif e.kind == "artifact" and store.is_pinned(e.name):
            kept_pinned += 1  # pinned while it was being removed: put back
        else:
            kept_recent += 1  # used since the scan: put back
    locks, links, kept = 0, [], before.kept
    if not dry_run:
        links = _remove_links(store, before.links)
        store.sweep_tmp()
        locks = store.remove_idle_locks()
        if removed or links:  # tmp/ and locks/ changed; the entries left are known (no rescan)
            again = Usage(before.root)
            with dirfd.opened(store.root) as root_fd:
                for name in KEPT:
                    _kept_bytes(root_fd, name, again)
            kept = again.kept
    gone = {e.name for e in removed}
    gone_links = {link.path for link in links}
    after = Usage(before.root, [e for e in before.entries if e.name not in gone], kept,
                  [link for link in before.links if link.path not in gone_links])
    return Pruned(removed, kept_recent, locks, after, dry_run, kept_pinned, links)


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
