"""cpu.native's sliding window and stream in C: ``hwb_model_push`` / ``hwb_model_prepare`` /
``hwb_model_reset`` (and ``hwb_model_stream_*``), appended to ``model.c``; their header lines
and the extension's FASTCALL entries; the executor's :meth:`Executor.incremental` hook.

**The incremental form** (fp32 recurrent models: per-step element-wise layers, a stack of
LSTM/GRU layers, each but the last returning sequences, then a head of Dense/activation layers
on the last state). The answer at tick ``t`` is the model on the window ``x[t-T+1 .. t]`` from
zero state. ``T`` windows are in flight, one per slot: the one that finishes at ``t`` has
consumed ``T-1`` steps, the newest none. After each answer, :c:func:`hwb_model_prepare`
advances every other window by the step ``x_t`` (each layer's gates from the recurrent
product prepared for it and its input), restarts the finished slot as the newest window,
and computes, for every window, the next step's recurrent products ``R·h + b``; last it
prefetches the weights the push reads (:func:`_warm`), which its own reads evicted. So the
push (the critical path) is one step per layer of the finishing window with only the products
that need ``x_t``: the first layer's input projection ``K₁·x_t`` (computed once and shared with
every window in the prepare), each later layer's ``K_l·h_{l-1}``, the gates, and the head.

**Reduced push weights** (the target's ``push_weights`` option, push_weights.py): the push
gets its own copies of the functions above (``hwb_inq``, ``hwb_cellq<l>``, ``hwb_tickq``) whose
input products read bf16, f16 or int8 weights and whose LSTM gates are vector code (AVX-512 or
AVX2: push_weights.FORMS) with a polynomial exp and no division; it keeps a copy of ``x_t``, from which the prepare computes the
fp32 projection the windows in flight share. So only the finishing window's last step is
reduced, and the answers are within that precision's tolerance of ``predict_into``'s, no longer
equal to them (the compile gates them: push_weights.gate). The stream stays fp32.

Before ``T`` steps were pushed the window is zero-filled at its start (hwbackends/sliding.py):
:c:func:`hwb_model_reset` sets each slot to the state a window has after as many zero steps as
its age (one run over zero steps, copied into the slots), and runs when the library loads.

**The recompute form** (every other model and precision; Conv1D/TCN stacks of any stride and
dilation without right padding, local and global pooling, a one-step slice and a Dense over
the flattened window take sliding_conv.py's incremental form first): the window in a doubled ring
buffer and the model function (``hwb_one``) on it each tick, so its answers are
``predict_into``'s bit for bit; there is no stream.

The state lives in the library (static arrays): one window and one stream per loaded library,
one caller at a time. :func:`steps` revokes the :class:`~hwbackends.sliding.Steps` it handed
out before over the same state.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hwbackends import layer_ir as ir
from hwbackends.contract import (
    InputError,
    Steps,
    StreamSteps,
    UnsupportedError,
    check_id,
    check_many,
    check_step,
)

from . import push_weights as pw
from .emit import Emitter, vector_shape

#: Per-step layers an incremental form applies to ``x_t`` before the first recurrent layer.
_PER_STEP = (ir.Act, ir.Affine)
#: Layers of the head (on the last recurrent layer's final state, a vector).
_HEAD = (ir.Dense, ir.Act, ir.Affine, ir.Flatten)


@dataclass
class Plan:
    """The incremental form's parts (:func:`plan`)."""

    prefix: list[ir.Layer]
    cells: list[ir.Recurrent]
    head: list[ir.Layer]
    window: int
    step: int


def plan(net: ir.Network, precision: str) -> Plan | None:
    """The incremental form of ``net``, or None when it has none (then the recompute form)."""
    if precision != "fp32" or len(net.input_shape) != 2:
        return None
    layers = list(net.layers)
    i = 0
    while i < len(layers) and isinstance(layers[i], _PER_STEP) and not (
            isinstance(layers[i], ir.Act) and layers[i].kind == "softmax"):
        i += 1
    prefix = layers[:i]
    cells: list[ir.Recurrent] = []
    while i < len(layers) and isinstance(layers[i], ir.Recurrent):
        cells.append(layers[i])  # type: ignore[arg-type]
        i += 1
    head = layers[i:]
    if not cells or any(not c.return_sequences for c in cells[:-1]) or cells[-1].return_sequences:
        return None
    if not all(isinstance(layer, _HEAD) for layer in head):
        return None
    return Plan(prefix, cells, head, int(net.input_shape[0]), int(net.input_shape[1]))


