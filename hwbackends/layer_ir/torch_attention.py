"""Self-attention in a torch.export program as one :class:`Attention` layer.

torch.export writes ``nn.MultiheadAttention`` (and ``nn.TransformerEncoderLayer``'s attention)
as a packed in-projection, reshapes and transposes into heads, ``aten.scaled_dot_product_attention``,
reshapes back and the out-projection; a hand-written attention writes the same shape with three
Linears. Rather than match any one spelling, the reader finds each SDPA node, walks back from
q, k and v through pure layout ops to a Linear and forward through layout ops to a Linear, and
*runs* those layout ops on index tensors: which projected channel of which time step and sample
each head reads, and which head channel each out-projection input is. Only a graph whose maps
are exactly per-head self-attention over time (every sample alike, keys in time order) is
fused; causal attention (SDPA's ``is_causal=True``) is the layer's ``causal``; anything else is
refused naming what it is (a mask tensor, cross-attention).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

from .ir import Attention, f32

SDPA = "aten.scaled_dot_product_attention.default"
_LINEAR = "aten.linear.default"
#: ops that only move or regroup elements: run on index tensors to learn where each comes from
_LAYOUT = {
    "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
    "aten.transpose.int", "aten.permute.default", "aten.unflatten.int",
    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
    "aten.contiguous.default", "aten.clone.default", "aten.alias.default", "aten.t.default",
    "aten.select.int", "aten.split.Tensor", "aten.split_with_sizes.default",
    "aten.chunk.default", "aten.unbind.int", "<built-in function getitem>",
}


@dataclass
class Fused:
    """One self-attention of the graph: its input value, the node standing for its output
    (laid out like the input or with batch and time swapped), the nodes it replaces, and the
    layer (``labels(x_labels)`` gives the output node's axes from the input's)."""

    x: Any
    end: Any
    nodes: set[Any]
    layer: Attention
    seq_axis: int  # which of x's first two axes the attention runs over (time)
    end_swapped: bool  # the output node holds x's first two axes swapped

    def labels(self, ax: list[str]) -> list[str]:
        """The output node's axes, given the input's (batch and time in either order)."""
        batch, time = ax[1 - self.seq_axis], ax[self.seq_axis]
        return [time, batch, ax[2]] if self.end_swapped else [batch, time, ax[2]]


@dataclass
class _Side:
    """One of q, k, v traced back to its projection: the Linear, the layout nodes between,
    and per head (rank within a sample) the projected channels it reads."""

    linear: Any
    path: list[Any] = field(default_factory=list)


def find_attention(ep: Any, target: str, consts: dict, live: set[Any]) -> list[Fused]:
    """Every SDPA node of ``ep`` and every explicit ``softmax(q·kᵀ·s)·v`` (what
    ``nn.MultiheadAttention`` writes with ``need_weights=True``) among the ``live`` nodes (those
    the output depends on), fused as described in the module docstring; refused when one is
    not plain self-attention."""
    order = {n: i for i, n in enumerate(ep.graph.nodes)}
    found = []
    for n in ep.graph.nodes:
        if n.op != "call_function" or n not in live:
            continue
        if str(n.target) == SDPA:
            qkv, scale, causal = _sdpa(n, target)
            found.append(_build(n, n, qkv, scale, {n}, target, consts, order, live, causal))
        elif str(n.target) in _SOFTMAX and _masked_scores(n):
            raise _refuse(target, n, "attention scores with a mask tensor added (attn_mask with "
                                     "need_weights=True); causal attention is compiled as "
                                     "nn.MultiheadAttention(..., attn_mask=mask, is_causal=True, "
                                     "need_weights=False) or F.scaled_dot_product_attention(..., "
                                     "is_causal=True)")
        elif str(n.target) in _SOFTMAX and (m := _explicit(n, live)) is not None:
            found.append(_build(n, *m, target, consts, order, live))
    return found


_SOFTMAX = {"aten.softmax.int", "aten._softmax.default"}
_MATMUL = {"aten.bmm.default", "aten.matmul.default"}


def _masked_scores(p: Any) -> bool:
    """Softmax node ``p`` over ``mask + q·kᵀ`` (``baddbmm``: what ``nn.MultiheadAttention``
    writes for an ``attn_mask`` when it returns the weights)."""
    s = p.args[0]
    while str(getattr(s, "target", "")) in ("aten.mul.Tensor", "aten.div.Tensor"):
        s = s.args[0]
    return str(getattr(s, "target", "")) == "aten.baddbmm.default"


def _explicit(p: Any, live: set[Any]) -> tuple[Any, list[Any], float | None, set[Any]] | None:
    """``softmax(q @ kᵀ · s, -1) @ v`` around softmax node ``p``: (the product with v, [q, k, v],
    s or None, the nodes of the pattern); None where ``p`` is not one (the walk then takes or
    refuses its ops one by one)."""
    nd = len(p.meta["val"].shape)
    users = [u for u in p.users if u in live]
    if p.args[1] % nd != nd - 1 or len(users) != 1 or str(users[0].target) not in _MATMUL:
        return None
    out, nodes, scale = users[0], {p, users[0]}, 1.0
    if out.args[0] is not p:
        return None
    s = p.args[0]
    while str(getattr(s, "target", "")) in ("aten.mul.Tensor", "aten.div.Tensor") and isinstance(
            s.args[1], (int, float)):
        scale *= s.args[1] if "mul" in str(s.target) else 1.0 / s.args[1]
        nodes.add(s)
        s = s.args[0]
    if str(getattr(s, "target", "")) not in _MATMUL:
        return None
    nodes.add(s)
    q, kt = s.args[:2]
    while str(getattr(q, "target", "")) in ("aten.mul.Tensor", "aten.div.Tensor") and isinstance(
            q.args[1], (int, float)):
        scale *= q.args[1] if "mul" in str(q.target) else 1.0 / q.args[1]
        nodes.add(q)
        q = q.args[0]
    if str(getattr(kt, "target", "")) != "aten.transpose.int" or sorted(
            a % nd for a in kt.args[1:3]) != [nd - 2, nd - 1]:
        return None
    nodes.add(kt)
    return out, [q, kt.args[0], out.args[1]], scale, nodes


def _sdpa(n: Any, target: str) -> tuple[list[Any], float | None, bool]:
    """An SDPA node's q, k, v, scale and ``is_causal``; a mask tensor, dropout, GQA refused."""
    args = list(n.args) + [None] * 4
    kw = dict(n.kwargs)
    mask = kw.get("attn_mask", args[3])
    dropout = kw.get("dropout_p", args[4] if args[4] is not None else 0.0)
    causal = kw.get("is_causal", args[5] if args[5] is not None else False)
    if mask is not None:
        raise _refuse(target, n, "attention with a mask tensor (attn_mask / key_padding_mask); "
                                 "causal attention written as is_causal=True is compiled "
                                 "(F.scaled_dot_product_attention(..., is_causal=True), or "
                                 "nn.MultiheadAttention with attn_mask, is_causal=True and "
                                 "need_weights=False)")
    if dropout:
        raise _refuse(target, n, f"attention dropout {dropout} (training mode)")
    if kw.get("enable_gqa"):
        raise _refuse(target, n, "grouped-query attention (enable_gqa)")
    scale = kw.get("scale", args[6] if len(args) > 6 else None)
    return list(args[:3]), None if scale is None else float(scale), bool(causal)


