"""``gpu.tensorrt``: ONNX → TensorRT engine (fp32/fp16/int8, entropy-calibrated), cached per
GPU model, compute capability, TensorRT and driver version, run from pinned buffers as one
CUDA graph per call. Unavailable without an NVIDIA GPU, ``tensorrt`` and ``cuda-python``."""
from __future__ import annotations

from hwbackends.contract import hookimpl

from .target import TensorRTTarget


@hookimpl
def hwb_targets():
    return [TensorRTTarget()]
