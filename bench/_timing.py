"""Timing helpers the benchmark scripts share: per-call cost of a zero-argument callable, and
one call at a time into a samples array, several callables measured in interleaved rounds (A B C A B C …) so that the noise of a shared
machine hits them alike; medians over rounds."""
from __future__ import annotations

import statistics
import sys
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np


def timed(f: Callable[..., object], args: tuple, samples: "np.ndarray", start: int, n: int) -> None:
    """``n`` calls of ``f(*args)``, each timed on its own: ``samples[start:start + n]`` (ns)."""
    clock = time.perf_counter_ns
    for i in range(start, start + n):
        t0 = clock()
        f(*args)
        samples[i] = clock() - t0


def per_call_ns(fn: Callable[[], object], calls: int) -> float:
    clock = time.perf_counter_ns
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, calls: int,
                progress: bool = False) -> dict[str, float]:
    """Median ns per call of each callable over ``rounds`` interleaved rounds."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for k, f in fns.items():
            samples[k].append(per_call_ns(f, calls))
        if progress:
            print(f"\r  round {r + 1}/{rounds}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return {k: statistics.median(v) for k, v in samples.items()}
