"""Profiles cached on disk per (artifact, machine, scenario parameters).

A router that starts with the same artifacts on the same machine reuses the measured
profiles instead of measuring again; a new artifact (other weights, options, toolchain), a
different machine fingerprint or other scenario parameters is a miss.

Profiles decide routing, so an entry is signed like a store manifest (hmac-sha256 under the
user's store key, :mod:`hwbackends.trust`) and bound to its cache key: an edited, planted or
moved entry is ignored (and measured again), never believed. Like the store, its directories
are created 0700 and its files 0600 (a profile tells how this machine's hardware behaves), and
it reads and writes with the store's path checks (:func:`trust.check_path`: no symlink, nothing
another user can change; :class:`~hwbackends.errors.StoreTrustError` otherwise).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from .. import dirfd, trust
from .profile import LatencyProfile

#: Bumped when what a cached profile means changes (it is then re-measured). 2: signed.
CACHE_FORMAT = 2

log = logging.getLogger("hwbackends.bench")


def profile_key(artifact_key: str, machine_id: str, scenario: dict[str, Any], batch_size: int,
                pin: list[int] | None = None) -> str:
    blob = json.dumps({"v": CACHE_FORMAT, "artifact": artifact_key, "machine": machine_id,
                       "scenario": scenario, "batch": batch_size, "pin": pin},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class ProfileCache:
    """``root/<key[:2]>/<key>.json``; writes are atomic (rename), reads tolerate damage."""

    def __init__(self, root: str | Path | None = None, max_age_s: float | None = None):
        if root is None:
            from ..store import default_root
            root = default_root() / "profiles"
        self.root = Path(root)
        self.max_age_s = max_age_s
        self._hmac_key: bytes | None = None

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def _key(self) -> bytes:
        if self._hmac_key is None:
            self._hmac_key = trust.load_key()
        return self._hmac_key

    def _check(self, p: Path) -> None:
        """The root, ``ab/`` and (when present) the file ``p``: each as the store checks its
        own (:func:`trust.check_path`: not a link, not changeable by others)."""
        gid = trust.trusted_gid()
        for q in (self.root, p.parent, p):
            trust.check_path(q, "profile cache path", gid)

    def get(self, key: str) -> LatencyProfile | None:
        p = self._path(key)
        try:
            self._check(p)
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                d = json.loads(f.read(4 << 20))
        except (OSError, ValueError):
            return None  # absent or damaged: measure again
        if not isinstance(d, dict) or d.get("key") != key or not trust.verify(self._key(), d):
            log.warning("profile cache entry %s is unsigned, altered or not this key's: "
                        "ignored (measured again)", p)
            return None
        try:
            prof = LatencyProfile.from_dict(d["profile"])
        except (KeyError, ValueError, TypeError):
            return None
        if self.max_age_s is not None and time.time() - prof.created > self.max_age_s:
            return None
        if prof.interrupted:
            return None  # never trust a partial measurement for routing
        return prof

    def put(self, key: str, prof: LatencyProfile) -> None:
        from ..store import private_mkdir

        p = self._path(key)
        private_mkdir(p.parent)
        gid = trust.trusted_gid()
        for q in (self.root, p.parent):
            trust.check_path(q, "profile cache directory", gid)
        # Signed as it will read back (JSON round trip), bound to its key.
        rec = json.loads(json.dumps({"key": key, "profile": prof.to_dict()}, default=str))
        rec["hmac"] = trust.sign(self._key(), rec)
        tmp = p.with_name(f".{os.getpid()}-{p.name}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(rec))
        os.replace(tmp, p)

    def clear(self) -> int:
        """Remove every cached profile (``ab/*.json``, through directory fds: a link is not
        followed); returns how many."""
        n = 0
        try:
            top = dirfd.open_dir(self.root)
        except (FileNotFoundError, dirfd.NotFollowed):
            return 0
        try:
            for ab in dirfd.entries(top):
                if not ab.is_dir(follow_symlinks=False):
                    continue
                try:
                    fd = dirfd.open_dir(ab.name, top)
                except OSError:
                    continue
                try:
                    for f in dirfd.entries(fd):
                        if f.name.endswith(".json") and f.is_file(follow_symlinks=False):
                            os.unlink(f.name, dir_fd=fd)
                            n += 1
                finally:
                    os.close(fd)
        finally:
            os.close(top)
        return n
