"""torch models (``nn.Sequential``, a torch.export program) as IR layers."""
from __future__ import annotations

from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

from .ir import (
    TORCH_OPS,
    Act,
    Bidirectional,
    Conv1D,
    Conv2D,
    GlobalPool1D,
    Layer,
    LayerNorm,
    Pad1D,
    Pad2D,
    Pool1D,
    Pool2D,
    Recurrent,
    f32,
    first,
    ungroup,
)
from .torch_attention import Fused, find_attention
from .walk import (
    Walk,
    final_axes,
    last_step,
    permuted,
    reduce_image,
    reshape_merge,
    squeeze_time,
    time_slice,
    walk_affine,
    walk_dense,
    walk_flatten,
    walk_merge,
)


def read_torch(obj: Any, target: str, in_shape: tuple[int, ...]) -> list[Layer]:
    """Every torch model is read as the ``torch.export`` program of its forward (what the
    compile worker gets anyway), ``nn.Sequential`` included: one walk that labels each
    tensor's axes, so a module acting on another axis than the channels (``BatchNorm1d`` or
    ``Softmax(dim=1)`` over a (batch, time, channels) input) is refused, not applied to the
    channels."""
    import torch

    if not isinstance(obj, torch.export.ExportedProgram):
        obj = export_module(obj, target, in_shape)
    return _aten(obj, target)


def export_module(obj: Any, target: str, in_shape: tuple[int, ...]) -> Any:
    """``obj`` (an ``nn.Module``, eval mode) as a ``torch.export`` program over a batch of 2;
    what torch.export cannot trace is refused naming the module and torch's reason."""
    import torch

    if not isinstance(obj, torch.nn.Module) or isinstance(obj, torch.jit.ScriptModule):
        raise UnsupportedError(f"{target} reads torch models through torch.export; a "
                               f"{type(obj).__name__} cannot be exported: pass the nn.Module "
                               f"itself (or a .pt2 written by torch.export.save)")
    try:
        return torch.export.export(obj.eval(), (torch.zeros((2, *in_shape)),))
    except Exception as exc:  # torch.export raises a family of its own types (dynamo's)
        why = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise UnsupportedError(f"{target}: torch.export cannot trace module "
                               f"{type(obj).__name__} ({type(exc).__name__}: {why}). Write its "
                               f"forward with the ops {target} takes ({TORCH_OPS})") from None


# -- torch.export programs ---------------------------------------------------------------------
#: torch ops :func:`_aten` takes, as refusals list them.

_ATEN_ACTS = {"aten.relu.default": "relu", "aten.tanh.default": "tanh", "aten.sigmoid.default": "sigmoid",
              "aten.exp.default": "exp", "aten.neg.default": "neg", "aten.sqrt.default": "sqrt"}
#: torch's SELU constants (an ELU scaled)
_SELU = (1.6732632423543772848170429916717, 1.0507009873554804934193349852946)
#: torch ops over (batch, channels, time): an input they read first is channels-first
_CHANNELS_FIRST = {"aten.conv1d.default", "aten.max_pool1d.default", "aten.avg_pool1d.default",
                   "aten.max_pool1d_with_indices.default", "aten.adaptive_avg_pool1d.default",
                   "aten.batch_norm.default", "aten._native_batch_norm_legit_no_training.default",
                   "aten.conv2d.default", "aten.conv2d.padding", "aten.max_pool2d.default",
                   "aten.avg_pool2d.default", "aten.adaptive_avg_pool2d.default"}
#: ops that act on each element alone (the layout is read from the op after them)
_ELEMENTWISE = {*_ATEN_ACTS, "aten.leaky_relu.default", "aten.elu.default", "aten.selu.default",
                "aten.gelu.default", "aten.hardtanh.default", "aten.clamp.default",
                "aten.dropout.default", "aten.clone.default", "aten.contiguous.default"}
#: ops on the input that read only its size
_ATEN_META = {"aten.sym_size.int", "aten.sym_numel.default"}
_ATEN_PASS = {"aten.dropout.default", "aten.alias.default", "aten.clone.default",
              "aten.contiguous.default", "aten.detach.default"}


