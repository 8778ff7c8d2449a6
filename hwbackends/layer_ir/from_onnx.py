"""ONNX graphs (what tf2onnx and torch.onnx write for the supported layers) as IR layers."""
from __future__ import annotations

from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

from .ir import (
    Act,
    Affine,
    Bidirectional,
    Conv1D,
    Conv2D,
    Dense,
    GlobalPool1D,
    Layer,
    LayerNorm,
    Pad1D,
    Pad2D,
    Pool1D,
    Pool2D,
    Recurrent,
    Reshape,
    chain_shape,
    f32,
    ungroup,
)
from .walk import (
    IR_ORDER,
    Walk,
    final_axes,
    ir_labels,
    last_step,
    permuted,
    reduce_image,
    reshape_merge,
    squeeze_time,
    time_slice,
    walk_affine,
    walk_dense,
    walk_flatten,
)

_META_OPS = {"Shape", "Size"}  # ops whose output is only the data's shape
_PASS = {"Identity", "Dropout", "Cast"}
_ZERO_KEEP = {"Expand", "Unsqueeze", "Reshape", "Cast", "Identity", "Tile", "Squeeze", "Slice", "Gather"}



#: ONNX ops over (batch, channels, time): an input they read first is channels-first
_CHANNELS_FIRST = {"Conv", "MaxPool", "AveragePool", "BatchNormalization", "GlobalAveragePool",
                   "GlobalMaxPool", "InstanceNormalization"}


#: ops that act on each element alone: the layout is read from the op after them
_ELEMENTWISE = {"Relu", "LeakyRelu", "Tanh", "Sigmoid", "Elu", "Selu", "Softplus", "Clip", "Exp",
                "Neg", "Sqrt", "HardSigmoid", "Softsign", "Identity", "Dropout", "Cast"}


def _pads_last_axis(n: Any, consts: dict[str, np.ndarray], rank: int) -> bool:
    """Whether Pad node ``n`` pads the last axis (channels-last, that would be the channels)."""
    attrs = _onnx_attrs(n)
    if len(n.input) > 1 and n.input[1] in consts:
        pads = [int(v) for v in np.ravel(consts[n.input[1]])]
    else:
        pads = list(attrs["pads"].ints) if "pads" in attrs else []
    return len(pads) == 2 * rank and bool(pads[rank - 1] or pads[2 * rank - 1])


def _first_consumer(g: Any, value: str, consts: dict[str, np.ndarray], rank: int) -> Any:
    """The first node reading ``value``, through Unsqueezes (torch.onnx writes a 1-D pool as
    Unsqueeze, the 2-D op, Squeeze), element-wise ops (a ReLU before the first Conv) and a Pad
    of other axes than the last (a loop, not a recursion: graphs are deep)."""
    readers: dict[str, Any] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, n)
    n = readers.get(value)
    while n is not None and (n.op_type == "Unsqueeze" or n.op_type in _ELEMENTWISE or (
            n.op_type == "Pad" and not _pads_last_axis(n, consts, rank))):
        n = readers.get(n.output[0])
    return n


def _reads_channels_first(g: Any, value: str, consts: dict[str, np.ndarray], rank: int) -> bool:
    """Whether the first op reading the input takes channels on axis 1: a Conv, pool or batch
    norm, a PRelu with one slope per axis-1 entry (a torch PReLU(channels) over an image), a
    Concat on axis 1, or a Pad of the last axis (padding a channels-last tensor's channels is
    not compiled)."""
    n = _first_consumer(g, value, consts, rank)
    if n is None:
        return False
    if n.op_type == "PRelu" and len(n.input) > 1 and n.input[1] in consts:
        s = np.shape(consts[n.input[1]])
        return len(s) == rank - 1 and s[0] > 1 and all(d == 1 for d in s[1:])
    if n.op_type == "Concat":  # joined on axis 1: the channels, as an inception module's
        return "axis" in _onnx_attrs(n) and _onnx_attrs(n)["axis"].i % rank == 1
    return n.op_type in _CHANNELS_FIRST or n.op_type == "Pad"


def _onnx_attrs(n: Any) -> dict[str, Any]:
    return {a.name: a for a in n.attribute}


def _refuse_typed_inputs(g: Any, target: str) -> None:
    """Refuse, naming the input, a graph that casts an input to another type than float32
    (hwbackends.models.onnx_dtypes writes that Cast for an int64 or float64 graph input)."""
    from onnx import TensorProto

    names = {i.name for i in g.input}
    for n in g.node:
        to = _onnx_attrs(n).get("to")
        if n.op_type == "Cast" and n.input and n.input[0] in names and to is not None and to.i != 1:
            t = TensorProto.DataType.Name(to.i).lower()
            raise UnsupportedError(f"{target} computes in float32 only; the graph takes input "
                                   f"{n.input[0]!r} as {t} (fed as float32 and cast to {t} at the "
                                   f"graph's edge). Compile it for ref or cpu.onnxruntime, which "
                                   f"run the cast")


