"""Profiles cached on disk per (artifact, machine, scenario parameters).

A router that starts with the same artifacts on the same machine reuses the measured
profiles instead of measuring again; a new artifact (other weights, options, toolchain), a
different machine fingerprint or other scenario parameters is a miss.

Profiles decide routing, so each is kept as a signed entry (:class:`hwbackends.store.signed_dir.
SignedDir`: hmac-sha256 under the user's store key, bound to its cache key and format, the
directories private and checked as the store's are): an edited, planted, moved or linked
entry is never believed (a miss: measured again), and a directory someone else could change
is :class:`~hwbackends.errors.StoreTrustError`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from ..store.signed_dir import SignedDir
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
    """``root/<key[:2]>/<key>.json``, the profile in a signed record; writes are atomic (a
    re-measurement replaces it), and a damaged entry is a miss."""

    def __init__(self, root: str | Path | None = None, max_age_s: float | None = None):
        if root is None:
            from ..store.artifacts import default_root
            root = default_root() / "profiles"
        self.root = Path(root)
        self.max_age_s = max_age_s
        self._dir = SignedDir(self.root, "profile cache", CACHE_FORMAT, suffix=".json")

    def get(self, key: str) -> LatencyProfile | None:
        """The profile measured for ``key``, or ``None`` (absent, unsigned, edited, of another
        format, too old, or from an interrupted run: measure again)."""
        entry = self._dir.read(key, touch=False)
        if entry is None:
            return None
        try:
            prof = LatencyProfile.from_dict(entry.record["profile"])
        except (KeyError, ValueError, TypeError):
            return None
        if self.max_age_s is not None and time.time() - prof.created > self.max_age_s:
            return None
        if prof.interrupted:
            return None  # never trust a partial measurement for routing
        return prof

    def put(self, key: str, prof: LatencyProfile) -> None:
        """Keep ``prof`` for ``key``, replacing what was kept (a re-measurement wins)."""
        self._dir.write_file(key, {"profile": prof.to_dict()})

    def clear(self) -> int:
        """Remove every cached profile (never following a link); returns how many."""
        return sum(self._dir.evict(k) for k in self._dir.keys())
