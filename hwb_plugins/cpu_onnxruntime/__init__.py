"""``cpu.onnxruntime``: ONNX Runtime's CPU execution provider.

Precisions: ``fp32``, ``int8-dynamic`` (ORT ``quantize_dynamic``), ``int8`` (ORT
``quantize_static``, QDQ, calibrated on representative data)."""
from __future__ import annotations

from hwbackends.contract import hookimpl

from .target import OnnxRuntimeTarget


@hookimpl
def hwb_targets():
    return [OnnxRuntimeTarget()]