def _refuse(target: str, node: Any, what: str) -> UnsupportedError:
    return UnsupportedError(f"{target} cannot compile torch op {node.name!r} ({node.target}): {what}. "
                            f"It compiles self-attention: q, k and v Linear projections of one "
                            f"(batch, time, channels) tensor, unmasked or causal "
                            f"(is_causal=True), no dropout")


def _build(n: Any, o: Any, qkv: list[Any], scale: float | None, core: set[Any], target: str,
           consts: dict, order: dict, live: set[Any], causal: bool = False) -> Fused:
    """The :class:`Fused` attention named after node ``n`` whose heads' output is node ``o``
    (q, k, v its inputs, ``scale`` on q·kᵀ (None: 1/sqrt(head size)), ``core`` the nodes
    between)."""
    sides = [_back(target, n, a) for a in qkv]
    xs = {s.linear.args[0] for s in sides}
    if len(xs) != 1:
        raise _refuse(target, n, "cross-attention (queries and keys/values projected from "
                                 "different tensors)")
    x = xs.pop()
    x_shape = _shape(x)
    if len(x_shape) != 3:
        raise _refuse(target, n, f"attention over a tensor of shape {x_shape} (it takes "
                                 f"(batch, time, channels))")
    maps = [_head_map(target, n, s, _run(s.linear, s.path, a, order), x_shape)
            for s, a in zip(sides, qkv, strict=True)]
    (seq, nb, cq), (seq_k, nb_k, ck), (seq_v, nb_v, cv) = maps
    if {seq, seq_k, seq_v} != {seq} or not (np.array_equal(nb, nb_k) and np.array_equal(nb, nb_v)):
        raise _refuse(target, n, "q, k and v grouped into heads differently")
    if cq.shape != ck.shape or cq.shape != cv.shape:
        raise _refuse(target, n, f"head sizes q {cq.shape[1]}, k {ck.shape[1]}, v {cv.shape[1]} "
                                 f"(they must be equal)")
    heads, d = cq.shape
    mult = 1.0 if scale is None else scale * np.sqrt(d)  # folded into the query
    wq, bq = _cols(target, n, sides[0].linear, cq, consts)
    wk, bk = _cols(target, n, sides[1].linear, ck, consts)
    wv, bv = _cols(target, n, sides[2].linear, cv, consts)
    out, end, swapped, rows, between = _forward(target, n, o, nb, heads, d, order)
    wo_t, bo = _weights(target, n, out, consts)  # (C_out, C_in), (C_out,)
    wo = np.zeros((heads * d, wo_t.shape[0]))
    wo[rows] = wo_t.T
    layer = Attention(n.name, f32(wq * mult), f32(bq * mult), f32(wk), f32(bk), f32(wv), f32(bv),
                      f32(wo), f32(bo), heads, causal)
    nodes = {*core, *between} | {m for s in sides for m in (s.linear, *s.path)}
    for m in nodes - {end}:
        if any(u not in nodes and u in live for u in m.users):
            raise _refuse(target, n, f"node {m.name!r} inside the attention is also read elsewhere")
    return Fused(x, end, nodes, layer, seq, swapped)


