"""The reference answers of a sliding window, from ``predict_into`` on each window itself
(tests/test_sliding*.py)."""
from __future__ import annotations

import numpy as np


def window_answers(cm, xs: np.ndarray, starts: set[int] = frozenset()) -> np.ndarray:
    """predict_into on the window ending at each step of ``xs``, zero-filled before it is full;
    the window empties before each index in ``starts`` (a reset)."""
    t = cm.input.shape[0]
    out = np.zeros((len(xs), *cm.output.shape), np.float32)
    y = np.zeros(cm.output.batched(cm.batch_size), np.float32)
    x = np.zeros(cm.input.batched(cm.batch_size), np.float32)
    begin = 0
    for i in range(len(xs)):
        if i in starts:
            begin = i
        win = np.zeros(cm.input.shape, np.float32)
        seen = xs[max(begin, i - t + 1):i + 1]
        win[t - len(seen):] = seen
        x[0] = win
        cm.predict_into(x, y)
        out[i] = y[0]
    return out


def push_all(w, xs: np.ndarray, out_shape: tuple[int, ...], resets: set[int] = frozenset(),
             prepare_every: int = 0) -> np.ndarray:
    """``w.push_into`` over every step of ``xs`` (``reset()`` before each index in ``resets``,
    ``prepare()`` after every ``prepare_every``-th push when it is not 0)."""
    got = np.zeros((len(xs), *out_shape), np.float32)
    out = np.zeros(out_shape, np.float32)
    for i in range(len(xs)):
        if i in resets:
            w.reset()
        w.push_into(xs[i, ...], out)
        got[i] = out
        if prepare_every and i % prepare_every == 0:
            w.prepare()
    return got


def check_drawn_ticks(cm, data, seed: int, features: int, window: int, bound: float) -> tuple:
    """The property both incremental forms share: Hypothesis draws a tick count, resets, the
    auto_prepare flag and a prepare pattern; ``cm.sliding()``'s pushes must equal predict_into
    on each window within ``bound`` of the output scale. Returns ``(xs, auto, every)`` for more checks."""
    from hypothesis import strategies as st

    n = data.draw(st.integers(1, 3 * window + 8), label="ticks")
    resets = data.draw(st.sets(st.integers(1, max(1, n - 1)), max_size=2), label="resets")
    auto = data.draw(st.booleans(), label="auto_prepare")
    every = data.draw(st.integers(0, 2), label="prepare_every")
    xs = np.random.default_rng(seed + 1).normal(0, 1.5, (n, features)).astype(np.float32)
    w = cm.sliding(auto_prepare=auto)
    assert w.form == "incremental"
    got = push_all(w, xs, tuple(cm.output.shape), resets, every)
    want = window_answers(cm, xs, {r for r in resets if r < n})
    err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
    assert err <= bound, (err, got, want)
    return xs, auto, every


def check_slides_incrementally(model, store, ticks: int, reset_at: int, prepare_every: int,
                               bound: float) -> None:
    """``model`` (a ``hwb.load_model`` result) on cpu.native slides in the incremental form and
    its pushes over ``ticks`` seeded steps, with a reset at ``reset_at`` and a prepare after
    every ``prepare_every``-th push, equal predict_into on each window within ``bound`` of the
    output scale."""
    import hwbackends as hwb

    cm = hwb.compile(model, "cpu.native", store=store, fidelity=False)
    w = cm.sliding()
    assert w.form == "incremental"
    xs = np.random.default_rng(5).normal(0, 1.5, (ticks, *cm.input.shape[1:])).astype(np.float32)
    got = push_all(w, xs, tuple(cm.output.shape), {reset_at}, prepare_every=prepare_every)
    want = window_answers(cm, xs, {reset_at})
    assert np.abs(got - want).max() <= bound * max(1.0, np.abs(want).max())


def seeded_weights(m, seed: int):
    """``m`` (Keras) with every weight, biases too, drawn N(0, 0.5) from ``seed``: a zero
    window's state or positions are then not zero."""
    rng = np.random.default_rng(seed)
    m.set_weights([rng.normal(0, 0.5, w.shape).astype(np.float32) for w in m.get_weights()])
    return m
