"""cpu.native's incremental sliding window for a Dense over the flattened window, strided
convolutions and local pooling (hwb_plugins/cpu_native/sliding_conv.py, sliding_dense.py),
through the public API: drawn Keras stacks of Conv1D (kernel, stride, dilation, 'valid' or
'causal', filters, activation) and MaxPooling1D/AveragePooling1D (size, stride) over a window
of any length, with a Flatten → Dense, a global pool or the last step as the head, compiled,
then ``sliding().push_into`` against ``predict_into`` on the same window over many ticks,
with resets and prepare patterns, the zero-filled start included; torch conv stacks in both
flatten layouts (channels-first, as ``flatten(1)`` of an ``(N, C, T)`` tensor, and
channels-last); 10,000 ticks without drift and the NaN rule. ``HWB_SLIDING_EXAMPLES`` raises
the number of drawn models (default 3)."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sliding_ref import (
    check_drawn_ticks,
    check_slides_incrementally,
    push_all,
    seeded_weights,
    window_answers,
)

import hwbackends as hwb

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
EXAMPLES = int(os.environ.get("HWB_SLIDING_EXAMPLES", "3"))
#: The issue's bound on |push_into - predict_into| in fp32, over the answers' scale.
FP32_ERR = 1e-5

#: ("conv", filters, kernel, stride, dilation, causal, activation) or ("max"/"avg", size, stride)
_conv = st.tuples(st.just("conv"), st.integers(1, 6), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3),
                  st.booleans(), st.sampled_from(["relu", "tanh", "linear"]))
_pool = st.tuples(st.sampled_from(["max", "avg"]), st.integers(1, 3), st.integers(1, 3))
stacks = st.lists(st.one_of(_conv, _pool), min_size=0, max_size=3)


def _span(layer) -> tuple[int, int, int]:
    """(receptive span, stride, left padding) of one drawn layer (dilation 1 with a stride:
    Keras takes only one of the two above 1)."""
    if layer[0] == "conv":
        _, _, k, s, d, causal, _ = layer
        d = 1 if s > 1 else d
        span = (k - 1) * d + 1
        return span, s, span - 1 if causal else 0
    _, size, s = layer
    return size, s, 0


def min_window(stack) -> int:
    """The shortest window the stack leaves at least one position of."""
    need = 1
    for layer in reversed(stack):
        span, s, p = _span(layer)
        need = max(1, (need - 1) * s + span - p)
    return need


def stack_model(seed: int, window: int, features: int, stack, per_step: bool, head: str, hidden: int):
    import keras

    keras.utils.set_random_seed(seed)
    inp = keras.Input((window, features), name="window")
    h = keras.layers.Dense(3, activation="tanh", name="per_step")(inp) if per_step else inp
    for i, layer in enumerate(stack):
        if layer[0] == "conv":
            _, filters, k, s, d, causal, act = layer
            h = keras.layers.Conv1D(filters, k, strides=s, dilation_rate=1 if s > 1 else d,
                                    padding="causal" if causal else "valid", activation=act, name=f"conv{i}")(h)
        else:
            kind, size, s = layer
            cls = keras.layers.MaxPooling1D if kind == "max" else keras.layers.AveragePooling1D
            h = cls(size, strides=s, name=f"pool{i}")(h)
    if head == "flatten":
        h = keras.layers.Flatten(name="flat")(h)
        h = keras.layers.Dense(hidden or 3, activation="relu", name="over_window")(h)
    elif head == "avg":
        h = keras.layers.GlobalAveragePooling1D(name="gpool")(h)
    elif head == "max":
        h = keras.layers.GlobalMaxPooling1D(name="gpool")(h)
    else:
        h = h[:, -1]
    if hidden and head != "flatten":
        h = keras.layers.Dense(hidden, activation="relu", name="hidden")(h)
    out = keras.layers.Dense(2, name="signal")(h)
    return seeded_weights(keras.Model(inp, out, name="sliding_dense_rand"), seed)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), extra=st.integers(0, 9), features=st.integers(1, 5), stack=stacks,
       per_step=st.booleans(), head=st.sampled_from(["flatten", "flatten", "avg", "max", "last"]),
       hidden=st.sampled_from([0, 4]), data=st.data())
def test_strided_pooled_and_flattened_windows_equal_predict_into(store_dir, seed, extra, features, stack,
                                                                 per_step, head, hidden, data):
    """Any drawn stack slides incrementally, and every answer is predict_into's on the window
    within 1e-5 of the answers' scale: strides whose last positions leave the newest steps
    unread, causal padding recomputed for each window, pooled positions cached like a conv's,
    and the flattened Dense's partial sums per window in flight."""
    window = min_window(stack) + extra
    km = stack_model(seed, window, features, stack, per_step, head, hidden)
    cm = hwb.compile(km, "cpu.native", store=store_dir, fidelity=False)
    assert cm.artifact.meta["sliding"]["form"] == "incremental"
    check_drawn_ticks(cm, data, seed, features, window, FP32_ERR)


