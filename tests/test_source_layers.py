"""A model a target cannot build is refused naming the user's layer (module path and class for
PyTorch, layer name and class for Keras) and what to do, not a converter's internals (an
``aten.`` op of the exported program, an ONNX op the user never wrote); where the target can
build the layer cheaply it does: tpu.xla lowers ONNX LayerNormalization, Pad and Mod, so a
torch TransformerEncoderLayer and a Keras TCN (dilated causal Conv1D) compile, answers checked
against the source model through ``hwb.compile`` and, per op, against ONNX Runtime
(Hypothesis; ``HWB_FUZZ_EXAMPLES`` draws more)."""
from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest

import hwbackends as hwb

torch = pytest.importorskip("torch")
nn = torch.nn
EXAMPLES = int(os.environ.get("HWB_FUZZ_EXAMPLES", "0") or 0) or 12


def _has(*mods: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in mods)


need_hls4ml = pytest.mark.skipif(not _has("hls4ml"), reason="fpga.hls4ml needs hls4ml")
need_jax = pytest.mark.skipif(not _has("jax", "onnx"), reason="tpu.xla needs jax and onnx")
need_keras = pytest.mark.skipif(not _has("keras", "tf2onnx"), reason="needs keras and tf2onnx")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("store")


class _Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.enc(x)[:, -1])


