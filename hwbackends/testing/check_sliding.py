"""The ``sliding`` check: ``cm.sliding()`` answers every tick what ``predict_into`` answers on
the window ending at that tick (hwbackends/sliding.py), whichever form the target gives it;
and ``cm.sliding(streams=N)``'s windows each answer their own ticks, through interleaved
pushes, ``push_many`` and a reset."""
from __future__ import annotations

import numpy as np

from ..compiled import CompiledModel
from ..errors import UnsupportedError
from ..fidelity import family_tolerance, precision_family
from .context import Conformance, ConformanceError, NotApplicable, Variant

#: Ticks past the first full window: every ring position is written twice, and an incremental
#: form retires and restarts each window in flight at least once.
EXTRA_TICKS = 20
#: Max |push_into - predict_into| over the answers' scale (max(1, max |answer|)) for an
#: incremental form in fp32 (the issue's bound); other families use their fidelity tolerance.
FP32_SLIDING_ERR = 1e-5


def push_precision(cm: CompiledModel) -> str | None:
    """The precision a variant's sliding push was gated at, when its target stored one
    (``meta["sliding"]["push_gate"]["tolerance"]``: cpu.native's ``push_weights`` keeps an
    fp32 variant whose push reads bf16 or int8 weights); ``None``: the variant's own."""
    sl = cm.artifact.meta.get("sliding")
    gate = sl.get("push_gate") if isinstance(sl, dict) else None
    tol = gate.get("tolerance") if isinstance(gate, dict) else None
    return tol if isinstance(tol, str) and tol in ("bf16", "fp16", "int8") else None


def replay(cm: CompiledModel, xs: np.ndarray) -> np.ndarray:
    """What ``predict_into`` answers for the window ending at each step of ``xs`` (``(n,
    *input.shape[1:])``), the window zero-filled before it is full."""
    t = cm.input.shape[0]
    hist = np.zeros((t - 1 + len(xs), *xs.shape[1:]), np.float32)
    hist[t - 1:] = xs
    x = np.zeros(cm.input.batched(cm.batch_size), np.float32)
    y = np.zeros(cm.output.batched(cm.batch_size), np.float32)
    out = np.zeros((len(xs), *cm.output.shape), np.float32)
    for i in range(len(xs)):
        x[0] = hist[i:i + t]
        cm.predict_into(x, y)
        out[i] = y[0]
    return out


def pushes(window: object, xs: np.ndarray, out_shape: tuple[int, ...], prepare: bool) -> np.ndarray:
    """``window.push_into`` over every step of ``xs`` (``prepare``: ``prepare()`` after each)."""
    res = np.zeros((len(xs), *out_shape), np.float32)
    out = np.zeros(out_shape, np.float32)
    for i in range(len(xs)):
        window.push_into(xs[i, ...], out)  # type: ignore[attr-defined]
        res[i] = out
        if prepare:
            window.prepare()  # type: ignore[attr-defined]
    return res


