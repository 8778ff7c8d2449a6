"""Per-variant check: ``predict_into`` allocates nothing, neither memory it keeps (a leak)
nor a temporary it frees before returning (a per-call scratch array, a copy of ``x``).

Both are measured with :mod:`tracemalloc`, which sees every Python object and every NumPy
array buffer: the *peak* traced memory during each call over the memory before it, and the
*net* growth over many calls."""
from __future__ import annotations

import gc
import tracemalloc
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .context import Conformance, ConformanceError, NotApplicable, Variant, io_arrays

#: ``predict_into`` calls measured by the net (leak) check, and the net bytes allowed over all
#: of them (a leak of one small object per call is ≥ 28 bytes × calls).
ALLOC_CALLS = 1000
ALLOC_BOUND_BYTES = 2048
#: Calls whose peak is measured one by one, and the peak bytes one call may reach above the
#: memory before it: room for the interpreter's own transient objects (a bound method, an
#: exception-free frame, a runtime's small result wrapper) but far below any array
#: temporary of a real model (a 1 MB scratch buffer fails by three orders of magnitude).
PEAK_CALLS = 200
PEAK_BOUND_BYTES = 4096

Call = Callable[[np.ndarray, np.ndarray], Any]


@dataclass(frozen=True)
class AllocProfile:
    """What a series of ``predict_into`` calls allocated (bytes, tracemalloc)."""

    net: int
    peak: int
    #: where the net growth was allocated ("file:line: +N bytes in K blocks"), largest first
    sites: tuple[str, ...] = ()


def measure(fn: Call, x: np.ndarray, out: np.ndarray, calls: int, peak_calls: int) -> AllocProfile:
    """Net growth over ``calls`` calls and the largest per-call peak over ``peak_calls``."""
    already = tracemalloc.is_tracing()  # e.g. python -X tracemalloc: measure, leave it on
    if not already:
        tracemalloc.start()
    try:
        for _ in range(100):  # one-time costs (first-call caches) happen before the baseline
            fn(x, out)
        gc.collect()
        peak = 0
        for _ in range(peak_calls):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            fn(x, out)
            peak = max(peak, tracemalloc.get_traced_memory()[1] - before)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        snap = tracemalloc.take_snapshot()
        for _ in range(calls):
            fn(x, out)
        gc.collect()
        net = tracemalloc.get_traced_memory()[0] - before
        sites: tuple[str, ...] = ()
        if net > 0:
            diff = tracemalloc.take_snapshot().compare_to(snap, "lineno")
            sites = tuple(f"{d.traceback[0].filename}:{d.traceback[0].lineno}: +{d.size_diff} bytes "
                          f"in {d.count_diff} blocks" for d in diff[:3] if d.size_diff > 0)
        return AllocProfile(net=net, peak=peak, sites=sites)
    finally:
        if not already:
            tracemalloc.stop()


def check_no_allocation(ctx: Conformance, v: Variant, calls: int = ALLOC_CALLS,
                        bound: int = ALLOC_BOUND_BYTES, peak_bound: int = PEAK_BOUND_BYTES) -> str:
    """``predict_into`` allocates nothing per call: the peak traced memory of one call stays
    within ``peak_bound`` bytes of the memory before it (no temporaries), and ``calls`` calls
    grow net memory by at most ``bound`` bytes (nothing kept). Best of three rounds, so a
    one-time cache filled during the first round does not count, while a per-call
    allocation fails all three."""
    cm = ctx.compiled(v)
    if ctx.target.family == "ref":
        raise NotApplicable("the ref family runs the source framework per call (the golden "
                            "outputs), it is not a serving hot path")
    x, out = io_arrays(cm)
    rounds = []
    for _ in range(3):
        p = measure(cm.predict_into, x, out, calls, PEAK_CALLS)
        rounds.append(p)
        if p.net <= bound and p.peak <= peak_bound:
            return (f"peak {p.peak} bytes per call (bound {peak_bound}), net {p.net} bytes over "
                    f"{calls} calls (bound {bound})")
    if all(p.peak > peak_bound for p in rounds):
        raise ConformanceError(
            f"predict_into allocates per call: peak {', '.join(str(p.peak) for p in rounds)} bytes "
            f"above the memory before the call in three rounds (bound {peak_bound}). Write through "
            f"buffers made once in load()/__init__ (np.matmul(..., out=), in-place ufuncs); no "
            f"temporaries, no copies of x. To see where: python -X tracemalloc=5 and "
            f"tracemalloc.take_snapshot() inside your predict_into, after the suspect line")
    where = rounds[-1].sites
    raise ConformanceError(f"predict_into keeps memory: net {', '.join(str(p.net) for p in rounds)} "
                           f"bytes over {calls} calls in three rounds (bound {bound})"
                           + (f"; allocated at {'; '.join(where)}" if where else "")
                           + ". The hot path must write into preallocated buffers and keep "
                           "nothing per call. tracemalloc sees Python objects and NumPy buffers, "
                           "not a native runtime's own allocations")
