"""Micro-batching policy and the preallocated batch buffers.

Requests that arrive within ``batch_timeout_us`` of the first one waiting are run as one
batch of at most ``max_batch_size``. A batch of ``n`` runs on the smallest *allowed* batch
size ``≥ n``, padded with zero rows (TF Serving's ``allowed_batch_sizes``): static-batch
targets need one compiled program per size, and a few sizes keep the padding waste small.
Presets for latency tiers keep batches tiny and timeouts short; batching that raises
throughput while pushing p99 up is the classic failure (see docs/serving.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError
from ..exclusive import lock_for
from .servable import servable_label


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int = 1
    batch_timeout_us: float = 0.0
    #: ``None``: every size 1..max for dynamic-batch backends, the compiled sizes otherwise.
    allowed_batch_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be ≥ 1, got {self.max_batch_size}")
        if self.batch_timeout_us < 0:
            raise ConfigError(f"batch_timeout_us must be ≥ 0, got {self.batch_timeout_us}")
        a = self.allowed_batch_sizes
        if a is not None:
            if not a or any(int(s) < 1 for s in a) or list(a) != sorted(set(a)):
                raise ConfigError(f"allowed_batch_sizes must be strictly increasing sizes ≥ 1, "
                                  f"got {a}")
            if a[-1] != self.max_batch_size:
                raise ConfigError(f"the largest allowed batch size ({a[-1]}) must equal "
                                  f"max_batch_size ({self.max_batch_size}), as in TF Serving")


#: Latency tiers keep batches tiny (1–4) and the wait short; throughput tiers trade p99 for QPS.
PRESETS: dict[str, BatchPolicy] = {
    "single": BatchPolicy(1, 0.0, None),
    "latency": BatchPolicy(4, 50.0, (1, 2, 4)),
    "balanced": BatchPolicy(16, 500.0, (1, 2, 4, 8, 16)),
    "throughput": BatchPolicy(64, 2000.0, (1, 8, 16, 32, 64)),
}


class Slot:
    """One allowed batch size: the backend that runs it and its fixed input/output buffers."""

    __slots__ = ("size", "backend", "fn", "x", "y", "variant", "lock")

    def __init__(self, size: int, backend: Any):
        self.size = size
        self.backend = backend
        self.fn: Callable[[np.ndarray, np.ndarray], None] = backend.predict_into
        # Held around every call of the backend, wherever it comes from (serving thread,
        # inline caller, swap warm-up/shadow, another engine): executors are single-threaded.
        self.lock = lock_for(backend)
        self.x = np.zeros(backend.input.batched(size), dtype=np.float32)
        self.y = np.zeros(backend.output.batched(size), dtype=np.float32)
        self.variant = servable_label(backend)


class BatchPlan:
    """The slots of one model version, chosen from the backends and the policy.

    * ``{size: backend}`` (one compiled program per size): those sizes, capped at the policy;
    * one dynamic-batch backend (``static_batch`` False): the policy's allowed sizes;
    * one static-batch backend: its compiled size; larger batches run in chunks of it.
    """

    def __init__(self, backends: Any, policy: BatchPolicy):
        if isinstance(backends, dict):
            sizes = sorted(backends)
            for s, b in backends.items():
                if getattr(b, "static_batch", True) and b.batch_size != s:
                    raise ConfigError(f"backend for batch size {s} was compiled for batch "
                                      f"{b.batch_size}; compile_batch_variants() builds one per size")
            slots = [Slot(s, backends[s]) for s in sizes]
        elif not getattr(backends, "static_batch", True):
            sizes = list(policy.allowed_batch_sizes or range(1, policy.max_batch_size + 1))
            slots = [Slot(s, backends) for s in sizes]
        else:
            slots = [Slot(backends.batch_size, backends)]
        first = slots[0].backend
        for s in slots[1:]:
            if s.backend.input.shape != first.input.shape or s.backend.output.shape != first.output.shape:
                raise ConfigError("all batch variants must share input and output shapes")
        self.slots = slots
        self.input = first.input
        self.output = first.output
        self.max_slot = slots[-1]
        # lookup[n] → slot for a batch of n (n ≤ the largest size); bigger batches are chunked.
        self._lookup: list[Slot] = [slots[0]]
        for n in range(1, self.max_slot.size + 1):
            self._lookup.append(next(s for s in slots if s.size >= n))
        self._first = first

    @property
    def variant(self) -> str:
        """The label of what serves now (a router strategy's follows its switches)."""
        return servable_label(self._first)

    @property
    def sizes(self) -> list[int]:
        return [s.size for s in self.slots]

    @property
    def backends(self) -> list[Any]:
        seen: list[Any] = []
        for s in self.slots:
            if not any(s.backend is b for b in seen):
                seen.append(s.backend)
        return seen

    def slot_for(self, n: int) -> Slot:
        return self._lookup[n] if n < len(self._lookup) else self.max_slot

    def run(self, xs: list[np.ndarray], on_rows: Callable[[int, np.ndarray, np.ndarray], None]) -> None:
        """Run ``xs`` (one sample each) in as few calls as the slots allow; ``on_rows(start,
        x_rows, y_rows)`` receives each chunk's inputs and outputs (views into the buffers,
        valid only during the callback, which runs under the slot's lock)."""
        n = len(xs)
        start = 0
        while start < n:
            k = min(n - start, self.max_slot.size)
            slot = self.slot_for(k)
            x, y = slot.x, slot.y
            with slot.lock:  # the buffers and the executor are this thread's until released
                for i in range(k):
                    x[i] = xs[start + i]
                if k < slot.size:
                    x[k:] = 0.0  # padding rows: their outputs are discarded
                slot.fn(x, y)
                on_rows(start, x[:k], y[:k])
            start += k

    def warmup(self, n: int) -> float:
        """Every slot ``n`` times on zeros, plus the backends' own warm-up; each call holds the
        backend's lock, so warming a backend that is already serving elsewhere is safe.
        Returns the median seconds of one call of the largest slot (0.0 when ``n`` is 0)."""
        for b in self.backends:
            w = getattr(b, "warmup", None)
            if w is not None:
                lk = lock_for(b)
                for _ in range(n):  # one call at a time, so live traffic interleaves
                    with lk:
                        w(1)
        times: list[float] = []
        clock = time.perf_counter
        for s in self.slots:
            for _ in range(n):
                with s.lock:
                    s.x[...] = 0.0
                    t0 = clock()
                    s.fn(s.x, s.y)
                    dt = clock() - t0
                if s is self.max_slot:
                    times.append(dt)
        return float(np.median(times)) if times else 0.0