def _aten(ep: Any, target: str) -> list[Layer]:
    """A ``torch.export`` program whose data flows through one chain of the ops
    :data:`TORCH_OPS` lists (modules' own ``forward`` included: an LSTM's output indexed at
    its last step, transposes to and from Conv1d's channels-first layout), as IR layers.
    Tensors are labelled as in :func:`read_onnx`; anything else is refused naming the op.
    The input's layout as :func:`read_onnx` reads it: from its first op, the other reading
    tried where that one is refused."""
    try:
        return _aten_read(ep, target, None)
    except UnsupportedError as exc:
        for channels_first in (True, False):  # one of them is the reading just refused
            try:
                return _aten_read(ep, target, channels_first)
            except UnsupportedError:
                pass
        raise exc from None


def _aten_read(ep: Any, target: str, channels_first: bool | None) -> list[Layer]:
    sig = ep.graph_signature
    names = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    consts = {p: ep.state_dict[t] for p, t in names.items()}
    consts.update({p: ep.constants[t] for p, t in
                   getattr(sig, "inputs_to_lifted_tensor_constants", {}).items()})
    user = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name not in consts]
    if len(user) != 1:
        raise UnsupportedError(f"{target} compiles torch models with one tensor input")
    in_shape = tuple(int(d) for d in user[0].meta["val"].shape[1:])
    if len(in_shape) not in (1, 2, 3):
        raise UnsupportedError(f"{target} compiles torch models over (batch, features), (batch, "
                               f"time, channels) or (batch, channels, rows, cols) inputs; this one "
                               f"takes {in_shape}")
    w = Walk(target, {}, in_shape)
    w.kind, w.supported = "torch op", TORCH_OPS
    data: dict[Any, list[str]] = {user[0]: _input_labels(w, ep, user[0], in_shape, channels_first)}
    meta: dict[Any, bool] = {}
    prev: set[Any] = {user[0]}
    w.put(user[0])
    rec: Any = None  # the last recurrent node, whose getitems are its outputs
    live = _live(ep)
    fused = find_attention(ep, target, consts, live)
    inside = {m for f in fused for m in f.nodes}
    ends = {f.end: f for f in fused}
    for n in ep.graph.nodes:
        if n in inside or (n.op == "call_function" and n not in live):
            if n in ends:
                data[n] = _aten_attention(w, ends[n], data)
                prev = {n}
            continue
        if n.op != "call_function":
            _aten_output(w, n, data)
            continue
        op = str(n.target)
        flat = [a for a in _aten_flat(n.args) if hasattr(a, "op")]
        din = [a for a in flat if a in data]
        if op in ("aten.sym_size.int", "aten.sym_numel.default"):  # the dynamic batch's size
            din = []
        if not din and op != "<built-in function getitem>":
            meta[n] = op in ("aten.zeros.default", "aten.zeros_like.default", "aten.new_zeros.default")
            continue
        if op == "<built-in function getitem>":
            data[n] = _aten_getitem(w, n, rec)
            prev.add(n)
            w.put(n)
            continue
        cat = op == "aten.cat.default" and len(din) >= 2  # branches from one tensor
        if cat or (op in ("aten.add.Tensor", "aten.add_.Tensor") and len(din) == 2):
            data[n] = _aten_cat(w, n, op, din, data) if cat else _aten_residual(w, n, op, din, data)
            prev = {n}
            continue
        if len(din) != 1 or any(a in data for a in flat if a is not din[0]):
            raise w.refuse(n.name, op, "the graph is not a chain of single-input ops or residual adds")
        w.enter(din[0], n.name, op)
        ax = list(data[din[0]])
        if "cell" in ax:
            raise w.refuse(n.name, op, "an LSTM's cell state (only its output or h_n is compiled)")
        if "H" in ax:
            last_step(w, n.name, op)
            ax = ["C" if a == "H" else a for a in ax]
        data[n] = _aten_node(w, n, op, ax, consts, meta)
        prev = {n}
        w.put(n)
        if op in ("aten.lstm.input", "aten.gru.input"):
            rec = n
    return w.main()