def read_onnx(proto: Any, target: str) -> list[Layer]:
    """The ONNX graphs tf2onnx and torch.onnx write for the layers :data:`SUPPORTED` lists, as
    IR layers: the data tensors form a chain (each op reading the previous one's output,
    weights as initializers or Constants); side computations on the input's Shape (the
    zero initial state an exported LSTM builds for the batch) are followed only far enough
    to see that they are zeros. Anything else is refused naming the node and op.

    The input's layout is read from the op consuming it (:func:`_reads_channels_first`);
    where that reading is refused, the other is tried (a graph whose first ops say nothing
    of the layout: element-wise ops, then a permute and reshape, or a pad of computed
    amounts). Either reading that completes is the graph's function, since every axis-
    dependent op is checked against the labels it tracks; if both are refused, the first
    refusal is raised."""
    try:
        return _read_onnx(proto, target, None)
    except UnsupportedError as exc:
        if len(proto.graph.input[0].type.tensor_type.shape.dim) not in (3, 4):
            raise
        auto = _reads_channels_first(proto.graph, proto.graph.input[0].name, _onnx_consts(proto.graph),
                                     len(proto.graph.input[0].type.tensor_type.shape.dim))
        try:
            return _read_onnx(proto, target, not auto)
        except UnsupportedError:
            raise exc from None


def _read_onnx(proto: Any, target: str, channels_first: bool | None) -> list[Layer]:
    """:func:`read_onnx` with the input read channels-first or not (None: as its first op says)."""
    g = proto.graph
    _refuse_typed_inputs(g, target)
    consts = _onnx_consts(g)
    dims = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
    if len(dims) not in (2, 3, 4):
        raise UnsupportedError(f"{target} compiles ONNX models over (batch, features), (batch, "
                               f"time, channels) or (batch, channels, rows, cols) inputs; input "
                               f"{g.input[0].name!r} has {len(dims)} axes")
    w = Walk(target, consts, tuple(dims[1:]))
    w.opset = next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), w.opset)
    # the model's own layout, read from the op that consumes its input
    first = (_reads_channels_first(g, g.input[0].name, consts, len(dims)) if channels_first is None
             else channels_first)
    data = {g.input[0].name: ["N", "C"] if len(dims) == 2 else
            w.channels_first(g.input[0].name, "input") if first else
            ["N", "T", "C"] if len(dims) == 3 else ["N", "Y", "X", "C"]}
    meta: dict[str, bool] = {}  # shape-derived tensors → whether they are all zeros
    prev = {g.input[0].name}
    w.put(g.input[0].name)
    users: dict[str, set[str]] = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, set()).add(n.op_type)
    graph_out = {o.name for o in g.output}
    for n in g.node:
        if n.op_type == "Constant" and n.output[0] in consts:
            continue
        name, op = n.name or f"{n.op_type}_{len(w.layers)}", n.op_type
        if op in ("Loop", "Scan", "If"):
            raise w.refuse(name, op, "control flow (tf2onnx writes a Keras GRU/LSTM it cannot map "
                                     "to an ONNX GRU/LSTM op as a Loop): compile the Keras source")
        ins = [i for i in n.input if i and i not in consts]
        din = [i for i in ins if i in data]
        if din and not any(users.get(o, set()) - _META_OPS or o in graph_out for o in n.output):
            continue  # a view of the data that only its Shape is taken of (torch.onnx writes them)
        if not ins and _onnx_fold(n, consts):  # constant arithmetic (torch.onnx's F.pad amounts)
            continue
        if not din or op in _META_OPS:
            _onnx_shape_of(w, n, [data[d] for d in din], din, consts)
            _onnx_meta(n, consts, meta)
            continue
        if (op == "Add" and len(din) == 2 and len(ins) == 2) or (op == "Concat" and len(din) >= 2):
            # a residual add; a concatenation of branches from one tensor (an inception module)
            prev = (_onnx_residual(w, n, name, din, data) if op == "Add"
                    else _onnx_concat(w, n, name, din, ins, data))
            continue
        _onnx_operands(w, name, op, ins, din, prev | set(w.branches.at), set(data), meta)
        w.enter(din[0], name, op)
        ax = list(data[din[0]])
        if "H" in ax:  # an LSTM/GRU's Y_h: the layer returns its last state
            last_step(w, name, op)
            ax = ["C" if a == "H" else a for a in ax]
        before = len(w.layers)
        outs = _onnx_node(w, n, name, op, ax, din[0], meta)
        if w.pad != (0, 0) and op != "Pad" and len(w.layers) > before:
            raise w.refuse(name, op, "a Pad that a Conv does not follow")
        data.update(outs)
        prev = set(outs)
        for o in outs:
            w.put(o)
    out = g.output[0].name
    if out not in prev or not (w.branches.tip(out) and w.branches.at[out][0] == 0):
        raise UnsupportedError(f"{target}: ONNX output {out!r} is not the end of the op chain")
    final_axes(w, data[out])
    return w.main()


#: The batch in a Shape's value (:func:`_onnx_shape_of`): a prime no per-sample size is, so the
#: shape arithmetic after it keeps it apart (a Reshape's target reads it as "the batch").
BATCH = 99991


def _onnx_shape_of(w: Walk, n: Any, axes: list[list[str]], din: list[str],
                   consts: dict[str, np.ndarray]) -> None:
    """For a Shape node of a data value (``din``, labelled ``axes``), its value as a
    constant, the batch as :data:`BATCH`, so the shape arithmetic torch.onnx writes around a
    reshape (``flatten(2)`` over a dynamic batch: Shape → Slice → Concat → Reshape) folds into
    the Reshape's target; nothing for another node, or a value whose axes the walk does not
    size (it stays a computed operand, refused where read)."""
    ch = w.branches
    if n.op_type != "Shape" or len(din) != 1:
        return
    ax, value = axes[0], din[0]
    if value not in ch.at or any(a not in ("N", "1", *IR_ORDER) for a in ax):
        return
    c, pos = ch.at[value]
    sizes = dict(zip(ir_labels(ax), chain_shape(ch.chains[c][:pos], ch.shapes[c]), strict=False))
    dims = [BATCH if a == "N" else sizes.get(a, 1) for a in ax]
    attrs = _onnx_attrs(n)
    start = attrs["start"].i if "start" in attrs else 0
    end = attrs["end"].i if "end" in attrs else len(dims)
    consts[n.output[0]] = np.array(dims[slice(start, end)], np.int64)