def _pad(n: int) -> int:
    return -(-n // 16) * 16


class _StepEmitter(Emitter):
    """The emitter's building blocks (matvec, gates, layers) with constants of their own names
    (``model.c`` already holds the model function's)."""

    def __init__(self, net: ir.Network, vw: int, acc: int):
        super().__init__(net, vw, acc)
        #: whether the constants emitted now are read by the push (the critical path)
        self.on_push = False
        #: the constants the push reads (:func:`_warm` prefetches them after a prepare)
        self.push_consts: list[tuple[str, int]] = []
        self._seen: dict[bytes, str] = {}

    def const(self, stem: str, a: np.ndarray) -> str:
        """One constant per distinct array (the push's product and push_many's read one copy)."""
        key = stem.encode() + str(np.shape(a)).encode() + np.asarray(a, np.float32).tobytes()
        name = self._seen.get(key)
        if name is None:
            name = self._seen[key] = super().const(f"SL{stem}", a)
        if self.on_push and all(n != name for n, _ in self.push_consts):
            self.push_consts.append((name, 4 * max(a.size, 1)))
        return name

    def function(self, signature: str) -> list[str]:
        """The lines emitted since the last call, as the C function ``signature``."""
        body, self.body = self.body, []
        self.gemm_scratch = None  # stack buffers are the function's own
        return [f"static void {signature} {{", *body, "}", ""]


def _gates(cell: ir.Recurrent) -> int:
    return 4 if cell.cell == "lstm" else 3


def _biases(cell: ir.Recurrent) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(the input projection's bias, the recurrent product's bias) of one layer."""
    if cell.cell == "lstm":
        return None, cell.bias
    if cell.reset_after:
        return cell.bias[0], cell.bias[1]
    return cell.bias, None


def _rec_weights(cell: ir.Recurrent) -> np.ndarray:
    """The recurrent kernel part that multiplies the previous state alone (a GRU without
    ``reset_after`` multiplies ``r·h`` by its candidate columns, on the push)."""
    if cell.cell == "gru" and not cell.reset_after:
        return np.ascontiguousarray(cell.recurrent[:, :2 * cell.units])
    return cell.recurrent


def emit_incremental(net: ir.Network, p: Plan, requires: list[str], push_weights: str = "fp32",
                     push_gates: str = "exact") -> str:
    """The incremental form's C (see the module docstring); appended to ``model.c``.
    ``push_weights`` other than ``fp32``: the push's input products in bf16, f16 or int8
    (hwb_plugins/cpu_native/push_weights.py); ``push_gates="fast"``: its LSTM gates in AVX-512 or AVX2
    (hwb_push.h). Either gives the push its own copies of the functions they change
    (``hwb_inq``, ``hwb_cellq<l>``); the prepare and the stream keep the exact fp32 ones."""
    vw, acc = vector_shape(requires)
    e = _StepEmitter(net, vw, acc)
    reduced_in = push_weights != "fp32"
    kern = pw.Kernels(push_weights, push_gates == "fast") if reduced_in or push_gates == "fast" else None
    out, names = _state(p, reduced_in)
    g0u = _gates(p.cells[0]) * p.cells[0].units
    # the step's per-step layers and the first layer's input projection, shared by the windows
    ib0, _ = _biases(p.cells[0])
    fns: list[str] = []
    for reduced in (False, True) if reduced_in else (False,):
        e.on_push = not reduced_in or reduced
        e.line(f"float xt[{_pad(p.step)}] A64;")
        e.line(f"for (int i = 0; i < {p.step}; i++) xt[i] = x[i];")
        for layer in p.prefix:
            e.layer(layer, "xt", (p.step,), None, (p.step,))
        if reduced:
            e.line(f"{kern.product(p.cells[0].kernel, ib0)}(xt, zx);")  # type: ignore[union-attr]
        elif p.cells[0].cell == "lstm":  # the full window's blocked product on one step (bit-equal sums)
            e.input_gemm("xt", 1, p.step, p.cells[0].kernel, dst="zx")
        else:
            e.matvec([("xt", p.step)], "zx", g0u, p.cells[0].kernel, ib0)
        fns += e.function(f"hwb_in{'q' if reduced else ''}(const float *restrict x, float *restrict zx)")
    many = not reduced_in and not p.prefix and p.cells[0].cell == "lstm"
    if many:  # push_many's input products: MANY ticks' as one blocked product (the same sums)
        e.on_push = True
        _, gp = e.input_gemm("x", MANY, p.step, p.cells[0].kernel, dst="zx")
        fns += e.function("hwb_in_many(const float *restrict x, float *restrict zx)")
    for li, cell in enumerate(p.cells):
        shared = None
        if kern is not None and not reduced_in and li:  # K·h_below: one function (and one copy
            e.on_push = True                             # of K) for the push's cell and the prepare's
            shared, fn = _product(e, li, cell, names)
            fns += fn
        e.on_push = kern is None
        fns += _cell(e, li, cell, names, product=shared)
        if kern is not None:
            e.on_push = True
            fns += _cell(e, li, cell, names, kern, product=shared or (
                kern.product(cell.kernel, _biases(cell)[0]) if li else None))
        e.on_push = False
        h, _, r, u, nr = names[li]
        if cell.cell == "lstm":  # R·h + b as the full window and the blocked prepare sum it
            e.input_gemm(f"{h}[slot]", 1, u, cell.recurrent, dst=f"{r}[slot]", bias=cell.bias)
        else:
            e.matvec([(f"{h}[slot]", u)], f"{r}[slot]", nr, _rec_weights(cell), _biases(cell)[1])
        fns += e.function(f"hwb_rec{li}(hwb_window *restrict w, int slot)")
    blocked = all(cell.cell == "lstm" for cell in p.cells)
    if blocked:
        fns += _blocked_parts(e, p, names)
    e.on_push = True
    fns += _head(e, p, names[-1][0])
    fns += _warm(e.push_consts + (kern.push_consts if kern is not None else []))
    lines = [*out, *(kern.c() if kern is not None else []), *e.consts, "", *fns]
    n = len(p.cells)
    tick = " ".join(f"hwb_cell{li}(w, slot, zx);" for li in range(n))
    tickq = " ".join(f"hwb_cellq{li}(w, slot, zx);" for li in range(n))
    rec = " ".join(f"hwb_rec{li}(w, slot);" for li in range(n))
    zero = " ".join(f"__builtin_memset({h}[slot], 0, sizeof {h}[slot]); __builtin_memset({c}[slot], 0, sizeof {c}[slot]);"
                    for h, c, _, _, _ in names)
    copy = " ".join(f"__builtin_memcpy({a}[d], {a}[s], sizeof {a}[d]);" for h, c, r, _, _ in names for a in (h, c, r))
    last_h = names[-1][0]
    win = "hwb_window *restrict w"
    if kern is not None:
        lines.append(f"static void hwb_tickq({win}, int slot, const float *zx) {{ {tickq} }}")
    if not reduced_in:
        push = ["    hwb_in(x, w->zx);", f"    hwb_tick{'q' if kern else ''}(w, w->f, w->zx);",
                f"    hwb_head({last_h}[w->f], y);"]
        fp32_in = []
    else:  # the answer from the reduced products; the prepare projects x_t again in fp32
        push = ["    hwb_inq(x, w->qzx);", "    hwb_tickq(w, w->f, w->qzx);", f"    hwb_head({last_h}[w->f], y);",
                f"    for (int i = 0; i < {p.step}; i++) w->xt[i] = x[i];"]
        fp32_in = ["    hwb_in(w->xt, w->zx);"]
    lines += [
        f"static void hwb_tick({win}, int slot, const float *zx) {{ {tick} }}",
        f"static void hwb_rec_all({win}, int slot) {{ {rec} }}",
        f"static void hwb_zero({win}, int slot) {{ {zero} hwb_rec_all(w, slot); }}",
        f"static void hwb_copy({win}, int d, int s) {{ {copy} }}",
        f"static int hwb_w_prepare({win}) {{",
        "    if (!w->pend) return 0;", *fp32_in,
        *(_blocked_prepare(p, names) if blocked else [
            "    for (int s = 0; s < HWB_NW; s++) if (s != w->f) { hwb_tick(w, s, w->zx); hwb_rec_all(w, s); }"]),
        "    hwb_zero(w, w->f);",
        "    w->f = w->f + 1 == HWB_NW ? 0 : w->f + 1;",
        "    hwb_warm();", "    w->pend = 0;", "    return 0;", "}",
        f"static int hwb_w_push({win}, const float *x, float *y) {{",
        "    if (w->pend) hwb_w_prepare(w);",
        *push,
        "    w->pend = 1;", "    return 0;", "}",
        # the stream's prepare reads R and one state, which evicts nothing the push reads: no warm pass
        f"static int hwb_s_prepare({win}) {{ if (w->spend) {{ hwb_rec_all(w, HWB_NW); w->spend = 0; }} return 0; }}",
        f"static int hwb_s_push({win}, const float *x, float *y) {{",
        "    if (w->spend) hwb_s_prepare(w);",
        f"    hwb_in(x, w->szx); hwb_tick(w, HWB_NW, w->szx); hwb_head({last_h}[HWB_NW], y);",
        "    w->spend = 1;", "    return 0;", "}",
        "/* a fresh window: each slot holds the state a window has after as many zero steps as its",
        "   age (one run over zero steps, copied into the slots); the stream's state zero */",
        f"static void hwb_w_fill({win}) {{",
        f"    static const float zeros[{_pad(p.step)}] A64;",
        "    w->pend = 0; w->f = 0; w->spend = 0;",
        "    hwb_in(zeros, w->tzx); hwb_zero(w, HWB_NW + 1);",
        "    for (int age = 0; age < HWB_NW; age++) {",
        "        hwb_copy(w, (w->f + HWB_NW - 1 - age) % HWB_NW, HWB_NW + 1);",
        "        if (age + 1 < HWB_NW) { hwb_tick(w, HWB_NW + 1, w->tzx); hwb_rec_all(w, HWB_NW + 1); }",
        "    }",
        "    hwb_zero(w, HWB_NW);", "}",
        "#define HWB_WINDOW_STREAM 1"]
    if many:
        lines += _push_many(p, g0u, gp, last_h)
    lines += ['#include "hwb_window.h"', ""]
    return "\n".join(lines)


#: The most bytes of one layer's input products over the windows in flight the blocked
#: prepare holds on the stack at once (a chunk of windows; the rest in further chunks).
PREPARE_CHUNK_BYTES = 64 << 10


def _chunks(nw: int, g: int) -> list[tuple[int, int]]:
    """``(first window, windows)`` of the blocked prepare's chunks over ``nw`` windows whose
    products are ``g`` floats each: whole tiles of 8 rows within :data:`PREPARE_CHUNK_BYTES`."""
    rows = max(8, PREPARE_CHUNK_BYTES // (4 * _pad(g)) // 8 * 8)
    return [(s0, min(rows, nw - s0)) for s0 in range(0, nw, rows)]


def _blocked_parts(e: _StepEmitter, p: Plan, names: list[tuple[str, str, str, int, int]]) -> list[str]:
    """The blocked prepare's functions (an LSTM stack): ``hwb_gate<l>(w, slot, zx)`` (one
    step of layer ``l``'s gates from its prepared ``r`` and input products ``zx``: what
    ``hwb_cell<l>`` does after its product), and per layer and chunk size ``n`` the products
    over ``n`` windows' rows at once, ``hwb_kb<l>_<n>(h, z)`` (``K_l·h_{l-1}``, l ≥ 1) and
    ``hwb_rb<l>_<n>(h, r)`` (``R_l·h_l + b`` into the rows of ``r``): :meth:`Emitter.input_gemm`
    with the rows' strides, so each window's sums are the one-window functions' bit for bit
    and each weight is read once per chunk, not once per window."""
    fns: list[str] = []
    e.on_push = False
    for li, cell in enumerate(p.cells):
        h, c, r, u, nr = names[li]
        g = _gates(cell) * u
        e.line(f"for (int j = 0; j < {g}; j++) {r}[slot][j] += zx[j];")
        e.lstm_gates(f"{r}[slot]", f"{c}[slot]", f"{h}[slot]", u)
        fns += e.function(f"hwb_gate{li}(hwb_window *restrict w, int slot, const float *restrict zx)")
        fns.append(f"#define HWB_GP{li} {-(-g // e.vw) * e.vw}")  # a product row's floats
        for n in sorted({k for _, k in _chunks(p.window, g)}):
            if li:
                below = names[li - 1][3]
                e.input_gemm("h", n, below, cell.kernel, dst="z", src_stride=_pad(below))
                fns += e.function(f"hwb_kb{li}_{n}(const float *restrict h, float *restrict z)")
            e.input_gemm("h", n, u, cell.recurrent, dst="r", bias=cell.bias, src_stride=_pad(u),
                         dst_stride=_pad(nr))
            fns += e.function(f"hwb_rb{li}_{n}(const float *restrict h, float *restrict r)")
    return fns


def _blocked_prepare(p: Plan, names: list[tuple[str, str, str, int, int]]) -> list[str]:
    """The prepare's step of every window in flight, layer by layer: layer 0's gates from
    the shared ``K₁·x_t``, each later layer's input products over the windows' states as
    blocked products (:func:`_blocked_parts`), then the next step's recurrent products
    likewise. The finishing window's slot (``w->f``) rides along in the products and is
    zeroed after (hwb_zero)."""
    lines = ["    for (int s = 0; s < HWB_NW; s++) if (s != w->f) hwb_gate0(w, s, w->zx);"]
    for li, cell in enumerate(p.cells[1:], 1):
        g = _gates(cell) * cell.units
        below = names[li - 1][0]
        lines.append("    {")
        for s0, n in _chunks(p.window, g):  # rows of whole vectors of any build (_pad)
            lines += [f"        {{ float z[{n * _pad(g)}] A64; hwb_kb{li}_{n}({below}[{s0}], z);",
                      f"          for (int j = 0; j < {n}; j++) if ({s0} + j != w->f) "
                      f"hwb_gate{li}(w, {s0} + j, z + j * HWB_GP{li}); }}"]
        lines.append("    }")
    for li, cell in enumerate(p.cells):
        h, _, r, _, _ = names[li]
        for s0, n in _chunks(p.window, _gates(cell) * cell.units):
            lines.append(f"    hwb_rb{li}_{n}({h}[{s0}], {r}[{s0}]);")
    return lines


#: The ticks of several windows :c:func:`hwb_model_window_push_many` projects as one blocked
#: product (the full window's tile height: the same sums as one tick's).
MANY = 8


def _push_many(p: Plan, g0u: int, gp: int, last_h: str) -> list[str]:
    """``hwb_w_push_many``: every pending prepare first, then the input products of the ``k``
    ticks, :data:`MANY` at a time, as one blocked product (the rest one by one, the same
    sums), then each window's step and head."""
    h = last_h.removeprefix("w->")
    return [
        "#define HWB_WINDOW_PUSH_MANY 1",
        "static int hwb_w_push_many(hwb_window *const *ws, uint32_t k, const float *xs, float *ys) {",
        f"    float zxs[{MANY * gp}] A64;",
        "    for (uint32_t j = 0; j < k; j++) { if (ws[j]->stream) hwb_s_prepare(ws[j]); else hwb_w_prepare(ws[j]); }",
        "    uint32_t i = 0;",
        f"    for (; i + {MANY} <= k; i += {MANY}) {{",
        f"        hwb_in_many(xs + (size_t)i * {p.step}, zxs);",
        f"        for (int j = 0; j < {MANY}; j++) {{ hwb_window *w = ws[i + j]; "
        f"__builtin_memcpy(w->stream ? w->szx : w->zx, zxs + j * {gp}, {4 * g0u}); }}",
        "    }",
        f"    for (; i < k; i++) hwb_in(xs + (size_t)i * {p.step}, ws[i]->stream ? ws[i]->szx : ws[i]->zx);",
        "    for (uint32_t j = 0; j < k; j++) {",
        "        hwb_window *w = ws[j];",
        "        float *y = ys + (size_t)j * HWB_MODEL_OUTPUT_SIZE;",
        f"        if (w->stream) {{ hwb_tick(w, HWB_NW, w->szx); hwb_head(w->{h}[HWB_NW], y); w->spend = 1; }}",
        f"        else {{ hwb_tick(w, w->f, w->zx); hwb_head(w->{h}[w->f], y); w->pend = 1; }}",
        "    }",
        "    return 0;", "}"]