def _input_labels(w: Walk, ep: Any, x: Any, in_shape: tuple[int, ...],
                  channels_first: bool | None = None) -> list[str]:
    """The input's axes: (batch, features), (batch, time, channels), or channels-first when
    the first op reading it takes channels on dim 1 (Conv1d, pooling, BatchNorm1d): the
    model's own layout, read from its op."""
    if len(in_shape) == 1:
        return ["N", "C"]
    if channels_first is not None:  # the reading asked for
        return (w.channels_first(x, "input") if channels_first else
                ["N", "T", "C"] if len(in_shape) == 2 else ["N", "Y", "X", "C"])
    first, value = None, x
    while first is None or first in _ELEMENTWISE or first == "pad":
        # the layout: the first op after element-wise ones and a pad of other axes than the
        # last (channels-last, that would be the channels: a pad of it reads channels-first)
        node = next((n for n in ep.graph.nodes if n.op == "call_function"
                     and value in _aten_flat(n.args) and str(n.target) not in _ATEN_META), None)
        if node is None:
            break
        first, value = str(node.target), node
        if first in ("aten.pad.default", "aten.constant_pad_nd.default"):
            first = "channels-first" if any(list(node.args[1])[:2]) else "pad"
        elif first == "aten.cat.default" and len(node.args) > 1 and node.args[1] % (len(in_shape) + 1) == 1:
            first = "channels-first"  # joined on dim 1: the channels, as an inception module's
    if first in _CHANNELS_FIRST or first == "channels-first":
        return w.channels_first(x, "input")
    return ["N", "T", "C"] if len(in_shape) == 2 else ["N", "Y", "X", "C"]


def _live(ep: Any) -> set[Any]:
    """The nodes the program's output depends on (MultiheadAttention's averaged attention
    weights, computed and dropped by a ``[0]``, are not)."""
    out = [n for n in ep.graph.nodes if n.op == "output"]
    live, todo = set(), list(out)
    while todo:
        n = todo.pop()
        if n not in live:
            live.add(n)
            todo.extend(n.all_input_nodes)
    return live


def _aten_output(w: Walk, n: Any, data: dict) -> None:
    """The program's output node: it must be the main chain's tip, laid out as the IR's."""
    if n.op != "output":
        return
    out = n.args[0][0] if isinstance(n.args[0], (list, tuple)) else n.args[0]
    if not (w.branches.tip(out) and w.branches.at[out][0] == 0):
        raise UnsupportedError(f"{w.target}: the torch output is not the end of the op chain")
    final_axes(w, data[out])


def _aten_attention(w: Walk, f: Fused, data: dict) -> list[str]:
    """A fused self-attention (:mod:`.torch_attention`) over data value ``f.x``."""
    op = "aten.scaled_dot_product_attention.default"
    ax = data.get(f.x)
    if ax is None or sorted(ax) != ["C", "N", "T"] or ax[2] != "C" or ax[f.seq_axis] != "T":
        raise w.refuse(f.layer.name, op, f"self-attention over axes {ax} (it runs over time, of "
                                         f"a (batch, time, channels) tensor)")
    w.enter(f.x, f.layer.name, op)
    w.layers.append(f.layer)
    w.put(f.end)
    return f.labels(ax)


def _aten_residual(w: Walk, n: Any, op: str, din: list[Any], data: dict) -> list[str]:
    """``a + b`` of two data values: a residual add (:class:`Residual`)."""
    if data[din[0]] != data[din[1]] or n.kwargs.get("alpha", 1) != 1 or len(n.args) > 2:
        raise w.refuse(n.name, op, f"an add of tensors laid out {data[din[0]]} and {data[din[1]]} "
                                   f"(or scaled by alpha)")
    w.merge(din[0], din[1], n.name, op)
    w.put(n)
    return list(data[din[0]])


def _aten_cat(w: Walk, n: Any, op: str, din: list[Any], data: dict) -> list[str]:
    """``torch.cat`` of data values on the channels: a :class:`Concat` of branches."""
    parts = n.args[0]
    ax = data[din[0]]
    dim = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % len(ax)
    if len(parts) != len(din) or any(data[d] != ax for d in din) or ax[dim] != "C":
        raise w.refuse(n.name, op, f"a concatenation of {len(parts)} tensors (axes {ax}) on dim {dim}: "
                                   f"it takes data tensors laid out alike, joined on the channels")
    w.concat(list(parts), n.name, op)
    w.put(n)
    return list(ax)