def _onnx_residual(w: Walk, n: Any, name: str, din: list[str], data: dict[str, list[str]]) -> set[str]:
    """An Add of two data tensors: a residual add (:class:`Residual`); the new chain's tip."""
    if data[din[0]] != data[din[1]]:
        raise w.refuse(name, "Add", f"an add of tensors laid out {data[din[0]]} and {data[din[1]]}")
    w.merge(din[0], din[1], name, "Add")
    data[n.output[0]] = list(data[din[0]])
    w.put(n.output[0])
    return {n.output[0]}


def _onnx_concat(w: Walk, n: Any, name: str, din: list[str], ins: list[str],
                 data: dict[str, list[str]]) -> set[str]:
    """A Concat of data tensors on the channels' axis: a :class:`Concat` of branches."""
    ax = data[din[0]]
    axis = _onnx_attrs(n)["axis"].i % len(ax) if "axis" in _onnx_attrs(n) else -1
    if len(din) != len(ins) or any(data[d] != ax for d in din) or axis < 0 or ax[axis] != "C":
        raise w.refuse(name, "Concat", f"a concatenation of {len(ins)} tensors (axes {ax}) on axis "
                                       f"{axis}: it takes data tensors laid out alike, joined on the "
                                       f"channels")
    w.concat(list(din), name, "Concat")
    data[n.output[0]] = list(ax)
    w.put(n.output[0])
    return {n.output[0]}


def _onnx_consts(g: Any) -> dict[str, np.ndarray]:
    """The graph's initializers and Constant nodes (initializers written another way)."""
    from onnx import numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return consts


def _onnx_operands(w: Walk, name: str, op: str, ins: list[str], din: list[str], prev: set[str],
                   data: set[str], meta: dict[str, bool]) -> None:
    """Refuse a node that does not read the previous node's output as its one data input."""
    if len(din) != 1 or din[0] not in prev:
        raise w.refuse(name, op, "the graph is not a chain of single-input ops")
    stray = [i for i in ins if i not in data and i not in meta]
    if stray:
        raise w.refuse(name, op, f"input {stray[0]!r} is neither data, weight nor shape")
    if any(i in meta for i in ins) and op not in ("LSTM", "GRU"):
        raise w.refuse(name, op, "a computed (not constant) operand")



def _onnx_meta(n: Any, consts: dict[str, np.ndarray], meta: dict[str, bool]) -> None:
    """Record a node computed from shapes and constants, and whether its output is zeros."""
    from onnx import numpy_helper

    a = _onnx_attrs(n).get("value")
    fill = numpy_helper.to_array(a.t) if a is not None else np.zeros(1)
    zero = (n.op_type == "ConstantOfShape" and not np.any(fill)) or (
        n.op_type in _ZERO_KEEP and bool(n.input) and _onnx_zero(n.input[0], consts, meta))
    for o in n.output:
        meta[o] = bool(zero)


#: ops on constants only that are folded into constants (their outputs stay small)
_FOLD = {"ConstantOfShape", "Concat", "Reshape", "Slice", "Transpose", "Cast", "Unsqueeze", "Squeeze",
         "Gather"}


def _onnx_fold(n: Any, consts: dict[str, np.ndarray]) -> bool:
    """Evaluate node ``n`` whose inputs are all constants (ONNX's reference evaluator) and
    record its outputs as constants; False for another op or an output over 4,096 values."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    args = [consts[i] for i in n.input if i]
    if n.op_type not in _FOLD or any(a.size > 4096 for a in args) or (
            n.op_type == "ConstantOfShape" and args and np.prod(args[0].astype(np.int64)) > 4096):
        return False
    try:
        outs = ReferenceEvaluator(helper.make_node(n.op_type, list(n.input), list(n.output),
                                                   **{a.name: helper.get_attribute_value(a)
                                                      for a in n.attribute})).run(
            None, {i: consts[i] for i in n.input if i})
    except Exception:  # a malformed node: left to the walk, which refuses it by name
        return False
    consts.update({o: np.asarray(v) for o, v in zip(n.output, outs, strict=False)})
    return True


def _onnx_zero(name: str, consts: dict[str, np.ndarray], meta: dict[str, bool]) -> bool:
    return meta.get(name, False) or (name in consts and not np.any(consts[name]))


def _onnx_spatial(w: Walk, name: str, op: str, ax: list[str]) -> int:
    """The index of time among an N, C, spatial… tensor's spatial axes (others singletons)."""
    if ax[:2] != ["N", "C"] or "T" not in ax[2:] or any(a != "1" for a in ax[2:] if a != "T"):
        raise w.refuse(name, op, f"its input's axes hold {ax}; it takes (batch, channels, time) "
                                 f"with singleton axes only beside time")
    return ax.index("T") - 2


