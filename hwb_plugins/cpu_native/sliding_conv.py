"""cpu.native's incremental sliding window for convolutions (TCNs), pooling and a Dense over
the flattened window: the same C ABI as hwb_plugins/cpu_native/sliding.py (``hwb_model_push`` /
``hwb_model_prepare`` / ``hwb_model_reset``; no stream, so ``hwb_model_stream_*`` return -1
as the recompute form's do).

**What it takes** (:func:`plan_conv`): fp32 networks over a window ``(T, C)`` made of *stages*
— the input, then each Conv1D with no right padding (``'valid'``, or causal: left padding,
which is how the IR holds Keras' ``padding='causal'`` and a torch conv whose right padding a
slice cut off; any stride and dilation), each local pooling (MaxPooling1D/AveragePooling1D,
any size and stride), and residual adds of two such chains (TCN blocks: an identity or 1×1-conv
shortcut) — each followed by per-position layers (Act, Affine, a per-step Dense); then a head:
a GlobalPool1D (avg or max), a one-step TimeSlice, or a Flatten then a Dense
(hwb_plugins/cpu_native/sliding_dense.py), and Dense / Act / Affine / Flatten layers on that vector.
Anything else ('same' padding, LayerNorm, attention, recurrent layers) keeps another form.

**Why a slide is exact.** Stage ``l`` has ``L_l`` positions ``S_l`` ticks apart (``S``: the
product of the strides below it) and the window's last position lags the newest tick by
``r_l`` ticks (a stride can leave the window's last steps unread). Position ``j`` is *clean*
when its receptive field reads no zero padding: the first ``B_l = ceil((B_{l-1} + p_l) / s_l)``
positions are not (``B_0 = 0``, ``p``: left padding, ``s``: stride; an add's is the larger of
its two sources'). A clean position depends only on inputs at fixed absolute times, so it is
one value ``U_l(τ)`` (``τ``: the time of its receptive field's end) in every window that holds
it — in the window ending at ``τ + r_l + m·S_l`` as position ``L_l-1-m``. With a stride the
windows of successive ticks hold different phases of ``U_l``, so every tick's ``U_l`` is some
window's position: each stage computes one new value per tick, once, from its source's values
at ``τ - (k-1-q)·d·S_{l-1}`` (tap ``q``), and keeps the last ``N_l = r_l + (L_l-1)·S_l + 1`` in a
doubled ring (every row written twice, so a window's positions are rows ``h+1, h+1+S, …`` from
the current tick's row ``h``). The first positions read the window's own zero padding and are
recomputed for each window (in place: a row, once padded, stays padded in every later window
that holds it, and no other window holds it).

* :c:func:`hwb_model_push` writes ``x_t`` (after the input stage's layers) as the input's
  newest row, computes the newest value of each stage with no lag (only those read ``x_t``),
  and the head: the pooled vector from the prepared partial (avg: the sum of positions
  ``0..L-2``, in the full window's order, plus the last, over ``L``; max likewise), the sliced
  position, or the flattened Dense's prepared partial sum plus its last position's term; then
  the Dense layers. When the last stage lags the newest step, the prepare pooled (or summed)
  its last position too, and the push only reads the prepared vector.
* :c:func:`hwb_model_prepare` computes the newest value of each lagging stage (they read
  ``x_t`` but no answer before a later tick's does), spreads the last stage's into the flattened
  Dense's partial sums, advances every ring, recomputes each stage's padded positions (stage by
  stage: they read their sources', already recomputed), and sums the last stage's positions
  ``0..L-2`` again from the ring — never a running add/subtract, so nothing drifts.
* :c:func:`hwb_model_reset` fills the input ring with the input layers' answer to a zero step
  and runs push and prepare on zero steps until every value any later window reads was
  computed from them (the deepest stage's ring plus its reach back to the input), so the
  zero-filled start is the one ``predict_into`` sees.

The NaN rule of ``predict_into`` (a window holding a non-finite input answers NaN) is kept:
a flag per input row, OR-ed over the window's older rows in the prepare.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hwbackends import layer_ir as ir

from . import sliding_dense as sd
from .emit import Emitter, vector_shape
from .sliding import WindowC, header_text

#: Layers applied to each position on its own (after a stage's conv, or to the input).
_PER_POSITION = (ir.Act, ir.Affine, ir.Dense)
#: Layers of the head, on the pooled or sliced vector.
_HEAD = (ir.Dense, ir.Act, ir.Affine, ir.Flatten)


@dataclass
class Stage:
    """One sequence the window keeps, position by position: the input (``kind`` "input"), a
    Conv1D or local pooling of stage ``srcs[0]`` ("conv", "pool"), per-position layers alone
    on stage ``srcs[0]`` ("map": a residual branch that starts with one), or the sum of two
    stages ("add": a residual); each with the per-position layers after it (``post``)."""

    kind: str
    srcs: tuple[int, ...] = ()
    op: ir.Conv1D | ir.Pool1D | None = None
    post: list[ir.Layer] = field(default_factory=list)
    #: positions in the full window, channels of each (after ``post``)
    length: int = 0
    channels: int = 0
    #: channels before ``post`` (the conv's outputs, or the source's)
    raw: int = 0
    #: positions whose receptive field reads zero padding (recomputed for each window)
    padded: int = 0
    #: ticks between positions (the strides below, multiplied)
    stride: int = 1
    #: ticks from the window's last position to its newest step
    lag: int = 0
    #: ticks from a value back to the oldest input it reads (reset's warm-up)
    reach: int = 0

    @property
    def rows(self) -> int:
        """Values kept: the window's positions and the ticks between and after them."""
        return self.lag + (self.length - 1) * self.stride + 1

    @property
    def clean_last(self) -> bool:
        return self.padded < self.length

    def same_grid(self, other: Stage) -> bool:
        return (self.length, self.channels, self.stride, self.lag) == (other.length, other.channels,
                                                                       other.stride, other.lag)


