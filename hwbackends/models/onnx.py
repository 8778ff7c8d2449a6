"""The ONNX reader: a ``ModelProto`` as a :class:`~.model.Model` (static specs with the batch
dimension resolved, fingerprint from the serialised graph, the reference ONNX Runtime
without graph optimisations)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import batchdim, cost
from ..errors import ModelError
from ..specs import TensorSpec
from .common import clip, digest, static_shape
from .model import Model


def load_onnx(path: Path, name: str, lim: cost.Limits) -> Model:
    """An ONNX file: the graph is read without its external data, its cost checked (the
    external tensors against the files they live in), and only then the data read."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    c = cost.onnx_cost(proto, name, path.parent)
    lim.check(c, name)
    if c.external_bytes:
        onnx.load_external_data_for_model(proto, str(path.parent))
    return from_onnx(proto, name, path, lim, c)


def from_onnx(proto: Any, name: str, path: Path | None, lim: cost.Limits | None = None,
               c: cost.Cost | None = None) -> Model:
    if c is None:  # an in-memory graph: its data is in it (estimated all the same)
        c = cost.onnx_cost(proto, name)
        (lim or cost.Limits.from_env()).check(c, name)
    g = proto.graph
    inits = {i.name for i in g.initializer}
    real_inputs = [i for i in g.input if i.name not in inits]
    if not real_inputs or not len(g.output):
        raise ModelError(f"ONNX model {name!r} has {len(real_inputs)} inputs and {len(g.output)} "
                         f"outputs; it needs at least one of each")

    def dims(vi: Any, what: str) -> tuple[int, ...]:
        d = [x.dim_value if x.HasField("dim_value") else None for x in vi.type.tensor_type.shape.dim]
        return static_shape(d[1:], what, name)

    ins = [TensorSpec(i.name, dims(i, "input")) for i in real_inputs]
    outs = [TensorSpec(o.name, dims(o, "output")) for o in g.output]
    # The fingerprint is the file as the user has it, before any batch rewrite.
    fp = digest(b"onnx", proto.SerializeToString(deterministic=True))
    if len(ins) > 1 or len(outs) > 1:
        graph, info = _onnx_batch_multi(proto, real_inputs, name)
    else:
        graph, info = _onnx_batch(proto, ins[0].shape, name)
    meta: dict[str, Any] = {"batch": info.to_dict(), "cost": c.to_dict()}
    if info.handling == batchdim.FIXED:
        meta["fixed_batch"] = info.exported
    return Model(graph, "onnx", ins, outs, fp, name, path, meta=meta)


def _onnx_batch_multi(proto: Any, real_inputs: list[Any], name: str) -> tuple[Any, batchdim.BatchInfo]:
    """A multi-IO graph keeps its batch dimension as exported: symbolic runs at any batch; a
    fixed one is compiled at (``predict`` pads/chunks). The rewrite to symbolic that
    single-input graphs get is not tried here (it verifies with one input)."""
    import onnx

    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelError(f"ONNX model {name!r} is not a valid ONNX graph ({clip(str(exc))}); "
                         f"is the file complete? Re-export it") from exc
    batches = {batchdim.dim0(i) for i in real_inputs}
    if len(batches) > 1:
        raise ModelError(f"ONNX model {name!r} declares different batch dimensions on its "
                         f"inputs ({sorted(map(str, batches))}); every input needs the same "
                         f"batch. {batchdim.reexport_advice('onnx')}")
    b = batches.pop()
    if b is None:
        return proto, batchdim.BatchInfo(None, batchdim.DYNAMIC, "the batch dimension is symbolic")
    if b < 1:
        raise ModelError(f"ONNX model {name!r} declares a batch dimension of {b}; expected ≥ 1 "
                         f"or symbolic. To fix, {batchdim.reexport_advice('onnx')}")
    return proto, batchdim.BatchInfo(b, batchdim.FIXED, f"exported with batch {b} (several "
                                     f"inputs/outputs: compiled at it, not made symbolic)")


def _onnx_batch(proto: Any, sample: tuple[int, ...], name: str) -> tuple[Any, batchdim.BatchInfo]:
    import onnx

    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelError(f"ONNX model {name!r} is not a valid ONNX graph ({clip(str(exc))}); "
                         f"is the file complete? Re-export it") from exc
    inits = {i.name for i in proto.graph.initializer}
    first = next(i for i in proto.graph.input if i.name not in inits)
    dim0 = first.type.tensor_type.shape.dim
    if len(dim0) and dim0[0].HasField("dim_value") and dim0[0].dim_value < 1:
        raise ModelError(f"ONNX model {name!r} declares a batch dimension of "
                         f"{dim0[0].dim_value}; expected ≥ 1 or symbolic. To fix, "
                         f"{batchdim.reexport_advice('onnx')}")
    try:
        graph, info = batchdim.relax_onnx(proto, sample)
    except Exception as exc:  # the original graph itself does not run
        raise ModelError(f"ONNX model {name!r} does not run in ONNX Runtime ({type(exc).__name__}: "
                         f"{str(exc)[:300]}); check it with onnx.checker.check_model and "
                         f"re-export it") from exc
    if info.handling == batchdim.FIXED and "output's first dimension" in info.detail:
        raise ModelError(f"ONNX model {name!r}: {info.detail}; hwbackends needs one output row "
                         f"per input sample")
    return graph, info
