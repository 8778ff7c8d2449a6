"""cpu.native's incremental sliding window for convolutions and pooling
(hwb_plugins/cpu_native/sliding_conv.py), through the public API: random Keras Conv1D stacks
(kernel, dilation, 'valid' or 'causal' padding, filters, activations, a per-step Dense, a
global average/max pool or a one-step slice, a Dense head) compiled, then
``sliding().push_into`` against ``predict_into`` on the same window over many ticks, with
resets and prepare patterns, the zero-filled start included; zoo:conv1d over 10,000 ticks;
a strided stack is taken; what the form refuses ('same' padding) keeps the recompute form.
``HWB_SLIDING_EXAMPLES`` raises the number of random models (default 3)."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sliding_ref import check_drawn_ticks, check_slides_incrementally, push_all, window_answers

import hwbackends as hwb
from hwbackends.errors import UnsupportedError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
EXAMPLES = int(os.environ.get("HWB_SLIDING_EXAMPLES", "3"))
#: The issue's bound on |push_into - predict_into| in fp32, over the answers' scale.
FP32_ERR = 1e-5

#: (filters, kernel, dilation, causal, activation) per Conv1D
convs = st.lists(st.tuples(st.integers(1, 9), st.integers(1, 4), st.integers(1, 4), st.booleans(),
                           st.sampled_from(["relu", "tanh", "linear"])), min_size=1, max_size=3)


def conv_model(seed: int, window: int, features: int, stack, prefix: bool, per_step: bool, pool: str,
               hidden: int, residual: str = "", stride: int = 1, padding: str | None = None):
    import keras

    keras.utils.set_random_seed(seed)
    inp = keras.Input((window, features), name="window")
    h = keras.layers.Activation("tanh", name="squash")(inp) if prefix else inp
    for i, (filters, k, dil, causal, act) in enumerate(stack):
        pad = padding or ("causal" if causal else "valid")
        h = keras.layers.Conv1D(filters, k, dilation_rate=dil, padding=pad, strides=stride, activation=act,
                                name=f"conv{i}")(h)
        if per_step and i == 0:
            h = keras.layers.Dense(3, activation="sigmoid", name="per_step")(h)
    if residual:  # a TCN block: two causal convs, a 1×1 conv or the identity as the shortcut
        c = int(h.shape[-1])
        body = keras.layers.Conv1D(c, 2, padding="causal", activation="relu", name="res0")(h)
        body = keras.layers.Conv1D(c, 2, dilation_rate=2, padding="causal", name="res1")(body)
        short = keras.layers.Conv1D(c, 1, name="res_short")(h) if residual == "conv" else h
        h = keras.layers.Activation("relu", name="res_act")(keras.layers.Add(name="add")([short, body]))
    if pool == "avg":
        h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    elif pool == "max":
        h = keras.layers.GlobalMaxPooling1D(name="pool")(h)
    elif pool == "last":
        h = h[:, -1]
    else:
        h = h[:, 0]
    if hidden:
        h = keras.layers.Dense(hidden, activation="relu", name="hidden")(h)
    out = keras.layers.Dense(2, name="signal")(h)
    m = keras.Model(inp, out, name="sliding_conv_rand")
    rng = np.random.default_rng(seed)  # biases too, so a zero window's positions are not zero
    m.set_weights([rng.normal(0, 0.5, w.shape).astype(np.float32) for w in m.get_weights()])
    return m


def _shrink(stack) -> int:
    """How many steps the 'valid' convolutions take off the window."""
    return sum((k - 1) * d for _, k, d, causal, _ in stack if not causal)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), extra=st.integers(0, 8), features=st.integers(1, 6), stack=convs,
       prefix=st.booleans(), per_step=st.booleans(), pool=st.sampled_from(["avg", "max", "last", "first"]),
       hidden=st.sampled_from([0, 5]), residual=st.sampled_from(["", "identity", "conv"]), data=st.data())
def test_incremental_conv_window_equals_predict_into_on_the_window(store_dir, seed, extra, features, stack,
                                                                   prefix, per_step, pool, hidden, residual,
                                                                   data):
    window = _shrink(stack) + 1 + extra
    km = conv_model(seed, window, features, stack, prefix, per_step, pool, hidden, residual)
    cm = hwb.compile(km, "cpu.native", store=store_dir, fidelity=False)
    assert cm.artifact.meta["sliding"]["form"] == "incremental"
    xs, auto, every = check_drawn_ticks(cm, data, seed, features, window, FP32_ERR)
    with pytest.raises(UnsupportedError, match="no streaming form"):
        cm.streaming()


@pytest.mark.parametrize("residual", ["", "conv"])
def test_causal_dilated_tcn_is_incremental_from_its_zero_filled_start(store_dir, residual):
    """A TCN (causal, dilations 1, 2, 4, kernel 3; then a residual block) over a window of 20:
    its first 14 positions (17 with the block) read the window's own zero padding, recomputed
    for each window; answers within 1e-5 of predict_into's from the first tick (the zero-filled
    start) on, and again after a reset."""
    stack = [(8, 3, 1, True, "relu"), (8, 3, 2, True, "relu"), (8, 3, 4, True, "relu")]
    cm = hwb.compile(conv_model(4, 20, 5, stack, False, False, "avg", 0, residual), "cpu.native",
                     store=store_dir, fidelity=False)
    w = cm.sliding()
    assert w.form == "incremental"
    xs = np.random.default_rng(2).normal(0, 1.5, (90, 5)).astype(np.float32)
    got = push_all(w, xs, (2,), {50})
    want = window_answers(cm, xs, {50})
    assert np.abs(got - want).max() <= FP32_ERR * max(1.0, np.abs(want).max())


@pytest.fixture(scope="module")
def conv1d_native(compiled):
    return compiled("conv1d", "cpu.native")


def test_zoo_conv1d_over_10000_ticks_without_drift(conv1d_native):
    """zoo:conv1d takes the incremental form; 10,000 ticks, every answer within 1e-5 of
    predict_into's on the same window (the pooled sum is rebuilt from the ring every tick, so
    the last ticks are as close as the first)."""
    cm = conv1d_native
    assert cm.artifact.meta["sliding"]["form"] == "incremental"
    xs = np.random.default_rng(7).normal(size=(10_000, 8)).astype(np.float32)
    got = push_all(cm.sliding(), xs, (1,), prepare_every=1)
    want = window_answers(cm, xs)
    err = np.abs(got - want) / max(1.0, np.abs(want).max())
    assert err.max() <= FP32_ERR
    assert err[-1000:].max() <= max(err[:1000].max(), 1e-6)


def test_a_non_finite_step_answers_nan_while_it_is_in_the_window(conv1d_native):
    """predict_into's NaN rule: a window holding a NaN or Inf answers NaN (a ReLU would hide
    it); the push does the same for the 32 ticks the step stays in the window, then recovers."""
    cm = conv1d_native
    xs = np.random.default_rng(8).normal(size=(80, 8)).astype(np.float32)
    xs[10, 3], xs[60, 0] = np.nan, np.inf
    got = push_all(cm.sliding(), xs, (1,))
    want = window_answers(cm, xs)
    assert np.isnan(want[10:42]).all() and np.isfinite(want[42:60]).all()
    np.testing.assert_allclose(got, want, atol=FP32_ERR * 2, rtol=0)


def test_what_it_refuses_keeps_the_recompute_form(store_dir):
    """'same' padding (the newest positions read right padding) is not taken: the recompute
    form, predict_into's own function on the ring, bit for bit. (Strides and local pooling
    are: tests/test_sliding_dense.py.)"""
    stack = [(4, 3, 1, False, "relu"), (4, 2, 1, False, "relu")]
    km = conv_model(3, 12, 3, stack, False, False, "avg", 0, padding="same")
    cm = hwb.compile(km, "cpu.native", store=store_dir, fidelity=False)
    w = cm.sliding()
    assert w.form == "recompute" and cm.artifact.meta["sliding"]["form"] == "recompute"
    xs = np.random.default_rng(3).normal(size=(30, 3)).astype(np.float32)
    np.testing.assert_array_equal(push_all(w, xs, (2,)), window_answers(cm, xs))


def test_a_strided_conv_is_incremental(store_dir):
    """A strided stack (stride 2 on both convs, window 12:
    the last position reads the window's steps up to 8 of 0..11, so the newest three reach the
    answer only through the NaN rule) slides incrementally, equal to predict_into on every
    window, a reset included."""
    stack = [(4, 3, 1, False, "relu"), (4, 2, 1, False, "relu")]
    cm = hwb.compile(conv_model(3, 12, 3, stack, False, False, "avg", 0, stride=2), "cpu.native",
                     store=store_dir, fidelity=False)
    w = cm.sliding()
    assert w.form == "incremental"
    xs = np.random.default_rng(3).normal(size=(40, 3)).astype(np.float32)
    got, want = push_all(w, xs, (2,), {20}), window_answers(cm, xs, {20})
    assert np.abs(got - want).max() <= FP32_ERR * max(1.0, np.abs(want).max())


def torch_tcn(c_in: int, ch: int, k: int, dils: list[int], style: str, gelu: bool):
    """A torch TCN over (batch, time, c_in), written as desks write it: channels-first through
    a transpose, causal by ``F.pad`` ("pad") or ``Conv1d(padding)`` then a slice ("slice"),
    residual blocks (a 1×1 conv where the channels change), the last step by ``y[..., -1]``."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn

    class TCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = nn.ModuleList(
                nn.Conv1d(c_in if i == 0 else ch, ch, k, dilation=d, padding=(k - 1) * d if style == "slice" else 0)
                for i, d in enumerate(dils))
            self.down = nn.Conv1d(c_in, ch, 1) if c_in != ch else None
            self.head = nn.Linear(ch, 2)

        def forward(self, x):
            y = x.transpose(1, 2)
            for i, (conv, d) in enumerate(zip(self.convs, dils, strict=True)):
                p = (k - 1) * d
                z = conv(F.pad(y, (p, 0))) if style == "pad" else (conv(y)[:, :, :-p] if p else conv(y))
                z = F.gelu(z) if gelu else torch.relu(z)
                y = z + (self.down(y) if i == 0 and self.down is not None else y)
            return self.head(y[..., -1])

    torch.manual_seed(k * 7 + len(dils))
    return TCN().eval()


@pytest.mark.parametrize("style,gelu", [("pad", False), ("slice", True)])
def test_torch_tcn_with_residual_blocks_is_incremental(store_dir, style, gelu):
    """The torch TCN (causal by F.pad or by a conv's padding cut off by a slice, residual
    blocks, dilations 1, 2, 4, the last step) slides incrementally: within 1e-5 of
    predict_into on every window, the zero-filled start and a reset included."""
    model = hwb.load_model(torch_tcn(3, 6, 3, [1, 2, 4], style, gelu), input_shape=(24, 3), name="tcn")
    check_slides_incrementally(model, store_dir, 80, 40, 3, FP32_ERR)