def _onnx_window(w: Walk, name: str, op: str, attrs: dict, t: int, rank: int,
                 kernel: list[int]) -> tuple[int, int, int, tuple[int, int]]:
    """(kernel, stride, dilation, pad) along time of a Conv/Pool; other axes must be trivial."""
    strides = list(attrs["strides"].ints) if "strides" in attrs else [1] * rank
    dil = list(attrs["dilations"].ints) if "dilations" in attrs else [1] * rank
    pads = list(attrs["pads"].ints) if "pads" in attrs else [0] * 2 * rank
    auto = attrs["auto_pad"].s.decode() if "auto_pad" in attrs else "NOTSET"
    for i in range(rank):
        if i != t and (kernel[i], strides[i], dil[i], pads[i], pads[i + rank]) != (1, 1, 1, 0, 0):
            raise w.refuse(name, op, "a window over a singleton axis")
    k, s, d = kernel[t], strides[t], dil[t]
    pad = (pads[t], pads[t + rank])
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if s != 1:
            raise w.refuse(name, op, f"auto_pad {auto} with strides > 1")
        span = (k - 1) * d
        lo = span // 2 if auto == "SAME_UPPER" else span - span // 2
        pad = (lo, span - lo)
    elif auto not in ("NOTSET", "VALID"):
        raise w.refuse(name, op, f"auto_pad {auto}")
    return k, s, d, pad



def _onnx_node(w: Walk, n: Any, name: str, op: str, ax: list[str], x: str,
               meta: dict[str, bool]) -> dict[str, list[str]]:
    """Append ``n``'s IR layers; the labels of its data outputs."""
    for part in (_onnx_elementwise, _onnx_dense, _onnx_image):
        out = part(w, n, name, op, ax)
        if out is not None:
            return out
    return _onnx_layer(w, n, name, op, ax, meta)


#: ONNX activations with float attributes: op → (IR kind, [(attribute, default)] as Act's
#: alpha, beta in order); Selu is an ELU scaled by gamma.
_ONNX_PARAM_ACTS: dict[str, tuple[str, list[tuple[str, float]]]] = {
    "Elu": ("elu", [("alpha", 1.0), ("__scale", 1.0)]),
    "Selu": ("elu", [("alpha", 1.67326319217681884765625), ("gamma", 1.05070102214813232421875)]),
    "Softplus": ("softplus", [("__beta", 1.0), ("__threshold", float("inf"))]),
    "HardSigmoid": ("hard_sigmoid", [("alpha", 0.2), ("beta", 0.5)]),
}


def _softmax_axis(w: Walk, name: str, op: str, attrs: dict, ax: list[str]) -> None:
    """A (Log)Softmax must run over the channels, the last axis (before opset 13 the default
    axis is 1 and the input is coerced to 2-D from it: the same only when that is the last)."""
    axis = attrs["axis"].i if "axis" in attrs else (-1 if w.opset >= 13 else 1)
    axis %= len(ax)
    if axis != len(ax) - 1 or ax[axis] != "C" or (w.perm is not None and ax != ["N", "C"]):
        raise w.refuse(name, op, f"{op.lower()} over axis {axis} (holding {ax[axis]}), not the "
                                 f"channels (the last axis)")


def _onnx_scalar(w: Walk, n: Any, idx: int, attrs: dict, key: str, default: float) -> float:
    """A float given as constant input ``idx`` (newer opsets) or attribute ``key``."""
    if len(n.input) > idx and n.input[idx]:
        if n.input[idx] not in w.consts:
            raise w.refuse(n.name or n.op_type, n.op_type, f"its {key} is computed, not a constant")
        return float(np.ravel(w.consts[n.input[idx]])[0])
    return float(attrs[key].f) if key in attrs else default


def _onnx_slope(w: Walk, n: Any, name: str, op: str, ax: list[str]) -> np.ndarray:
    """A PRelu slope: one, or one per channel (the axis labelled C); anything else refused."""
    if n.input[1] not in w.consts:
        raise w.refuse(name, op, "its slope is computed, not a constant")
    s = np.asarray(w.consts[n.input[1]], np.float64)
    if s.size == 1:
        return s.reshape(1)
    # numpy broadcasting from the right: the slope's axes are ax's last s.ndim
    lab = ax[len(ax) - s.ndim:] if s.ndim <= len(ax) else []
    big = [i for i, d in enumerate(s.shape) if d != 1]
    if len(big) != 1 or not lab or lab[big[0]] != "C" or w.perm is not None:
        raise w.refuse(name, op, f"a slope of shape {s.shape} over axes {ax}: it takes one "
                                 f"slope, or one per channel")
    return s.ravel()


def _onnx_elementwise(w: Walk, n: Any, name: str, op: str, ax: list[str]) -> dict[str, list[str]] | None:
    """Activations and the ops that only move axes (None: not one of those)."""
    attrs, o = _onnx_attrs(n), n.output[0]
    if op in _PASS:
        if op == "Cast" and attrs["to"].i != 1:
            raise w.refuse(name, op, "a cast to other than float32")
        return {o: ax}
    if op in ("Relu", "Tanh", "Sigmoid", "Exp", "Neg", "Sqrt", "Softsign"):
        w.layers.append(Act(name, op.lower()))
        return {o: ax}
    if op in _ONNX_PARAM_ACTS:
        kind, params = _ONNX_PARAM_ACTS[op]
        vals = [attrs[k].f if k in attrs else d for k, d in params]
        w.layers.append(Act(name, kind, *vals))
        return {o: ax}
    if op == "Clip":
        lo, hi = (_onnx_scalar(w, n, i, attrs, k, d)
                  for i, k, d in ((1, "min", -np.inf), (2, "max", np.inf)))
        w.layers.append(Act(name, "clip", lo, hi))
        return {o: ax}
    if op == "PRelu":
        w.layers.append(Act(name, "prelu", slope=_onnx_slope(w, n, name, op, ax)))
        return {o: ax}
    if op == "LogSoftmax":
        _softmax_axis(w, name, op, attrs, ax)
        w.layers.append(Act(name, "log_softmax"))
        return {o: ax}
    if op == "LeakyRelu":
        w.layers.append(Act(name, "leaky_relu", attrs["alpha"].f if "alpha" in attrs else 0.01))
        return {o: ax}
    if op == "Softmax":
        _softmax_axis(w, name, op, attrs, ax)
        w.layers.append(Act(name, "softmax"))
        return {o: ax}
    if op == "Transpose":
        perm = list(attrs["perm"].ints) if "perm" in attrs else list(range(len(ax)))[::-1]
        return {o: [ax[i] for i in perm]}
    if op == "Unsqueeze":
        axes = sorted(a % (len(ax) + len(w.const_ints(n, 1, attrs, "axes") or []))
                      for a in w.const_ints(n, 1, attrs, "axes") or [])
        out = list(ax)
        for a in axes:
            out.insert(a, "1")
        return {o: out}
    if op == "Squeeze":
        axes = w.const_ints(n, 1, attrs, "axes")
        axes = [a % len(ax) for a in axes] if axes is not None else [i for i, a in enumerate(ax) if a == "1"]
        if any(ax[a] not in ("1", "T") for a in axes):
            raise w.refuse(name, op, f"squeezing axes {axes} of {ax} (only singletons)")
        return {o: squeeze_time(w, name, op, ax, axes)}
    return None


