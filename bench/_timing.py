"""Timing helpers the benchmark scripts share: per-call cost of a zero-argument callable, and
several callables measured in interleaved rounds (A B C A B C …) so that the noise of a shared
machine hits them alike; medians over rounds."""
from __future__ import annotations

import statistics
import sys
import time
from typing import Callable


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
