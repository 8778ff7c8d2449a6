"""``cpu.litert``: LiteRT (TFLite) with the XNNPACK delegate on the CPU.

Precisions: ``fp32``, ``fp16`` (weights in fp16), ``int8-dynamic`` (weights int8, activations
float), ``int8`` (full integer, calibrated on representative data; float32 in and out)."""
from __future__ import annotations

from hwbackends.contract import hookimpl

from .target import LiteRTTarget


@hookimpl
def hwb_targets():
    return [LiteRTTarget()]