def _back(target: str, sdpa: Any, a: Any) -> _Side:
    """From SDPA input ``a`` back through layout ops to its Linear projection."""
    path, m = [], a
    while hasattr(m, "op") and str(m.target) in _LAYOUT:
        path.append(m)
        m = m.args[0]
    if not (hasattr(m, "op") and str(m.target) == _LINEAR):
        what = m.name if hasattr(m, "op") else repr(m)
        raise _refuse(target, sdpa, f"q/k/v {a.name if hasattr(a, 'name') else a!r} is not a "
                                    f"Linear projection reshaped into heads (it comes from {what})")
    return _Side(m, path)


def _run(src: Any, path: list[Any], dst: Any, order: dict) -> np.ndarray:
    """Flat indices into ``src``'s value of each element of ``dst``, ``path`` being the layout
    nodes between (run in graph order on an index tensor)."""
    import torch
    from torch.fx.node import map_arg

    shape = _shape(src)
    env: dict[Any, Any] = {src: torch.arange(int(np.prod(shape)), dtype=torch.int64).reshape(shape)}

    def value(v: Any) -> Any:  # a node on the path, or a size (the batch's) in the graph
        return env[v] if v in env else _int(v.meta["val"])

    for m in sorted(set(path), key=order.__getitem__):
        if m not in env:
            env[m] = m.target(*map_arg(m.args, value), **map_arg(m.kwargs, value))
    return env[dst].numpy()


#: the batch size index maps are run at where the program's batch is symbolic (any size ≥ 2
#: tells samples apart)
_BATCH = 2


def _int(v: Any) -> int:
    """A size of the program: an int, or a symbolic size (the dynamic batch's) at :data:`_BATCH`."""
    if isinstance(v, int):
        return v
    expr = v.node.expr
    return int(expr.subs({s: _BATCH for s in expr.free_symbols}))


def _shape(node: Any) -> tuple[int, ...]:
    return tuple(_int(d) for d in node.meta["val"].shape)


def _head_map(target: str, sdpa: Any, side: _Side, idx: np.ndarray,
              x_shape: tuple[int, ...]) -> tuple[int, np.ndarray, np.ndarray]:
    """(the time axis of x, the sample of each SDPA batch entry, channels (heads, d) of the
    projection each head reads) from the index map ``idx`` (*B, T, d) into the projection."""
    p_shape = _shape(side.linear)
    if idx.ndim < 3 or len(p_shape) != 3:
        raise _refuse(target, sdpa, f"heads laid out {idx.shape} over a projection of shape {p_shape}")
    t, d = idx.shape[-2:]
    flat = idx.reshape(-1, t, d)
    a0, a1, ch = np.unravel_index(flat, p_shape)
    steps = np.arange(t)[None, :, None]
    ok = [t == x_shape[i] and bool(np.all(a == steps)) for i, a in enumerate((a0, a1))]
    seq = ok.index(True) if any(ok) else -1
    b = a1 if seq == 0 else a0
    if seq < 0:
        raise _refuse(target, sdpa, "attention whose sequence axis is not the time steps in order")
    nb = b[:, 0, 0]
    if np.any(b != nb[:, None, None]) or np.any(ch != ch[:, :1, :]):
        raise _refuse(target, sdpa, "heads that mix samples or time steps")
    samples = [np.flatnonzero(nb == i) for i in range(x_shape[1 - seq])]
    if any(len(s) != len(samples[0]) for s in samples) or len(samples[0]) * len(samples) != len(nb):
        raise _refuse(target, sdpa, "samples with different numbers of heads")
    per = np.stack([ch[s, 0, :] for s in samples])  # (samples, heads, d)
    if np.any(per != per[:1]):
        raise _refuse(target, sdpa, "heads that read different channels for different samples")
    return seq, nb, per[0]


