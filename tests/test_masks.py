"""Attention masks are compiled or refused by name on cpu.native, never ignored: causal
attention (Keras ``use_causal_mask=True``, torch ``is_causal=True``) is the layer IR's
``Attention.causal`` and runs exactly; a mask tensor (Keras ``attention_mask``, torch
``attn_mask`` without ``is_causal``, an ONNX graph's masked scores) is refused naming it.
The differential fuzz (tests/test_fuzz_layer_ir.py) draws causal attention in every front end
that has attention; these are the direct cases, through ``hwb.compile``."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import hwbackends as hwb

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
keras = pytest.importorskip("keras")
torch = pytest.importorskip("torch")
nn = torch.nn
T, C = 8, 4
X = np.random.default_rng(0).standard_normal((64, T, C)).astype(np.float32)


def _compile(m, store, precision: str = "fp32"):
    return hwb.compile(m, "cpu.native", precision, store=store, isolate_compile=False,
                       validation_data=X, calibration_data=X if precision == "int8" else None)


def _keras_mha(**call) -> object:
    keras.utils.set_random_seed(3)
    inp = keras.Input((T, C))
    mha = keras.layers.MultiHeadAttention(2, 3)
    args = {k: (v(inp) if callable(v) else v) for k, v in call.items()}
    y = mha(inp, inp, **args)
    km = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(y)))
    rng = np.random.default_rng(4)  # Keras starts the biases at zero: give them values
    mha.set_weights([w + rng.normal(0, 0.3, w.shape) for w in mha.get_weights()])
    return km


def test_keras_causal_mask_is_compiled_exactly(tmp_path) -> None:
    """MultiHeadAttention(x, x, use_causal_mask=True): without the mask the variant is far
    off (corr ~0.7); with it, fp32 matches Keras and int8 passes its gate."""
    km = _keras_mha(use_causal_mask=True)
    want = np.asarray(km(X))
    unmasked = np.asarray(_keras_mha()(X))
    assert np.abs(unmasked - want).max() > 0.1 * np.abs(want).max()  # the mask matters here
    cm = _compile(km, tmp_path)
    assert np.abs(cm.predict(X) - want).max() <= 1e-5 * np.abs(want).max()
    assert _compile(km, tmp_path, "int8").fidelity.corr >= 0.98  # raises if its gate fails


def test_keras_attention_mask_is_refused_by_name(tmp_path) -> None:
    km = _keras_mha(attention_mask=lambda inp: keras.layers.Dense(T)(inp))
    with pytest.raises(hwb.UnsupportedError, match=r"'multi_head_attention.*'.*attention_mask"):
        _compile(km, tmp_path)


class _Attn(nn.Module):
    """Self-attention, per-step out-projection, a Dense head: SDPA over per-head views of three
    Linears, or nn.MultiheadAttention (with ``mask`` as its attn_mask)."""

    def __init__(self, form: str, causal: bool, mask=None, weights: bool = False) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.form, self.causal, self.weights = form, causal, weights
        self.mha = nn.MultiheadAttention(C, 2, batch_first=True)
        self.q, self.k, self.v, self.o = (nn.Linear(C, C) for _ in range(4))
        self.head = nn.Linear(T * C, 1)
        self.register_buffer("mask", mask)

    def forward(self, x):
        if self.form == "sdpa":
            def split(y):
                return y.view(y.shape[0], T, 2, C // 2).transpose(1, 2)
            a = torch.nn.functional.scaled_dot_product_attention(
                split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=self.causal)
            a = self.o(a.transpose(1, 2).reshape(x.shape[0], T, C))
        else:
            a = self.mha(x, x, x, attn_mask=self.mask, is_causal=self.causal,
                         need_weights=self.weights)[0]
        return self.head(a.reshape(x.shape[0], -1))


def _torch(mod):
    mod = mod.eval()
    with torch.no_grad():
        want = mod(torch.from_numpy(X)).numpy()
    return hwb.load_model(mod, example_input=torch.zeros(2, T, C)), want


@pytest.mark.parametrize("form", ["sdpa", "mha"])
def test_torch_is_causal_is_compiled_exactly(form, tmp_path) -> None:
    tri = nn.Transformer.generate_square_subsequent_mask(T)
    m, want = _torch(_Attn(form, True, tri if form == "mha" else None))
    _, unmasked = _torch(_Attn(form, False))
    assert np.abs(unmasked - want).max() > 0.05 * np.abs(want).max()
    cm = _compile(m, tmp_path)
    assert np.abs(cm.predict(X) - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("weights", [False, True])
def test_torch_attn_mask_is_refused_by_name(weights, tmp_path) -> None:
    mask = torch.from_numpy(np.random.default_rng(6).standard_normal((T, T)).astype(np.float32))
    m, _ = _torch(_Attn("mha", False, mask, weights))
    with pytest.raises(hwb.UnsupportedError, match=r"torch op '[^']+'.*mask tensor.*is_causal=True"):
        _compile(m, tmp_path)


def test_onnx_causal_attention_is_never_ignored(tmp_path) -> None:
    """The causal SDPA exported to ONNX: the mask is ops on the scores; cpu.native refuses
    an op by name, or compiles the graph exactly (never the unmasked attention)."""
    pytest.importorskip("onnx")
    mod = _Attn("sdpa", True).eval()
    path = tmp_path / "causal.onnx"
    torch.onnx.export(mod, (torch.zeros(1, T, C),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    with torch.no_grad():
        want = mod(torch.from_numpy(X)).numpy()
    try:
        cm = _compile(hwb.load_model(str(path)), tmp_path / "store")
    except hwb.UnsupportedError as exc:
        assert "cpu.native" in str(exc) and "'" in str(exc), exc
        return
    assert np.abs(cm.predict(X) - want).max() <= 1e-5 * np.abs(want).max()
