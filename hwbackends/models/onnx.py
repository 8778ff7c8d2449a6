"""The ONNX reader: a ``ModelProto`` as a :class:`~.model.Model` (static specs with the batch
dimension resolved, fingerprint from the serialised graph, the reference ONNX Runtime
without graph optimisations). A graph older than ONNX Runtime runs (default-domain opset
below :data:`MIN_OPSET`) is first upgraded to :data:`UPGRADE_OPSET` with
``onnx.version_converter``, so every target sees the upgraded graph; ``Model.describe()``
names the conversion (``upgraded``), and a graph the converter cannot upgrade is refused
naming it. Inputs and outputs that are not float32 are cast at the graph's edge
(:mod:`.onnx_dtypes`), named in ``describe()`` (``cast``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import batchdim, cost
from ..errors import ModelError
from ..specs import TensorSpec
from .common import clip, digest, static_shape
from .model import Model
from .onnx_dtypes import float_io


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


#: The oldest default-domain opset ONNX Runtime runs; an older graph is upgraded first.
MIN_OPSET = 7
#: What an old graph is upgraded to (the torch exporter's default opset).
UPGRADE_OPSET = 17


def default_opset(proto: Any) -> int | None:
    """The graph's ``ai.onnx`` (default domain) opset version, None when it imports none."""
    vs = [int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    return vs[0] if vs else None


def upgrade_opset(proto: Any, name: str) -> tuple[Any, dict[str, Any] | None]:
    """``proto`` upgraded to :data:`UPGRADE_OPSET` when its opset is below :data:`MIN_OPSET`
    (else itself), and what was done (None: nothing). A failed conversion is a ModelError
    naming ``onnx.version_converter`` and the opsets."""
    old = default_opset(proto)
    if old is None or old >= MIN_OPSET:
        return proto, None
    import onnx
    from onnx import version_converter

    try:
        new = version_converter.convert_version(_channel_slopes(proto), UPGRADE_OPSET)
        # the converter's inferred shapes fix the exported batch inside the graph: drop them,
        # as the file had none, so the batch rewrite (batchdim.relax_onnx) sees the graph alike
        del new.graph.value_info[:]
        # the new opset's IR version: an IR-3 file lists its initializers as inputs, which the
        # converter leaves to a version where they need not be
        new.ir_version = max(new.ir_version, onnx.helper.find_min_ir_version_for(
            [o for o in new.opset_import if o.domain in ("", "ai.onnx")]))
        onnx.checker.check_model(new)
    except Exception as exc:
        raise ModelError(f"ONNX model {name!r} uses opset {old}, older than ONNX Runtime runs "
                         f"(≥ {MIN_OPSET}), and onnx.version_converter (onnx {onnx.__version__}) "
                         f"could not upgrade it to opset {UPGRADE_OPSET}: "
                         f"{type(exc).__name__}: {clip(str(exc))}. Re-export the model at opset "
                         f"{MIN_OPSET} or later") from exc
    return new, {"from_opset": old, "to_opset": UPGRADE_OPSET,
                 "by": f"onnx.version_converter (onnx {onnx.__version__})"}


def _channel_slopes(proto: Any) -> Any:
    """A copy of opset-6 ``proto`` whose PRelu slopes of shape (C,) over an (N, C, …) input are
    reshaped to (C, 1, …): opset 6 applies such a slope per channel, opset 7 broadcasts it
    numpy-style over the last axis, and the version converter does not adapt it."""
    import onnx
    from onnx import numpy_helper

    prelu = [n for n in proto.graph.node if n.op_type == "PRelu" and len(n.input) == 2]
    if not prelu:
        return proto
    new = type(proto)()
    new.CopyFrom(proto)
    try:
        known = onnx.shape_inference.infer_shapes(new)
    except Exception:  # the converter will say what is wrong with the graph
        return proto
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim)
             for vi in [*known.graph.input, *known.graph.value_info] if vi.type.HasField("tensor_type")}
    inits = {i.name: i for i in new.graph.initializer}
    for n in prelu:
        slope, rank = inits.get(n.input[1]), ranks.get(n.input[0], 0)
        if slope is None or len(slope.dims) != 1 or slope.dims[0] <= 1 or rank <= 2:
            continue
        arr = numpy_helper.to_array(slope).reshape(slope.dims[0], *[1] * (rank - 2))
        slope.CopyFrom(numpy_helper.from_array(arr, slope.name))
        for vi in new.graph.input:  # an IR-3 file also declares it as an input
            if vi.name == slope.name:
                vi.type.tensor_type.shape.CopyFrom(onnx.helper.make_tensor_type_proto(
                    slope.data_type, arr.shape).tensor_type.shape)
    return new


def from_onnx(proto: Any, name: str, path: Path | None, lim: cost.Limits | None = None,
               c: cost.Cost | None = None) -> Model:
    if c is None:  # an in-memory graph: its data is in it (estimated all the same)
        c = cost.onnx_cost(proto, name)
        (lim or cost.Limits.from_env()).check(c, name)
    # The fingerprint is the file as the user has it, before any upgrade or batch rewrite
    # (and the converter that upgraded it: another one may write another graph).
    fp = digest(b"onnx", proto.SerializeToString(deterministic=True))
    proto, upgraded = upgrade_opset(proto, name)
    if upgraded:
        fp = digest(b"onnx-upgraded", fp.encode(), upgraded["by"].encode(),
                    str(upgraded["to_opset"]).encode())
    cast = None
    if (default_opset(proto) or 0) >= 6:
        proto, cast = float_io(proto, name)
    if cast:  # the graph the targets see has float32 edges: say so in the fingerprint
        fp = digest(b"onnx-float-io", fp.encode(), repr(sorted(cast.items())).encode())
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
    if len(ins) > 1 or len(outs) > 1:
        graph, info = _onnx_batch_multi(proto, real_inputs, name)
    else:
        graph, info = _onnx_batch(proto, ins[0].shape, name)
    meta: dict[str, Any] = {"batch": info.to_dict(), "cost": c.to_dict()}
    if upgraded:
        meta["upgraded"] = upgraded
    if cast:
        meta["cast"] = cast
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
