"""The shared layer IR (hwbackends/layer_ir/) from ONNX and torch.export beyond MLPs:
Conv/pooling/Flatten/LSTM/GRU graphs as tf2onnx and torch.onnx write them, and
torch modules with their own forward (an LSTM's last step, a Conv1d between transposes),
compiled by cpu.native and checked against ONNX Runtime / torch themselves; what the IR
cannot hold is refused naming the op and what about it."""
from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import UnsupportedError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


def _torch_modules() -> dict[str, tuple[Any, tuple[int, ...]]]:
    """Seeded torch modules with their own forward, each over (batch, time, channels)."""
    import torch
    from torch import nn

    torch.manual_seed(7)

    class ConvGRU(nn.Module):  # Conv1d → relu → MaxPool1d → GRU's last step → softmax head
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.pool = nn.Conv1d(4, 6, 3, padding=1), nn.MaxPool1d(2)
            self.gru, self.head = nn.GRU(6, 5, batch_first=True), nn.Linear(5, 2)

        def forward(self, x: Any) -> Any:
            y = self.pool(torch.relu(self.conv(x.transpose(1, 2))))
            y, _ = self.gru(y.transpose(1, 2))
            return torch.softmax(self.head(y[:, -1]), -1)

    class ConvFlat(nn.Module):  # dilated Conv1d + BatchNorm1d, AvgPool1d, channels-first flatten
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv1d(4, 6, 3, dilation=2), nn.BatchNorm1d(6)
            self.pool, self.head = nn.AvgPool1d(2), nn.Linear(6 * 8, 3)
            with torch.no_grad():
                self.bn.running_mean.uniform_(-1, 1)
                self.bn.running_var.uniform_(0.5, 2)

        def forward(self, x: Any) -> Any:
            y = self.pool(torch.tanh(self.bn(self.conv(x.permute(0, 2, 1)))))
            return self.head(torch.flatten(y, 1))

    class LSTMHidden(nn.Module):  # the head reads h_n
        def __init__(self) -> None:
            super().__init__()
            self.lstm, self.head = nn.LSTM(4, 7, batch_first=True), nn.Linear(7, 1)

        def forward(self, x: Any) -> Any:
            _, (h, _) = self.lstm(x)
            return self.head(h[-1])

    return {"conv_gru": (ConvGRU().eval(), (20, 4)), "conv_flat": (ConvFlat().eval(), (20, 4)),
            "lstm_hidden": (LSTMHidden().eval(), (9, 4))}