def _aten_getitem(w: Walk, n: Any, rec: Any) -> list[str]:
    """The labels of ``lstm(...)[i]``: the output sequence, h_n (its last state), c_n."""
    if n.args[0] is not rec:
        raise w.refuse(n.name, str(n.target), "indexing a tuple that is not an LSTM/GRU's output")
    i = int(n.args[1])
    if i == 0:
        return ["N", "T", "C"] if rec.args[8] else ["T", "N", "C"]
    if i == 1 and rec.args[7]:
        return ["B", "N", "H"]  # refused where it is read (_aten_time)
    if i == 1 and rec.args[4] > 1:
        w.stacked = int(rec.args[4])
        return ["S", "N", "H"]  # h_n of every layer: h_n[-1] is the last layer's
    return ["1", "N", "H"] if i == 1 else ["cell"]


def _aten_flat(args: Any) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out += _aten_flat(a) if isinstance(a, (list, tuple)) else [a]
    return out


def _aten_node(w: Walk, n: Any, op: str, ax: list[str], consts: dict, meta: dict) -> list[str]:
    """Append the IR layers of aten node ``n``; its output's labels."""
    args, name = list(n.args), n.name

    def t(a: Any) -> np.ndarray | None:
        return None if a is None else consts[a.name].detach().cpu().numpy().astype(np.float64)

    if op in _ATEN_PASS:
        if op == "aten.dropout.default" and args[2]:
            raise w.refuse(name, op, "dropout in training mode")
        return ax
    if op in _ATEN_ACTS:
        w.layers.append(Act(name, _ATEN_ACTS[op]))
        return ax
    if op == "aten.leaky_relu.default":
        w.layers.append(Act(name, "leaky_relu", float(args[1]) if len(args) > 1 else 0.01))
        return ax
    got = _aten_param_act(w, n, op, ax, args, t)
    if got is not None:
        w.layers.append(got)
        return ax
    if op in ("aten.softmax.int", "aten._softmax.default", "aten.log_softmax.int",
              "aten._log_softmax.default"):
        if ax[args[1]] != "C" or (w.perm is not None and ax != ["N", "C"]):
            raise w.refuse(name, op, f"softmax over dim {args[1]} (holding {ax[args[1]]}), not the channels")
        w.layers.append(Act(name, "log_softmax" if "log" in op else "softmax"))
        return ax
    if op == "aten.linear.default":
        k = t(args[1]).T
        b = t(args[2]) if len(args) > 2 and args[2] is not None else np.zeros(k.shape[1])
        walk_dense(w, name, op, ax, k, b)
        return ax
    if op in _ATEN_DESK:
        return _aten_desk(w, n, op, ax, t)
    if op == "aten.batch_norm.default":
        if args[5]:
            raise w.refuse(name, op, "batch norm in training mode (call .eval() before exporting)")
        if ax[1] != "C":
            held = {"T": "time", "1": "a singleton"}.get(ax[1], ax[1])
            raise w.refuse(name, op, f"BatchNorm1d normalizes dim 1, which holds {held} here, not "
                                     f"the channels: transpose to (batch, channels, time) first")
        wt, bt, mean, var = (t(a) for a in args[1:5])
        scale = (wt if wt is not None else 1.0) / np.sqrt(var + float(args[7]))
        shift = (bt if bt is not None else 0.0) - mean * scale
        walk_affine(w, name, op, scale, shift)
        return ax
    return _aten_layout(w, n, op, ax, t, meta)


def _aten_param_act(w: Walk, n: Any, op: str, ax: list[str], args: list[Any], t: Any) -> Act | None:
    """ELU, SELU, Softplus, Hardtanh/ReLU6/clamp, Hardsigmoid, PReLU as an :class:`Act`
    (None: not one of these)."""
    name = n.name

    def arg(i: int, key: str, default: Any) -> Any:
        v = n.kwargs.get(key, args[i] if len(args) > i else default)
        return default if v is None else v

    if op == "aten.elu.default":
        if float(arg(3, "input_scale", 1.0)) != 1.0:
            raise w.refuse(name, op, "an ELU with input_scale other than 1")
        return Act(name, "elu", float(arg(1, "alpha", 1.0)), float(arg(2, "scale", 1.0)))
    if op == "aten.selu.default":
        return Act(name, "elu", *_SELU)
    if op == "aten.softplus.default":
        return Act(name, "softplus", float(arg(1, "beta", 1.0)), float(arg(2, "threshold", 20.0)))
    if op in ("aten.hardtanh.default", "aten.clamp.default"):
        lo, hi = (arg(1, "min", -1.0), arg(2, "max", 1.0)) if "hardtanh" in op else \
            (arg(1, "min", -np.inf), arg(2, "max", np.inf))
        if hasattr(lo, "op") or hasattr(hi, "op"):
            raise w.refuse(name, op, "a clamp to tensor bounds (it takes numbers)")
        return Act(name, "clip", float(lo), float(hi))
    if op == "aten.hardsigmoid.default":
        return Act(name, "hard_sigmoid", 1.0 / 6.0, 0.5)
    if op == "aten.prelu.default":
        s = np.asarray(t(args[1]), np.float64).ravel()
        if s.size > 1 and (len(ax) < 2 or ax[1] != "C" or w.perm is not None):
            raise w.refuse(name, op, f"a PReLU of {s.size} slopes over dim 1, which holds "
                                     f"{ax[1] if len(ax) > 1 else '?'} here (it takes one slope, "
                                     f"or one per channel)")
        return Act(name, "prelu", slope=s)
    return None


