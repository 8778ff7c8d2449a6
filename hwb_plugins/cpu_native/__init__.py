"""``cpu.native``: the model as generated C with its weights as constants, compiled by the
system C compiler (``HWB_CC``, default ``cc``) for this CPU's instruction set and entered from
Python through a per-artifact CPython ``METH_FASTCALL`` function (no ctypes, no allocation).
The same artifact exports a C shared library with a generated header (``hwb export --format
c``). Precisions: ``fp32``; ``int8`` (symmetric per-channel weights, calibrated activations,
int32 accumulation); ``fixed`` / ``ap_fixed<W,I[,Q,O]>`` (hls4ml's fixed-point arithmetic in
integers, bit-exact with ``fpga.hls4ml``'s C-simulation at the same types: fixed.py)."""
from __future__ import annotations

from hwbackends.contract import hookimpl

from .target import NativeTarget


@hookimpl
def hwb_targets():
    return [NativeTarget()]
