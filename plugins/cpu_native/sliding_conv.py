"""cpu.native's incremental sliding window for convolutions (TCNs) and pooling: the same C ABI
as plugins/cpu_native/sliding.py (``hwb_model_push`` / ``hwb_model_prepare`` /
``hwb_model_reset``; no stream, so ``hwb_model_stream_*`` return -1 as the recompute form's do).

**What it takes** (:func:`plan_conv`): fp32 networks over a window ``(T, C)`` made of *stages*
— the input, then each stride-1 Conv1D with no right padding (``'valid'``, or causal: left
padding, which is how the IR holds Keras' ``padding='causal'`` and a torch conv whose right
padding a slice cut off), and residual adds of two such chains (TCN blocks: an identity or
1×1-conv shortcut) — each followed by per-position layers (Act, Affine, a per-step Dense);
then a head of a GlobalPool1D (avg or max) or a one-step TimeSlice, and Dense / Act / Affine
/ Flatten layers on that vector. Anything else (strides, 'same' padding, local pooling,
LayerNorm, attention, a Flatten of the sequence) keeps the recompute form.

**Why a slide is exact.** Stage ``l`` has ``L_l`` positions in the full window. Position ``j``
is *clean* when its receptive field reads no zero padding; with left padding ``p_l`` the first
``B_l = B_{l-1} + p_l`` positions are not (``B_0 = 0``; an add's is the larger of its two
sources'). A clean position depends only on inputs at fixed absolute times, so in the window ending at ``t + 1`` it equals position ``j + 1`` of
the window ending at ``t``: each stage keeps its positions in a doubled ring (``2·L_l`` rows,
every row written twice, so a window's positions are contiguous rows from a base), and a
slide advances the base. Only position ``L_l - 1`` of each stage reads ``x_t`` (stride 1, no
right padding); the first ``min(B_l, L_l - 1)`` positions read the window's own zero padding
and are recomputed for each window.

* :c:func:`hwb_model_push` writes ``x_t`` (after the input stage's layers) as the input's
  newest row, computes each stage's newest position from its sources, and the head: the
  pooled vector from the prepared partial (avg: the sum of positions ``0..L-2``, in the full
  window's order, plus the newest, over ``L``; max likewise) or the sliced position, then the
  Dense layers.
* :c:func:`hwb_model_prepare` advances every base, recomputes each stage's padded positions
  (stage by stage: they read their sources', already recomputed), and sums the last
  stage's positions ``0..L-2`` again from the ring — never a running add/subtract, so nothing
  drifts over any number of ticks.
* :c:func:`hwb_model_reset` fills the input stage with the input layers' answer to a zero
  step and computes every position of every stage from it (a conv of zeros is its bias,
  through its activations), so the zero-filled start is the one ``predict_into`` sees.

The NaN rule of ``predict_into`` (a window holding a non-finite input answers NaN) is kept:
a flag per input row, OR-ed over the window's older rows in the prepare.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._shared import layer_ir as ir
from .emit import Emitter, vector_shape
from .sliding import HEADER, WindowC

#: Layers applied to each position on its own (after a stage's conv, or to the input).
_PER_POSITION = (ir.Act, ir.Affine, ir.Dense)
#: Layers of the head, on the pooled or sliced vector.
_HEAD = (ir.Dense, ir.Act, ir.Affine, ir.Flatten)


@dataclass
class Stage:
    """One sequence the window keeps, position by position: the input (``kind`` "input"), a
    Conv1D of stage ``srcs[0]`` ("conv"), per-position layers alone on stage ``srcs[0]``
    ("map": a residual branch that starts with one), or the sum of two stages ("add": a
    residual); each with the per-position layers after it (``post``)."""

    kind: str
    srcs: tuple[int, ...] = ()
    conv: ir.Conv1D | None = None
    post: list[ir.Layer] = field(default_factory=list)
    #: positions in the full window, channels of each (after ``post``)
    length: int = 0
    channels: int = 0
    #: channels before ``post`` (the conv's outputs, or the source's)
    raw: int = 0
    #: positions whose receptive field reads zero padding (recomputed for each window)
    padded: int = 0


@dataclass
class ConvPlan:
    """The incremental form's parts (:func:`plan_conv`): the stages in an order where every
    stage comes after its sources."""

    stages: list[Stage]
    #: ``GlobalPool1D`` or a one-step ``TimeSlice`` on the last stage
    pool: ir.Layer
    #: the pooled/sliced position (a TimeSlice's), -1 for a global pool
    index: int
    head: list[ir.Layer]
    window: int
    step: int


def _chain(stages: list[Stage], layers: list[ir.Layer], src: int, owned: bool) -> tuple[int, int] | None:
    """Append the stages of ``layers`` (a chain, from stage ``src``) to ``stages``; returns
    (the last stage, how many layers were taken: it stops at the first it cannot slide), or
    None for a residual it cannot take. ``owned``: ``src`` was made by this chain, so later
    per-position layers may join its ``post`` (else another reader sees it as it is)."""
    for n, layer in enumerate(layers):
        cur = stages[src]
        if isinstance(layer, ir.Conv1D):
            if layer.stride != 1 or layer.pad[1] != 0 or layer.pad[0] < 0 or layer.w.shape[1] != cur.channels:
                return src, n
            t = layer.out_shape((cur.length, cur.channels))[0]
            if t < 1:
                return None
            co = int(layer.w.shape[2])
            stages.append(Stage("conv", (src,), layer, [], t, co, co, cur.padded + layer.pad[0]))
        elif isinstance(layer, _PER_POSITION):
            if isinstance(layer, ir.Dense) and layer.w.shape[0] != cur.channels:
                return None
            if not owned:
                stages.append(Stage("map", (src,), None, [], cur.length, cur.channels, cur.channels, cur.padded))
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
            if (a.length, a.channels) != (b.length, b.channels):
                return None
            stages.append(Stage("add", (ends[0], ends[1]), None, [], a.length, a.channels, a.channels,
                                max(a.padded, b.padded)))
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
    if not any(st.kind == "conv" for st in stages) or i == len(layers) or last_i != len(stages) - 1:
        return None
    last = stages[-1]
    pool = layers[i]
    if isinstance(pool, ir.GlobalPool1D) and pool.kind in ("avg", "max"):
        index = -1
    elif isinstance(pool, ir.TimeSlice) and not pool.keep and pool.stop == pool.start + 1 \
            and 0 <= pool.start < last.length:
        index = pool.start
    else:
        return None
    head = layers[i + 1:]
    if not all(isinstance(layer, _HEAD) for layer in head):
        return None
    return ConvPlan(stages, pool, index, head, t, c)


class _ConvEmitter(Emitter):
    """The emitter's matvec and layers, with constants of their own names (``model.c``
    already holds the model function's) and identical constants written once."""

    def __init__(self, net: ir.Network, vw: int, acc: int):
        super().__init__(net, vw, acc)
        self._seen: dict[bytes, str] = {}

    def const(self, stem: str, a: np.ndarray) -> str:
        key = stem.encode() + np.asarray(a, np.float32).tobytes()
        if key not in self._seen:
            self._seen[key] = super().const(f"SC{stem}", a)
        return self._seen[key]

    def function(self, signature: str) -> list[str]:
        body, self.body = self.body, []
        self.gemm_scratch = None
        return [f"static void {signature} {{", *body, "}", ""]