def _state(p: Plan, reduced_in: bool) -> tuple[list[str], list[tuple[str, str, str, int, int]]]:
    """``struct hwb_window``: one window's state (and one stream's: a handle is one or the
    other, hwb_window.h), and per layer the C names of its state, recurrent products and
    sizes ``(h, c, r, units, product width)``."""
    members = ["int stream;", "int f, pend, spend;"]
    names = []
    for li, cell in enumerate(p.cells):
        u = cell.units
        nr = _rec_weights(cell).shape[1]
        names.append((f"w->h{li}", f"w->c{li}", f"w->r{li}", u, nr))
        # slots 0..NW-1: the windows; NW: the stream; NW+1: reset's scratch window
        members += [f"float h{li}[HWB_NW + 2][{_pad(u)}] A64;", f"float c{li}[HWB_NW + 2][{_pad(u)}] A64;",
                    f"float r{li}[HWB_NW + 2][{_pad(nr)}] A64;"]
    g0u = _gates(p.cells[0]) * p.cells[0].units
    members += [f"float zx[{_pad(g0u)}] A64, szx[{_pad(g0u)}] A64, tzx[{_pad(g0u)}] A64;"]
    if reduced_in:  # the push's reduced projection, and x_t kept for the prepare's fp32 one
        members += [f"float qzx[{_pad(g0u)}] A64, xt[{_pad(p.step)}] A64;"]
    out = [f"#define HWB_NW {p.window}", "struct hwb_window {", *(f"    {m}" for m in members), "};"]
    return out, names


