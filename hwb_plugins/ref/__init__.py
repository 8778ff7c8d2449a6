"""``ref``: the source framework itself (Keras, PyTorch, or ONNX Runtime unoptimised for ONNX
models) in fp32. Its outputs are the golden values every other target is checked against."""
from __future__ import annotations

from hwbackends.contract import hookimpl

from .target import RefTarget


@hookimpl
def hwb_targets():
    return [RefTarget()]
