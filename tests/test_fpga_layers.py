"""fpga.hls4ml takes the layers hls4ml 1.3 converts (a causal TCN's Conv1D and
pooling here; zoo:lstm in tests/test_fpga_hls4ml.py), C-simulated within fidelity, and refuses
by name what hls4ml would build wrong: a dilated convolution (hls4ml's Keras 3 handler drops
``dilation_rate``; a design built from it computes an undilated convolution, corr 0.47 on
the model below). Everything goes through ``hwb compile`` as a user runs it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import Run, hwb

from hwbackends.cli import EXIT_ERROR, EXIT_OK

TARGET = "fpga.hls4ml"
PRECISION = "ap_fixed<16,6>"


def hwb_compile(path: Path, store: Path, *args: str) -> Run:
    """``hwb compile PATH -t fpga.hls4ml -p ap_fixed<16,6> ARGS`` (tests/cli_run.py)."""
    return hwb("compile", str(path), "--cache-dir", str(store), "-t", TARGET, "-p", PRECISION, *args)


def tcn(path: Path, dilation: int) -> Path:
    """A small causal TCN over an (8, 2) window: causal Conv1D (ReLU), a second one at
    ``dilation``, max and average pooling, Flatten, Dense."""
    import keras

    keras.utils.set_random_seed(0)
    L = keras.layers
    inp = keras.Input((8, 2))
    h = L.Conv1D(3, 3, padding="causal", activation="relu", name="c1")(inp)
    h = L.Conv1D(3, 2, padding="causal", dilation_rate=dilation, activation="relu", name="c2")(h)
    h = L.AveragePooling1D(2, name="avgp")(L.MaxPooling1D(2, name="maxp")(h))
    keras.Model(inp, L.Dense(1, name="out")(L.Flatten(name="flat")(h))).save(path)
    return path


def test_dilated_conv_is_refused_as_hls4mls_limit(tmp_path: Path) -> None:
    p = hwb_compile(tcn(tmp_path / "dilated.keras", 2), tmp_path / "store")
    assert p.returncode == EXIT_ERROR, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("hwb compile: UnsupportedError"))
    for part in ("'c2' (Conv1D)", "dilation_rate=(2,)", "hls4ml's limit", "another target"):
        assert part in line, line
    assert "cpu.native" not in line  # hls4ml's limit, not another target's op list


@pytest.fixture(scope="module")
def causal_tcn(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("tcn")
    p = hwb_compile(tcn(d / "tcn.keras", 1), d / "store", "--json")
    assert p.returncode == EXIT_OK, p.stderr
    return json.loads(p.stdout)


@pytest.mark.slow
def test_causal_tcn_is_c_simulated_within_fidelity(causal_tcn: dict) -> None:
    assert causal_tcn["mode"] == "emulated"
    assert causal_tcn["fidelity_gate"]["passed"], causal_tcn["fidelity_gate"]
    fid = causal_tcn["fidelity"]
    assert fid["n"] >= 256 and fid["corr"] > 0.999 and fid["sign_agree"] > 0.99, fid


@pytest.mark.slow
def test_causal_tcn_layers_reach_hls4ml(causal_tcn: dict) -> None:
    """Every layer of the model is in hls4ml's design (its per-layer types), none dropped."""
    types = causal_tcn["meta"]["types"]
    for layer in ("c1", "c2", "maxp", "avgp", "out"):
        assert layer in types, sorted(types)


