"""Static batch for ONNX graphs (ONNX Runtime, XLA and TensorRT build at a fixed batch)."""
from __future__ import annotations

from typing import Any


def fix_batch(proto: Any, batch: int) -> Any:
    """Static shapes: set the batch dimension of every graph input and output.

    The model's graph arrives with a symbolic batch, or (``model.meta["fixed_batch"]``) at
    its exported batch, which the compiler then compiles at (see hwbackends.batchdim). The
    model's own graph is left as it is (an in-process compile shares it with the model's
    reference): the result is a copy."""
    proto, src = type(proto)(), proto
    proto.CopyFrom(src)
    inits = {i.name for i in proto.graph.initializer}
    for vi in [*proto.graph.input, *proto.graph.output]:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_value = batch
    return proto


def batch_meta(model: Any, batch: int) -> dict[str, Any]:
    """What the target did with the model's batch dimension, for the artifact's meta
    (``describe()["meta"]["batch"]``)."""
    info = dict(model.meta.get("batch") or {"exported": None, "handling": "dynamic", "detail": ""})
    info["compiled"] = batch
    if info["handling"] == "fixed":
        info["how"] = (f"compiled at the model's exported batch {batch}; predict() pads and "
                       f"chunks other batch sizes")
    elif info["handling"] == "symbolic":
        info["how"] = f"batch dimension made symbolic, then compiled at batch {batch}"
    else:
        info["how"] = f"compiled at batch {batch}"
    return {"batch": info}
