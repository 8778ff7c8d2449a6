"""Testbench measurements on the Verilated design: latency, initiation interval, bit-exactness.

Latency is *measured*: distinct random vectors enter one per clock, and the latency is the
clock offset at which the output trace equals da4ml's bit-exact reference interpreter
(interp.py: ``CombLogic.predict``, or da4ml's Python evaluator where its C++ build is wrong) for
every vector. With one new vector on every clock and every output
right, the initiation interval is 1 by observation. Neither figure is taken from da4ml's own
``latency`` constant; the caller checks the measurement against the pipeline depth.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hwbackends.contract import CompileError

from . import interp
from .executor import RtlLibrary, WordFormat

MAX_LATENCY = 256


@dataclass
class Timing:
    latency_cycles: int
    initiation_interval: int
    vectors: int


def reference_words(comb: Any, fmt: WordFormat, x: np.ndarray) -> np.ndarray:
    """da4ml's interpreter on the host-saturated inputs, as output words (int)."""
    y = interp.evaluate(comb, fmt.clamp(x.reshape(len(x), -1)))
    return np.round(y * 2.0 ** fmt.f_out).astype(np.int64)


def timing(lib: RtlLibrary, comb: Any, fmt: WordFormat, n: int = 64, seed: int = 7) -> Timing:
    """Latency and II from a stream of ``n`` distinct random vectors, one per clock."""
    lo, hi = fmt.lo, fmt.hi
    x = np.random.default_rng(seed).uniform(lo, hi, (n, lib.n_in))
    words = np.zeros((n, lib.n_in), np.int32)
    fmt.encode(x, words)
    want = reference_words(comb, fmt, x)
    if len({tuple(r) for r in want}) < 2:
        raise CompileError("the design's output is constant on random inputs: latency is not measurable")
    trace = np.round(fmt.decode(lib.stream(words, n + MAX_LATENCY)) * 2.0 ** fmt.f_out).astype(np.int64)
    for lat in range(MAX_LATENCY + 1):
        if np.array_equal(trace[lat:lat + n], want):
            return Timing(lat, 1, n)
    raise CompileError(f"the Verilated design never reproduced da4ml's reference for {n} vectors fed one "
                       f"per clock within {MAX_LATENCY} clocks: RTL and interpreter disagree")


def bit_exact(run: Any, comb: Any, fmt: WordFormat, x: np.ndarray) -> dict[str, Any]:
    """Compare ``run(x)`` (the executor's float outputs) with the interpreter, word for word."""
    got = np.round(np.asarray(run(x), np.float64).reshape(len(x), -1) * 2.0 ** fmt.f_out).astype(np.int64)
    want = reference_words(comb, fmt, x)
    bad = int(np.count_nonzero(np.any(got != want, axis=1)))
    return {"samples": len(x), "mismatches": bad, "bit_exact": bad == 0,
            "reference": "da4ml's bit-exact interpreter on the same saturated inputs"}