def _cols(target: str, sdpa: Any, linear: Any, chans: np.ndarray, consts: dict) -> tuple[np.ndarray, np.ndarray]:
    """The IR kernel (C_in, heads·d) and bias of the projection channels ``chans``."""
    w, b = _weights(target, sdpa, linear, consts)
    sel = chans.reshape(-1)
    return w[sel].T, b[sel]


def _weights(target: str, sdpa: Any, linear: Any, consts: dict) -> tuple[np.ndarray, np.ndarray]:
    args = list(linear.args) + [None]
    if not hasattr(args[1], "name") or args[1].name not in consts or (
            args[2] is not None and getattr(args[2], "name", None) not in consts):
        raise _refuse(target, sdpa, f"projection {linear.name!r} has weights computed in the graph")
    w = consts[args[1].name].detach().cpu().numpy().astype(np.float64)
    b = (np.zeros(w.shape[0]) if args[2] is None
         else consts[args[2].name].detach().cpu().numpy().astype(np.float64))
    return w, b


def _forward(target: str, sdpa: Any, o: Any, nb: np.ndarray, heads: int, d: int,
             order: dict) -> tuple[Any, Any, bool, np.ndarray, list[Any]]:
    """From the heads' output ``o`` (of SDPA node ``sdpa`` or its explicit form) through
    layout ops to the out-projection and on to the first node laid out as (batch, time, C)
    or (time, batch, C): (the out-projection, that node, whether batch and time are swapped
    there, the IR row (head·d + j) of each out-projection input, the nodes from ``o`` to it)."""
    path, m = [], o
    while len(m.users) == 1 and str(next(iter(m.users)).target) in _LAYOUT:
        m = next(iter(m.users))
        path.append(m)
    out = next(iter(m.users)) if len(m.users) == 1 else None
    if out is None or str(out.target) != _LINEAR or out.args[0] is not m:
        raise _refuse(target, sdpa, "its output does not go (reshaped) into one Linear projection")
    o_shape = _shape(o)
    t = o_shape[-2]
    idx = _run(o, path, m, order) if path else np.arange(int(np.prod(o_shape))).reshape(o_shape)
    rows = idx.reshape(-1, idx.shape[-1])
    b, step, j = np.unravel_index(rows, (len(nb), t, d))
    rank = np.zeros(len(nb), int)
    for s in np.unique(nb):
        rank[nb == s] = np.arange(int(np.sum(nb == s)))
    sample = nb[b]
    row_ir = rank[b] * d + j
    if (rows.shape[1] != heads * d or np.any(sample != sample[:, :1]) or np.any(step != step[:, :1])
            or np.any(row_ir != row_ir[:1]) or len(np.unique(row_ir[0])) != heads * d):
        raise _refuse(target, sdpa, "heads not concatenated per sample and time step before the "
                                    "out-projection")
    r_sample, r_step = sample[:, 0], step[:, 0]
    m2, tail = out, []
    while True:
        swapped = _laid_out(_run(out, tail, m2, order) if tail else None, out, r_sample, r_step)
        if swapped is not None:
            return out, m2, swapped, row_ir[0], [*path, out, *tail]
        if len(m2.users) != 1 or str(next(iter(m2.users)).target) not in _LAYOUT:
            raise _refuse(target, sdpa, "its output is not reshaped back to (batch, time, channels)")
        m2 = next(iter(m2.users))
        tail.append(m2)


def _laid_out(idx: np.ndarray | None, out: Any, r_sample: np.ndarray, r_step: np.ndarray) -> bool | None:
    """False: ``idx`` (into the out-projection's value) is laid out (sample, step, C); True:
    (step, sample, C); None: neither."""
    o_shape = _shape(out)
    if idx is None:
        idx = np.arange(int(np.prod(o_shape))).reshape(o_shape)
    if idx.ndim != 3:
        return None
    c = o_shape[-1]
    row, ch = np.divmod(idx, c)
    if idx.shape[-1] != c or np.any(ch != np.arange(c)):
        return None
    p0 = np.arange(idx.shape[0])[:, None, None]
    p1 = np.arange(idx.shape[1])[None, :, None]
    s, st = r_sample[row], r_step[row]
    if np.all(s == p0) and np.all(st == p1):
        return False
    if np.all(st == p0) and np.all(s == p1):
        return True
    return None
