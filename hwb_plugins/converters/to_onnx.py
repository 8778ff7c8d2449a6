from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hwbackends.contract import CompileError, HwbError, Model, UnsupportedError, keras_call_input

from .._shared.onnx_source import annotate_keras, annotate_torch

OPSET = 17

#: What to do when a converter cannot take a model (every refusal below ends with it).
ADVICE = ("What to do: compile it for a target that reads the model's own format (hwb targets "
          "lists each target's formats: cpu.litert and cpu.native take Keras, gpu.torch takes "
          "PyTorch), replace the layer with one the converter supports, or report it to "
          "the converter ({issues}) with this message.")
ISSUES = {"tf2onnx": "github.com/onnx/tensorflow-onnx/issues",
          "torch.onnx": "github.com/pytorch/pytorch/issues"}


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

    try:
        proto, _ = tf2onnx.convert.from_function(serve, input_signature=spec, opset=OPSET)
    except HwbError:
        raise
    except Exception as exc:
        raise converter_error("tf2onnx", model.name, exc) from None
    check_ops("tf2onnx", model.name, proto)
    annotate_keras(proto, km)
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
    try:
        if isinstance(obj, torch.export.ExportedProgram):
            prog = torch.onnx.export(obj, examples, dynamo=True, opset_version=18,
                                     input_names=in_names, output_names=out_names)
            proto = prog.model_proto
        else:
            buf = io.BytesIO()
            torch.onnx.export(obj.eval(), examples, buf, dynamo=False, opset_version=OPSET,
                              input_names=in_names, output_names=out_names,
                              dynamic_axes={n: {0: "batch"} for n in (*in_names, *out_names)})
            proto = onnx.load_from_string(buf.getvalue())
            annotate_torch(proto, obj)
    except HwbError:
        raise
    except Exception as exc:
        raise converter_error("torch.onnx", model.name, exc) from None
    check_ops("torch.onnx", model.name, proto)
    return _as_onnx(model, proto)


def converter_error(converter: str, name: str, exc: BaseException) -> CompileError:
    """A converter's exception as a CompileError: the converter, the op or layer its message
    names (when it names one), the message itself (not the traceback) and what to do."""
    import re

    msg = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).split())
    op = _named_op(msg)
    return CompileError(f"{converter} could not convert {name!r} to ONNX"
                        f"{f' at {op}' if op else ''}: {type(exc).__name__}: {_excerpt(msg, op)}. "
                        + ADVICE.format(issues=ISSUES[converter]))


def check_ops(converter: str, name: str, proto: Any) -> None:
    """Refuse a graph in which the converter left ops ONNX does not define (tf2onnx keeps a TF
    op it cannot convert, logs it and carries on; no ONNX runtime can run the result)."""
    import onnx

    bad = sorted({n.op_type for n in proto.graph.node
                  if n.domain in ("", "ai.onnx", "ai.onnx.ml")
                  and not onnx.defs.has(n.op_type, n.domain)})
    if bad:
        raise UnsupportedError(f"{converter} has no ONNX conversion for op(s) {', '.join(bad)} "
                               f"of {name!r} (it left them unconverted). "
                               + ADVICE.format(issues=ISSUES[converter]))


def _named_op(msg: str) -> str:
    """The op or layer a converter's message names, as \"op X\"; "" when none is found."""
    import re

    for pat in (r"OpOverload\(op='([\w.]+)'", r"[Uu]nsupported ops?:?\s*(?:Counter\(\{)?'?([A-Za-z_][\w.:]*)",
                r"(aten::[\w.]+|aten\.[\w.]+)", r"\bop(?:erator)? '?([A-Z][\w.]*)'?"):
        m = re.search(pat, msg)
        if m:
            return f"op {m.group(1)}"
    return ""



def _excerpt(msg: str, op: str, limit: int = 600) -> str:
    """The message, cut to ``limit`` characters around where it names ``op`` (a converter's
    message can run to pages; the part naming the op is the one to keep)."""
    at = msg.find(op.removeprefix("op ")) if op else -1
    if len(msg) <= limit or at < limit // 2:
        return msg[:limit] + ("…" if len(msg) > limit else "")
    return msg[:limit // 3] + " … " + msg[at - limit // 3:at + limit // 3] + "…"
