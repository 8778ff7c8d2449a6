"""The layers desks use, on cpu.native: causal/left padding, time
slices, channels-first torch through transposes, residual adds, LayerNormalization, GELU,
stacked and bidirectional LSTM/GRU, multi-head self-attention. Each family is drawn by
Hypothesis (shapes, paddings, dilations, heads; a few examples each), compiled through the
public API and compared with the source framework: fp32 within 1e-5 of the output scale;
int8 within its gate. The router's ultra tier picks cpu.native for a causal dilated TCN."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import hwbackends as hwb

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

#: examples per property (HWB_DESK_EXAMPLES=50 for a long run): each is a C build
FEW = settings(max_examples=int(os.environ.get("HWB_DESK_EXAMPLES", "2")), deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _close(got: np.ndarray, want: np.ndarray, what: str, tol: float = 1e-5) -> None:
    """fp32: max error within ``tol`` of the output scale."""
    scale = max(float(np.abs(want).max()), 1e-3)
    err = float(np.abs(got - want).max())
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} x output scale {scale:.3g}"


def _x(shape: tuple[int, ...], n: int = 24, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, *shape)).astype(np.float32)


def _native(model: hwb.Model, store: Any, precision: str = "fp32", calib: Any = None) -> Any:
    return hwb.compile(model, "cpu.native", precision, store=store, fidelity=False,
                       calibration_data=calib)


# -- torch: causal dilated TCN, written the ways desks write it ------------------------------
def tcn(c_in: int, ch: int, k: int, dils: list[int], style: str, last: str, gelu: bool) -> Any:
    """A causal dilated TCN over (batch, time, c_in): channels-first through a transpose,
    causal by ``F.pad`` (style "pad") or ``Conv1d(padding)`` and a slice (style "slice"),
    residual blocks (a 1x1 conv where the channels change), the last step by ``x[:, :, -1]``
    or ``x[..., -1]``."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn

    class TCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = nn.ModuleList(
                nn.Conv1d(c_in if i == 0 else ch, ch, k, dilation=d,
                          padding=(k - 1) * d if style == "slice" else 0) for i, d in enumerate(dils))
            self.down = nn.Conv1d(c_in, ch, 1) if c_in != ch else None
            self.head = nn.Linear(ch, 1)

        def forward(self, x: Any) -> Any:
            x = x.transpose(1, 2)
            y = x
            for i, (conv, d) in enumerate(zip(self.convs, dils, strict=True)):
                p = (k - 1) * d
                if style == "pad":
                    z = conv(F.pad(y, (p, 0)))
                else:
                    z = conv(y)[:, :, :-p] if p else conv(y)
                z = F.gelu(z) if gelu else torch.relu(z)
                skip = self.down(y) if (i == 0 and self.down is not None) else y
                y = z + skip
            return self.head(y[:, :, -1] if last == "dim" else y[..., -1])

    torch.manual_seed(k * 7 + len(dils))
    return TCN().eval()


@FEW
@given(c_in=st.integers(1, 5), ch=st.integers(2, 9), k=st.integers(2, 4),
       dils=st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3),
       style=st.sampled_from(["pad", "slice"]), last=st.sampled_from(["dim", "ellipsis"]),
       gelu=st.booleans())
def test_torch_tcn_matches_torch(store_dir, c_in, ch, k, dils, style, last, gelu) -> None:
    import torch

    t = 24
    m = tcn(c_in, ch, k, dils, style, last, gelu)
    model = hwb.load_model(m, input_shape=(t, c_in), name="tcn")
    x = _x((t, c_in))
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    _close(_native(model, store_dir).predict(x), want, f"tcn {style} {last} dils={dils}")