def _warm(consts: list[tuple[str, int]]) -> list[str]:
    """``hwb_warm()``: read, at the end of a prepare, one word of every cache line of every
    constant the push reads (its weights: 320 KiB of fp32 for LSTM_A's shape), so they and
    their pages' TLB entries are near when the tick comes. The prepare reads the recurrent
    weights and every window's state, and what it evicts the push would otherwise fetch on the
    critical path. Loads, not ``__builtin_prefetch``: GCC 12 deletes these prefetch loops
    (the function counts as free of side effects). Informally (a loaded 2-vCPU Zen 4, rdtsc
    around the push's parts, LSTM_A's shape): the push's p99 fell from ~39k to ~14k TSC ticks
    and its p50 from ~10.1k to ~9.4k; the first layer's input projection's p99 from ~30k to
    ~5k. The answers are unchanged (nothing the push computes is touched)."""
    body = [f"    for (int i = 0; i < {size // 4}; i += 16) s ^= ((const uint32_t *){name})[i];"
            for name, size in consts]
    return ["static volatile uint32_t hwb_sink;", "static void hwb_warm(void) {", "    uint32_t s = 0;",
            *body, "    hwb_sink = s;", "}", ""]


def _product(e: _StepEmitter, li: int, cell: ir.Recurrent, names: list[tuple[str, str, str, int, int]]
             ) -> tuple[str, list[str]]:
    """``hwb_k<li>(h, zx)``: layer ``li``'s ``K·h_below (+ its input bias)`` in fp32, summed as
    the full window sums it (into a buffer of whole vectors); (its name, its C)."""
    g, u, nb = _gates(cell), cell.units, names[li - 1][3]
    if cell.cell == "lstm":
        e.input_gemm("h", 1, nb, cell.kernel, dst="zx")
    else:
        e.matvec([("h", nb)], "zx", g * u, cell.kernel, _biases(cell)[0])
    return f"hwb_k{li}", e.function(f"hwb_k{li}(const float *restrict h, float *restrict zx)")