def _onnx_dense(w: Walk, n: Any, name: str, op: str, ax: list[str]) -> dict[str, list[str]] | None:
    """Gemm/MatMul, per-channel Add/Mul, Pad, Flatten/Reshape (None: not one of those)."""
    attrs, c, o = _onnx_attrs(n), w.consts, n.output[0]
    if op in ("Gemm", "MatMul"):
        if n.input[1] not in c:
            raise w.refuse(name, op, "a matrix product with computed weights")
        k = c[n.input[1]].astype(np.float32)
        b = np.zeros(k.shape[-1], np.float32)
        if op == "Gemm":
            if "transB" in attrs and attrs["transB"].i:
                k = k.T
            if (attrs.get("transA") and attrs["transA"].i) or any(
                    key in attrs and attrs[key].f != 1.0 for key in ("alpha", "beta")):
                raise w.refuse(name, op, "transA/alpha/beta")
            b = c[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(k.shape[1])
        walk_dense(w, name, op, ax, k, b)
        return {o: ax}
    if op == "Add" and isinstance(w.layers[-1:] and w.layers[-1], Dense) and ax == ["N", "C"]:
        dense = w.layers[-1]
        bias = next(c[i] for i in n.input if i in c)
        dense.b = f32(dense.b + np.broadcast_to(bias, dense.b.shape))
        return {o: ax}
    if op in ("Add", "Mul", "Pad"):
        return _onnx_affine(w, n, name, op, ax)
    if op == "Reshape" and "D" in ax:  # a bidirectional Y (…, directions, channels) → (…, 2·channels)
        to = [int(v) for v in c[n.input[1]]] if n.input[1] in c else []
        if ax[-2:] != ["D", "C"] or len(to) != len(ax) - 1 or to[-1] not in (-1, w.shape()[-1]):
            raise w.refuse(name, op, f"a reshape of a bidirectional LSTM/GRU's output {ax} other than "
                                     f"merging its directions into the channels")
        return {o: ax[:-2] + ["C"]}
    if op in ("Flatten", "Reshape"):
        if op == "Flatten" and (attrs["axis"].i if "axis" in attrs else 1) != 1:
            raise w.refuse(name, op, "flattening from an axis other than 1")
        if op == "Reshape":
            to = [int(v) for v in c[n.input[1]]] if n.input[1] in c else None
            to = [0 if d == BATCH else d for d in to] if to is not None else None
            if to is not None and len(to) > 2:
                return {o: reshape_merge(w, name, op, ax, to)}
            if to is None or len(to) != 2 or to[0] not in (0, -1) or (
                    to[1] not in (-1, int(np.prod(w.shape())))):
                raise w.refuse(name, op, "a reshape other than to (batch, features)")
        return {o: walk_flatten(w, name, op, ax)}
    return None


def _onnx_batchnorm(w: Walk, n: Any, name: str, op: str, ax: list[str]) -> dict[str, list[str]]:
    """An eval-mode BatchNormalization over axis 1 (the channels) as an Affine:
    ``y = (x - mean) / sqrt(var + eps) · scale + B``."""
    attrs, c, o = _onnx_attrs(n), w.consts, n.output[0]
    if len(n.output) > 1 and any(n.output[1:]) or (attrs.get("training_mode") and attrs["training_mode"].i):
        raise w.refuse(name, op, "training mode (running statistics as outputs)")
    if len(ax) < 2 or ax[1] != "C":
        raise w.refuse(name, op, f"it normalizes axis 1, which holds {ax[1] if len(ax) > 1 else '?'} "
                                 f"here, not the channels")
    if not all(i in c for i in n.input[1:5]):
        raise w.refuse(name, op, "computed statistics")
    g, b, mean, var = (np.asarray(c[i], np.float64) for i in n.input[1:5])
    scale = g / np.sqrt(var + (attrs["epsilon"].f if "epsilon" in attrs else 1e-5))
    walk_affine(w, name, op, scale, b - mean * scale)
    return {o: ax}


def _onnx_layer(w: Walk, n: Any, name: str, op: str, ax: list[str],
                meta: dict[str, bool]) -> dict[str, list[str]]:
    """Conv, pooling, the last step of a sequence, LSTM/GRU; anything else is refused."""
    attrs, c, o = _onnx_attrs(n), w.consts, n.output[0]
    if op == "Conv":
        t = _onnx_spatial(w, name, op, ax)
        wt = c.get(n.input[1])
        if wt is None:
            raise w.refuse(name, op, "a computed kernel")
        groups = attrs["group"].i if "group" in attrs else 1
        k, s, d, pad = _onnx_window(w, name, op, attrs, t, wt.ndim - 2, list(wt.shape[2:]))
        pad, w.pad = (pad[0] + w.pad[0], pad[1] + w.pad[1]), (0, 0)
        kern = ungroup(np.moveaxis(wt.reshape(wt.shape[0], wt.shape[1], k), 2, 0).transpose(0, 2, 1), groups)
        b = c[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(wt.shape[0])
        w.layers.append(Conv1D(name, f32(kern), f32(b), s, d, pad))
        return {o: ax}
    if op == "BatchNormalization":
        return _onnx_batchnorm(w, n, name, op, ax)
    if op in ("MaxPool", "AveragePool"):
        t = _onnx_spatial(w, name, op, ax)
        if len(n.output) > 1 and n.output[1] or (attrs.get("ceil_mode") and attrs["ceil_mode"].i):
            raise w.refuse(name, op, "indices output or ceil_mode")
        k, s, d, pad = _onnx_window(w, name, op, attrs, t, len(ax) - 2, list(attrs["kernel_shape"].ints))
        kind = "max" if op == "MaxPool" else "avg"
        if d != 1 or pad != (0, 0):  # a window with padding or dilation: the 2-D pool over (T, 1, C)
            count = bool(attrs["count_include_pad"].i) if "count_include_pad" in attrs else False
            steps, ch = w.shape()
            w.layers.append(Reshape(f"{name}_rows", (steps, 1, ch)))
            w.layers.append(Pool2D(name, kind, (k, 1), (s, 1), (d, 1), (pad, (0, 0)), count))
            w.layers.append(Reshape(f"{name}_steps", (w.shape()[0], ch)))
            return {o: ax}
        w.layers.append(Pool1D(name, kind, k, s))
        return {o: ax}
    if op in ("GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax"):
        if op.startswith("Global"):
            _onnx_spatial(w, name, op, ax)
            axes, keep = [ax.index("T")], True
        else:
            axes = [a % len(ax) for a in w.const_ints(n, 1, attrs, "axes") or []]
            keep = bool(attrs["keepdims"].i) if "keepdims" in attrs else True
            if [ax[a] for a in axes if ax[a] != "1"] != ["T"]:
                raise w.refuse(name, op, f"reducing axes {axes} of {ax} (only time is)")
        w.layers.append(GlobalPool1D(name, "max" if "Max" in op else "avg"))
        return {o: [("1" if a == "T" else a) for i, a in enumerate(ax) if keep or i not in axes]}
    if op in ("Gather", "Slice"):
        return _onnx_index(w, n, name, op, ax, attrs)
    if op in ("LSTM", "GRU"):
        return _onnx_recurrent(w, n, name, op, ax, attrs, meta)
    if op == "LayerNormalization":
        axis = attrs["axis"].i if "axis" in attrs else -1
        if ax[axis] != "C" or axis % len(ax) != len(ax) - 1 or n.input[1] not in c:
            raise w.refuse(name, op, f"a layer norm over axis {axis} of {ax} (the channels, last, only)")
        ch = w.shape()[-1]
        b = c[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(ch)
        eps = attrs["epsilon"].f if "epsilon" in attrs else 1e-5
        w.layers.append(LayerNorm(name, f32(permuted(w, np.broadcast_to(c[n.input[1]], (ch,)))),
                                  f32(permuted(w, np.broadcast_to(b, (ch,)))), float(eps)))
        return {o: ax}
    raise w.refuse(name, op)


def _onnx_window_2d(w: Walk, name: str, op: str, attrs: dict, shape: tuple[int, ...],
                    kernel: list[int]) -> tuple[tuple, tuple, tuple]:
    """(strides, dilations, ((top, bottom), (left, right))) of a 2-D Conv/Pool; auto_pad's
    SAME_UPPER / SAME_LOWER pad to ceil(in / stride) cells, the odd cell after / before."""
    strides = tuple(attrs["strides"].ints) if "strides" in attrs else (1, 1)
    dil = tuple(attrs["dilations"].ints) if "dilations" in attrs else (1, 1)
    pads = list(attrs["pads"].ints) if "pads" in attrs else [0, 0, 0, 0]
    auto = attrs["auto_pad"].s.decode() if "auto_pad" in attrs else "NOTSET"
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * 4
        for i in range(2):
            total = max((-(-shape[i] // strides[i]) - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - shape[i], 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pads[i], pads[i + 2] = lo, total - lo
    elif auto not in ("NOTSET", "VALID"):
        raise w.refuse(name, op, f"auto_pad {auto}")
    if len(strides) != 2 or len(dil) != 2 or len(pads) != 4 or min(pads) < 0:
        raise w.refuse(name, op, f"strides {strides}, dilations {dil}, pads {pads} (2-D, no negative pads)")
    return strides, dil, ((pads[0], pads[2]), (pads[1], pads[3]))


def _onnx_image(w: Walk, n: Any, name: str, op: str, ax: list[str]) -> dict[str, list[str]] | None:
    """Conv, pooling and reductions over an image's rows and columns (None: not one)."""
    if "Y" not in ax and "X" not in ax:
        return None
    attrs, c, o = _onnx_attrs(n), w.consts, n.output[0]
    if op in ("Conv", "MaxPool", "AveragePool"):
        if ax != ["N", "C", "Y", "X"]:
            raise w.refuse(name, op, f"its input's axes hold {ax}; it takes (batch, channels, rows, cols)")
        if op == "Conv":
            wt = c.get(n.input[1])
            if wt is None or wt.ndim != 4:
                raise w.refuse(name, op, "a computed (or not 2-D) kernel")
            strides, dil, pad = _onnx_window_2d(w, name, op, attrs, w.shape(), list(wt.shape[2:]))
            groups = attrs["group"].i if "group" in attrs else 1
            b = c[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(wt.shape[0])
            k = ungroup(np.asarray(wt, np.float32).transpose(2, 3, 1, 0), groups)
            w.layers.append(Conv2D(name, f32(k), f32(b), strides, dil, pad))
            return {o: ax}
        if len(n.output) > 1 and n.output[1] or (attrs.get("ceil_mode") and attrs["ceil_mode"].i):
            raise w.refuse(name, op, "indices output or ceil_mode")
        size = tuple(attrs["kernel_shape"].ints)
        strides, dil, pad = _onnx_window_2d(w, name, op, attrs, w.shape(), list(size))
        count = bool(attrs["count_include_pad"].i) if "count_include_pad" in attrs else False
        w.layers.append(Pool2D(name, "max" if op == "MaxPool" else "avg", size, strides, dil, pad, count))
        return {o: ax}
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        axes, keep = [ax.index("Y"), ax.index("X")], True
    elif op in ("ReduceMean", "ReduceMax", "ReduceSum"):
        axes = [a % len(ax) for a in w.const_ints(n, 1, attrs, "axes") or []]
        keep = bool(attrs["keepdims"].i) if "keepdims" in attrs else True
    else:
        return None
    return {o: reduce_image(w, name, op, ax, axes, keep)}


def _onnx_affine(w: Walk, n: Any, name: str, op: str, ax: list[str]) -> dict[str, list[str]]:
    """Per-channel Mul/Add by a constant (the batch normalization tf2onnx writes; a bias after
    a Conv or Dense) and a zero Pad of time (before a causal Conv)."""
    c, o = w.consts, n.output[0]
    if op == "Pad" and ("Y" in ax or "X" in ax):
        return {o: _onnx_pad_2d(w, n, name, op, ax)}
    if op == "Pad":
        pads = w.const_ints(n, 1, _onnx_attrs(n), "pads") or []
        mode = _onnx_attrs(n).get("mode")
        value = c.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        r = len(ax)
        if ("T" not in ax or len(pads) != 2 * r or (mode is not None and mode.s != b"constant")
                or (value is not None and np.any(value))
                or any(pads[i] or pads[i + r] for i in range(r) if ax[i] != "T")):
            raise w.refuse(name, op, "padding other than zeros along time")
        t = ax.index("T")
        if pads[t] or pads[t + r]:
            w.layers.append(Pad1D(name, (pads[t], pads[t + r])))  # folded into a Conv after it
        return {o: ax}
    k = [c[i] for i in n.input if i in c]
    if len(k) != 1 or w.perm is not None:
        raise w.refuse(name, op, "an element-wise op on computed operands")
    v = np.asarray(k[0], np.float64)
    v = v.reshape((1,) * (len(ax) - v.ndim) + v.shape)
    if v.ndim != len(ax) or any(d != 1 and a != "C" for d, a in zip(v.shape, ax, strict=True)):
        raise w.refuse(name, op, f"an operand of shape {k[0].shape} over axes {ax} (per channel only)")
    if v.size not in (1, w.shape()[-1]):
        raise w.refuse(name, op, f"an operand of {v.size} values over {w.shape()[-1]} channels")
    v = np.broadcast_to(v.ravel(), (w.shape()[-1],)).astype(np.float64)
    last = w.layers[-1] if w.layers else None
    if op == "Add" and isinstance(last, (Dense, Conv1D, Conv2D)):
        last.b = f32(last.b + v)
    elif op == "Add" and isinstance(last, Affine):
        last.shift = last.shift + v
    else:
        ones, zeros = np.ones_like(v), np.zeros_like(v)
        w.layers.append(Affine(name, v if op == "Mul" else ones, zeros if op == "Mul" else v))
    return {o: ax}


def _onnx_pad_2d(w: Walk, n: Any, name: str, op: str, ax: list[str]) -> list[str]:
    """A Pad of an image's rows and columns: constant (any value), reflect or edge."""
    attrs = _onnx_attrs(n)
    pads = w.const_ints(n, 1, attrs, "pads") or []
    mode = attrs["mode"].s.decode() if "mode" in attrs else "constant"
    if len(n.input) > 2 and n.input[2]:
        if n.input[2] not in w.consts:
            raise w.refuse(name, op, "a computed padding value")
        value = float(np.ravel(w.consts[n.input[2]])[0])
    else:
        value = attrs["value"].f if "value" in attrs else 0.0
    r = len(ax)
    if (len(pads) != 2 * r or mode not in ("constant", "reflect", "edge") or min(pads, default=0) < 0
            or any(pads[i] or pads[i + r] for i in range(r) if ax[i] not in ("Y", "X"))
            or ax != ["N", "C", "Y", "X"] and ax != ["N", "Y", "X", "C"]):
        raise w.refuse(name, op, f"pads {pads} (mode {mode!r}) over axes {ax}: padding of the rows and "
                                 f"columns only, constant/reflect/edge")
    y, x = ax.index("Y"), ax.index("X")
    w.layers.append(Pad2D(name, ((pads[y], pads[y + r]), (pads[x], pads[x + r])), mode, value))
    return ax


def _onnx_index(w: Walk, n: Any, name: str, op: str, ax: list[str], attrs: dict) -> dict[str, list[str]]:
    """The last time step of a recurrent layer's sequence, by Gather (index -1) or Slice."""
    c, o = w.consts, n.output[0]
    steps = w.shape()[0] if "T" in ax else 0
    if op == "Gather":
        axis = (attrs["axis"].i if "axis" in attrs else 0) % len(ax)
        idx = c.get(n.input[1])
        if ax[axis] == "1" and idx is not None and idx.ndim == 0 and int(idx) in (0, -1):
            return {o: [a for i, a in enumerate(ax) if i != axis]}  # Y_h[-1]: one layer
        if ax[axis] != "T" or idx is None or idx.ndim != 0:
            raise w.refuse(name, op, f"gathering along {ax[axis]} (only one time step is)")
        i = int(idx) % steps
        time_slice(w, name, op, i, i + 1, 1, False)
        return {o: [a for i, a in enumerate(ax) if i != axis]}
    starts, ends = (w.const_ints(n, i, attrs, k) for i, k in ((1, "starts"), (2, "ends")))
    axes = w.const_ints(n, 3, attrs, "axes") or list(range(len(starts or [])))
    stepv = w.const_ints(n, 4, attrs, "steps") or [1] * len(axes)
    if starts is None or ends is None or len(axes) != 1 or ax[axes[0] % len(ax)] != "T":
        raise w.refuse(name, op, "slicing other than time")
    time_slice(w, name, op, starts[0], min(ends[0], steps), stepv[0], True)
    return {o: ax}  # x[:, a:a+1] keeps a time axis of one step (a Squeeze drops it)


def _onnx_recurrent(w: Walk, n: Any, name: str, op: str, ax: list[str], attrs: dict,
                    meta: dict[str, bool]) -> dict[str, list[str]]:
    """ONNX LSTM (gates i, o, f, c) / GRU (z, r, h) as a Keras-order :class:`Recurrent`."""
    c = w.consts
    layout = attrs["layout"].i if "layout" in attrs else 0
    if [a for a in ax if a != "1"] != (["T", "N", "C"] if layout == 0 else ["N", "T", "C"]) or "1" in ax:
        raise w.refuse(name, op, f"its input's axes hold {ax}")
    direction = attrs["direction"].s.decode() if "direction" in attrs else "forward"
    if direction not in ("forward", "bidirectional"):
        raise w.refuse(name, op, f"direction {direction!r} (forward or bidirectional only)")
    acts = [a.decode().lower() for a in attrs["activations"].strings] if "activations" in attrs else []
    want = ["sigmoid", "tanh", "tanh"] if op == "LSTM" else ["sigmoid", "tanh"]
    want = want * (2 if direction == "bidirectional" else 1)
    if acts and acts != want:
        raise w.refuse(name, op, f"activations {acts} (tanh/sigmoid only)")
    for key in ("clip", "input_forget"):
        if key in attrs and (attrs[key].f if key == "clip" else attrs[key].i):
            raise w.refuse(name, op, f"{key}")
    ins = list(n.input) + [""] * (8 - len(n.input))
    if ins[4]:
        raise w.refuse(name, op, "sequence_lens (the whole window is run)")
    for i in ins[5:7] + ([ins[7]] if op == "LSTM" else []):
        if i and not _onnx_zero(i, c, meta):
            raise w.refuse(name, op, f"input {i!r}: only a zero initial state (and no peepholes) is compiled")
    if ins[1] not in c or ins[2] not in c:
        raise w.refuse(name, op, "computed weights")
    u = int(attrs["hidden_size"].i)
    g = 4 if op == "LSTM" else 3
    cells = [_onnx_cell(f"{name}_{d}" if direction == "bidirectional" else name, op, attrs,
                        c[ins[1]][d].astype(np.float64), c[ins[2]][d].astype(np.float64),
                        c[ins[3]][d].astype(np.float64) if ins[3] else np.zeros(2 * g * u), u)
             for d in range(2 if direction == "bidirectional" else 1)]
    w.layers.append(Bidirectional(name, *cells) if direction == "bidirectional" else cells[0])
    dirs = "D" if direction == "bidirectional" else "1"  # D: the directions, merged by a Reshape
    y = ["T", dirs, "N", "C"] if layout == 0 else ["N", "T", dirs, "C"]
    out = {n.output[0]: y} if n.output[0] else {}
    if len(n.output) > 1 and n.output[1]:  # Y_h: consumed, it makes the layer return its last state
        out[n.output[1]] = ["1", "N", "H"] if layout == 0 else ["N", "1", "H"]
    return out


def _onnx_cell(name: str, op: str, attrs: dict, wx: np.ndarray, wh: np.ndarray, bias: np.ndarray,
               u: int) -> Recurrent:
    """One direction of an ONNX LSTM/GRU as a Keras-order :class:`Recurrent`."""
    g = 4 if op == "LSTM" else 3
    order = [0, 2, 3, 1] if op == "LSTM" else [0, 1, 2]  # ONNX i,o,f,c → Keras i,f,c,o

    def keras(m: np.ndarray) -> np.ndarray:  # (G·u, …) in ONNX order → (…, G·u) in Keras'
        return np.concatenate([m[j * u:(j + 1) * u] for j in order]).T

    reset_after = True
    if op == "LSTM":
        b = keras(bias[:g * u] + bias[g * u:])
    else:
        reset_after = bool(attrs["linear_before_reset"].i) if "linear_before_reset" in attrs else False
        b = np.stack([bias[:g * u], bias[g * u:]]) if reset_after else bias[:g * u] + bias[g * u:]
    return Recurrent(name, op.lower(), f32(keras(wx)), f32(keras(wh)), f32(b), u, True, reset_after)
