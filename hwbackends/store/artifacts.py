"""Content-addressed artifact store: one directory per cache key, verified on every load.

Layout under the root (``HWB_CACHE_DIR``, default ``~/.cache/hwbackends``)::

    objects/ab/abcdef…/manifest.json   the record, with the sha256 of every file
    objects/ab/abcdef…/<files>         what the target wrote
    tmp/<random>/                      staging; renamed into objects/ atomically
    locks/abcdef….lock                 held (flock) by the process building that key
    build-cache/, zoo/, profiles/      build products, trained zoo models, measured profiles

An entry directory's mtime is when it was last used (set at commit, touched on each load), so
``hwb store prune`` (:mod:`hwbackends.store.prune`) removes the least recently used first.

A missing manifest, a missing, extra or changed file, a manifest whose HMAC does not
verify with this user's key (:mod:`hwbackends.store.trust`), or one signed for another key (an
entry moved to another key's directory) makes the entry invalid: it is removed and the
caller rebuilds it (each entry is a :class:`hwbackends.store.signed_dir.SignedDir` entry; this
module adds the root, the manifest's ``key_parts`` check, locks, pins and listing). A root, entry or file that someone else could have written (another
owner, group/world-writable, a symlink) is refused with :class:`StoreTrustError` before
anything in it is read. The root is resolved and checked once (:func:`trust.resolve_root`)
and every later path is under that real directory, never through a link again.
Directories are created 0700, files 0600. Nothing half-written is ever visible under
``objects/``.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..errors import CacheError
from . import dirfd, trust
from .signed_dir import HEX_KEY, SignedDir, staged_files
from .signed_dir import file_sha256 as file_sha256  # what plugins import from here

log = logging.getLogger("hwbackends.store")
#: 2: manifests are HMAC-signed and no file outside the manifest is allowed.
#: 3: the manifest signs its key's parts (``key_parts``: fingerprint, target, precision,
#: options, toolchain…), checked against the key on every load.
#: 4: the record is :class:`hwbackends.store.manifest.Manifest`, its reload check named
#: ``reload_check`` with one input array per tensor (``xs``); an entry of any other format is
#: removed on read and rebuilt, so no reader keeps the older key names.
STORE_FORMAT = 4
MANIFEST = "manifest.json"
#: What a store key is: the hex sha256 :func:`cache_key` returns (nothing else names a path).
KEY_RE = HEX_KEY


def default_root() -> Path:
    env = os.environ.get("HWB_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hwbackends"


def cache_key(parts: dict[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


#: Entries pinned against pruning in this process: (real store root, key) -> how many pins.
_PINS: Counter[tuple[str, str]] = Counter()
_PINS_LOCK = threading.Lock()


class Pins:
    """The handle :meth:`ArtifactStore.pinned` yields: :meth:`add` pins more keys (each
    released when the ``with`` block ends)."""

    def __init__(self, root: str):
        self._root = root
        self._keys: list[str] = []

    def add(self, *keys: str) -> None:
        checked = [check_key(k) for k in keys]
        with _PINS_LOCK:
            for k in checked:
                _PINS[(self._root, k)] += 1
            self._keys += checked

    def _release(self) -> None:
        with _PINS_LOCK:
            for k in self._keys:
                _PINS[(self._root, k)] -= 1
                if _PINS[(self._root, k)] <= 0:
                    del _PINS[(self._root, k)]
            self._keys = []


def check_key(key: Any) -> str:
    """``key`` if it is a store key (64 lowercase hex digits), else :class:`CacheError`: a key
    names a directory, so ``../`` or a slash in one would reach outside the store."""
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise CacheError(f"{key!r:.80} is not a store key (64 hex digits, a sha256); refused")
    return key


def _check_parts(record: dict[str, Any]) -> None:
    """A manifest's signed ``key_parts``, when present, must hash to its key."""
    parts = record.get("key_parts")
    if parts is not None and cache_key(parts) != record.get("key"):
        raise CacheError("the manifest's signed key_parts do not hash to its key")


