"""Static batch for ONNX graphs (ONNX Runtime, XLA and TensorRT build at a fixed batch)."""
from __future__ import annotations

from typing import Any


def fix_batch(proto: Any, batch: int) -> Any:
    """Static shapes: set the batch dimension of every graph input and output."""
    inits = {i.name for i in proto.graph.initializer}
    for vi in [*proto.graph.input, *proto.graph.output]:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_value = batch
    return proto