def _cell(e: _StepEmitter, li: int, cell: ir.Recurrent, names: list[tuple[str, str, str, int, int]],
          kern: pw.Kernels | None = None, product: str | None = None) -> list[str]:
    """``hwb_cell<li>(slot, zx)``: one step of layer ``li`` for window ``slot``, from its
    prepared recurrent product ``r`` (which it overwrites) and its input: the shared ``zx``
    for the first layer, the layer below's new state otherwise. ``product``: the function
    that computes ``K·h_below (+ its bias)`` (:func:`_product`, or a reduced one of
    push_weights.py) instead of the inline fp32 product. ``kern``: this is the push's copy
    ``hwb_cellq<li>``, with ``kern``'s vector LSTM gates where it has them."""
    reduced = product if li else None
    h, c, r, u, _ = names[li]
    hs, cs, rs = f"{h}[slot]", f"{c}[slot]", f"{r}[slot]"
    g = _gates(cell)
    ib, _ = _biases(cell)
    if li == 0:
        zx = "zx"
    elif cell.cell == "lstm":
        zx = ""
    elif not reduced:
        zx = e.buf(g * u)
    below = (f"{names[li - 1][0]}[slot]", names[li - 1][3]) if li else None
    fn = f"hwb_cell{'q' if kern is not None else ''}{li}(hwb_window *restrict w, int slot, const float *restrict zx)"
    fast = kern is not None and kern.fast_gates
    if below is not None and reduced:
        zx = e.buf(_pad(g * u))
        e.line(f"{reduced}({below[0]}, {zx});")
    if cell.cell == "lstm":
        if below is not None and not reduced:  # K·h_below as the full window's blocked product sums it
            zx = e.buf(_pad(g * u))
            e.input_gemm(below[0], 1, below[1], cell.kernel, dst=zx)
        if fast:
            e.body += kern.lstm_gates(rs, zx, cs, hs, u)  # type: ignore[union-attr]
            return e.function(fn)
        e.line(f"for (int j = 0; j < {g * u}; j++) {rs}[j] += {zx}[j];")
        e.lstm_gates(rs, cs, hs, u)
        return e.function(fn)
    if below is not None and not reduced:
        e.matvec([below], zx, g * u, cell.kernel, ib)
    if cell.reset_after:
        e.line(f"for (int j = 0; j < {u}; j++) {{ const float zg = hwb_sigmoid({zx}[j] + {rs}[j]), "
               f"rg = hwb_sigmoid({zx}[{u} + j] + {rs}[{u} + j]), "
               f"hh = hwb_tanh({zx}[{2 * u} + j] + rg * {rs}[{2 * u} + j]); "
               f"{hs}[j] = zg * {hs}[j] + (1.0f - zg) * hh; }}")
    else:  # the candidate's recurrent term multiplies r·h: its matvec is on the push
        z, hz, rh = e.buf(u), e.buf(2 * u), e.buf(u)
        e.line(f"for (int j = 0; j < {2 * u}; j++) {hz}[j] = hwb_sigmoid({zx}[j] + {rs}[j]);")
        e.line(f"for (int j = 0; j < {u}; j++) {{ {rh}[j] = {hz}[{u} + j] * {hs}[j]; {z}[j] = {zx}[{2 * u} + j]; }}")
        e.matvec([(rh, u)], z, u, np.ascontiguousarray(cell.recurrent[:, 2 * u:]), None, accumulate=True)
        e.line(f"for (int j = 0; j < {u}; j++) {{ const float zg = {hz}[j], hh = hwb_tanh({z}[j]); "
               f"{hs}[j] = zg * {hs}[j] + (1.0f - zg) * hh; }}")
    return e.function(fn)


