"""Run a stored bitstream on a PYNQ board (mode *hardware*).

The pattern of hls4ml's VivadoAccelerator driver (``axi_stream_driver.py``): an ``Overlay``
with an AXI DMA (``hier_0.axi_dma_0`` in hls4ml's block design, else a top-level
``axi_dma_0``), physically contiguous buffers from ``pynq.allocate``, one send and one
receive transfer per call. When the accelerator's stream carries ``ap_fixed<W,I>`` words
(manifest ``io.input_type``/``io.output_type``), float↔fixed conversion happens at the
boundary here, in preallocated numpy buffers.

Needs ``pynq`` (only importable on a board image) and a validated bitstream entry; no test
on this machine can run it, and none pretends to.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from hwbackends.contract import Availability, Executor, TensorSpec

from .bitstreams import BitstreamEntry


def _fixed(typ: str) -> tuple[int, int] | None:
    m = re.match(r"^(?:ap_)?u?fixed<\s*(\d+)\s*,\s*(-?\d+)", typ or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _int_dtype(width: int) -> np.dtype:
    for bits, dt in ((8, np.int8), (16, np.int16), (32, np.int32), (64, np.int64)):
        if width <= bits:
            return np.dtype(dt)
    raise ValueError(f"stream word of {width} bits is wider than 64")


class PynqExecutor(Executor):
    """``predict_into`` through the FPGA: encode → DMA send/receive → decode."""

    mode = "hardware"

    def __init__(self, entry: BitstreamEntry, batch: int, inp: TensorSpec, out: TensorSpec):
        from pynq import Overlay, allocate

        self.availability = Availability.hardware(
            f"FPGA board {entry.manifest.get('board', '?')} ({entry.manifest.get('part', '?')}) via PYNQ",
            f"bitstream {entry.bit.name} for this model's fingerprint")
        self.entry = entry
        self._init_io(inp, out, batch)
        io = entry.manifest["io"]
        self.overlay = Overlay(str(entry.bit))  # PYNQ finds design.hwh next to the .bit
        dma = getattr(self.overlay, "hier_0", self.overlay).axi_dma_0
        self._send, self._recv = dma.sendchannel, dma.recvchannel
        self._in_fx, self._out_fx = _fixed(io.get("input_type", "float")), _fixed(io.get("output_type", "float"))
        n_in, n_out = int(np.prod(inp.shape)) * batch, int(np.prod(out.shape)) * batch
        in_dt = _int_dtype(self._in_fx[0]) if self._in_fx else np.dtype(np.float32)
        out_dt = _int_dtype(self._out_fx[0]) if self._out_fx else np.dtype(np.float32)
        self._ibuf = allocate(shape=(n_in,), dtype=in_dt)
        self._obuf = allocate(shape=(n_out,), dtype=out_dt)
        self._in_scale = float(2 ** (self._in_fx[0] - self._in_fx[1])) if self._in_fx else 1.0
        self._out_scale = float(2.0 ** -(self._out_fx[0] - self._out_fx[1])) if self._out_fx else 1.0
        self._tmp = np.empty(n_in, dtype=np.float32)

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        (x,), (out,) = xs, outs  # one tensor each way
        # Work on flat views of the fixed-shape buffers; x and out keep their own strides
        # (reshaping a strided array would copy it, and a write into the copy would be lost).
        flat_in = self._tmp.reshape(x.shape)
        np.copyto(flat_in, x)
        if self._in_fx:
            np.multiply(self._tmp, self._in_scale, out=self._tmp)
            np.rint(self._tmp, out=self._tmp)
        self._ibuf[:] = self._tmp
        self._send.transfer(self._ibuf)
        self._recv.transfer(self._obuf)
        self._send.wait()
        self._recv.wait()
        o = self._obuf.reshape(out.shape)
        if self._out_fx:
            np.multiply(o, self._out_scale, out=out)
        else:
            out[...] = o

    def close(self) -> None:
        for buf in (self._ibuf, self._obuf):
            try:
                buf.freebuffer()
            except Exception:
                pass


def describe(entry: BitstreamEntry) -> dict[str, Any]:
    return {"board": entry.board, "part": entry.manifest.get("part"),
            "build_date": entry.manifest.get("build_date"), "path": str(entry.path)}