def _ring(li: int) -> str:
    return f"hwb_s{li}"


def _post(e: _ConvEmitter, st: Stage, src: str) -> str:
    """The stage's per-position layers on ``src`` (``raw`` floats); the buffer holding them."""
    cur, shape = src, (st.raw,)
    for k, layer in enumerate(st.post):
        out_shape = layer.out_shape(shape)
        e.cur = 1_000_000 + k  # no layer of the net: no conv epilogue fused into it
        cur = e.layer(layer, cur, shape, None, out_shape)
        shape = out_shape
    return cur


def _store_row(e: _ConvEmitter, li: int, st: Stage, src: str, j: str) -> None:
    """Write ``src`` (``channels`` floats) as position ``j`` of stage ``li``'s window: rows
    ``(base + j) mod L`` and that plus ``L``."""
    n, c = st.length, st.channels
    e.line(f"{{ int r = hwb_b{li} + {j}; if (r >= {n}) r -= {n}; float *d0 = {_ring(li)} + r * {c}, "
           f"*d1 = d0 + {n * c}; for (int i = 0; i < {c}; i++) d0[i] = d1[i] = {src}[i]; }}")


def _row(li: int, st: Stage, j: str) -> str:
    return f"({_ring(li)} + (hwb_b{li} + {j}) * {st.channels})"