def bn_tcn(path: Path, first_pad: str = "valid") -> Path:
    """Conv1D stacks with BatchNormalization in each place a desk puts one: on the inputs
    (before a ``first_pad``-padded Conv1D), after a Conv1D then a ReLU, and after a causal
    Conv1D then a tanh; non-trivial statistics, so a fold that is off shows."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(3)
    L = keras.layers
    inp = keras.Input((10, 3))
    h = L.BatchNormalization(name="bn_in")(inp)
    h = L.Conv1D(4, 3, padding=first_pad, name="c1")(h)
    h = L.ReLU(name="r1")(L.BatchNormalization(name="bn1")(h))
    h = L.Conv1D(3, 2, padding="causal", name="c2")(h)
    h = L.Activation("tanh", name="t2")(L.BatchNormalization(name="bn2")(h))
    km = keras.Model(inp, L.Dense(1, name="out")(L.Flatten(name="flat")(L.MaxPooling1D(2, name="pool")(h))))
    rng = np.random.default_rng(5)
    for name in ("bn_in", "bn1", "bn2"):
        bn = km.get_layer(name)
        n = bn.get_weights()[0].shape[0]
        bn.set_weights([rng.uniform(0.5, 2.0, n), rng.normal(0, 0.5, n), rng.normal(0, 0.5, n),
                        rng.uniform(0.3, 3.0, n)])
    km.save(path)
    return path


@pytest.mark.parametrize("functional", [False, True])
def test_batchnorm_folds_into_conv1d_on_either_side_exactly(tmp_path: Path, functional: bool) -> None:
    """The fold fpga.hls4ml (and cpu.native ``fixed``) makes before hls4ml sees the model:
    a BN after a Conv1D (any padding) into its output, one on the inputs into the 'valid'
    Conv1D after it; no BatchNormalization left, the same function (float32 rounding)."""
    import keras
    import numpy as np

    from hwbackends.layer_ir.batchnorm import fold_keras

    km = keras.models.load_model(bn_tcn(tmp_path / "bn.keras"))
    if not functional:
        km = keras.Sequential([keras.Input((10, 3)), *km.layers[1:]])
    folded = fold_keras(km, "fpga.hls4ml")
    assert not [ly.name for ly in folded.layers if type(ly).__name__ == "BatchNormalization"]
    x = np.random.default_rng(1).standard_normal((64, 10, 3)).astype(np.float32)
    want = np.asarray(km(x, training=False))
    assert np.abs(np.asarray(folded(x)) - want).max() <= 1e-5 * np.abs(want).max()


def test_batchnorm_before_a_padded_conv_is_refused_by_name(tmp_path: Path) -> None:
    """A BN on the inputs of a causal Conv1D cannot fold (the conv pads the normalized signal
    with zeros): refused naming it and why, before any build (through the public API, in
    process: the CLI's refusal path is test_dilated_conv_is_refused_as_hls4mls_limit's)."""
    import hwbackends as hwb
    from hwbackends.errors import UnsupportedError

    m = hwb.load_model(bn_tcn(tmp_path / "bn_causal.keras", "causal"))
    with pytest.raises(UnsupportedError) as err:
        hwb.compile(m, TARGET, PRECISION, store=tmp_path / "store", fidelity=False)
    line = str(err.value)
    for part in ("'bn_in' (BatchNormalization)", "model's inputs", "'c1' (Conv1D)", "'causal'",
                 "'valid'"):
        assert part in line, line


@pytest.fixture(scope="module")
def bn_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for the BN stack's builds: the io_parallel design built through ``hwb
    compile`` is found there by the io_stream comparison."""
    return tmp_path_factory.mktemp("bn_store")


@pytest.mark.slow
def test_conv1d_batchnorm_stack_is_c_simulated_against_keras(tmp_path: Path, bn_store: Path) -> None:
    """BN → Conv1D(valid) → BN → ReLU → Conv1D(causal) → BN → tanh → pooling → Dense on
    hls4ml's C-simulation, checked against the Keras model (the reference is the source
    model, BatchNormalizations included)."""
    p = hwb_compile(bn_tcn(tmp_path / "bn.keras"), bn_store, "--json")
    assert p.returncode == EXIT_OK, p.stderr
    d = json.loads(p.stdout)
    assert d["mode"] == "emulated" and d["fidelity_gate"]["passed"], d["fidelity_gate"]
    fid = d["fidelity"]
    assert fid["n"] >= 256 and fid["corr"] > 0.999 and fid["sign_agree"] > 0.99, fid
    assert fid["max_abs"] < 0.05, fid
    assert {"c1", "c2", "pool", "out"} <= set(d["meta"]["types"]), sorted(d["meta"]["types"])


@pytest.mark.slow
def test_io_stream_c_simulation_answers_as_io_parallel(tmp_path: Path, bn_store: Path) -> None:
    """``-O io_type=io_stream`` (hls4ml's streaming Conv1D, pooling and activations, layers
    joined by FIFOs) builds the BN stack's C-simulation, and it answers exactly as the
    io_parallel design: the option changes the hardware, not the arithmetic."""
    import numpy as np

    import hwbackends as hwb

    m = hwb.load_model(bn_tcn(tmp_path / "bn.keras"))
    x = np.ascontiguousarray(m.representative(256, seed=4), np.float32)
    par = hwb.compile(m, TARGET, PRECISION, store=bn_store, fidelity=False)
    stream = hwb.compile(m, TARGET, PRECISION, store=bn_store, fidelity=False,
                         options={"io_type": "io_stream"})
    assert stream.artifact.key != par.artifact.key  # two designs, not one cached twice
    y = par.predict(x)
    assert len(np.unique(y)) > 50
    np.testing.assert_array_equal(stream.predict(x), y)


