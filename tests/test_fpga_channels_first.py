"""The FPGA targets read a channels-first input, ``(batch, channels, time)``, as the model
holds it (a PyTorch BatchNorm1d → Conv1d → ReLU → flatten → Linear): fpga.da4ml takes the
layout and the batch norm into its first constant matrix (rows permuted to the source's
order, the affine folded in: the float layers compute what torch computes), fpga.hls4ml
rebuilds the exported Conv1d/Flatten for hls4ml's PyTorch converter, which transposes to its
channels-last internally. Both compile through ``hwb.compile`` at ``auto`` and answer within
their fidelity gate against torch; a channels-first model a target cannot build is refused
naming the layer, never asking the user to change the layout."""
from __future__ import annotations

import numpy as np
import pytest

import hwbackends as hwb

torch = pytest.importorskip("torch")
nn = torch.nn
C, L = 4, 9
X = np.random.default_rng(0).standard_normal((256, C, L)).astype(np.float32)
LAYOUT_ADVICE = ("channels_last", "channels-last", "permute", "transpose your", "change the layout")


def _bn(c: int) -> nn.Module:
    bn = nn.BatchNorm1d(c).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


class _Net(nn.Module):
    """BatchNorm1d over the channels, a padded strided Conv1d, ReLU, a channels-first flatten."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.conv = _bn(C), nn.Conv1d(C, 5, 3, stride=2, padding=1)
        self.fc = nn.Linear(5 * 5, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(self.norm(x))).flatten(1))


class _Pooled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pool, self.fc = nn.MaxPool1d(3), nn.Linear(C * 3, 2)

    def forward(self, x):
        return self.fc(self.pool(x).flatten(1))


def _model(net: type) -> hwb.Model:
    torch.manual_seed(3)
    return hwb.load_model(net().eval(), input_shape=(C, L), name=net.__name__.lower())


def _need(target: str) -> None:
    from hwbackends.registry import get_registry
    from hwbackends.specs import Mode

    av = get_registry().target(target).probe()
    if av.mode is Mode.UNAVAILABLE:
        pytest.skip(f"{target}: {av.reason}")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("store")


def test_da4ml_float_layers_read_the_channels_first_input_exactly() -> None:
    pytest.importorskip("da4ml")
    from hwb_plugins.fpga_da4ml.network import extract

    m = _model(_Net)
    layers = extract(m)
    assert layers[0].w.shape[0] == C * L  # the source's flattened (C, L), fed as it is
    y = X.reshape(len(X), -1).astype(np.float64)
    for lyr in layers:
        y = lyr.forward(y)
    np.testing.assert_allclose(y, m.reference(X), rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["fpga.da4ml", "fpga.hls4ml"])
def test_channels_first_conv_compiles_within_the_gate(target, store) -> None:
    """About 10 s (da4ml, no synthesis) and 35 s (hls4ml: a fixed-point search of C-sim builds)."""
    _need(target)
    m = _model(_Net)
    cm = hwb.compile(m, target, "auto", store=store,
                     options={"synth": False} if target == "fpga.da4ml" else None)
    want, got = m.reference(X), cm.predict(X)  # data the gate's validation never saw
    err = float(np.abs(got - want).max())
    corr = float(np.corrcoef(got.ravel(), want.ravel())[0, 1])
    assert corr > 0.9999 and err < 0.02 * float(np.abs(want).max()), (corr, err)


@pytest.mark.parametrize("target", ["fpga.da4ml", "fpga.hls4ml"])
def test_a_channels_first_layer_it_cannot_build_is_refused_by_name(target, store) -> None:
    _need(target)
    with pytest.raises(hwb.UnsupportedError) as e:
        hwb.compile(_model(_Pooled), target, "auto", store=store)
    msg = str(e.value)
    assert re_layer(msg), msg
    assert not any(a in msg.lower() for a in LAYOUT_ADVICE), msg


def re_layer(msg: str) -> bool:
    """The refusal names the pooling layer (module path for hls4ml's rebuild, the IR's layer
    for da4ml)."""
    return "layer 'pool' (MaxPool1d)" in msg or "(Pool1D)" in msg
