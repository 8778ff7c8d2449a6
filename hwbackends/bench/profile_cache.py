"""Profiles cached on disk per (artifact, machine, scenario parameters).

A router that starts with the same artifacts on the same machine reuses the measured
profiles instead of measuring again; a new artifact (other weights, options, toolchain), a
different machine fingerprint or other scenario parameters is a miss.

Profiles decide routing, so an entry is signed like a store manifest (hmac-sha256 under the
user's store key, :mod:`hwbackends.trust`) and bound to its cache key: an edited, planted or
moved entry is ignored (and measured again), never believed. Like the store, its directories
are created 0700 and its files 0600 (a profile tells how this machine's hardware behaves).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from .. import trust
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

    def get(self, key: str) -> LatencyProfile | None:
        p = self._path(key)
        try:
            d = json.loads(p.read_text())
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
        # Signed as it will read back (JSON round trip), bound to its key.
        rec = json.loads(json.dumps({"key": key, "profile": prof.to_dict()}, default=str))
        rec["hmac"] = trust.sign(self._key(), rec)
        tmp = p.with_name(f".{os.getpid()}-{p.name}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(rec))
        os.replace(tmp, p)

    def clear(self) -> int:
        n = 0
        for f in self.root.glob("*/*.json"):
            f.unlink(missing_ok=True)
            n += 1
        return n
