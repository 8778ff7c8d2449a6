"""A model whose input is channels-first, ``(batch, channels, time)``, is read as the model
holds it on cpu.native: the layout comes from the first op consuming the input (a torch
Conv1d / MaxPool1d / AvgPool1d / BatchNorm1d, an ONNX Conv / pool / BatchNormalization over
axis 1), the IR gets a Transpose to its (time, channels) and, for an output the model keeps
channels-first, one back. Answers exact against the framework, through ``hwb.compile``."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends import layer_ir

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
torch = pytest.importorskip("torch")
nn = torch.nn
C, L = 4, 9
X = np.random.default_rng(0).standard_normal((32, C, L)).astype(np.float32)


class _Head(nn.Module):
    def __init__(self, body: nn.Module, flat: int | None) -> None:
        super().__init__()
        self.body, self.flat = body, flat
        self.fc = nn.Linear(flat, 3) if flat else None

    def forward(self, x):
        y = self.body(x)
        return self.fc(y.flatten(1)) if self.fc is not None else y


def _bn(c: int) -> nn.Module:
    bn = nn.BatchNorm1d(c).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


BODIES = {
    "conv1d": lambda: (nn.Sequential(nn.Conv1d(C, 5, 3), nn.ReLU()), 5 * (L - 2)),
    "conv1d_seq_out": lambda: (nn.Conv1d(C, 5, 3, padding=1), None),  # (N, 5, L) out
    "maxpool1d": lambda: (nn.MaxPool1d(2), C * (L // 2)),
    "avgpool1d": lambda: (nn.AvgPool1d(3, 2), C * ((L - 3) // 2 + 1)),
    "batchnorm1d": lambda: (_bn(C), C * L),
}


def _model(kind: str) -> nn.Module:
    torch.manual_seed(1)
    body, flat = BODIES[kind]()
    return _Head(body, flat).eval()


def _want(m: nn.Module) -> np.ndarray:
    with torch.no_grad():
        return m(torch.from_numpy(X)).numpy()


def _exact(cm, want: np.ndarray) -> None:
    got = cm.predict(X)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * max(float(np.abs(want).max()), 1e-3)


@pytest.mark.parametrize("kind", list(BODIES))
def test_torch_channels_first_input_is_exact(kind, tmp_path) -> None:
    m = _model(kind)
    model = hwb.load_model(m, example_input=torch.zeros(2, C, L))
    assert isinstance(layer_ir.extract(model, "cpu.native").layers[0], layer_ir.Transpose)
    _exact(hwb.compile(model, "cpu.native", store=tmp_path, isolate_compile=False), _want(m))


@pytest.mark.parametrize("kind", list(BODIES))
def test_onnx_channels_first_input_is_exact(kind, tmp_path) -> None:
    pytest.importorskip("onnx")
    m = _model(kind)
    path = tmp_path / f"{kind}.onnx"
    torch.onnx.export(m, (torch.zeros(1, C, L),), str(path), dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    _exact(hwb.compile(hwb.load_model(str(path)), "cpu.native", store=tmp_path / "s",
                       isolate_compile=False), _want(m))


def test_the_issue_batchnorm_sequential_compiles(tmp_path) -> None:
    """nn.Sequential(BatchNorm1d(4), Flatten(), Linear(24, 2)) over (4, 6): BatchNorm1d
    normalizes dim 1, so the input is (channels 4, time 6), as ONNX Runtime runs it; int8 too."""
    torch.manual_seed(2)
    seq = nn.Sequential(_bn(4), nn.Flatten(), nn.Linear(24, 2)).eval()
    x = np.random.default_rng(3).standard_normal((64, 4, 6)).astype(np.float32)
    with torch.no_grad():
        want = seq(torch.from_numpy(x)).numpy()
    model = hwb.load_model(seq, example_input=torch.zeros(2, 4, 6))
    cm = hwb.compile(model, "cpu.native", store=tmp_path, isolate_compile=False, validation_data=x)
    assert np.abs(cm.predict(x) - want).max() <= 1e-5 * np.abs(want).max()
    q = hwb.compile(model, "cpu.native", "int8", store=tmp_path, isolate_compile=False,
                    calibration_data=x, validation_data=x)
    assert q.fidelity.corr >= 0.98


def test_a_channels_last_input_keeps_its_layout() -> None:
    """The input of a model whose first op is per-step (a Linear over the channels) stays
    (batch, time, channels): no Transpose."""
    seq = nn.Sequential(nn.Linear(C, 3), nn.Flatten(), nn.Linear(3 * L, 1)).eval()
    net = layer_ir.extract(hwb.load_model(seq, example_input=torch.zeros(2, L, C)), "cpu.native")
    assert not any(isinstance(x, layer_ir.Transpose) for x in net.layers)