def test_torch_tcn_int8_and_ir(store_dir) -> None:
    """int8 over the TCN (residual branches calibrated per layer), and the IR it reads: the
    pads folded into the convs, no slice left but the last step."""
    import torch

    from hwbackends import layer_ir

    m = tcn(3, 8, 3, [1, 2, 4], "slice", "dim", False)
    model = hwb.load_model(m, input_shape=(32, 3), name="tcn8")
    net = layer_ir.extract(model, "cpu.native")
    kinds = [type(layer).__name__ for layer in net.layers]
    assert kinds == ["Residual"] * 3 + ["TimeSlice", "Dense"], kinds
    assert [c.pad for r in net.layers[:3] for c in r.body if isinstance(c, layer_ir.Conv1D)] == [
        (2, 0), (4, 0), (8, 0)]
    x = _x((32, 3), 256, seed=1)
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    got = _native(model, store_dir, "int8", x[:128]).predict(x)
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.995
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_torch_refusals_name_the_op(store_dir) -> None:
    """What the IR cannot hold is refused naming the op: a reflect pad, a strided slice,
    an add of differently laid out tensors."""
    import torch.nn.functional as F  # noqa: N812
    from torch import nn

    class Reflect(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(2, 3, 3)

        def forward(self, x: Any) -> Any:
            return self.conv(F.pad(x.transpose(1, 2), (2, 0), mode="reflect"))[:, :, -1]

    with pytest.raises(hwb.UnsupportedError, match=r"pad.*only zero padding of time"):
        _native(hwb.load_model(Reflect().eval(), input_shape=(8, 2), name="reflect"), store_dir)


# -- Keras: residual blocks, LayerNormalization, GELU, attention, bidirectional --------------
def transformer(t: int, f: int, dm: int, heads: int, n_out: int) -> Any:
    """A small transformer classifier: projection, MultiHeadAttention + residual +
    LayerNormalization, a GELU Dense FFN + residual + LayerNormalization, pooled, softmax."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(t * 31 + heads)
    inp = keras.Input((t, f))
    x = layers.Dense(dm)(inp)
    a = layers.MultiHeadAttention(heads, max(dm // heads, 1))(x, x)
    x = layers.LayerNormalization()(layers.Add()([x, a]))
    h = layers.Dense(2 * dm, activation="gelu")(x)
    x = layers.LayerNormalization(epsilon=1e-5)(x + layers.Dense(dm)(h))
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inp, layers.Dense(n_out, activation="softmax")(x), name="transformer")


@FEW
@given(t=st.integers(2, 12), f=st.integers(1, 6), dm=st.sampled_from([4, 8, 12]),
       heads=st.sampled_from([1, 2, 4]), n_out=st.integers(2, 4))
def test_keras_transformer_matches_keras(store_dir, t, f, dm, heads, n_out) -> None:
    m = transformer(t, f, dm, heads, n_out)
    x = _x((t, f))
    _close(_native(hwb.load_model(m), store_dir).predict(x), m(x).numpy(), "transformer")


def recurrent(t: int, f: int, u: int, cell: str, bidir: bool, stacked: bool) -> Any:
    """A stacked (and maybe bidirectional) LSTM/GRU regression, the last step by ``x[:, -1]``."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(u * 13 + t)
    rnn = layers.LSTM if cell == "lstm" else layers.GRU
    inp = keras.Input((t, f))
    x = inp
    for _ in range(2 if stacked else 1):
        r = rnn(u, return_sequences=True)
        x = layers.Bidirectional(r)(x) if bidir else r(x)
    x = x[:, -1]
    return keras.Model(inp, layers.Dense(1)(x), name="rnn")


@FEW
@given(t=st.integers(2, 10), f=st.integers(1, 5), u=st.integers(1, 9),
       cell=st.sampled_from(["lstm", "gru"]), bidir=st.booleans(), stacked=st.booleans())
def test_keras_recurrent_matches_keras(store_dir, t, f, u, cell, bidir, stacked) -> None:
    m = recurrent(t, f, u, cell, bidir, stacked)
    x = _x((t, f))
    _close(_native(hwb.load_model(m), store_dir).predict(x), m(x).numpy(), f"{cell} bidir={bidir}")


@FEW
@given(left=st.integers(0, 4), right=st.integers(0, 3), k=st.integers(1, 3), d=st.integers(1, 3),
       crop=st.integers(0, 2))
def test_keras_padding_and_residual(store_dir, left, right, k, d, crop) -> None:
    """ZeroPadding1D before a dilated conv, Cropping1D, a residual add around a conv block
    with LayerNormalization and GELU."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(left + 5 * right + k)
    t, f = 12, 3
    inp = keras.Input((t, f))
    x = layers.ZeroPadding1D((left, right))(inp)
    x = layers.Conv1D(6, k, dilation_rate=d, activation="gelu")(x)
    x = layers.Cropping1D((crop, 0))(x)
    y = layers.LayerNormalization()(layers.Conv1D(6, 1)(x))
    x = layers.Add()([x, y])
    out = layers.Dense(2)(layers.Flatten()(x))
    m = keras.Model(inp, out)
    x_in = _x((t, f))
    _close(_native(hwb.load_model(m), store_dir).predict(x_in), m(x_in).numpy(), "pad/crop/residual")


@pytest.mark.slow  # two int8 builds with calibration
def test_int8_over_the_keras_families(store_dir) -> None:
    """int8 takes the transformer (attention's output projection in float) and the
    bidirectional LSTM; both stay within an int8 gate."""
    for m in (transformer(8, 4, 8, 2, 3), recurrent(8, 3, 6, "lstm", True, True)):
        x = _x(tuple(m.inputs[0].shape[1:]), 256, seed=2)
        got = _native(hwb.load_model(m), store_dir, "int8", x[:128]).predict(x)
        want = m(x).numpy()
        assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.99, m.name


# -- the router -----------------------------------------------------------------------------
def test_router_ultra_tier_picks_native_for_the_tcn(tmp_path: Path, store_dir, capsys) -> None:
    """`hwb route --json` over a strategies file: a causal dilated TCN (torch.export file) in
    the ultra tier (10 us) is served by cpu.native, not ONNX Runtime."""
    import torch

    from hwbackends.cli import main

    m = tcn(4, 8, 3, [1, 2, 4], "pad", "dim", False)
    batch = {0: torch.export.Dim("batch")}
    torch.export.save(torch.export.export(m, (torch.zeros(2, 16, 4),), dynamic_shapes=(batch,)),
                      tmp_path / "tcn.pt2")
    cfg = tmp_path / "strategies.toml"
    cfg.write_text("""
[tiers.ultra]
p99_us = 10

[router]
isolate_compile = false

[router.bench]
n = 400
warmup = 50

[strategies.mm]
model = "tcn.pt2"
tier = "ultra"
targets = ["cpu.native", "cpu.onnxruntime"]
precisions = ["fp32"]
fidelity = { corr_min = 0.999, max_abs = 1e-4 }
""")
    assert main(["route", str(cfg), "--json", "--cache-dir", str(store_dir)]) == 0
    out = capsys.readouterr().out
    s = json.loads(out[out.index("{"):])["strategies"][0]
    assert s["chosen"] == "cpu.native:fp32", s
    assert {c["variant"] for c in s["candidates"]} == {"cpu.native:fp32", "cpu.onnxruntime:fp32"}


# -- torch: stacked and bidirectional LSTM/GRU ------------------------------------------------
def torch_rnn(cell: str, f: int, u: int, layers: int, bidir: bool, last: str) -> Any:
    """``nn.LSTM``/``nn.GRU`` with ``num_layers`` and ``bidirectional``, read at the last step
    of its output or (unidirectional) by ``h_n[-1]``."""
    import torch
    from torch import nn

    class RNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = getattr(nn, cell)(f, u, num_layers=layers, bidirectional=bidir, batch_first=True)
            self.head = nn.Linear(u * (2 if bidir else 1), 1)

        def forward(self, x: Any) -> Any:
            y, h = self.rnn(x)
            if last == "h_n":
                return self.head((h[0] if isinstance(h, tuple) else h)[-1])
            return self.head(y[:, -1])

    torch.manual_seed(u * 3 + layers)
    return RNN().eval()


@FEW
@given(cell=st.sampled_from(["LSTM", "GRU"]), f=st.integers(1, 4), u=st.integers(1, 8),
       layers=st.integers(1, 3), bidir=st.booleans(), last=st.sampled_from(["out", "h_n"]))
def test_torch_stacked_bidirectional_matches_torch(store_dir, cell, f, u, layers, bidir, last) -> None:
    import torch

    last = "out" if bidir else last
    m = torch_rnn(cell, f, u, layers, bidir, last)
    x = _x((7, f))
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    got = _native(hwb.load_model(m, input_shape=(7, f), name="rnn"), store_dir).predict(x)
    _close(got, want, f"{cell} layers={layers} bidir={bidir} {last}")


# -- the four desk families, on every CPU target that takes them ------------------------------
def gbr_onnx(n_feat: int = 6) -> tuple[Any, Any]:
    """A gradient-boosted regressor (20 depth-1 trees fitted to residuals, lr 0.3) as an
    ONNX-ML ``TreeEnsembleRegressor``; and its own NumPy prediction."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, n_feat)).astype(np.float32)
    y = np.tanh(x[:, 0]) + 0.5 * x[:, 1] * (x[:, 2] > 0)
    base, f, trees = float(y.mean()), np.full(len(y), float(y.mean())), []
    for _ in range(20):
        r, best = y - f, None
        for j in range(n_feat):
            for thr in np.quantile(x[:, j], [0.25, 0.5, 0.75]):
                m = x[:, j] <= thr
                sse = ((r[m] - r[m].mean()) ** 2).sum() + ((r[~m] - r[~m].mean()) ** 2).sum()
                if best is None or sse < best[0]:
                    best = (sse, j, float(thr), 0.3 * r[m].mean(), 0.3 * r[~m].mean())
        trees.append(best[1:])
        f += np.where(x[:, best[1]] <= best[2], best[3], best[4])
    a: dict[str, list] = {k: [] for k in (
        "nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
        "nodes_truenodeids", "nodes_falsenodeids", "target_treeids", "target_nodeids", "target_ids",
        "target_weights")}
    for t, (j, thr, lo, hi) in enumerate(trees):
        for nid, feat, val, mode, yes, no in ((0, j, thr, "BRANCH_LEQ", 1, 2), (1, 0, 0.0, "LEAF", 0, 0),
                                              (2, 0, 0.0, "LEAF", 0, 0)):
            for k, v in zip(("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values",
                             "nodes_modes", "nodes_truenodeids", "nodes_falsenodeids"),
                            (t, nid, feat, val, mode, yes, no), strict=True):
                a[k].append(v)
        for nid, wt in ((1, lo), (2, hi)):
            for k, v in zip(("target_treeids", "target_nodeids", "target_ids", "target_weights"),
                            (t, nid, 0, wt), strict=True):
                a[k].append(v)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", n_targets=1,
                            base_values=[base], **a)
    g = helper.make_graph([node], "gbr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, n_feat])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])

    def predict(v: np.ndarray) -> np.ndarray:
        return (base + sum(np.where(v[:, j] <= thr, lo, hi) for j, thr, lo, hi in trees))[:, None]

    return proto, predict


@pytest.mark.slow  # ten compiles through tf2onnx, the LiteRT converter and torch.onnx
def test_four_desk_families_on_every_cpu_target(store_dir) -> None:
    """A stacked LSTM regression and a small transformer classifier (Keras: cpu.native,
    cpu.onnxruntime, cpu.litert), a causal dilated TCN (torch: cpu.native, cpu.onnxruntime)
    compile and match their framework; a gradient-boosted regressor as ONNX-ML compiles on
    cpu.onnxruntime and is refused by cpu.native naming its op. (The transformer's exact GELU
    reaches ONNX Runtime as Erfc, which it refuses by name.)"""
    import torch

    lstm = recurrent(16, 4, 8, "lstm", False, True)
    tr = transformer(16, 4, 8, 2, 3)
    t = tcn(4, 8, 3, [1, 2, 4], "pad", "dim", False)
    cases = [(hwb.load_model(lstm), lambda v: lstm(v).numpy(), ("cpu.native", "cpu.onnxruntime", "cpu.litert")),
             (hwb.load_model(tr), lambda v: tr(v).numpy(), ("cpu.native", "cpu.onnxruntime", "cpu.litert")),
             (hwb.load_model(t, input_shape=(16, 4), name="tcn"),
              lambda v: t(torch.from_numpy(v)).detach().numpy(), ("cpu.native", "cpu.onnxruntime"))]
    for model, ref, targets in cases:
        x = _x(tuple(model.input.shape), 64, seed=3)
        want = ref(x)
        for target in targets:
            if (model.name, target) == ("transformer", "cpu.onnxruntime"):
                # tf2onnx writes Keras' exact GELU with Erfc, an op ONNX Runtime lacks: a clear
                # refusal naming it (cpu.native and cpu.litert take the model)
                with pytest.raises(hwb.UnsupportedError, match=r"Erfc"):
                    hwb.compile(model, target, "fp32", store=store_dir, fidelity=False)
                continue
            cm = hwb.compile(model, target, "fp32", store=store_dir, fidelity=False)
            _close(cm.predict(x), want, f"{model.name} on {target}", tol=1e-4 if target != "cpu.native" else 1e-5)
    proto, predict = gbr_onnx()
    gbr = hwb.load_model(proto, name="gbr")
    x = _x((6,), 64, seed=4)
    cm = hwb.compile(gbr, "cpu.onnxruntime", "fp32", store=store_dir, fidelity=False)
    _close(cm.predict(x), predict(x), "gbr on cpu.onnxruntime")
    with pytest.raises(hwb.UnsupportedError, match=r"cpu.native cannot compile ONNX node .*TreeEnsembleRegressor"):
        _native(gbr, store_dir)


# -- ONNX (torch.onnx) of the same families -------------------------------------------------
@FEW
@given(k=st.integers(2, 3), dils=st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=2),
       style=st.sampled_from(["pad", "slice"]), bidir=st.booleans(), cell=st.sampled_from(["LSTM", "GRU"]))
def test_onnx_tcn_and_bidirectional_match_onnxruntime(store_dir, tmp_path_factory, k, dils, style, bidir,
                                                      cell) -> None:
    """torch.onnx's TCN (a Pad whose amounts are constant arithmetic, Slice of time, residual
    Add, Gather of the last step) and its stacked LSTM/GRU (bidirectional: Transpose + Reshape
    merging the directions) compile and match ONNX Runtime on the same graph."""
    import onnxruntime as ort

    from hwb_plugins.converters.to_onnx import torch_to_onnx

    d = tmp_path_factory.mktemp("onnx")
    for m, shape in ((tcn(3, 5, k, dils, style, "dim", False), (16, 3)),
                     (torch_rnn(cell, 3, 4, 2, bidir, "out"), (7, 3))):
        o = torch_to_onnx(hwb.load_model(m, input_shape=shape, name="desk"), d)
        x = _x(shape)
        s = ort.InferenceSession(o.obj.SerializeToString(), providers=["CPUExecutionProvider"])
        want = s.run(None, {s.get_inputs()[0].name: x})[0]
        _close(_native(hwb.load_model(o.obj, name="desk_onnx"), store_dir).predict(x), want, "onnx")


# -- torch: self-attention and TransformerEncoderLayer (torch.export) ------------------------
def torch_attention(kind: str, t: int, f: int, dm: int, heads: int, norm_first: bool = False,
                    act: str = "relu", pooled: bool = True, variant: str = "") -> Any:
    """A Linear f → dm, then self-attention written one of three ways (``kind``):
    ``nn.MultiheadAttention`` as ``attn(x, x, x, need_weights=False)[0]`` plus a residual,
    the same with ``need_weights=True`` (``mha_weights``: torch writes bmm/softmax/bmm and the
    averaged weights, dropped), ``F.scaled_dot_product_attention`` over per-head views of three
    Linears (``sdpa``), ``softmax(q @ kᵀ / sqrt(d)) @ v`` from one packed Linear
    (``explicit``), or an eval-mode
    ``nn.TransformerEncoderLayer`` (``norm_first``, ``act``); then the mean over time and a
    Linear (``pooled``) or the (batch, time, dm) sequence itself. ``variant`` writes what
    cpu.native must refuse: a mask tensor, cross-attention, dropout, heads cut across time,
    heads not put back per time step; or ``causal`` (``is_causal=True``), which it compiles."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn

    torch.manual_seed(t * 7 + dm + heads)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(f, dm)
            self.mha = nn.MultiheadAttention(dm, heads, batch_first=True)
            self.q, self.k, self.v, self.o, self.side = (nn.Linear(dm, dm) for _ in range(5))
            self.enc = nn.TransformerEncoderLayer(dm, heads, 2 * dm, dropout=0.0, batch_first=True,
                                                  norm_first=norm_first, activation=act)
            self.head = nn.Linear(dm, 2)
            self.qkv = nn.Linear(dm, 3 * dm)
            self.register_buffer("mask", torch.triu(torch.ones(t, t, dtype=torch.bool), 1))

        def extra_repr(self) -> str:  # what forward does is part of the model's fingerprint
            # (hwb's torch fingerprint is repr + weights: TransformerEncoderLayer's repr
            # shows neither norm_first nor its activation)
            return f"kind={kind}, norm_first={norm_first}, act={act}, pooled={pooled}, variant={variant!r}"

        def split(self, y: Any) -> Any:
            if variant == "heads_across_time":
                return y.reshape(y.shape[0], heads, t, dm // heads)  # no transpose: mixes steps
            return y.view(y.shape[0], t, heads, dm // heads).transpose(1, 2)

        def sdpa(self, x: Any) -> Any:
            kv = self.side(x) if variant == "cross" else x
            q, k, v = self.split(self.q(x)), self.split(self.k(kv)), self.split(self.v(kv))
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=self.mask if variant == "mask" else None,
                is_causal=variant == "causal", dropout_p=0.1 if variant == "dropout" else 0.0)
            merged = (o.reshape(x.shape[0], t, dm) if variant == "heads_not_merged"
                      else o.transpose(1, 2).reshape(x.shape[0], t, dm))
            return self.o(merged)

        def forward(self, x: Any) -> Any:
            x = self.inp(x)
            if kind == "mha":
                kv = self.side(x) if variant == "cross" else x
                x = x + self.mha(x, kv, kv, need_weights=False,
                                 attn_mask=self.mask if variant in ("mask", "causal") else None,
                                 is_causal=variant == "causal")[0]
            elif kind == "mha_weights":
                x = x + self.mha(x, x, x)[0]
            elif kind == "sdpa":
                x = self.sdpa(x)
            elif kind == "explicit":
                q, k, v = self.qkv(x).view(x.shape[0], t, 3, heads, dm // heads).permute(2, 0, 3, 1, 4)
                scores = q @ k.transpose(-2, -1) / (dm // heads) ** 0.5
                a = (scores.tanh() if variant == "scores_squashed" else scores).softmax(-1) @ v
                x = self.o(a.transpose(1, 2).reshape(x.shape[0], t, dm))
            else:
                x = self.enc(x)
            return self.head(x.mean(1)) if pooled else x

    return Block().eval()


def _torch_ref(m: Any, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return m(torch.from_numpy(x)).numpy()


@settings(FEW, max_examples=int(os.environ.get("HWB_DESK_EXAMPLES", "3")))
@given(kind=st.sampled_from(["mha", "mha_weights", "sdpa", "explicit", "encoder"]), heads=st.sampled_from([1, 2, 4]),
       per_head=st.sampled_from([2, 3, 4]), t=st.integers(2, 10), f=st.integers(1, 5),
       norm_first=st.booleans(), act=st.sampled_from(["relu", "gelu"]), pooled=st.booleans())
@example(kind="mha", heads=2, per_head=3, t=7, f=2, norm_first=False, act="relu", pooled=False)
@example(kind="mha_weights", heads=4, per_head=2, t=5, f=3, norm_first=False, act="relu", pooled=True)
@example(kind="sdpa", heads=2, per_head=4, t=6, f=1, norm_first=False, act="relu", pooled=False)
@example(kind="explicit", heads=2, per_head=2, t=4, f=3, norm_first=False, act="relu", pooled=True)
@example(kind="encoder", heads=2, per_head=4, t=8, f=3, norm_first=True, act="gelu", pooled=True)
@example(kind="encoder", heads=4, per_head=2, t=3, f=2, norm_first=False, act="relu", pooled=False)
def test_torch_attention_matches_torch(store_dir, kind, heads, per_head, t, f, norm_first, act,
                                       pooled) -> None:
    """MultiheadAttention (need_weights either way), hand-written SDPA, hand-written
    softmax(q·kᵀ)·v and TransformerEncoderLayer (either norm order, relu or gelu), pooled or returning the sequence, compile on cpu.native within 1e-5 of
    the output scale of torch."""
    m = torch_attention(kind, t, f, heads * per_head, heads, norm_first, act, pooled)
    model = hwb.load_model(m, input_shape=(t, f), name=f"attn_{kind}")
    x = _x((t, f))
    _close(_native(model, store_dir).predict(x), _torch_ref(m, x),
           f"{kind} heads={heads} d={heads * per_head} t={t} norm_first={norm_first} {act}")


def test_torch_encoder_layer_ir_and_int8(store_dir) -> None:
    """A TransformerEncoderLayer reads as the IR's own transformer: each attention one
    Attention layer (its q/k/v/out projections folded in, the heads kept) inside a
    Residual, LayerNorms, a per-step feed-forward; int8 over it and over a bare
    MultiheadAttention stays within the int8 gate."""
    from hwbackends import layer_ir

    for norm_first, want in ((False, ["Dense", "Residual", "LayerNorm", "Residual", "LayerNorm",
                                      "GlobalPool1D", "Dense"]),
                             (True, ["Dense", "Residual", "Residual", "GlobalPool1D", "Dense"])):
        m = torch_attention("encoder", 6, 3, 8, 2, norm_first, "gelu")
        net = layer_ir.extract(hwb.load_model(m, input_shape=(6, 3), name="enc"), "cpu.native")
        assert [type(v).__name__ for v in net.layers] == want
        att = net.layers[1].body
        assert [type(v).__name__ for v in att] == (["LayerNorm", "Attention"] if norm_first else ["Attention"])
        assert att[-1].heads == 2 and att[-1].wq.shape == (8, 8) and att[-1].wo.shape == (8, 8)
    for m in (torch_attention("encoder", 8, 3, 8, 2, True, "gelu"),
              torch_attention("mha", 8, 3, 8, 4, pooled=False)):
        x = _x((8, 3), 256, seed=2)
        want_y = _torch_ref(m, x)
        got = _native(hwb.load_model(m, input_shape=(8, 3), name="att8"), store_dir, "int8", x[:128]).predict(x)
        assert np.corrcoef(got.ravel(), want_y.ravel())[0, 1] > 0.995
        assert np.abs(got - want_y).max() < 0.05 * np.abs(want_y).max()


@pytest.mark.parametrize(("kind", "variant", "why"), [
    ("mha", "mask", r"attention with a mask"),
    ("sdpa", "mask", r"attention with a mask"),
    ("mha", "cross", r"cross-attention"),
    ("sdpa", "cross", r"cross-attention"),
    ("sdpa", "heads_across_time", r"sequence axis is not the time steps|mix samples or time steps"),
    ("sdpa", "heads_not_merged", r"heads not concatenated per sample and time step"),
    ("explicit", "scores_squashed", r"cpu.native cannot compile torch op"),
])
def test_torch_attention_refusals_name_what(store_dir, kind, variant, why) -> None:
    """What ir.Attention cannot hold is refused naming it, not compiled as something else:
    mask tensors, cross-attention, reshapes that put heads across time steps or do
    not put them back per step, scores squashed by tanh before the softmax (valid torch, other
    maths)."""
    m = torch_attention(kind, 5, 3, 8, 2, variant=variant)
    with pytest.raises(hwb.UnsupportedError, match=why):
        _native(hwb.load_model(m, input_shape=(5, 3), name=f"bad_{variant}"), store_dir)


@pytest.mark.parametrize("kind", ["mha", "sdpa"])
def test_torch_causal_attention_matches_torch(store_dir, kind) -> None:
    """``is_causal=True`` (nn.MultiheadAttention with its mask, or SDPA) is ir.Attention's
    ``causal``: compiled, within 1e-5 of torch."""
    m = torch_attention(kind, 5, 3, 8, 2, variant="causal")
    x = _x((5, 3))
    _close(_native(hwb.load_model(m, input_shape=(5, 3), name=f"causal_{kind}"), store_dir).predict(x),
           _torch_ref(m, x), f"causal {kind}")


def test_torch_attention_dropout_in_training_refused(store_dir) -> None:
    """A program exported in training mode (attention dropout 0.1 in the SDPA, the
    TransformerEncoderLayer's own dropouts) is refused naming the dropout."""
    import torch
    from torch import nn

    enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True).train()
    ep = torch.export.export(enc, (torch.zeros(2, 5, 8),))
    with pytest.raises(hwb.UnsupportedError, match=r"dropout"):
        _native(hwb.load_model(ep, input_shape=(5, 8), name="enc_train"), store_dir)
    m = torch_attention("sdpa", 5, 3, 8, 2, variant="dropout").train()
    ep = torch.export.export(m, (torch.zeros(2, 5, 3),))
    with pytest.raises(hwb.UnsupportedError, match=r"attention dropout 0.1 \(training mode\)"):
        _native(hwb.load_model(ep, input_shape=(5, 3), name="sdpa_train"), store_dir)


def test_torch_attention_on_onnxruntime(store_dir) -> None:
    """cpu.onnxruntime takes the same torch models (through torch.onnx) and matches torch."""
    for kind, nf in (("mha", False), ("mha_weights", False), ("sdpa", False), ("explicit", False),
                     ("encoder", True), ("encoder", False)):
        m = torch_attention(kind, 6, 3, 8, 2, nf, "gelu", pooled=kind != "mha")
        x = _x((6, 3), 32, seed=5)
        cm = hwb.compile(hwb.load_model(m, input_shape=(6, 3), name=f"ort_{kind}"), "cpu.onnxruntime",
                         "fp32", store=store_dir, fidelity=False)
        _close(cm.predict(x), _torch_ref(m, x), f"{kind} on cpu.onnxruntime", tol=1e-4)
