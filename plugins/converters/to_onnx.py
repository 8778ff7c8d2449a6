from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hwbackends.models import Model, keras_call_input

OPSET = 17


def _as_onnx(model: Model, proto: Any) -> Model:
    """The converted model keeps the source's identity: fingerprint, specs, name, data."""
    out = dataclasses.replace(model, obj=proto, format="onnx", _ref=None)
    out.meta = dict(model.meta, converted_from=model.format)
    return out


def keras_to_onnx(model: Model, workdir: Path) -> Model:
    """One input signature per input, named after its spec (the batch symbolic unless the
    model has a fixed one), and the outputs in the model's order: the ONNX graph's inputs and
    outputs keep that order (tf2onnx names the outputs ``Identity:0``, ``Identity_1:0``, …)."""
    import tensorflow as tf
    import tf2onnx

    km = model.obj
    batch = model.meta.get("fixed_batch")
    spec = tuple(tf.TensorSpec([batch, *s.shape], tf.float32, name=s.name) for s in model.inputs)

    @tf.function(input_signature=spec)
    def serve(*xs: Any) -> Any:
        y = km(keras_call_input(km, xs), training=False)
        return list(y) if isinstance(y, (list, tuple)) else [y]

    proto, _ = tf2onnx.convert.from_function(serve, input_signature=spec, opset=OPSET)
    return _as_onnx(model, proto)


def torch_to_onnx(model: Model, workdir: Path) -> Model:
    """Every input and output of the ONNX graph is named after the model's spec (``input`` /
    ``output`` for one tensor; ``forward``'s argument names and ``output_0``, … for several),
    in the spec order, with a symbolic batch unless the model has a fixed one."""
    import io

    import onnx
    import torch

    obj = model.obj
    # A program exported at a fixed batch only runs at that batch (the ONNX keeps it, and
    # meta["fixed_batch"] has every target compile at it).
    batch = model.meta.get("fixed_batch") or 1
    examples = tuple(torch.zeros((batch, *s.shape), dtype=torch.float32) for s in model.inputs)
    in_names = [s.name for s in model.inputs]
    out_names = [s.name for s in model.outputs]
    if isinstance(obj, torch.export.ExportedProgram):
        prog = torch.onnx.export(obj, examples, dynamo=True, opset_version=18,
                                 input_names=in_names, output_names=out_names)
        return _as_onnx(model, prog.model_proto)
    buf = io.BytesIO()
    torch.onnx.export(obj.eval(), examples, buf, dynamo=False, opset_version=OPSET,
                      input_names=in_names, output_names=out_names,
                      dynamic_axes={n: {0: "batch"} for n in (*in_names, *out_names)})
    return _as_onnx(model, onnx.load_from_string(buf.getvalue()))