def _position(e: _ConvEmitter, p: ConvPlan, li: int, newest: bool) -> list[str]:
    """``hwb_new<li>()`` (the newest position: a conv's taps known at compile time) or
    ``hwb_pos<li>(j)`` (any position; a conv's taps on the left padding skipped): stage
    ``li``'s position from its sources' rows, through its per-position layers, into its ring."""
    st = p.stages[li]
    j = str(st.length - 1) if newest else "j"
    o = e.buf(st.raw)
    if st.kind == "conv":
        conv, s = st.conv, st.srcs[0]
        assert conv is not None
        below = p.stages[s]
        k, ci, co = conv.w.shape
        d, left = conv.dilation, conv.pad[0]
        if newest:
            i0 = st.length - 1 - left
            taps = [q for q in range(k) if i0 + q * d >= 0]
            if d == 1 and len(taps) == k:  # the k·c_in contiguous floats: one matvec, as predict's
                e.matvec([(_row(s, below, str(i0)), k * ci)], o, co, conv.w.reshape(k * ci, co), conv.b)
            else:
                for n, q in enumerate(taps):
                    e.matvec([(_row(s, below, str(i0 + q * d)), ci)], o, co, conv.w[q],
                             None if n else conv.b, accumulate=n > 0)
        else:
            bias = e.const("B", conv.b)
            e.line(f"for (int i = 0; i < {co}; i++) {o}[i] = {bias}[i];")
            for q in range(k):
                e.line(f"if (j - {left - q * d} >= 0) {{")
                e.matvec([(_row(s, below, f"j - {left - q * d}"), ci)], o, co, conv.w[q], None, accumulate=True)
                e.line("}")
    elif st.kind == "map":
        e.line(f"for (int i = 0; i < {st.raw}; i++) {o}[i] = {_row(st.srcs[0], p.stages[st.srcs[0]], j)}[i];")
    else:  # add: the residual's two branches, in the order the full window adds them
        a, b = (_row(s, p.stages[s], j) for s in st.srcs)
        e.line(f"for (int i = 0; i < {st.raw}; i++) {o}[i] = {a}[i] + {b}[i];")
    cur = _post(e, st, o)
    _store_row(e, li, st, cur, j)
    return e.function(f"hwb_new{li}(void)" if newest else f"hwb_pos{li}(int j)")


def _head(e: _ConvEmitter, p: ConvPlan) -> list[str]:
    """``hwb_head(y)``: the pooled (prepared partial and the newest) or sliced vector, then
    the head's layers into ``y``."""
    last = p.stages[-1]
    li, n, c = len(p.stages) - 1, last.length, last.channels
    newest = _row(li, last, str(n - 1))
    v = e.buf(c)
    if p.index >= 0:
        e.line(f"for (int i = 0; i < {c}; i++) {v}[i] = {_row(li, last, str(p.index))}[i];")
    elif n == 1:
        e.line(f"for (int i = 0; i < {c}; i++) {v}[i] = {newest}[i];")
    elif p.pool.kind == "max":  # type: ignore[attr-defined]
        e.line(f"for (int i = 0; i < {c}; i++) {{ const float u = {newest}[i]; "
               f"{v}[i] = u > hwb_acc[i] ? u : hwb_acc[i]; }}")
    else:
        e.line(f"for (int i = 0; i < {c}; i++) {v}[i] = hwb_acc[i] + {newest}[i];")
    if p.index < 0 and p.pool.kind == "avg":  # type: ignore[attr-defined]
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
    return e.function("hwb_head(float *restrict y)")


def _partial(p: ConvPlan) -> list[str]:
    """``hwb_partial()``: the pooled positions ``0..L-2`` of the next window, summed (or
    maxed) in the full window's order, from the ring."""
    last = p.stages[-1]
    li, n, c = len(p.stages) - 1, last.length, last.channels
    if p.index >= 0 or n == 1:
        return ["static void hwb_partial(void) {}", ""]
    op = "hwb_acc[i] = u > hwb_acc[i] ? u : hwb_acc[i];" if p.pool.kind == "max" else "hwb_acc[i] += u;"  # type: ignore[attr-defined]
    return ["static void hwb_partial(void) {",
            f"    for (int i = 0; i < {c}; i++) hwb_acc[i] = {_row(li, last, '0')}[i];",
            f"    for (int t = 1; t < {n - 1}; t++) for (int i = 0; i < {c}; i++) "
            f"{{ const float u = {_row(li, last, 't')}[i]; {op} }}", "}", ""]