def _aten_layout(w: Walk, n: Any, op: str, ax: list[str], t: Any, meta: dict) -> list[str]:
    """Ops that move axes, flatten, Conv1d."""
    args, name = list(n.args), n.name
    if op == "aten.transpose.int":
        out = list(ax)
        a, b = args[1] % len(ax), args[2] % len(ax)
        out[a], out[b] = ax[b], ax[a]
        return out
    if op == "aten.permute.default":
        return [ax[i] for i in args[1]]
    if op == "aten.unsqueeze.default":
        out = list(ax)
        out.insert(args[1] % (len(ax) + 1), "1")
        return out
    if op in ("aten.squeeze.dim", "aten.squeeze.dims"):
        dims = [d % len(ax) for d in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]])]
        return squeeze_time(w, name, op, ax, dims)
    if op in ("aten.flatten.using_ints", "aten.view.default", "aten.reshape.default"):
        if op == "aten.flatten.using_ints":
            start = (args[1] if len(args) > 1 else 0) % len(ax)
            end = (args[2] if len(args) > 2 else -1) % len(ax)
            if start != 1 or end != len(ax) - 1:
                return walk_merge(w, name, op, ax, start, end + 1)
            ok = True
        else:
            shp = args[1]
            if len(shp) > 2 and all(isinstance(d, int) for d in shp):
                return reshape_merge(w, name, op, ax, list(shp), batch=2)  # traced at batch 2
            ok = len(shp) == 2 and (shp[1] == -1 or shp[1] == int(np.prod(w.shape())))
        if not ok:
            raise w.refuse(name, op, "a reshape other than to (batch, features), or merging adjacent axes")
        return walk_flatten(w, name, op, ax)
    if op in ("aten.conv1d.default", "aten.conv1d.padding"):
        return _aten_conv(w, n, op, ax, t)
    if op in ("aten.conv2d.default", "aten.conv2d.padding"):
        return _aten_conv2d(w, n, op, ax, t)
    return _aten_pool(w, n, op, ax, t, meta)