def _keras_conv() -> Any:
    """Padding same (dilated) and causal, a BatchNormalization (tf2onnx writes Mul/Add),
    max and average pooling, Flatten: what tf2onnx wraps in Unsqueeze/Transpose/Squeeze/Pad."""
    import keras

    keras.utils.set_random_seed(5)
    m = keras.Sequential([
        keras.Input((20, 4), name="window"),
        keras.layers.Conv1D(9, 3, padding="same", dilation_rate=2, name="conv_same"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.Activation("tanh", name="tanh"),
        keras.layers.MaxPooling1D(2, name="maxpool"),
        keras.layers.Conv1D(5, 2, padding="causal", strides=2, activation="relu", name="conv_causal"),
        keras.layers.AveragePooling1D(2, 1, name="avgpool"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(2, activation="sigmoid", name="out"),
    ], name="onnx_conv")
    bn = m.get_layer("bn")
    rng = np.random.default_rng(1)
    bn.set_weights([rng.uniform(0.5, 1.5, 9), rng.normal(0, 0.3, 9), rng.normal(0, 0.3, 9),
                    rng.uniform(0.5, 2.0, 9)])
    return m


def _ort(proto: Any, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def _native(model: hwb.Model, store_dir: Any) -> Any:
    return hwb.compile(model, "cpu.native", "fp32", store=store_dir, fidelity=False)


def test_onnx_conv_pool_flatten_lstm_gru(zoo_model, store_dir, tmp_path) -> None:
    """tf2onnx's Keras Conv1D (as an NCHW Conv between Unsqueeze/Transpose/Squeeze), its
    pooling, Pad, Mul/Add batch norm and Reshape; its Keras LSTM (an ONNX LSTM over a
    Shape-built zero state, sliced at the last step); torch.onnx's LSTM/GRU (gate orders
    i,o,f,c / z,r,h with linear_before_reset), Conv1d, pooling and channels-first Flatten:
    all compile and match ONNX Runtime on the same graph."""
    from hwb_plugins.converters.to_onnx import keras_to_onnx, torch_to_onnx

    mods = _torch_modules()
    cases = [keras_to_onnx(zoo_model("conv1d"), tmp_path), keras_to_onnx(zoo_model("lstm"), tmp_path),
             keras_to_onnx(hwb.load_model(_keras_conv()), tmp_path),
             torch_to_onnx(zoo_model("lstm_torch"), tmp_path)]
    cases += [torch_to_onnx(hwb.load_model(m, input_shape=s, name=k), tmp_path)
              for k, (m, s) in mods.items()]
    seen: set[str] = set()
    for o in cases:
        seen |= {n.op_type for n in o.obj.graph.node}
        cm = _native(hwb.load_model(o.obj, name=o.name), store_dir)
        x = np.random.default_rng(3).normal(size=(16, *o.input.shape)).astype(np.float32)
        np.testing.assert_allclose(cm.predict(x), _ort(o.obj, x), atol=1e-5, rtol=1e-5, err_msg=o.name)
    assert {"Conv", "LSTM", "GRU", "MaxPool", "AveragePool", "GlobalAveragePool", "Pad",
            "Reshape", "Flatten", "Gather", "Slice"} <= seen, seen


@pytest.mark.slow  # four torch.export runs and builds (~9 s each under load)
def test_torch_export_conv_lstm_gru(zoo_model, store_dir) -> None:
    """torch modules with their own forward reach the compile worker as torch.export
    programs: an LSTM's last step (the zoo's lstm_torch), h_n, a GRU after Conv1d/MaxPool1d,
    a dilated Conv1d with a BatchNorm1d folded in and a channels-first flatten."""
    import torch

    models = [zoo_model("lstm_torch")] + [hwb.load_model(m, input_shape=s, name=k)
                                          for k, (m, s) in _torch_modules().items()]
    for m in models:
        cm = _native(m, store_dir)
        x = np.random.default_rng(4).normal(size=(16, *m.input.shape)).astype(np.float32)
        with torch.no_grad():
            want = m.obj(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(cm.predict(x), want, atol=1e-5, rtol=1e-5, err_msg=m.name)


def _refused_torch() -> dict[str, tuple[Any, tuple[int, ...], str]]:
    import torch
    from torch import nn

    class Last(nn.Module):
        def __init__(self, **kw: Any) -> None:
            super().__init__()
            self.lstm = nn.LSTM(4, 5, batch_first=True, **kw)

        def forward(self, x: Any) -> Any:
            return self.lstm(x)[0][:, -1]

    class Grouped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3, groups=2)

        def forward(self, x: Any) -> Any:
            return torch.flatten(self.conv(x.transpose(1, 2)), 1)

    class Mid(nn.Module):  # every other time step: not a contiguous slice
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(4, 5, batch_first=True)

        def forward(self, x: Any) -> Any:
            return self.gru(x)[0][:, ::2]

    class BidirHidden(nn.Module):  # h_n[-1] of a bidirectional LSTM: the backward state at step 0
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(4, 5, batch_first=True, bidirectional=True)

        def forward(self, x: Any) -> Any:
            return self.lstm(x)[1][0][-1]

    return {"bidirectional": (Last(bidirectional=True).eval(), (9, 4), r"bidirectional=True"),
            "bidir_hidden": (BidirHidden().eval(), (9, 4), r"h_n of a bidirectional LSTM/GRU"),
            "grouped": (Grouped().eval(), (9, 4), None),
            "middle": (Mid().eval(), (9, 4), r"slice.*contiguous")}


def test_torch_unsupported_named(store_dir) -> None:
    """h_n of a bidirectional LSTM and a strided time slice are refused naming the op and
    the setting (a stacked or bidirectional LSTM's output compiles: tests/test_desk_layers.py)."""
    for name, (m, shape, why) in _refused_torch().items():
        if why is None or name == "bidirectional":
            continue
        with pytest.raises(UnsupportedError, match=why):
            _native(hwb.load_model(m, input_shape=shape, name=name), store_dir)


def test_grouped_conv1d_flattened_channels_first_is_exact(store_dir, tmp_path) -> None:
    """A grouped Conv1d (its block-diagonal kernel) whose channels-first output is flattened
    as the model's output (the IR's (time, channels) put back in the source's order before
    the flatten), from torch and through torch.onnx, against torch."""
    import torch

    from hwb_plugins.converters.to_onnx import torch_to_onnx

    m, shape, _ = _refused_torch()["grouped"]
    x = np.random.default_rng(4).standard_normal((16, *shape)).astype(np.float32)
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    model = hwb.load_model(m, input_shape=shape, name="grouped")
    onnx_model = hwb.load_model(torch_to_onnx(model, tmp_path).obj, name="grouped")
    for src in (model, onnx_model):
        got = _native(src, store_dir).predict(x)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), src.format


def test_onnx_unsupported_named(store_dir, tmp_path) -> None:
    """The Loop tf2onnx writes for a Keras GRU it cannot map to an ONNX GRU is refused naming
    the op (a bidirectional LSTM compiles: tests/test_desk_layers.py)."""
    import keras

    from hwb_plugins.converters.to_onnx import keras_to_onnx

    keras.utils.set_random_seed(2)
    gru = keras.Sequential([keras.Input((6, 3)), keras.layers.GRU(4, return_sequences=True),
                            keras.layers.GRU(4, reset_after=False), keras.layers.Dense(1)])
    o = keras_to_onnx(hwb.load_model(gru, name="keras_gru"), tmp_path)
    with pytest.raises(UnsupportedError, match=r"op Loop"):
        _native(hwb.load_model(o.obj, name="keras_gru"), store_dir)


def test_in_process_module_walks_its_export(zoo_model) -> None:
    """layer_ir.extract on an in-process module with its own forward (not yet a torch.export
    program) exports it and reads the same layers; the IR's float64 reference matches torch."""
    import torch

    from hwbackends import layer_ir

    m = zoo_model("lstm_torch")
    net = layer_ir.extract(m, "cpu.native")
    assert [type(layer).__name__ for layer in net.layers] == ["Recurrent", "Dense"]
    assert not net.layers[0].return_sequences
    x = np.random.default_rng(5).normal(size=(8, 16, 8)).astype(np.float32)
    with torch.no_grad():
        want = m.obj(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(layer_ir.forward(net, x)[-1], want, atol=1e-5)
