"""The Verilated design, opened with ctypes: the ``fpga.da4ml`` executor (RTL simulation).

Float inputs become the design's fixed-point words on the host (saturated to the input
type's range, then truncated, as a host-side packer would), one vector per clock goes
through the cycle-accurate model, and the output words become floats again.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hwbackends.contract import CacheError, Executor, TensorSpec


@dataclass(frozen=True)
class WordFormat:
    """How floats map to the design's I/O words (shared by the executor and the reference)."""

    lo: float            # input saturation range
    hi: float
    f_in: int            # input fractional bits
    k_out: int           # output sign bit, integer bits, fractional bits (uniform across outputs)
    i_out: int
    f_out: int

    @classmethod
    def from_meta(cls, d: dict[str, Any]) -> "WordFormat":
        return cls(float(d["lo"]), float(d["hi"]), int(d["f_in"]), int(d["k_out"]), int(d["i_out"]),
                   int(d["f_out"]))

    def clamp(self, x: np.ndarray) -> np.ndarray:
        return np.clip(x, self.lo, self.hi)

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        """Saturate and truncate ``x`` into int32 words ``out`` (same element count)."""
        np.floor(self.clamp(x).reshape(out.shape) * 2.0 ** self.f_in, out=out, casting="unsafe")

    def decode(self, words: np.ndarray) -> np.ndarray:
        """int32 output words → values (sign-extend the ``k+i+f``-bit field, then scale)."""
        k, i, f = self.k_out, self.i_out, self.f_out
        a, b = 2 ** (k + i + f), k * 2 ** (i + f)
        return ((words.astype(np.int64) + b) % a - b) * 2.0 ** -f


class RtlLibrary:
    """One opened Verilator model (the lookup tables are read from ``memdir`` at open)."""

    def __init__(self, lib: Path, memdir: Path, n_in: int, n_out: int):
        try:
            self.cdll = ctypes.CDLL(str(lib))
        except OSError as exc:
            raise CacheError(f"cannot dlopen the Verilator model {lib}: {exc}") from exc
        if (self.cdll.hwb_n_in(), self.cdll.hwb_n_out()) != (n_in, n_out):
            raise CacheError(f"{lib} has another I/O size than its artifact says; it will be rebuilt")
        self.n_in, self.n_out = n_in, n_out
        self.cdll.hwb_open.argtypes = [ctypes.c_char_p]
        self.cdll.hwb_open.restype = ctypes.c_void_p
        self.cdll.hwb_close.argtypes = [ctypes.c_void_p]
        self.cdll.hwb_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_long, ctypes.c_long]
        self.cdll.hwb_stream.restype = None
        self.handle = self.cdll.hwb_open(str(memdir).encode())
        if not self.handle:
            raise CacheError(f"cannot open the Verilator model: memory files directory {memdir} missing")
        self._close = self.cdll.hwb_close

    def stream(self, words: np.ndarray, clocks: int) -> np.ndarray:
        """Raw output words per clock, shape (clocks, n_out), for int32 ``words`` (n, n_in)."""
        words = np.ascontiguousarray(words, dtype=np.int32)
        trace = np.zeros((clocks, self.n_out), np.int32)
        self.cdll.hwb_stream(self.handle, words.ctypes.data, trace.ctypes.data, len(words), clocks)
        return trace

    def __del__(self) -> None:
        h, self.handle = getattr(self, "handle", None), None
        if h:
            self._close(h)


class RtlExecutor(Executor):
    """``fpga.da4ml`` in mode *emulated*: the pipelined RTL, cycle-accurate under Verilator.

    A batch of ``b`` vectors takes ``b + latency`` simulated clocks (one vector per clock)."""

    def __init__(self, lib: RtlLibrary, fmt: WordFormat, latency: int, batch: int, inp: TensorSpec,
                 out: TensorSpec):
        self._init_io(inp, out, batch)
        self.lib, self.fmt, self.latency = lib, fmt, latency
        self._words = np.zeros((batch, lib.n_in), np.int32)
        self._trace = np.zeros((batch + latency, lib.n_out), np.int32)
        self._fn = lib.cdll.hwb_stream
        self._args = (lib.handle, self._words.ctypes.data, self._trace.ctypes.data, batch, batch + latency)

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        (x,), (out,) = xs, outs  # one tensor each way
        self.fmt.encode(x, self._words)
        self._fn(*self._args)
        # assigned through out's own shape, so a strided ``out`` is written correctly too
        out[...] = self.fmt.decode(self._trace[self.latency:]).reshape(out.shape)