def emit_incremental(net: ir.Network, p: ConvPlan, requires: list[str]) -> str:
    """The incremental form's C (see the module docstring); appended to ``model.c``."""
    vw, acc = vector_shape(requires)
    e = _ConvEmitter(net, vw, acc)
    nw, step = p.window, p.step
    decls = ["static int hwb_pend, hwb_badp;", f"static unsigned char hwb_bad[{nw}];",
             f"static float hwb_acc[{p.stages[-1].channels}] A64;"]
    for li, st in enumerate(p.stages):
        decls += [f"static float {_ring(li)}[{2 * st.length * st.channels}] A64;", f"static int hwb_b{li};"]
    # the input stage: one step through its layers, into position j of its window
    s0 = p.stages[0]
    e.line(f"float xt[{step}] A64;")
    e.line(f"for (int i = 0; i < {step}; i++) xt[i] = x[i];")
    _store_row(e, 0, s0, _post(e, s0, "xt"), "j")
    fns = e.function("hwb_put0(const float *restrict x, int j)")
    for li in range(1, len(p.stages)):
        fns += _position(e, p, li, newest=True)
        fns += _position(e, p, li, newest=False)
    fns += _head(e, p)
    fns += _partial(p)
    n = len(p.stages)
    advance = " ".join(f"hwb_b{li} = hwb_b{li} + 1 == {st.length} ? 0 : hwb_b{li} + 1;"
                       for li, st in enumerate(p.stages))
    redo = "".join(f"    for (int j = 0; j < {min(st.padded, st.length - 1)}; j++) hwb_pos{li}(j);\n"
                   for li, st in enumerate(p.stages) if li and min(st.padded, st.length - 1) > 0)
    news = " ".join(f"hwb_new{li}();" for li in range(1, n))
    fill = "".join(f"    for (int j = 0; j < {st.length}; j++) hwb_pos{li}(j);\n"
                   for li, st in enumerate(p.stages) if li)
    out_n = int(np.prod(net.output_shape))
    code = [*decls, *e.consts, "", *fns,
            "int hwb_model_prepare(void) {",
            "    if (!hwb_pend) return 0;",
            f"    {advance}",
            redo.rstrip("\n"),
            "    hwb_partial();",
            "    int bad = 0;",
            f"    for (int j = 0; j < {nw - 1}; j++) {{ int r = hwb_b0 + j; if (r >= {nw}) r -= {nw}; bad |= hwb_bad[r]; }}",
            "    hwb_badp = bad;", "    hwb_pend = 0;", "    return 0;", "}",
            "int hwb_model_push(const float *x, float *y) {",
            "    if (hwb_pend) hwb_model_prepare();",
            "    int bad = 0;",
            f"    for (int i = 0; i < {step}; i++) bad |= !(__builtin_fabsf(x[i]) <= 3.40282347e38f);",
            f"    {{ int r = hwb_b0 + {nw - 1}; if (r >= {nw}) r -= {nw}; hwb_bad[r] = (unsigned char)bad; }}",
            f"    hwb_put0(x, {nw - 1});",
            f"    {news}",
            "    hwb_head(y);",
            f"    if (__builtin_expect(bad | hwb_badp, 0)) for (int i = 0; i < {out_n}; i++) y[i] = __builtin_nanf(\"\");",
            "    hwb_pend = 1;", "    return 0;", "}",
            "int hwb_model_reset(void) {",
            f"    static const float zeros[{step}] A64;",
            f"    {' '.join(f'hwb_b{li} = 0;' for li in range(n))}",
            f"    for (int j = 0; j < {nw}; j++) {{ hwb_put0(zeros, j); hwb_bad[j] = 0; }}",
            fill.rstrip("\n"),
            "    hwb_badp = 0; hwb_pend = 1;", "    return 0;", "}",
            "int hwb_model_stream_push(const float *x, float *y) { (void)x; (void)y; return -1; }",
            "int hwb_model_stream_prepare(void) { return -1; }",
            "int hwb_model_stream_reset(void) { return -1; }",
            "__attribute__((constructor)) static void hwb_window_init(void) { hwb_model_reset(); }", ""]
    return "\n".join(line for line in code if line)


def emit(net: ir.Network | None, in_shape: tuple[int, ...], precision: str, requires: list[str]) -> WindowC | None:
    """The sliding window's C for a convolutional model of input ``in_shape`` (the same
    symbols, header and metadata as :func:`plugins.cpu_native.sliding.emit`, ``stream`` 0),
    or None when :func:`plan_conv` finds no incremental form (then sliding.emit's)."""
    p = plan_conv(net, precision) if net is not None else None
    if p is None:
        return None
    header = HEADER.format(window=p.window, step=p.step, form="incremental", stream=0)
    code = emit_incremental(net, p, requires)  # type: ignore[arg-type]
    return WindowC("/* ---- the sliding window (plugins/cpu_native/sliding_conv.py) ---- */\n" + code, header,
                   {"form": "incremental", "window": p.window, "step": p.step, "stream": False})