@pytest.mark.parametrize("stack", [
    [("conv", 6, 3, 2, 1, False, "relu"), ("max", 2, 1)],  # lags the newest step: all prepared
    [("conv", 5, 3, 1, 2, True, "tanh")],  # causal: 4 padded positions per window, the last on the push
], ids=["strided-pooled", "causal"])
def test_dense_over_the_flattened_window_over_10000_ticks_without_drift(store_dir, stack):
    """Flatten → Dense on a strided conv and a max pool, or on a causal dilated conv (window
    30): 10,000 ticks, every answer within 1e-5 of predict_into's (each window's partial sum
    starts from the bias, so the last ticks are as close as the first); a NaN answers NaN
    while it is in the window, then the answers recover."""
    cm = hwb.compile(stack_model(9, 30, 4, stack, False, "flatten", 5), "cpu.native", store=store_dir,
                     fidelity=False)
    w = cm.sliding()
    assert w.form == "incremental"
    xs = np.random.default_rng(7).normal(size=(10_000, 4)).astype(np.float32)
    xs[5000, 2] = np.nan
    got = push_all(w, xs, (2,), prepare_every=1)
    want = window_answers(cm, xs)
    assert np.isnan(want[5000:5030]).all() and np.isnan(got[5000:5030]).all()
    ok = np.isfinite(want).all(axis=1)
    assert ok.sum() == 10_000 - 30
    err = np.abs(got[ok] - want[ok]) / max(1.0, np.abs(want[ok]).max())
    assert err.max() <= FP32_ERR
    assert err[-1000:].max() <= max(err[:1000].max(), 1e-6)


def torch_stack(c_in: int, channels_first: bool):
    """A torch conv stack over (batch, time, c_in) as desks write it: a transpose to
    channels-first, a strided Conv1d, a max pool, then ``flatten(1)`` of the (N, C, T) tensor
    (channels-first order) or of its transpose back (channels-last), and two Linear layers."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(c_in, 5, 3, stride=2)
            self.pool = nn.MaxPool1d(2, stride=1)
            self.fc = nn.Linear(5 * 7, 6)
            self.out = nn.Linear(6, 2)

        def forward(self, x):
            y = self.pool(torch.relu(self.conv(x.transpose(1, 2))))
            y = y.flatten(1) if channels_first else y.transpose(1, 2).flatten(1)
            return self.out(torch.tanh(self.fc(y)))

    torch.manual_seed(3 + channels_first)
    return Net().eval()


@pytest.mark.parametrize("channels_first", [True, False])
def test_torch_conv_flatten_dense_in_both_layouts_is_incremental(store_dir, channels_first):
    """Window 18 → conv (stride 2) 8 positions → pool 7 → flatten 35 → Linear: the push equals
    predict_into on every window in either flatten layout, the zero-filled start and a reset
    included."""
    model = hwb.load_model(torch_stack(3, channels_first), input_shape=(18, 3), name="conv_flat")
    check_slides_incrementally(model, store_dir, 70, 37, 2, FP32_ERR)