def check_sliding(ctx: Conformance, v: Variant) -> str:
    """``sliding()`` equals ``predict_into`` on the window ending at each tick, zero-filled
    before it is full, over ``window + EXTRA_TICKS`` ticks; after ``reset()`` the same
    pushes give the same answers; with ``auto_prepare=False`` an explicit ``prepare()``
    between ticks gives them too."""
    cm = ctx.compiled(v)
    if cm.multi_io or not cm.input.shape:
        raise NotApplicable(f"{v.model} has no single windowed input (sliding() needs one)")
    try:
        w = cm.sliding()
    except UnsupportedError as exc:
        raise ConformanceError(f"sliding() refused {cm.variant} on {v.model}: {exc}; every "
                               f"target has at least the recompute fallback") from exc
    t = cm.input.shape[0]
    m = ctx.model(v.model)
    xs = np.ascontiguousarray(m.representative(t + EXTRA_TICKS, seed=5)[:, -1], np.float32)
    want = replay(cm, xs)
    got = pushes(w, xs, tuple(cm.output.shape), prepare=False)
    scale = max(1.0, float(np.abs(want).max()))
    fam = precision_family(v.precision)
    if w.form == "recompute":
        tol = 1e-6
    elif (pushed := push_precision(cm)) is not None:
        tol = family_tolerance(pushed).rel_err
    else:
        tol = FP32_SLIDING_ERR if fam == "fp32" else family_tolerance(v.precision).rel_err
    err = float(np.abs(got - want).max()) / scale
    if not err <= tol:
        tick = int(np.abs(got - want).reshape(len(xs), -1).max(axis=1).argmax())
        raise ConformanceError(f"sliding ({w.form}) on {cm.variant}: push_into differs from "
                               f"predict_into on the same window by {err:.3g} of the answers' scale "
                               f"(bound {tol:g}), first worst at tick {tick} of {len(xs)} (window {t})")
    w.reset()
    again = pushes(w, xs[:t + 2], tuple(cm.output.shape), prepare=False)
    if not np.array_equal(again, got[:t + 2]):
        raise ConformanceError(f"sliding ({w.form}) on {cm.variant}: after reset() the same pushes "
                               f"give other answers (max diff {np.abs(again - got[:t + 2]).max():.3g})")
    manual = cm.sliding(auto_prepare=False)
    split = pushes(manual, xs[:t + 2], tuple(cm.output.shape), prepare=True)
    if not np.array_equal(split, got[:t + 2]):
        raise ConformanceError(f"sliding ({manual.form}, auto_prepare=False) on {cm.variant}: "
                               f"push_into then prepare() gives other answers than push_into alone "
                               f"(max diff {np.abs(split - got[:t + 2]).max():.3g})")
    many = check_streams(cm, xs, tol)
    return (f"{w.form}: {len(xs)} ticks over a window of {t}, max error {err:.2g} of scale {scale:.3g}; "
            f"{many}")


#: Windows the many-window part drives.
STREAMS = 3


def check_streams(cm: CompiledModel, xs: np.ndarray, tol: float) -> str:
    """``sliding(streams=STREAMS)``: window ``i`` takes its own sequence (``xs`` scaled by
    ``1 - i/4``, reversed for odd ``i``), the windows' ticks interleaved: on every third
    round all together through ``push_many`` (ids in a shuffled order), else one by one;
    window 2 is reset halfway. Each window's answers must be ``predict_into``'s on its own
    ticks (within ``tol`` of the answers' scale)."""
    ws = cm.sliding(streams=STREAMS)
    seqs = [np.ascontiguousarray((xs[::-1] if i % 2 else xs) * np.float32(1 - i / 4)) for i in range(STREAMS)]
    n, half = len(xs), len(xs) // 2
    got = np.zeros((STREAMS, n, *cm.output.shape), np.float32)
    out = np.zeros(cm.output.shape, np.float32)
    order = np.array([2, 0, 1], np.int64)
    for r in range(n):
        if r == half:
            ws.reset(2)
        if r % 3 == 2:
            outs = np.zeros((STREAMS, *cm.output.shape), np.float32)
            ws.push_many(order, np.ascontiguousarray(np.stack([seqs[i][r] for i in order.tolist()])), outs)
            for j, i in enumerate(order.tolist()):
                got[i, r] = outs[j]
        else:
            for i in range(STREAMS):
                ws.push_into(i, seqs[i][r], out)
                got[i, r] = out
    worst = 0.0
    for i in range(STREAMS):
        want = replay(cm, seqs[i])
        if i == 2:  # the reset: the second half starts on an empty window
            want[half:] = replay(cm, seqs[i][half:])
        scale = max(1.0, float(np.abs(want).max()))
        err = float(np.abs(got[i] - want).max()) / scale
        worst = max(worst, err)
        if not err <= tol:
            raise ConformanceError(
                f"sliding(streams={STREAMS}) ({ws.form}) on {cm.variant}: window {i} differs from "
                f"predict_into on its own ticks by {err:.3g} of the answers' scale (bound {tol:g}); "
                f"its windows must not share state, and push_many must answer as push_into does")
    return f"{STREAMS} windows ({ws.form}) interleaved with push_many and a reset, max error {worst:.2g}"