def _aten_conv2d(w: Walk, n: Any, op: str, ax: list[str], t: Any) -> list[str]:
    """``conv2d(x, weight, bias, stride, padding, dilation, groups)`` over (N, C, H, W)."""
    args, name = list(n.args) + [None] * 7, n.name
    if ax != ["N", "C", "Y", "X"]:
        raise w.refuse(name, op, f"its input's axes hold {ax}; Conv2d takes (batch, channels, rows, cols)")
    wt = t(args[1])
    stride, dil = _two(args[3] or 1), _two(args[5] or 1)
    groups = args[6] or 1
    kh, kw = wt.shape[2:]
    if isinstance(args[4], str):
        if args[4] == "same" and stride != (1, 1):
            raise w.refuse(name, op, "padding 'same' with stride > 1")
        pads = [((k - 1) * d // 2, (k - 1) * d - (k - 1) * d // 2) if args[4] == "same" else (0, 0)
                for k, d in ((kh, dil[0]), (kw, dil[1]))]
        pad = (pads[0], pads[1])
    else:
        ph, pw = _two(args[4] or 0)
        pad = ((ph, ph), (pw, pw))
    b = t(args[2]) if args[2] is not None else np.zeros(wt.shape[0])
    w.layers.append(Conv2D(name, f32(ungroup(wt.transpose(2, 3, 1, 0), groups)), f32(b), stride, dil, pad))
    return ax


def _two(v: Any) -> tuple[int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return (int(v[0]), int(v[-1]))


def _aten_pool2d(w: Walk, n: Any, op: str, ax: list[str]) -> list[str]:
    """``max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)`` / ``avg_pool2d(x, kernel,
    stride, padding, ceil_mode, count_include_pad, divisor_override)``; ``adaptive_avg_pool2d``
    to one cell."""
    args, name = list(n.args) + [None] * 7, n.name
    if ax != ["N", "C", "Y", "X"]:
        raise w.refuse(name, op, f"its input's axes hold {ax}; it takes (batch, channels, rows, cols)")
    if op == "aten.adaptive_avg_pool2d.default":
        if _two(args[1]) != (1, 1):
            raise w.refuse(name, op, "an adaptive pool to other than one cell")
        return reduce_image(w, name, op, ax, [2, 3], True)
    k = _two(args[1])
    s = _two(args[2]) if args[2] else k
    ph, pw = _two(args[3] or 0)
    mx = "max" in op
    dil = _two(args[4] or 1) if mx else (1, 1)
    ceil = args[5] if mx else args[4]
    count = bool(True if args[5] is None else args[5]) if not mx else False
    if ceil or (not mx and args[6] is not None):
        raise w.refuse(name, op, "ceil_mode or divisor_override")
    w.layers.append(Pool2D(name, "max" if mx else "avg", k, s, dil, ((ph, ph), (pw, pw)), count))
    return ax


def _aten_pool(w: Walk, n: Any, op: str, ax: list[str], t: Any, meta: dict) -> list[str]:
    """Pooling, the last step of a sequence, LSTM/GRU; anything else is refused."""
    args, name = list(n.args), n.name
    if op in ("aten.max_pool2d.default", "aten.avg_pool2d.default", "aten.adaptive_avg_pool2d.default"):
        return _aten_pool2d(w, n, op, ax)
    if op in ("aten.mean.dim", "aten.amax.default") and ("Y" in ax or "X" in ax):
        dims = [d % len(ax) for d in args[1]]
        return reduce_image(w, name, "ReduceMean" if "mean" in op else "ReduceMax", ax, dims,
                            bool(args[2]) if len(args) > 2 else False)
    if op in ("aten.max_pool1d.default", "aten.avg_pool1d.default"):
        if ax != ["N", "C", "T"]:
            raise w.refuse(name, op, f"its input's axes hold {ax}; it takes (batch, channels, time)")
        k = first(args[1])
        s = first(args[2]) if len(args) > 2 and args[2] else k
        pad = first(args[3]) if len(args) > 3 else 0
        rest = args[4:] if op.startswith("aten.max") else args[4:5]
        if pad or (op.startswith("aten.max") and len(args) > 4 and first(args[4]) != 1) or any(
                a is True for a in rest):
            raise w.refuse(name, op, "padding, dilation or ceil_mode")
        w.layers.append(Pool1D(name, "max" if "max" in op else "avg", k, s))
        return ax
    if op == "aten.adaptive_avg_pool1d.default":
        if ax != ["N", "C", "T"] or first(args[1]) != 1:
            raise w.refuse(name, op, "an adaptive pool to other than one step")
        w.layers.append(GlobalPool1D(name, "avg"))
        return ["N", "C", "1"]
    if op in ("aten.mean.dim", "aten.amax.default"):
        dims = [d % len(ax) for d in args[1]]
        keep = bool(args[2]) if len(args) > 2 else False
        if [ax[d] for d in dims] != ["T"]:
            raise w.refuse(name, op, f"reducing dims {dims} of {ax} (only time is)")
        w.layers.append(GlobalPool1D(name, "avg" if "mean" in op else "max"))
        return [("1" if a == "T" else a) for i, a in enumerate(ax) if keep or i not in dims]
    if op == "aten.select.int" and ax[args[1] % len(ax)] == "1" and args[2] in (0, -1):
        return [a for i, a in enumerate(ax) if i != args[1] % len(ax)]  # h_n[-1]: one layer
    if op in ("aten.select.int", "aten.slice.Tensor"):
        return _aten_time(w, n, op, ax)
    if op in ("aten.lstm.input", "aten.gru.input"):
        return _aten_recurrent(w, n, op, ax, t, meta)
    raise w.refuse(name, op)


_ATEN_DESK = {"aten.gelu.default", "aten.pad.default", "aten.constant_pad_nd.default",
              "aten.layer_norm.default"}


def _aten_desk(w: Walk, n: Any, op: str, ax: list[str], t: Any) -> list[str]:
    """GELU, zero padding of time, LayerNorm over the channels."""
    args, name = list(n.args), n.name
    if op == "aten.gelu.default":
        approx = n.kwargs.get("approximate", args[1] if len(args) > 1 else "none")
        w.layers.append(Act(name, "gelu_tanh" if approx == "tanh" else "gelu"))
        return ax
    if op in ("aten.pad.default", "aten.constant_pad_nd.default"):
        return _aten_pad(w, n, op, ax)
    if ax[-1] != "C" or len(args[1]) != 1:
        raise w.refuse(name, op, f"a layer norm over {list(args[1])} of axes {ax} (the channels only)")
    c = w.shape()[-1]
    g = t(args[2]) if len(args) > 2 and args[2] is not None else np.ones(c)
    b = t(args[3]) if len(args) > 3 and args[3] is not None else np.zeros(c)
    g, b = permuted(w, g), permuted(w, b)
    w.layers.append(LayerNorm(name, f32(g), f32(b), float(args[4]) if len(args) > 4 else 1e-5))
    return ax


def _aten_time(w: Walk, n: Any, op: str, ax: list[str]) -> list[str]:
    """``x[:, i]`` / ``x[..., a:b]`` along time (:class:`TimeSlice`; the last step of an
    LSTM/GRU's sequence becomes its last state)."""
    args, name = list(n.args) + [None] * 4, n.name
    dim = args[1] % len(ax)
    if ax[dim] == "B":
        raise w.refuse(name, op, "h_n of a bidirectional LSTM/GRU (its last entry is the backward "
                                 "state at step 0): take output[:, -1] instead")
    if op == "aten.select.int" and ax[dim] == "S" and args[2] % w.stacked == w.stacked - 1:
        return ax[:dim] + ax[dim + 1:]  # h_n[-1]: the last layer's last state
    if op == "aten.slice.Tensor" and args[2] in (None, 0) and args[4] in (None, 1) and (
            args[3] is None or args[3] >= 2 ** 62):
        return ax  # x[:] of any axis (torch.export writes them over a dynamic batch)
    if ax[dim] != "T":
        raise w.refuse(name, op, f"indexing axis {dim} (holding {ax[dim]}; only time is indexed)")
    steps = w.shape()[0]
    if op == "aten.select.int":
        i = args[2] % steps
        time_slice(w, name, op, i, i + 1, 1, False)
        return [a for j, a in enumerate(ax) if j != dim]
    start = 0 if args[2] is None else args[2]
    stop = steps if args[3] is None else min(args[3], steps)
    time_slice(w, name, op, start, stop, 1 if args[4] is None else args[4], True)
    return ax  # x[:, a:a+1] keeps a time axis of one step (a squeeze drops it)


def _aten_pad(w: Walk, n: Any, op: str, ax: list[str]) -> list[str]:
    """``F.pad`` with zeros along time (:class:`Pad1D`, folded into the Conv1d after it); of
    an image's rows and columns constant, reflect or replicate (:class:`Pad2D`)."""
    args = list(n.args) + [None] * 3
    pads = list(args[1])
    mode = n.kwargs.get("mode", args[2] if op == "aten.pad.default" else "constant")
    value = n.kwargs.get("value", args[3] if op == "aten.pad.default" else args[2])
    if "Y" in ax or "X" in ax:
        return _aten_pad2d(w, n, op, ax, pads, mode or "constant", value)
    pairs = {len(ax) - 1 - k: (pads[2 * k], pads[2 * k + 1]) for k in range(len(pads) // 2)}
    if (mode or "constant") != "constant" or value not in (None, 0, 0.0) or any(
            p != (0, 0) for d, p in pairs.items() if ax[d] != "T") or min(pads, default=0) < 0:
        raise w.refuse(n.name, op, f"padding {pads} (mode {mode!r}, value {value}) over axes {ax}: "
                                   f"only zero padding of time is compiled")
    t = ax.index("T") if "T" in ax else -1
    if t in pairs and pairs[t] != (0, 0):
        w.layers.append(Pad1D(n.name, pairs[t]))
    return ax


def _aten_pad2d(w: Walk, n: Any, op: str, ax: list[str], pads: list[int], mode: str,
                value: Any) -> list[str]:
    pairs = {len(ax) - 1 - k: (pads[2 * k], pads[2 * k + 1]) for k in range(len(pads) // 2)}
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}
    if (mode not in modes or min(pads, default=0) < 0 or ax not in (["N", "C", "Y", "X"], ["N", "Y", "X", "C"])
            or any(p != (0, 0) for d, p in pairs.items() if ax[d] not in ("Y", "X"))):
        raise w.refuse(n.name, op, f"padding {pads} (mode {mode!r}) over axes {ax}: padding of the rows "
                                   f"and columns only, constant/reflect/replicate")
    y, x = ax.index("Y"), ax.index("X")
    w.layers.append(Pad2D(n.name, (pairs.get(y, (0, 0)), pairs.get(x, (0, 0))), modes[mode],
                          float(value or 0.0)))
    return ax


def _aten_conv(w: Walk, n: Any, op: str, ax: list[str], t: Any) -> list[str]:
    args, name = list(n.args) + [None] * 7, n.name
    if ax != ["N", "C", "T"]:
        raise w.refuse(name, op, f"its input's axes hold {ax}; Conv1d takes (batch, channels, time): "
                                 f"transpose a (batch, time, channels) input first")
    wt = t(args[1])
    s, d, groups = first(args[3] or 1), first(args[5] or 1), args[6] or 1
    k = wt.shape[2]
    span = (k - 1) * d
    if isinstance(args[4], str):
        if args[4] == "same" and s != 1:
            raise w.refuse(name, op, "padding 'same' with stride > 1")
        pad = (span // 2, span - span // 2) if args[4] == "same" else (0, 0)
    else:
        p = first(args[4] or 0)
        pad = (p, p)
    b = t(args[2]) if args[2] is not None else np.zeros(wt.shape[0])
    w.layers.append(Conv1D(name, f32(ungroup(wt.transpose(2, 1, 0), groups)), f32(b), s, d, pad))
    return ax


def _aten_recurrent(w: Walk, n: Any, op: str, ax: list[str], t: Any, meta: dict) -> list[str]:
    """``aten.lstm.input(x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
    batch_first)`` (gates i, f, g, o: Keras' order) / ``aten.gru`` (r, z, n → Keras z, r, h)."""
    x, hx, params, has_bias, layers, _, train, bidir, batch_first = n.args
    name, cell = n.name, "lstm" if "lstm" in op else "gru"
    if train:
        raise w.refuse(name, op, "training mode")
    if ax != (["N", "T", "C"] if batch_first else ["T", "N", "C"]):
        raise w.refuse(name, op, f"its input's axes hold {ax}")
    for h in hx if isinstance(hx, (list, tuple)) else [hx]:
        if not meta.get(h, False):
            raise w.refuse(name, op, "an initial state other than zeros")
    per = 4 if has_bias else 2
    dirs = 2 if bidir else 1
    if len(params) != per * layers * dirs:
        raise w.refuse(name, op, "proj_size (a projected LSTM)")
    for i in range(layers):  # params: layer 0 forward, [layer 0 reverse], layer 1 forward, …
        sides = [_torch_cell(f"{name}_{i}_{d}", cell, params[(i * dirs + d) * per:(i * dirs + d + 1) * per],
                             has_bias, t) for d in range(dirs)]
        w.layers.append(Bidirectional(f"{name}_{i}", *sides) if bidir else sides[0])
    return ["tuple"]


def _torch_cell(name: str, cell: str, params: list[Any], has_bias: bool, t: Any) -> Recurrent:
    """One direction of one layer of a torch LSTM/GRU as a Keras-order :class:`Recurrent`."""
    g = 4 if cell == "lstm" else 3
    wi, wh = t(params[0]), t(params[1])
    u = wh.shape[1]
    bi, bh = (t(params[2]), t(params[3])) if has_bias else (np.zeros(g * u), np.zeros(g * u))
    order = [0, 1, 2, 3] if cell == "lstm" else [1, 0, 2]

    def keras(m: np.ndarray) -> np.ndarray:
        return np.concatenate([m[j * u:(j + 1) * u] for j in order]).T

    b = keras(bi + bh) if cell == "lstm" else np.stack([keras(bi), keras(bh)])
    return Recurrent(name, cell, f32(keras(wi)), f32(keras(wh)), f32(b), u, True, True)
