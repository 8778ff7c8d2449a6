"""cpu.native int8 on inputs past the calibrated range.

Min-max calibration on a few hundred samples sees less than the tail of fresh inputs. The
long int8 fuzz found BN -> ReLU -> Dense(1) over 2 features whose test inputs went 27 %
past the calibrated max: quantised at the calibrated scale they were clipped, and the head
moved by 0.21 of its range (gate 0.2). The calibrated range is now a floor: an input past it
is quantised, for that call only, at its own wider range. These tests go through the public
API (load_model, compile on cpu.native int8) and compare with torch.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.fidelity import TOLERANCES, compare

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

torch = pytest.importorskip("torch")
nn = torch.nn


def _bn_relu_dense() -> nn.Module:
    """The fuzz's failing model (torch, seed 38 of the same draw): BatchNorm1d(2) -> ReLU ->
    Linear(2, 1), one feature's weight ~70x smaller than the other's."""
    m = nn.Sequential(nn.BatchNorm1d(2), nn.ReLU(), nn.Linear(2, 1)).eval()
    with torch.no_grad():
        bn, lin = m[0], m[2]
        bn.weight.copy_(torch.tensor([1.8848, 1.9731]))
        bn.bias.copy_(torch.tensor([-0.0272, -0.0603]))
        bn.running_mean.copy_(torch.tensor([0.7530, 0.0728]))
        bn.running_var.copy_(torch.tensor([2.2023, 1.6107]))
        lin.weight.copy_(torch.tensor([[0.00271, 0.19023]]))
        lin.bias.copy_(torch.tensor([-0.5866]))
    return m


def _x(shape: tuple[int, ...], n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def _torch(mod: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return mod(torch.from_numpy(x)).double().numpy()


def _int8(mod: nn.Module, shape: tuple[int, ...], calib: np.ndarray, store) -> hwb.CompiledModel:
    m = hwb.load_model(mod, example_input=torch.zeros(2, *shape))
    return hwb.compile(m, "cpu.native", "int8", store=store, fidelity=False, calibration_data=calib)


def test_inputs_past_the_calibrated_max_are_not_clipped(store_dir) -> None:
    """The fuzz's case, with its draws (calibration seed 40, test seed 41): the Dense's input
    on the test set exceeds its calibrated max, and int8 now stays within its gate (the old
    code clipped: rel_err 0.30 > 0.2)."""
    mod = _bn_relu_dense()
    calib, x = _x((2,), 256, 40), _x((2,), 256, 41)
    dense_in = [float(np.abs(_torch(mod[:2], a)).max()) for a in (calib, x)]
    assert dense_in[1] > 1.1 * dense_in[0]  # the case: fresh inputs past the calibrated range
    f = compare(_torch(mod, x), _int8(mod, (2,), calib, store_dir).predict(x))
    assert not TOLERANCES["quantized"].violations(f), f


@pytest.mark.parametrize("factor", [3.0, 1e3, 1e6])
def test_inputs_far_past_calibration_keep_their_relative_accuracy(store_dir, factor) -> None:
    """Inputs many times the calibrated range: each answer is within 2 % of the output's
    range, as it is inside the calibrated range (clipped, a 1e3x input answered ~1e-3 of it)."""
    mod = _bn_relu_dense()
    cm = _int8(mod, (2,), _x((2,), 256, 40), store_dir)
    x = _x((2,), 64, 7) * np.float32(factor)
    want = _torch(mod, x)
    err = np.abs(cm.predict(x) - want).max() / np.ptp(want)
    assert err < 0.02, f"{factor}x the calibration range: error {err:.3g} of the output range"


def test_one_wide_sample_does_not_change_the_others(store_dir) -> None:
    """The widening is per sample: a batch with an outlier answers every other row exactly
    as the batch without it does."""
    mod = _bn_relu_dense()
    cm = _int8(mod, (2,), _x((2,), 256, 40), store_dir)
    x = _x((2,), 16, 3)
    wide = x.copy()
    wide[5] *= 50.0
    got, alone = cm.predict(wide), cm.predict(x)
    keep = np.arange(16) != 5
    np.testing.assert_array_equal(got[keep], alone[keep])


class _ConvHead(nn.Module):
    """Conv1d over a (time, features) window (its input quantised once for every output step)
    -> flatten -> Linear: the int8 conv path's calibration."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.out = nn.Conv1d(3, 4, 3), nn.Linear(4 * 6, 1)

    def forward(self, x):
        return self.out(torch.relu(torch.flatten(self.conv(x.transpose(1, 2)), 1)))


def test_conv_window_past_the_calibrated_range_is_not_clipped(store_dir) -> None:
    """The conv quantises its whole input once at one scale; an input three times the
    calibrated range widens that scale too (the old code clipped it: corr 0.95 < 0.98)."""
    torch.manual_seed(0)
    mod = _ConvHead().eval()
    calib = _x((8, 3), 256, 1)
    x = _x((8, 3), 256, 2) * np.float32(3.0)
    f = compare(_torch(mod, x), _int8(mod, (8, 3), calib, store_dir).predict(x))
    assert not TOLERANCES["quantized"].violations(f), f


@pytest.mark.parametrize("per_step", [False, True])
def test_a_signal_on_a_large_offset_keeps_its_resolution(store_dir, per_step) -> None:
    """A Dense input that rides on an offset 100x its spread (Linear y = 5 + 0.05·x): a
    symmetric scale of max |x| / 127 ≈ 0.04 leaves the signal about two levels (corr ~0.9);
    each Dense input is now centred on its calibrated midpoint (the offset through the
    weights in float), so the int8 product sees only the signal. ``per_step``: the Dense runs
    on every step of a (6, 3) window (torch Linear over the last axis)."""
    shape = (6, 3) if per_step else (3,)
    n = int(np.prod(shape)) if not per_step else 3
    first = nn.Linear(n, 2)
    with torch.no_grad():
        first.weight.copy_(torch.full((2, n), 0.05))
        first.weight[1] *= -1.0
        first.bias.copy_(torch.tensor([5.0, -3.0]))
    torch.manual_seed(3)
    rest = [nn.Flatten(), nn.Linear(2 * shape[0], 1)] if per_step else [nn.Linear(2, 1)]
    mod = nn.Sequential(first, *rest).eval()
    calib, x = _x(shape, 256, 1), _x(shape, 256, 2)
    f = compare(_torch(mod, x), _int8(mod, shape, calib, store_dir).predict(x))
    assert not TOLERANCES["quantized"].violations(f), f