def _head(e: _StepEmitter, p: Plan, h: str) -> list[str]:
    """``hwb_head(h, y)``: the head layers on a copy of the last layer's state."""
    u = p.cells[-1].units
    e.line(f"float hv[{_pad(u)}] A64;")
    e.line(f"for (int j = 0; j < {u}; j++) hv[j] = h[j];")
    producing = [i for i, layer in enumerate(p.head) if not isinstance(layer, (ir.Act, ir.Flatten, ir.Affine))]
    last = producing[-1] if producing else -1
    cur, shape = "hv", (u,)
    for i, layer in enumerate(p.head):
        out_shape = layer.out_shape(shape)
        e.cur = 1_000_000 + i  # no layer of the net: no conv epilogue fused into it
        cur = e.layer(layer, cur, shape, "y" if i == last else None, out_shape)
        shape = out_shape
    if last < 0:
        e.line(f"for (int j = 0; j < {int(np.prod(shape))}; j++) y[j] = {cur}[j];")
    return e.function("hwb_head(const float *restrict h, float *restrict y)")


def emit_recompute(window: int, step: int) -> str:
    """The recompute form's C: the window in a doubled ring, ``hwb_one`` on it each tick."""
    return "\n".join([
        f"#define HWB_NW {window}", f"#define HWB_STEP {step}",
        "struct hwb_window { int stream; int k; float ring[2 * HWB_NW * HWB_STEP] A64; };",
        "static int hwb_w_push(hwb_window *restrict w, const float *x, float *y) {",
        "    __builtin_memcpy(w->ring + w->k * HWB_STEP, x, 4 * HWB_STEP);",
        "    __builtin_memcpy(w->ring + (w->k + HWB_NW) * HWB_STEP, x, 4 * HWB_STEP);",
        "    hwb_one(w->ring + (w->k + 1) * HWB_STEP, y);",
        "    w->k = w->k + 1 == HWB_NW ? 0 : w->k + 1;", "    return 0;", "}",
        "static int hwb_w_prepare(hwb_window *restrict w) { (void)w; return 0; }",
        "static void hwb_w_fill(hwb_window *restrict w) { __builtin_memset(w->ring, 0, sizeof w->ring); w->k = 0; }",
        "#define HWB_WINDOW_STREAM 0", '#include "hwb_window.h"', ""])