@dataclass
class ConvPlan:
    """The incremental form's parts (:func:`plan_conv`): the stages in an order where every
    stage comes after its sources."""

    stages: list[Stage]
    #: ``GlobalPool1D``, a one-step ``TimeSlice`` or a ``Flatten`` on the last stage
    pool: ir.Layer
    #: the pooled/sliced position (a TimeSlice's), -1 otherwise
    index: int
    head: list[ir.Layer]
    window: int
    step: int
    #: the Dense over the flattened last stage (then ``head`` is what follows it)
    flat: sd.FlatDense | None = None


def _taps(op: ir.Conv1D | ir.Pool1D) -> tuple[int, int, int, int]:
    """(taps, dilation, left padding, stride) of a conv or pooling."""
    if isinstance(op, ir.Conv1D):
        return int(op.w.shape[0]), op.dilation, op.pad[0], op.stride
    return op.size, 1, 0, op.stride


def _windowed(op: ir.Conv1D | ir.Pool1D, kind: str, src: int, cur: Stage) -> Stage | None:
    """The stage of a conv or pooling on ``cur`` (stage ``src``), None when it has no position."""
    k, d, p, s = _taps(op)
    t = op.out_shape((cur.length, cur.channels))[0]
    if t < 1 or s < 1:
        return None
    last_tap = (t - 1) * s - p + (k - 1) * d  # the source position the last one reads last
    co = int(op.w.shape[2]) if isinstance(op, ir.Conv1D) else cur.channels
    return Stage(kind, (src,), op, [], t, co, co, -(-(cur.padded + p) // s), cur.stride * s,
                 cur.lag + (cur.length - 1 - last_tap) * cur.stride, cur.reach + (k - 1) * d * cur.stride)


def _chain(stages: list[Stage], layers: list[ir.Layer], src: int, owned: bool) -> tuple[int, int] | None:
    """Append the stages of ``layers`` (a chain, from stage ``src``) to ``stages``; returns
    (the last stage, how many layers were taken: it stops at the first it cannot slide), or
    None for a residual it cannot take. ``owned``: ``src`` was made by this chain, so later
    per-position layers may join its ``post`` (else another reader sees it as it is)."""
    for n, layer in enumerate(layers):
        cur = stages[src]
        if isinstance(layer, (ir.Conv1D, ir.Pool1D)):
            if isinstance(layer, ir.Conv1D) and (layer.pad[1] != 0 or layer.pad[0] < 0
                                                 or layer.w.shape[1] != cur.channels):
                return src, n
            st = _windowed(layer, "conv" if isinstance(layer, ir.Conv1D) else "pool", src, cur)
            if st is None:
                return None
            stages.append(st)
        elif isinstance(layer, _PER_POSITION):
            if isinstance(layer, ir.Dense) and layer.w.shape[0] != cur.channels:
                return None
            if not owned:
                stages.append(Stage("map", (src,), None, [], cur.length, cur.channels, cur.channels, cur.padded,
                                    cur.stride, cur.lag, cur.reach))
            st = stages[-1]
            st.post.append(layer)
            st.channels = layer.out_shape((st.length, st.channels))[1]
        elif isinstance(layer, ir.Residual):
            ends = []
            for branch in (layer.body, layer.shortcut):
                got = _chain(stages, list(branch), src, False)
                if got is None or got[1] != len(branch):
                    return None
                ends.append(got[0])
            a, b = stages[ends[0]], stages[ends[1]]
            if not a.same_grid(b):
                return None
            stages.append(Stage("add", (ends[0], ends[1]), None, [], a.length, a.channels, a.channels,
                                max(a.padded, b.padded), a.stride, a.lag, max(a.reach, b.reach)))
        else:
            return src, n
        src, owned = len(stages) - 1, True
    return src, len(layers)


def plan_conv(net: ir.Network, precision: str) -> ConvPlan | None:
    """The convolutional incremental form of ``net``, or None (then another form)."""
    if precision != "fp32" or len(net.input_shape) != 2:
        return None
    t, c = (int(v) for v in net.input_shape)
    stages = [Stage("input", (), None, [], t, c, c, 0)]
    layers = list(net.layers)
    got = _chain(stages, layers, 0, True)
    if got is None:
        return None
    last_i, i = got
    if i == len(layers) or last_i != len(stages) - 1:
        return None
    last = stages[-1]
    pool, flat = layers[i], None
    if isinstance(pool, ir.GlobalPool1D) and pool.kind in ("avg", "max"):
        index, rest = -1, i + 1
    elif isinstance(pool, ir.TimeSlice) and not pool.keep and pool.stop == pool.start + 1 \
            and 0 <= pool.start < last.length:
        index, rest = pool.start, i + 1
    else:
        flat = sd.take(layers[i:], last.length, last.channels)
        if flat is None:
            return None
        index, rest = -1, i + 2
    head = layers[rest:]
    if not all(isinstance(layer, _HEAD) for layer in head):
        return None
    return ConvPlan(stages, pool, index, head, t, c, flat)


class _ConvEmitter(Emitter):
    """The emitter's matvec and layers, with constants of their own names (``model.c``
    already holds the model function's) and identical constants written once."""

    def __init__(self, net: ir.Network, vw: int, acc: int):
        super().__init__(net, vw, acc)
        self._seen: dict[bytes, str] = {}

    def const(self, stem: str, a: np.ndarray) -> str:
        key = stem.encode() + str(np.shape(a)).encode() + np.asarray(a, np.float32).tobytes()
        if key not in self._seen:
            self._seen[key] = super().const(f"SC{stem}", a)
        return self._seen[key]

    def function(self, signature: str) -> list[str]:
        body, self.body = self.body, []
        self.gemm_scratch = None
        return [f"static void {signature} {{", *body, "}", ""]


def _ring(li: int) -> str:
    return f"w->s{li}"


def _back(li: int, st: Stage, a: int) -> str:
    """Stage ``li``'s value ``a`` ticks before the current one (``0 <= a < rows``)."""
    assert 0 <= a < st.rows, (a, st.rows)
    return f"({_ring(li)} + (w->h{li} + {st.rows - a}) * {st.channels})"


def _row(li: int, st: Stage, j: str) -> str:
    """Position ``j`` (a C expression) of the current window of stage ``li``."""
    return f"({_ring(li)} + (w->h{li} + 1 + ({j}) * {st.stride}) * {st.channels})"


def _post(e: _ConvEmitter, st: Stage, src: str) -> str:
    """The stage's per-position layers on ``src`` (``raw`` floats); the buffer holding them."""
    cur, shape = src, (st.raw,)
    for k, layer in enumerate(st.post):
        out_shape = layer.out_shape(shape)
        e.cur = 1_000_000 + k  # no layer of the net: no conv epilogue fused into it
        cur = e.layer(layer, cur, shape, None, out_shape)
        shape = out_shape
    return cur


def _store(e: _ConvEmitter, li: int, st: Stage, src: str, j: str | None) -> None:
    """Write ``src`` (``channels`` floats) as position ``j`` of stage ``li``'s current window
    (``None``: as the value of the current tick), both copies of its row."""
    n, c = st.rows, st.channels
    r = f"w->h{li}" if j is None else f"w->h{li} + 1 + ({j}) * {st.stride}"
    e.line(f"{{ int r = {r}; if (r >= {n}) r -= {n}; float *d0 = {_ring(li)} + r * {c}, "
           f"*d1 = d0 + {n * c}; for (int i = 0; i < {c}; i++) d0[i] = d1[i] = {src}[i]; }}")


def _pool_line(e: _ConvEmitter, op: ir.Pool1D, o: str, c: int, rows: list[str]) -> None:
    """``o`` = the pooling of the rows (its taps, in order), as predict_into's loop does it."""
    step = "m = v > m ? v : m;" if op.kind == "max" else "m += v;"
    fin = "m" if op.kind == "max" else f"m / {float(op.size).hex()}f"
    more = " ".join(f"{{ const float v = {r}[ch]; {step} }}" for r in rows[1:])
    e.line(f"for (int ch = 0; ch < {c}; ch++) {{ float m = {rows[0]}[ch]; {more} {o}[ch] = {fin}; }}")


def _source(p: ConvPlan, st: Stage) -> tuple[Any, int, Stage, tuple[int, int, int, int]]:
    """A conv or pool stage's layer, its source stage's index and stage, and the layer's
    taps (kernel, dilation, left padding, stride)."""
    op, s = st.op, st.srcs[0]
    assert op is not None
    return op, s, p.stages[s], _taps(op)


def _newest(e: _ConvEmitter, p: ConvPlan, li: int) -> list[str]:
    """``hwb_new<li>()``: stage ``li``'s value of the current tick (the last position of the
    window ``lag`` ticks on), its taps known at compile time, into its ring."""
    st = p.stages[li]
    o = e.buf(st.raw)
    if st.kind in ("conv", "pool"):
        op, s, below, (k, d, left, stride) = _source(p, st)
        i0 = (st.length - 1) * stride - left
        # source position i of the window `lag` ticks on is `lag - lag_below + (L-1-i)·S` back
        back = [(below.lag - st.lag + (below.length - 1 - (i0 + q * d)) * below.stride, q)
                for q in range(k) if i0 + q * d >= 0]
        if isinstance(op, ir.Pool1D):
            _pool_line(e, op, o, st.raw, [_back(s, below, a) for a, _ in back])
        else:
            ci, co = int(op.w.shape[1]), int(op.w.shape[2])
            if d * below.stride == 1 and len(back) == k:  # k·c_in contiguous floats: one matvec, as predict's
                e.matvec([(_back(s, below, back[0][0]), k * ci)], o, co, op.w.reshape(k * ci, co), op.b)
            else:
                w = np.concatenate([op.w[q] for _, q in back])
                e.matvec([(_back(s, below, a), ci) for a, _ in back], o, co, w, op.b)
    elif st.kind == "map":
        e.line(f"for (int i = 0; i < {st.raw}; i++) {o}[i] = {_back(st.srcs[0], p.stages[st.srcs[0]], 0)}[i];")
    else:  # add: the residual's two branches, in the order the full window adds them
        a, b = (_back(s, p.stages[s], 0) for s in st.srcs)
        e.line(f"for (int i = 0; i < {st.raw}; i++) {o}[i] = {a}[i] + {b}[i];")
    _store(e, li, st, _post(e, st, o), None)
    return e.function(f"hwb_new{li}(hwb_window *restrict w)")


def _position(e: _ConvEmitter, p: ConvPlan, li: int) -> list[str]:
    """``hwb_pos<li>(j)``: position ``j`` of stage ``li``'s current window from its sources'
    positions (a conv's taps on the left padding skipped), into its ring."""
    st = p.stages[li]
    o = e.buf(st.raw)
    if st.kind in ("conv", "pool"):
        op, s, below, (k, d, left, stride) = _source(p, st)
        if isinstance(op, ir.Pool1D):
            _pool_line(e, op, o, st.raw, [_row(s, below, f"j * {stride} + {q}") for q in range(k)])
        else:
            ci, co = int(op.w.shape[1]), int(op.w.shape[2])
            bias = e.const("B", op.b)
            e.line(f"for (int i = 0; i < {co}; i++) {o}[i] = {bias}[i];")
            for q in range(k):
                at = f"j * {stride} - {left - q * d}"
                e.line(f"if ({at} >= 0) {{")
                e.matvec([(_row(s, below, at), ci)], o, co, op.w[q], None, accumulate=True)
                e.line("}")
    elif st.kind == "map":
        e.line(f"for (int i = 0; i < {st.raw}; i++) {o}[i] = {_row(st.srcs[0], p.stages[st.srcs[0]], 'j')}[i];")
    else:
        a, b = (_row(s, p.stages[s], "j") for s in st.srcs)
        e.line(f"for (int i = 0; i < {st.raw}; i++) {o}[i] = {a}[i] + {b}[i];")
    _store(e, li, st, _post(e, st, o), "j")
    return e.function(f"hwb_pos{li}(hwb_window *restrict w, int j)")


def _head(e: _ConvEmitter, p: ConvPlan) -> list[str]:
    """``hwb_head(y)``: the pooled (prepared partial and the last), sliced or flattened-Dense
    vector, then the head's layers into ``y``."""
    last = p.stages[-1]
    li, n, c = len(p.stages) - 1, last.length, last.channels
    newest = _row(li, last, str(n - 1))
    if p.flat is not None:
        v, c = sd.push(e, p.flat, f"w->h{li}", None if last.lag else newest), p.flat.width
    else:
        v = e.buf(c)
    if p.flat is not None:
        pass
    elif p.index >= 0:
        e.line(f"for (int i = 0; i < {c}; i++) {v}[i] = {_row(li, last, str(p.index))}[i];")
    elif n == 1:
        e.line(f"for (int i = 0; i < {c}; i++) {v}[i] = {newest}[i];")
    elif last.lag:  # every position is known before the tick: the prepare pooled them all
        e.line(f"for (int i = 0; i < {c}; i++) {v}[i] = w->acc[i];")
    elif p.pool.kind == "max":  # type: ignore[attr-defined]
        e.line(f"for (int i = 0; i < {c}; i++) {{ const float u = {newest}[i]; "
               f"{v}[i] = u > w->acc[i] ? u : w->acc[i]; }}")
    else:
        e.line(f"for (int i = 0; i < {c}; i++) {v}[i] = w->acc[i] + {newest}[i];")
    if p.flat is None and p.index < 0 and p.pool.kind == "avg":  # type: ignore[attr-defined]
        e.line(f"for (int i = 0; i < {c}; i++) {v}[i] /= {float(n).hex()}f;")
    producing = [i for i, layer in enumerate(p.head) if not isinstance(layer, (ir.Act, ir.Flatten, ir.Affine))]
    final = producing[-1] if producing else -1
    cur, shape = v, (c,)
    for i, layer in enumerate(p.head):
        out_shape = layer.out_shape(shape)
        e.cur = 2_000_000 + i
        cur = e.layer(layer, cur, shape, "y" if i == final else None, out_shape)
        shape = out_shape
    if final < 0:
        e.line(f"for (int i = 0; i < {int(np.prod(shape))}; i++) y[i] = {cur}[i];")
    return e.function("hwb_head(hwb_window *restrict w, float *restrict y)")


def _partial(e: _ConvEmitter, p: ConvPlan) -> list[str]:
    """``hwb_partial()``: the next window's own part of the head: the pooled positions
    ``0..L-2`` summed (or maxed) in the full window's order from the ring (``0..L-1`` when the
    stage lags the newest step: all are known), or the flattened Dense's terms of its padded
    positions (and of its last, likewise)."""
    last = p.stages[-1]
    li, n, c = len(p.stages) - 1, last.length, last.channels
    if p.flat is not None:
        sd.own_terms(e, p.flat, f"w->h{li}", lambda j: _row(li, last, str(j)), last.padded, last.lag > 0)
        return e.function("hwb_partial(hwb_window *restrict w)")
    if p.index >= 0 or n == 1:
        return ["static void hwb_partial(hwb_window *restrict w) { (void)w; }", ""]
    op = "w->acc[i] = u > w->acc[i] ? u : w->acc[i];" if p.pool.kind == "max" else "w->acc[i] += u;"  # type: ignore[attr-defined]
    upto = n if last.lag else n - 1  # a lagging stage's last position is known now too
    return ["static void hwb_partial(hwb_window *restrict w) {",
            f"    for (int i = 0; i < {c}; i++) w->acc[i] = {_row(li, last, '0')}[i];",
            f"    for (int t = 1; t < {upto}; t++) for (int i = 0; i < {c}; i++) "
            f"{{ const float u = {_row(li, last, 't')}[i]; {op} }}", "}", ""]


def _spread(e: _ConvEmitter, p: ConvPlan) -> list[str]:
    """``hwb_spread()`` (the prepare, before the rings advance): the answered window's partial
    sum starts over from the bias, and the last stage's clean value of this tick goes into
    every later window's (a flattened Dense head; nothing otherwise)."""
    last = p.stages[-1]
    li = len(p.stages) - 1
    if p.flat is not None:
        sd.retire(e, p.flat, f"w->h{li}")
        if last.clean_last:
            sd.spread(e, p.flat, _back(li, last, 0), f"w->h{li}", last.rows, last.lag, last.stride,
                      last.padded)
    return e.function("hwb_spread(hwb_window *restrict w)")


def _redo(st: Stage) -> int:
    """How many of a stage's positions the prepare recomputes for each window: the padded
    ones, but not the last when the push computes it (no lag)."""
    return min(st.padded, st.length - (st.lag == 0))


def emit_incremental(net: ir.Network, p: ConvPlan, requires: list[str]) -> str:
    """The incremental form's C (see the module docstring); appended to ``model.c``."""
    vw, acc = vector_shape(requires)
    e = _ConvEmitter(net, vw, acc)
    nw, step = p.window, p.step
    # one window's state (hwb_window.h: a handle per window, none in the library)
    members = ["int stream;", "int pend, badp;", f"unsigned char bad[{nw}];",
               f"float acc[{p.stages[-1].channels}] A64;"]
    if p.flat is not None:
        members += sd.members(p.flat, p.stages[-1].rows)
    for li, st in enumerate(p.stages):
        members += [f"float s{li}[{2 * st.rows * st.channels}] A64;", f"int h{li};"]
    decls = ["struct hwb_window {", *(f"    {m}" for m in members), "};"]
    # the input stage: one step through its layers, into the current tick's row
    s0 = p.stages[0]
    e.line(f"float xt[{step}] A64;")
    e.line(f"for (int i = 0; i < {step}; i++) xt[i] = x[i];")
    _store(e, 0, s0, _post(e, s0, "xt"), None)
    fns = e.function("hwb_put0(hwb_window *restrict w, const float *restrict x)")
    for li in range(1, len(p.stages)):
        fns += _newest(e, p, li)
        fns += _position(e, p, li)
    fns += _head(e, p)
    fns += _partial(e, p)
    fns += _spread(e, p)
    stages = list(enumerate(p.stages))
    advance = " ".join(f"w->h{li} = w->h{li} + 1 == {st.rows} ? 0 : w->h{li} + 1;" for li, st in stages)
    news = " ".join(f"hwb_new{li}(w);" for li, st in stages if li and st.lag == 0)
    lagging = " ".join(f"hwb_new{li}(w);" for li, st in stages if li and st.lag > 0 and st.clean_last)
    redo = "".join(f"    for (int j = 0; j < {_redo(st)}; j++) hwb_pos{li}(w, j);\n"
                   for li, st in stages if li and _redo(st) > 0)
    warm = max(st.rows + st.reach for st in p.stages) + 1
    out_n = int(np.prod(net.output_shape))
    win = "hwb_window *restrict w"
    code = [*decls, *e.consts, "", *fns,
            f"static int hwb_w_prepare({win}) {{",
            "    if (!w->pend) return 0;",
            f"    {lagging}",
            "    hwb_spread(w);",
            f"    {advance}",
            redo.rstrip("\n"),
            "    hwb_partial(w);",
            "    int bad = 0;",
            f"    for (int j = 0; j < {nw - 1}; j++) {{ int r = w->h0 + 1 + j; if (r >= {nw}) r -= {nw}; bad |= w->bad[r]; }}",
            "    w->badp = bad;", "    w->pend = 0;", "    return 0;", "}",
            f"static void hwb_in({win}, const float *x) {{",
            "    hwb_put0(w, x);",
            f"    {news}",
            "}",
            f"static int hwb_w_push({win}, const float *x, float *y) {{",
            "    if (w->pend) hwb_w_prepare(w);",
            "    int bad = 0;",
            f"    for (int i = 0; i < {step}; i++) bad |= !(__builtin_fabsf(x[i]) <= 3.40282347e38f);",
            "    w->bad[w->h0] = (unsigned char)bad;",
            "    hwb_in(w, x);",
            "    hwb_head(w, y);",
            f"    if (__builtin_expect(bad | w->badp, 0)) for (int i = 0; i < {out_n}; i++) y[i] = __builtin_nanf(\"\");",
            "    w->pend = 1;", "    return 0;", "}",
            "/* a fresh window: the input ring holds the input layers' answer to a zero step, then",
            "   push and prepare on zero steps until every value a later window reads was computed",
            "   from them */",
            f"static void hwb_w_fill({win}) {{",
            f"    static const float zeros[{step}] A64;",
            f"    {' '.join(f'w->h{li} = 0; __builtin_memset({_ring(li)}, 0, sizeof {_ring(li)});' for li in range(1, len(p.stages)))}",
            f"    for (int j = 0; j < {nw}; j++) {{ w->h0 = j; hwb_put0(w, zeros); w->bad[j] = 0; }}",
            "    w->h0 = 0; w->pend = 0;",
            *([f"    for (int s = 0; s < {p.stages[-1].rows}; s++) {{ w->h{len(p.stages) - 1} = s; hwb_spread(w); }}",
               f"    w->h{len(p.stages) - 1} = 0;"] if p.flat is not None else []),
            f"    for (int k = 0; k < {warm}; k++) {{ hwb_in(w, zeros); w->pend = 1; hwb_w_prepare(w); }}",
            "    w->badp = 0;", "}",
            "#define HWB_WINDOW_STREAM 0", '#include "hwb_window.h"', ""]
    return "\n".join(line for line in code if line.strip())


def emit(net: ir.Network | None, in_shape: tuple[int, ...], precision: str, requires: list[str]) -> WindowC | None:
    """The sliding window's C for a convolutional, pooling or flattened-Dense model of input
    ``in_shape`` (the same symbols, header and metadata as
    :func:`hwb_plugins.cpu_native.sliding.emit`, ``stream`` 0), or None when :func:`plan_conv`
    finds no incremental form (then sliding.emit's)."""
    p = plan_conv(net, precision) if net is not None else None
    if p is None:
        return None
    # the push's weights and gates are the model's own: fp32, exact (sliding.py's options)
    header = header_text(p.window, p.step, "incremental", False)
    code = emit_incremental(net, p, requires)  # type: ignore[arg-type]
    return WindowC("/* ---- the sliding window (hwb_plugins/cpu_native/sliding_conv.py) ---- */\n" + code, header,
                   {"form": "incremental", "window": p.window, "step": p.step, "stream": False})
