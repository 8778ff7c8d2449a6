"""Load a built C-simulation library with ctypes and call it on the hot path.

hls4ml's ``ModelGraph.predict`` loops over samples in Python, allocating two numpy arrays and
re-checking argument types per sample. Here the library is opened once (``dlopen``, no
rebuild), the batch loop runs in C (``hwb_predict_batch``, see build.py) and a call is one
ctypes foreign call with raw pointers.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Sequence

import numpy as np

from hwbackends.contract import CacheError, Executor, TensorSpec


class CsimLibrary:
    """One opened C-sim library: the fixed-point design, bit-accurate, on the CPU."""

    def __init__(self, lib: Path, weights_dir: Path, n_in: int, n_out: int):
        try:
            # RTLD_LOCAL (ctypes' default): each design keeps its own symbols and weights.
            self.cdll = ctypes.CDLL(str(lib))
        except OSError as exc:
            raise CacheError(f"cannot dlopen the C-sim library {lib}: {exc}") from exc
        self.path = lib
        try:
            got_in, got_out = self.cdll.hwb_n_in(), self.cdll.hwb_n_out()
        except AttributeError as exc:
            raise CacheError(f"{lib} lacks the hwbackends entry points; it will be rebuilt") from exc
        if (got_in, got_out) != (n_in, n_out):
            raise CacheError(f"{lib} takes {got_in} inputs / {got_out} outputs per sample; the "
                             f"artifact says {n_in}/{n_out}")
        self.n_in, self.n_out = n_in, n_out
        # hls4ml reads the weights' .txt files on the first call, from this directory.
        self.cdll.hwb_set_weights_dir.argtypes = [ctypes.c_char_p]
        self.cdll.hwb_set_weights_dir(str(weights_dir).encode())
        fn = self.cdll.hwb_predict_batch
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
        fn.restype = None
        self.batch_fn = fn

    def run(self, x: np.ndarray) -> np.ndarray:
        """Outputs for ``n`` samples (allocating; for calibration and tests, not the hot path)."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(len(x), -1)
        if x.shape[1] != self.n_in:
            raise ValueError(f"expected {self.n_in} values per sample, got {x.shape[1]}")
        y = np.zeros((len(x), self.n_out), dtype=np.float32)
        self.batch_fn(x.ctypes.data, y.ctypes.data, len(x))
        return y


class CsimExecutor(Executor):
    """The ``fpga.hls4ml`` executor in mode *emulated*: hls4ml's C-simulation.

    The C loop takes raw pointers (a pointer carries no size or strides), so the guard also
    requires C-contiguous, writeable arrays (``contiguous = True``); ``_run`` makes one
    foreign call."""

    contiguous = True

    def __init__(self, lib: CsimLibrary, batch: int, inp: TensorSpec, out: TensorSpec):
        self.lib = lib
        self._init_io(inp, out, batch)
        self._fn = lib.batch_fn
        self._n = ctypes.c_long(batch)

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        (x,), (out,) = xs, outs  # one tensor each way
        self._fn(x.ctypes.data, out.ctypes.data, self._n)