@dataclass
class WindowC:
    """What :func:`emit` gives the target: the C to append, its header lines, the metadata."""

    code: str
    header: str
    meta: dict[str, Any]


def emit(net: ir.Network | None, in_shape: tuple[int, ...], precision: str, requires: list[str],
         push_weights: str = "fp32", push_gates: str = "exact") -> WindowC:
    """The sliding window's and stream's C for a model of input ``in_shape`` (``net``: its
    layer IR, None for the fixed-point path, which takes the recompute form). ``push_weights``
    and ``push_gates`` (the target's options, push_weights.py): the precision of the weights the
    push reads and its LSTM gates' form; anything but ``fp32`` / ``exact`` needs the incremental
    form (UnsupportedError otherwise)."""
    window = int(in_shape[0]) if in_shape else 1
    step = int(np.prod(in_shape[1:])) if len(in_shape) > 1 else 1
    p = plan(net, precision) if net is not None else None
    form = "incremental" if p is not None else "recompute"
    if (push_weights != "fp32" or push_gates != "exact") and p is None:
        what = f"push_weights={push_weights!r}" if push_weights != "fp32" else f"push_gates={push_gates!r}"
        raise UnsupportedError(
            f"cpu.native option {what} changes the sliding "
            f"push's incremental form (fp32 stacks of LSTM/GRU layers under a Dense head); this "
            f"model at precision {precision!r} takes the {form} form, whose push is the whole "
            f"model: drop {what.split('=')[0]} (or use precision='int8' for reduced weights everywhere)")
    code = (emit_incremental(net, p, requires, push_weights, push_gates) if p is not None  # type: ignore[arg-type]
            else emit_recompute(window, step))
    header = header_text(window, step, form, p is not None, push_weights, push_gates)
    meta = {"form": form, "window": window, "step": step, "stream": p is not None}
    if push_weights != "fp32" or push_gates != "exact":
        meta.update(push_weights=push_weights, push_gates=push_gates)
    return WindowC("/* ---- the sliding window and the stream (hwb_plugins/cpu_native/sliding.py) ---- */\n"
                   + code, header, meta)