class ArtifactStore:
    def __init__(self, root: Path | str | None = None):
        self._given = Path(root) if root else default_root()
        self._real: Path | None = None
        self._key: bytes | None = None
        self._signed: SignedDir | None = None

    @property
    def root(self) -> Path:
        """The store root, resolved once through :func:`trust.resolve_root` (created 0700,
        every component and link on the way checked) and pinned: every path of the store is
        under this real directory, whatever the given path points at later."""
        if self._real is None:
            self._real = trust.resolve_root(self._given, trust.trusted_gid())
        return self._real

    def _exists(self) -> bool:
        return os.path.lexists(self._real if self._real is not None else self._given)

    @property
    def key(self) -> bytes:
        if self._key is None:
            self._key = trust.load_key()
        return self._key

    @contextlib.contextmanager
    def pinned(self, keys: Iterable[str] = ()) -> Iterator[Pins]:
        """Keep ``keys`` (and any added with the yielded handle's ``add``) from being pruned
        while the block runs: every :func:`~hwbackends.store.prune.prune` in this process
        skips them, including the automatic one ``HWB_CACHE_MAX_SIZE`` runs after each
        compile commits. For a caller that compiles many variants and then reads them
        (``hwb export`` over a batch-size sweep)::

            with store.pinned() as pins:
                for b in sizes:
                    cm = hwbackends.compile(m, target, batch_size=b, store=store)
                    pins.add(cm.artifact.key)   # just used: within the grace period
                copy(...)                       # none of them is pruned meanwhile

        Pins are per process and per store root (any :class:`ArtifactStore` of the same real
        root sees them) and nest (a key pinned twice is free when both blocks end); they do
        not stop another process's ``hwb store prune``, which keeps what was used in the last
        :data:`~hwbackends.store.prune.GRACE_S` seconds. A key that is not a store key is
        :class:`CacheError`. Pinning does not make an absent or evicted entry present."""
        pins = Pins(str(self.root))
        try:
            pins.add(*keys)
            yield pins
        finally:
            pins._release()

    def is_pinned(self, key: str) -> bool:
        """Whether ``key`` is pinned (:meth:`pinned`) in this process."""
        with _PINS_LOCK:
            return _PINS.get((str(self.root), key), 0) > 0

    def check_root(self) -> None:
        """Refuse a root someone else could change (:class:`StoreTrustError`); create it 0700.
        The pinned root is re-checked each time; one removed (:meth:`clear`) is resolved anew."""
        if self._real is not None and not os.path.lexists(self._real):
            self._real = None
        trust.check_root(self.root, trust.trusted_gid())

    @property
    def objects(self) -> Path:
        return self.root / "objects"

    @property
    def _entries(self) -> SignedDir:
        """The entries, as signed directories under ``objects/`` (staged in ``tmp/``)."""
        if self._signed is None or self._signed.root != self.objects:
            self._signed = SignedDir(self.objects, "store", STORE_FORMAT, record=MANIFEST,
                                     format_field="store_format", staging=self.root / "tmp",
                                     signing_key=lambda: self.key)
        return self._signed

    def path_for(self, key: str) -> Path:
        check_key(key)
        return self.objects / key[:2] / key

    def get(self, key: str, *, touch: bool = True) -> dict[str, Any] | None:
        """The verified manifest of ``key``, or ``None`` (absent, removed meanwhile by a prune
        or another process, or invalid and now removed: :meth:`SignedDir.read`). With
        ``touch`` (a use: the caller reads the entry) its last use is recorded before it is
        read, so a prune that scanned earlier keeps it (:func:`~hwbackends.store.prune.prune`
        re-checks at removal)."""
        self.check_root()
        check_key(key)
        entry = self._entries.read(key, touch=touch, check=_check_parts)
        return None if entry is None else entry.record

    def stage(self) -> Path:
        """A private staging directory for an entry's files (``tmp/``; :meth:`commit`)."""
        self.check_root()
        return self._entries.stage()

    def sweep_tmp(self, max_age: float = 24 * 3600) -> None:
        """Remove what ``tmp/`` holds older than ``max_age`` s: stagings of builds that died,
        evictions interrupted half-way (a live build's staging is younger)."""
        self._entries.sweep(max_age)

    def staged_files(self, staged: Path) -> dict[str, str]:
        """The sha256 of every file under ``staged`` (but a manifest), made private on the
        way (dirs 0700, files 0600); a symlink or anything but files and directories is
        refused."""
        return staged_files(staged, MANIFEST)

    def commit(self, staged: Path, key: str, record: dict[str, Any]) -> dict[str, Any]:
        """Hash the staged files, write the signed manifest and move the directory into place
        (:meth:`SignedDir.commit`). What the target wrote is made private (dirs 0700, files
        0600); symlinks are refused. ``record["key_parts"]``, when given, must hash to ``key``
        (it is signed with it). Another process that committed ``key`` first wins: its entry
        is returned."""
        check_key(key)
        if "key_parts" in record and cache_key(record["key_parts"]) != key:
            raise CacheError(f"key_parts do not hash to the key {key[:12]} they are stored under")
        placed = self._entries.commit(staged, key, dict(record, created=time.time()))
        if placed is not None:
            return placed
        existing = self.get(key)
        if existing is None:
            raise CacheError(f"could not place artifact {key[:12]} into {self.path_for(key)}")
        return existing

    @contextlib.contextmanager
    def build_lock(self, key: str, what: str = "", progress: Callable[[str], None] | None = None,
                   timeout: float | None = None, heartbeat: float = 15.0) -> Iterator[bool]:
        """Held while this process builds ``key``: a second process (or thread) asking for
        the same key waits here instead of repeating a build that may take minutes, then
        finds it in the store. Yields whether it had to wait (the caller looks the key up
        again). An ``flock``, so a builder that dies (crash, SIGKILL, a lost node) releases it
        with its process; after ``timeout`` seconds of waiting the build goes ahead
        unlocked, and says so (a store on a filesystem without working flock only loses the
        deduplication: commits stay atomic, :meth:`commit`)."""
        check_key(key)
        say = progress or log.info
        self.check_root()
        locks = self.root / "locks"
        trust.private_dir(locks, "store directory", trust.trusted_gid())
        fd = os.open(locks / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            waited, held = False, False
            t0 = time.monotonic()
            next_say = t0 + heartbeat
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                    break
                except BlockingIOError:
                    pass
                except OSError as exc:  # no flock here (some network filesystems): no dedup
                    log.warning("store lock %s unavailable (%s); building without it", key[:12], exc)
                    break
                now = time.monotonic()
                if not waited:
                    waited = True
                    say(f"{what or key[:12]}: another process is building it; waiting for "
                        f"that build instead of repeating it")
                elif now >= next_say:
                    next_say = now + heartbeat
                    say(f"{what or key[:12]}: still waiting for the other build "
                        f"({now - t0:.0f} s)")
                if timeout is not None and now - t0 > timeout:
                    say(f"{what or key[:12]}: the other build held its lock over {timeout:g} s; "
                        f"building here as well")
                    break
                time.sleep(0.05)
            yield waited
        finally:
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def remove_idle_locks(self) -> int:
        """Remove the lock files no build holds (one is left behind per key ever built);
        returns how many. A process that opened a lock file just before it is removed may
        build beside a later one: a build done twice, never a wrong entry (commits are
        atomic and the first wins)."""
        try:
            dir_fd = dirfd.open_under(self.root, ["locks"])
        except FileNotFoundError:
            return 0
        except dirfd.NotFollowed as exc:
            log.warning("%s/locks is %s; idle locks not removed", self.root, exc.strerror)
            return 0
        n = 0
        try:
            for e in dirfd.entries(dir_fd):
                if not e.name.endswith(".lock"):
                    continue
                if e.is_symlink():  # never written by the store: unlinked, not followed
                    dirfd.remove_at(dir_fd, e.name)
                    continue
                try:
                    fd = os.open(e.name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                                 dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # held: a build is running
                    os.close(fd)
                    continue
                try:
                    os.unlink(e.name, dir_fd=dir_fd)
                    n += 1
                except OSError:
                    pass
                finally:
                    os.close(fd)
        finally:
            os.close(dir_fd)
        return n

    def touch(self, key: str) -> None:
        """Record that ``key`` was just used (its directory's mtime): ``hwb store prune``
        removes the least recently used first."""
        with contextlib.suppress(OSError):
            os.utime(self.path_for(key), follow_symlinks=False)

    def keys(self) -> list[str]:
        """The keys of every entry directory (unverified: :meth:`get` verifies one)."""
        return self._entries.keys() if self._exists() else []

    def discard(self, staged: Path) -> None:
        self._entries.discard(staged)

    def evict(self, key: str, keep: Callable[[os.stat_result], bool] | None = None) -> bool:
        """Remove the entry ``key``: renamed into ``tmp/`` first (a concurrent reader sees it
        absent, never half of it), then removed, unless ``keep`` (called with the moved
        entry's ``lstat``) says to put it back. Every directory on the way is opened without
        following a link (:meth:`SignedDir.evict`): a linked ``objects/ab`` is not followed,
        and an entry that is a link is unlinked. Returns whether it was removed."""
        check_key(key)
        return self._entries.evict(key, keep)

    def entries(self) -> Iterator[dict[str, Any]]:
        """Every entry's manifest, each verified as :meth:`get` does (an invalid entry is
        removed and skipped, never listed; a directory whose name is no key is skipped)."""
        if not self._exists() or not self.objects.exists():
            return
        self.check_root()
        for key in self._entries.keys():
            record = self.get(key, touch=False)
            if record is not None:
                yield record

    def clear(self) -> None:
        if self._exists():
            shutil.rmtree(self.root, ignore_errors=True)