class _Gru(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        y, _ = self.gru(x)
        return self.head(y[:, -1])


class _CumSum(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, -1)


class _WithCumSum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.running = nn.Linear(4, 4), _CumSum()

    def forward(self, x):
        return self.running(self.lin(x))


def _torch(kind: str):
    torch.manual_seed(0)
    net, shape = {"transformer": (_Transformer, (6, 8)), "gru": (_Gru, (6, 4)),
                  "cumsum": (_WithCumSum, (4,))}[kind]
    return hwb.load_model(net().eval(), input_shape=shape, name=kind)


def _keras(kind: str):
    import keras

    keras.utils.set_random_seed(0)
    if kind == "tcn":
        i = keras.Input((16, 3))
        x = keras.layers.Conv1D(4, 3, padding="causal", dilation_rate=2, activation="relu", name="tcn_conv")(i)
        x = keras.layers.Conv1D(4, 3, padding="causal", dilation_rate=4, name="tcn_conv_wide")(x)
        o = keras.layers.Dense(1, name="out")(keras.layers.GlobalAveragePooling1D(name="pool")(x))
    else:  # a Dense whose softplus activation tf2onnx writes as an ONNX Softplus
        i = keras.Input((4,))
        o = keras.layers.Dense(2, activation="softplus", name="smooth")(i)
    return hwb.load_model(keras.Model(i, o, name=kind), name=kind)


def _no_internals_first(msg: str, layer: str) -> None:
    """The message names ``layer`` before (and never only) a converter's op."""
    assert layer in msg, msg
    first = re.search(r"aten\.|ONNX op", msg)
    assert first is None or msg.index(layer) < first.start(), msg
    assert "sym_size" not in msg, msg


# -- fpga.hls4ml: a torch.export program's layers it does not rebuild --------------------------
@need_hls4ml
@pytest.mark.parametrize(("kind", "layer"), [("transformer", "layer 'enc' (TransformerEncoderLayer"),
                                             ("gru", "layer 'gru' (GRU)")])
def test_fpga_hls4ml_refuses_a_torch_layer_by_its_name(kind, layer, store) -> None:
    with pytest.raises(hwb.UnsupportedError) as e:
        hwb.compile(_torch(kind), "fpga.hls4ml", store=store)
    msg = str(e.value)
    _no_internals_first(msg, layer)
    assert "Keras twin" in msg and "cpu.onnxruntime or tpu.xla" in msg, msg
    # the docs' list of what fpga.hls4ml takes from PyTorch is what it rebuilds
    from hwb_plugins._shared.torch_export import REBUILT
    assert REBUILT in msg


# -- tpu.xla: lowered where cheap, else refused by layer ---------------------------------------
@need_jax
@pytest.mark.parametrize("kind", ["transformer", pytest.param("tcn", marks=need_keras)])
def test_tpu_xla_builds_a_transformer_and_a_tcn(kind, store) -> None:
    m = _torch(kind) if kind == "transformer" else _keras(kind)
    cm = hwb.compile(m, "tpu.xla", "fp32", store=store)
    x = np.random.default_rng(1).standard_normal((64, *m.input.shape)).astype(np.float32)
    want, got = m.reference(x), cm.predict(x)
    scale = max(float(np.abs(want).max()), 1e-3)
    assert float(np.abs(got - want).max()) <= 1e-5 * scale


@need_jax
@pytest.mark.parametrize(("kind", "layer"), [("cumsum", "layer 'running' (_CumSum)"),
                                             pytest.param("smooth", "layer 'smooth' (Dense)", marks=need_keras)])
def test_tpu_xla_refuses_by_the_users_layer(kind, layer, store) -> None:
    m = _torch(kind) if kind == "cumsum" else _keras("softplus")
    with pytest.raises(hwb.UnsupportedError) as e:
        hwb.compile(m, "tpu.xla", "fp32", store=store)
    msg = str(e.value)
    _no_internals_first(msg, layer)
    assert "cpu.onnxruntime" in msg, msg


# -- the new lowerings against ONNX Runtime ---------------------------------------------------
def _run_both(nodes, inits, x: np.ndarray, out_rank: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from hwb_plugins.tpu_xla.onnx_jax import to_jax
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * out_rank)], inits)
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = np.asarray(to_jax(proto)(x)[0])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@need_jax
def test_xla_lowerings_match_onnxruntime() -> None:
    pytest.importorskip("onnxruntime")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from onnx import helper, numpy_helper

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 2**31 - 1), st.sampled_from(["pad", "layernorm", "mod", "fmod"]),
           st.sampled_from(["constant", "reflect", "edge", "wrap"]), st.integers(-3, 2), st.booleans())
    def check(seed, op, mode, axis, with_axes):
        rng = np.random.default_rng(seed)
        shape = tuple(int(d) for d in rng.integers(2, 5, 3))
        x = rng.standard_normal((2, *shape)).astype(np.float32)
        rank = x.ndim
        if op == "pad":
            axes = sorted(rng.choice(rank, size=int(rng.integers(1, rank + 1)), replace=False).tolist())
            axes = axes if with_axes else list(range(rank))
            hi = 2 if mode != "constant" else 3  # reflect needs pads below the axis length
            pads = rng.integers(0, hi, 2 * len(axes)).astype(np.int64)
            ins = ["x", "pads", "value"] + (["axes"] if with_axes else [])
            inits = [numpy_helper.from_array(pads, "pads"),
                     numpy_helper.from_array(np.array(rng.normal(), np.float32), "value"),
                     numpy_helper.from_array(np.array(axes, np.int64), "axes")]
            nodes = [helper.make_node("Pad", ins, ["y"], mode=mode)]
        elif op == "layernorm":
            ax = axis % rank or 1  # not over the batch axis
            norm = x.shape[ax:]
            inits = [numpy_helper.from_array(rng.normal(1, 0.3, norm).astype(np.float32), "s"),
                     numpy_helper.from_array(rng.normal(0, 0.3, norm).astype(np.float32), "b")]
            nodes = [helper.make_node("LayerNormalization", ["x", "s"] + (["b"] if with_axes else []), ["y"],
                                      axis=ax - rank if axis < 0 else ax, epsilon=1e-3)]
        else:
            d = rng.uniform(0.5, 2.0, x.shape[-1]).astype(np.float32) * rng.choice([-1, 1], x.shape[-1])
            inits = [numpy_helper.from_array(d.astype(np.float32), "d")]
            nodes = [helper.make_node("Mod", ["x", "d"], ["y"], fmod=1)]
            if op == "mod":  # ONNX Runtime takes float Mod with fmod=1 only: integers for fmod=0
                x = np.round(x * 4)
                inits = [numpy_helper.from_array(np.where(d < 0, -3, 2).astype(np.float32), "d")]
                nodes = [helper.make_node("Cast", ["x"], ["xi"], to=7),
                         helper.make_node("Cast", ["d"], ["di"], to=7),
                         helper.make_node("Mod", ["xi", "di"], ["yi"], fmod=0),
                         helper.make_node("Cast", ["yi"], ["y"], to=1)]
        _run_both(nodes, inits, x, rank)

    check()
