"""Inference cache: identical feature vectors recur (several strategies on one tick,
overlapping windows), so an LRU keyed by a fast hash of the feature bytes and the model
version can skip the model. Off by default; bounded by entries *and* bytes.

The key is a 128-bit digest (xxh3_128 when ``xxhash`` is installed, else BLAKE2b-128 from
the standard library) of the raw float32 bytes, so equal arrays hit and any change of one bit
misses; the model version is part of the key so a swap never serves the old model's outputs.

An entry records the version that computed it, and :meth:`InferenceCache.put` stores it only
when that is the version its key names: a request keyed under version 1 that a swap let
version 2 answer is never cached (a rollback to version 1 would otherwise serve version 2's
output from the cache). Such refusals are counted (``stale_puts``).
"""
from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ConfigError


def _hasher() -> tuple[str, Callable[[bytes | memoryview], bytes]]:
    if importlib.util.find_spec("xxhash") is not None:
        import xxhash

        return "xxh3_128", lambda b: xxhash.xxh3_128_digest(b)
    return "blake2b-128", lambda b: hashlib.blake2b(b, digest_size=16).digest()


HASH_NAME, _digest = _hasher()


@dataclass(frozen=True)
class CacheStats:
    entries: int
    bytes: int
    hits: int
    misses: int
    evictions: int
    max_entries: int
    max_bytes: int
    #: Outputs not stored because another version than the key's computed them.
    stale_puts: int = 0
    hash: str = HASH_NAME

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class InferenceCache:
    """Thread-safe LRU of output arrays (stored read-only, returned as the same object)."""

    def __init__(self, max_entries: int = 10_000, max_bytes: int = 16 << 20):
        if max_entries < 1 or max_bytes < 1:
            raise ConfigError(f"cache bounds must be ≥ 1 (max_entries={max_entries}, "
                              f"max_bytes={max_bytes}); leave the cache off instead")
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        #: key → (the version that computed the output, the output)
        self._d: OrderedDict[bytes, tuple[int, np.ndarray]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = self.stale_puts = 0

    @staticmethod
    def key(x: np.ndarray, version: int) -> bytes:
        # x is C-contiguous float32 (validated); memoryview avoids a copy of the bytes.
        return version.to_bytes(8, "little") + _digest(memoryview(x).cast("B"))

    @staticmethod
    def key_version(key: bytes) -> int:
        """The model version a key names."""
        return int.from_bytes(key[:8], "little")

    def get(self, key: bytes) -> np.ndarray | None:
        with self._lock:
            e = self._d.get(key)
            if e is None or e[0] != self.key_version(key):
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
            return e[1]

    def put(self, key: bytes, y: np.ndarray, version: int) -> bool:
        """Store ``y``, computed by model ``version``, under ``key``; only when ``version`` is
        the one ``key`` names (else nothing is stored and ``False`` is returned)."""
        if version != self.key_version(key):
            with self._lock:
                self.stale_puts += 1
            return False
        size = y.nbytes + len(key) + 100  # + the dict entry's overhead, roughly
        if size > self.max_bytes:
            return False
        y = np.array(y, dtype=np.float32, copy=True)
        y.flags.writeable = False  # a hit hands out this object: nobody may change it
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._bytes -= old[1].nbytes + len(key) + 100
            self._d[key] = (version, y)
            self._bytes += size
            while len(self._d) > self.max_entries or self._bytes > self.max_bytes:
                k, (_, v) = self._d.popitem(last=False)
                self._bytes -= v.nbytes + len(k) + 100
                self.evictions += 1
        return True

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(len(self._d), self._bytes, self.hits, self.misses, self.evictions,
                              self.max_entries, self.max_bytes, self.stale_puts)