def header_text(window: int, step: int, form: str, stream: bool, push_weights: str = "fp32",
                push_gates: str = "exact") -> str:
    """The window's lines of ``hwb_model.h`` for every incremental form (this module's and
    sliding_conv.py's): its sizes, form, stream and push options, then :data:`HEADER`'s
    declarations copied verbatim (the exported header is one self-contained file)."""
    return (f"\n/* the sliding window of this library: its sizes and form; its calls below */\n"
            f"#define HWB_MODEL_WINDOW {window}\n#define HWB_MODEL_PUSH_WEIGHTS \"{push_weights}\"\n"
            f"#define HWB_MODEL_PUSH_GATES \"{push_gates}\"\n#define HWB_MODEL_STEP_SIZE {step}\n"
            f"#define HWB_MODEL_SLIDING \"{form}\"\n#define HWB_MODEL_STREAM {int(stream)}\n"
            + (Path(__file__).resolve().parent / HEADER).read_text())


#: The sliding window's calls in every artifact's ``hwb_model.h``, a real header beside this
#: module: what they do, then their declarations.
HEADER = "hwb_model_window.h"

# -- the extension's entries ---------------------------------------------------------------
def ext_parts(in_shape: tuple[int, ...]) -> tuple[str, str]:
    """The extension's definitions and method-table entries for one artifact: the fixed
    window entries (hwb_ext_window.h) for this artifact's step shape."""
    step = tuple(in_shape[1:])
    defs = (f"#define HWB_EXT_SXSHAPE {', '.join(map(str, step)) or '0'}\n"
            f"#define HWB_EXT_SXND {len(step)}\n#include \"hwb_ext_window.h\"\n")
    return defs, "\n    HWB_EXT_WINDOW_METHODS"


# -- the executor's hook -------------------------------------------------------------------
#: The Steps last handed out per library (its module name: two executors of one artifact load
#: one shared object, so they share its state) and semantics.
_LIVE: dict[str, dict[bool, Steps]] = {}


def steps(module: Any, meta: dict[str, Any], in_shape: tuple[int, ...], out_shape: tuple[int, ...],
          *, stateful: bool, auto_prepare: bool) -> Steps | None:
    """The :class:`Steps` over the library's window (``stateful``: its stream), reset; None
    when the artifact has none (built before it, or no stream form)."""
    info = meta.get("sliding")
    if not info or not hasattr(module, "push_into") or (stateful and not info.get("stream")):
        return None
    module.window_check(functools.partial(_check, module, tuple(in_shape[1:]), tuple(out_shape)), InputError)
    live = _LIVE.setdefault(module.__name__, {})
    old = live.get(stateful)
    if old is not None:
        old.revoke("this window was replaced: a later sliding()/streaming() on the same cpu.native "
                   "library took over its state (one window and one stream per loaded model); use "
                   "the newest")
    if stateful:
        module.stream_reset()
        s = Steps(module.stream_step_into if auto_prepare else module.stream_push_into,
                  module.stream_prepare, module.stream_reset, "incremental")
    else:
        module.reset()
        s = Steps(module.step_into if auto_prepare else module.push_into, module.prepare,
                  module.reset, info["form"])
    live[stateful] = s
    return s


def streams_steps(module: Any, meta: dict[str, Any], in_shape: tuple[int, ...],
                  out_shape: tuple[int, ...], streams: int, *, stateful: bool,
                  auto_prepare: bool) -> StreamSteps | None:
    """``streams`` windows (``stateful``: streams) as handles of the library
    (hwb_window.h), in one capsule freed with the returned calls; None when the artifact has
    none (built before them, or no stream form)."""
    info = meta.get("sliding")
    if not info or not hasattr(module, "windows") or (stateful and not info.get("stream")):
        return None
    module.window_check(functools.partial(_check, module, tuple(in_shape[1:]), tuple(out_shape)), InputError)
    cap = module.windows(streams, stateful)
    push = module.wstep if auto_prepare else module.wpush
    many = module.wstep_many if auto_prepare else module.wpush_many
    return StreamSteps(functools.partial(push, cap), functools.partial(many, cap),
                       functools.partial(module.wprepare, cap), functools.partial(module.wreset, cap),
                       "incremental" if stateful else info["form"])


def _check(module: Any, step: tuple[int, ...], out_shape: tuple[int, ...], *args: Any) -> None:
    """The InputError for a call the extension's fast checks refused: ``(x_t, out)`` of the
    library's window, ``(set, i, x_t, out)`` or ``(set, ids, xs, outs)`` of a set."""
    if len(args) == 2:
        check_step(args[0], args[1], step, out_shape)
        return
    if len(args) != 4:
        raise TypeError(f"push_into takes (x_t, out), or (i, x_t, out) on many windows; got "
                        f"{len(args) - 1 if len(args) > 2 else len(args)} arguments")
    n = module.wcount(args[0])
    if isinstance(args[1], np.ndarray):
        check_many(args[1], args[2], args[3], n, step, out_shape)
    else:
        check_id(args[1], n)
        check_step(args[2], args[3], step, out_shape)