def test_da4ml_refusal_names_da4mls_own_set(tmp_path: Path) -> None:
    """A layer the shared layer IR does not read: the refusal lists what fpga.da4ml builds,
    not the IR's (cpu.native's) list, which promises LSTM, LayerNormalization and attention."""
    import keras

    inp = keras.Input((4,))
    h = keras.layers.Discretization(bin_boundaries=[-1.0, 0.0, 1.0], name="bins")(inp)
    keras.Model(inp, keras.layers.Dense(1)(h)).save(tmp_path / "bins.keras")
    p = hwb("compile", str(tmp_path / "bins.keras"), "--cache-dir", str(tmp_path / "store"),
            "-t", "fpga.da4ml")
    assert p.returncode == EXIT_ERROR, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("hwb compile: UnsupportedError"))
    assert "'bins' (Discretization)" in line and "fpga.da4ml (da4ml) compiles: Dense/Linear" in line
    for promised in ("LSTM", "MultiHeadAttention", "LayerNormalization", "TORCH_OPS"):
        assert promised not in line, line


def test_fpga_layer_table_in_the_docs_is_current() -> None:
    """docs/targets-fpga.md's layer table is what the targets' checks accept (regenerate it
    with ``python -m hwb_plugins._shared.fpga_layers`` after changing them)."""
    from hwb_plugins._shared import fpga_layers
    from hwb_plugins.fpga_hls4ml.convert import accepted_keras_layers

    assert fpga_layers.is_current(), "run python -m hwb_plugins._shared.fpga_layers"
    section = fpga_layers.DOC.read_text().split(fpga_layers.BEGIN)[1].split(fpga_layers.END)[0]
    keras_row = next(ln for ln in section.splitlines() if ln.startswith("| fpga.hls4ml | Keras |"))
    listed = keras_row.split(" | ")[2].rstrip(" |").split(", ")
    assert listed == accepted_keras_layers()
    assert {"Conv1D", "LSTM", "GRU", "MaxPooling1D"} <= set(listed)
    assert "BatchNormalization" not in listed  # folded into a neighbouring Dense/Conv1D
    assert "Conv1D right before it (any padding" in section


@pytest.mark.slow
def test_da4ml_builds_a_dilated_causal_tcn_as_constant_matrices(tmp_path: Path) -> None:
    """fpga.da4ml takes Conv1D (causal, dilated) followed by activations and a Flatten, built
    as the convolution's constant matrix; the Verilated RTL matches the Keras model (the
    reference is the source model, so this checks the lowering itself)."""
    import keras

    keras.utils.set_random_seed(0)
    L = keras.layers
    inp = keras.Input((8, 2))
    h = L.Conv1D(3, 3, padding="causal", activation="relu", name="c1")(inp)
    h = L.Conv1D(3, 3, padding="causal", dilation_rate=2, activation="relu", name="c2")(h)
    keras.Model(inp, L.Dense(1, name="out")(L.Flatten()(h))).save(tmp_path / "tcn.keras")
    # the lowering is what is checked here; yosys' synthesis (≈ 20 s of this build) is
    # tests/test_fpga_da4ml.py's
    p = hwb("compile", str(tmp_path / "tcn.keras"), "--cache-dir", str(tmp_path / "store"),
            "-t", "fpga.da4ml", "-O", "synth=false", "--json")
    assert p.returncode == EXIT_OK, p.stderr
    d = json.loads(p.stdout)
    assert d["fidelity_gate"]["passed"], d["fidelity_gate"]
    assert d["fidelity"]["corr"] > 0.999 and d["fidelity"]["sign_agree"] > 0.99, d["fidelity"]


def test_da4ml_conv_then_pooling_is_refused_naming_the_conv(tmp_path: Path) -> None:
    import keras

    L = keras.layers
    inp = keras.Input((8, 2))
    h = L.MaxPooling1D(2, name="pool")(L.Conv1D(3, 3, activation="relu", name="c1")(inp))
    keras.Model(inp, L.Dense(1)(L.Flatten()(h))).save(tmp_path / "cp.keras")
    p = hwb("compile", str(tmp_path / "cp.keras"), "--cache-dir", str(tmp_path / "store"),
            "-t", "fpga.da4ml")
    assert p.returncode == EXIT_ERROR and "Traceback" not in p.stderr, p.stderr
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("hwb compile: UnsupportedError"))
    assert "'c1' (Conv1D)" in line and "pooling" in line and "Flatten" in line, line
