"""Real models and a newcomer's first hour: model shapes users actually have — a
Keras 2 functional JSON (hls4ml's KERAS_1layer), one input with two outputs, a PyTorch MLP on
the da4ml FPGA target, BatchNormalization before a softmax on hls4ml (its compile is
the jet tagger's in test_fpga_classifiers.py), a model whose output
is constant on synthetic inputs — and the advice given when a model file cannot be used.
Every model is built here, tiny, with a fixed seed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from legacy_models import numpy_mlp, write_keras2_functional

import hwbackends as hwb

X16 = np.random.default_rng(20).standard_normal((6, 16)).astype(np.float32)



# -- item 1: cpu.litert / tpu.edgetpu follow the structure of km.input ------------------------
@pytest.fixture(scope="module")
def keras1layer(tmp_path_factory) -> tuple[Path, list[np.ndarray]]:
    """hls4ml's KERAS_1layer shape: a Keras 2 functional JSON and its ``_weights.h5``."""
    return write_keras2_functional(tmp_path_factory.mktemp("k1"))


def test_keras2_functional_json_compiles_on_the_default_target(keras1layer, store_dir, hwb_cli):
    """`hwb compile KERAS_1layer.json`: a new user's first command, on cpu.litert."""
    path, ws = keras1layer
    rc, out, err = hwb_cli("compile", str(path), "--cache-dir", str(store_dir))
    assert rc == 0, err
    assert "cpu.litert:fp32" in out
    m = hwb.load_model(path)
    assert isinstance(m.obj.input, list)  # the structure that broke static_clone
    cm = hwb.compile(m, "cpu.litert", store=store_dir)
    np.testing.assert_allclose(cm.predict(X16), numpy_mlp(X16, ws), atol=1e-5)


def test_keras2_functional_json_int8_and_edgetpu(keras1layer, store_dir):
    m = hwb.load_model(keras1layer[0])
    for target, precision in (("cpu.litert", "int8"), ("tpu.edgetpu", None)):
        cm = hwb.compile(m, target, precision, store=store_dir)
        assert cm.fidelity.argmax_agree > 0.9, (target, cm.fidelity)


@pytest.fixture(scope="module")
def one_in_two_out():
    import keras

    keras.utils.set_random_seed(3)
    x = keras.Input((6,), name="x")
    h = keras.layers.Dense(8, activation="relu", name="h")(x)
    km = keras.Model(x, [keras.layers.Dense(1, name="ret")(h),
                         keras.layers.Dense(3, activation="softmax", name="side")(h)])
    return hwb.load_model(km, name="one_in_two_out")


@pytest.mark.parametrize("target,precision", [("cpu.litert", "fp32"), ("cpu.litert", "int8"),
                                              ("tpu.edgetpu", None)])
def test_one_input_two_outputs(one_in_two_out, store_dir, target, precision):
    m = one_in_two_out
    cm = hwb.compile(m, target, precision, store=store_dir)
    x = np.random.default_rng(4).standard_normal((5, 6)).astype(np.float32)
    got, want = cm.predict(x), m.reference(x)
    assert [a.shape for a in got] == [(5, 1), (5, 3)]
    tol = 1e-5 if precision == "fp32" else 0.1
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=tol)


def _need(target: str) -> None:
    """Skip with the probe's reason when ``target`` cannot run here."""
    from hwbackends.registry import get_registry
    from hwbackends.specs import Mode

    av = get_registry().target(target).probe()
    if av.mode is Mode.UNAVAILABLE:
        pytest.skip(f"{target}: {av.reason}")


# -- item 3: PyTorch models reach the FPGA targets as torch.export programs -----------------
def _torch_mlp(*extra):
    import torch

    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), *extra, torch.nn.ReLU(),
                               torch.nn.Linear(6, 2)).eval()


def test_exported_chain_is_rebuilt_as_its_sequential():
    """The shared rebuild (hwb_plugins/_shared/torch_export.py): Linear, eval BatchNorm1d, Dropout
    and a no-op Flatten come back as modules with the exported weights; a branch is refused."""
    import torch

    from hwb_plugins._shared.torch_export import as_sequential
    from hwbackends.errors import UnsupportedError

    bn = torch.nn.BatchNorm1d(6)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    net = torch.nn.Sequential(torch.nn.Flatten(), *_torch_mlp(bn, torch.nn.Dropout(0.2))).eval()
    x = torch.randn(4, 8)
    ep = torch.export.export(net, (x,))
    seq = as_sequential(ep, "fpga.test", "advice")
    assert [type(m).__name__ for m in seq] == ["Linear", "BatchNorm1d", "ReLU", "Linear"]
    with torch.no_grad():
        torch.testing.assert_close(seq(x), net(x))

    class Skip(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.a(x) + x

    with pytest.raises(UnsupportedError, match=r"fpga\.test cannot build the forward of Skip, at "
                                               r"`return self\.a\(x\) \+ x`.*op aten\.add.*advice"):
        as_sequential(torch.export.export(Skip().eval(), (x,)), "fpga.test", "advice")


@pytest.mark.slow
def test_torch_mlp_compiles_on_da4ml(store_dir):
    import torch

    _need("fpga.da4ml")
    net = _torch_mlp()
    m = hwb.load_model(net, input_shape=(8,), name="torch_mlp")
    cm = hwb.compile(m, "fpga.da4ml", store=store_dir, options={"synth": False})
    assert cm.fidelity.corr > 0.999, cm.fidelity
    assert [lyr["activation"] for lyr in cm.artifact.meta["layers"]] == ["relu", "linear"]
    x = np.random.default_rng(6).standard_normal((5, 8)).astype(np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(cm.predict(x), want, atol=0.05)


# -- item 4: BatchNormalization folds into the Dense before it (one implementation) ---------
def _bn_model(functional: bool = False, act: str | None = None):
    """Dense(4) → BatchNormalization (set statistics) → Softmax over 8 features."""
    import keras

    keras.utils.set_random_seed(7)
    bn = keras.layers.BatchNormalization(name="bn")
    layers = [keras.layers.Dense(4, activation=act, use_bias=functional, name="fc"), bn,
              keras.layers.Softmax(name="prob")]
    if functional:
        x = keras.Input((8,), name="x")
        h = x
        for layer in layers:
            h = layer(h)
        km = keras.Model(x, h)
    else:
        km = keras.Sequential([keras.Input((8,)), *layers])
    bn.set_weights([np.array(v, np.float32) for v in
                    ([1.5, 0.5, 2.0, 1.0], [0.2, -0.1, 0.0, 0.3], [0.1, -0.2, 0.0, 0.4],
                     [2.0, 0.5, 1.0, 3.0])])
    return km


@pytest.mark.parametrize("functional", [False, True])
def test_batchnorm_folds_into_the_dense_before_it(functional):
    from hwbackends.layer_ir.batchnorm import fold_keras

    km = _bn_model(functional)
    folded = fold_keras(km, "fpga.test")
    assert "BatchNormalization" not in {type(layer).__name__ for layer in folded.layers}
    x = np.random.default_rng(8).standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(folded(x)), np.asarray(km(x)), atol=1e-6)


def test_batchnorm_that_cannot_fold_is_refused_by_name_before_any_build(store_dir):
    from hwb_plugins.fpga_hls4ml.convert import supported_layers
    from hwbackends.errors import UnsupportedError

    _need("fpga.hls4ml")
    # hls4ml's Keras 3 converter has no BatchNormalization: the list must not promise one
    assert "BatchNormalization" not in supported_layers("keras")
    m = hwb.load_model(_bn_model(act="relu"), name="bn_after_relu")
    with pytest.raises(UnsupportedError, match=r"'bn' \(BatchNormalization\).*activation 'relu'"):
        hwb.compile(m, "fpga.hls4ml", store=store_dir)


# BatchNormalization before a softmax compiling on hls4ml (folded, meeting the gate) is checked
# on the softmax jet tagger of tests/test_fpga_classifiers.py, which carries one (one auto
# search instead of two).


# -- item 5: a constant reference makes fidelity meaningless: flagged, data asked for -------
def test_compare_flags_a_constant_reference():
    from hwbackends.fidelity import Tolerance, compare

    ref = np.tile(np.array([[0.196, 0.200, 0.204]], np.float32), (64, 1))  # range 0.008
    f = compare(ref, ref + 1e-4)
    assert f.degenerate and "validation" in f.warning and "--validation" in f.warning
    assert "corr" not in f.gated and "argmax" not in f.gated
    assert f.rel_err == pytest.approx(1e-4 / 0.204, rel=1e-2)  # against the magnitude, not 0.008
    assert Tolerance(corr_min=0.999, rel_err=0.01).passes(f)
    assert "degenerate" in str(f) and f.to_dict()["degenerate"] is True
    from hwbackends.report.html import _fidelity_row
    from hwbackends.variant import VariantRecord
    row = _fidelity_row(VariantRecord.from_dict({"target": "cpu.litert", "precision": "fp32",
                                                 "variant": "cpu.litert:fp32", "mode": "hardware",
                                                 "fidelity": f.to_dict()}))
    assert "degenerate" in row[-1] and "validation" in row[-1]
    moving = ref + np.linspace(0, 1, 64, dtype=np.float32)[:, None]
    live = compare(moving, ref)
    assert not live.degenerate and live.warning == ""
    multi = compare((moving, ref), (moving, ref), names=["ret", "side"])
    assert multi.degenerate and "output(s) side" in multi.warning


def _saturating(tmp: Path) -> Path:
    """8 → relu(x − 8) → 3 softmax: every hidden unit is dead on N(0,1) inputs (the output is
    the same vector for each), alive on the inputs it was made for, ~N(10, 1)."""
    import keras

    keras.utils.set_random_seed(9)
    km = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu", name="gate"),
                           keras.layers.Dense(3, activation="softmax", name="prob")])
    gate, prob = km.layers
    gate.set_weights([np.eye(8, dtype=np.float32), np.full(8, -8.0, np.float32)])
    w = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)
    prob.set_weights([w, np.array([0.0, 0.02, 0.04], np.float32)])
    km.save(tmp / "saturating.keras")
    return tmp / "saturating.keras"


def test_constant_output_model_says_its_fidelity_is_degenerate(tmp_path, store_dir, hwb_cli):
    path = _saturating(tmp_path)
    m = hwb.load_model(path)
    cm = hwb.compile(m, "cpu.onnxruntime", store=store_dir)
    assert cm.fidelity.degenerate and cm.fidelity.corr == pytest.approx(1.0)
    rc, out, err = hwb_cli("compile", str(path), "-t", "cpu.onnxruntime",
                        "--cache-dir", str(store_dir))
    assert rc == 0, err
    assert "WARNING: degenerate fidelity" in out and "--validation" in out
    real = np.random.default_rng(2).normal(10, 1, (256, 8)).astype(np.float32)
    np.save(tmp_path / "real.npy", real)
    rc, out, err = hwb_cli("compile", str(path), "-t", "cpu.onnxruntime", "--validation",
                        str(tmp_path / "real.npy"), "--cache-dir", str(store_dir), "--json")
    assert rc == 0, err
    assert '"degenerate": false' in out


# -- item 6: advice that names the real cause and the fix ------------------------------------
def _no_advice_to_reexport(e: pytest.ExceptionInfo) -> None:
    assert "Is the file complete" not in str(e.value), str(e.value)


def test_torch_input_shape_mismatch_names_the_shape(tmp_path):
    import torch

    torch.save(torch.nn.Sequential(torch.nn.Linear(16, 2)), tmp_path / "net.pt")
    with pytest.raises(hwb.ModelError, match=r"does not run on a batch of shape \(1, 10\).*"
                       r"Linear, takes 16.*input-shape") as e:
        hwb.load_model(tmp_path / "net.pt", trust_pickle=True, input_shape=(10,))
    _no_advice_to_reexport(e)


def _module(tmp: Path, name: str, code: str) -> None:
    (tmp / f"{name}.py").write_text(code)


def test_pickle_of_a_class_from_a_local_module_says_pythonpath(tmp_path, monkeypatch):
    import importlib
    import sys

    import torch

    _module(tmp_path, "hwbt_net", "import torch\nclass Net(torch.nn.Sequential):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("hwbt_net")
    torch.save(mod.Net(torch.nn.Linear(16, 2)), tmp_path / "net.pt")
    monkeypatch.delitem(sys.modules, "hwbt_net")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    with pytest.raises(hwb.ModelError, match=r"module 'hwbt_net'.*not importable.*PYTHONPATH") as e:
        hwb.load_model(tmp_path / "net.pt", trust_pickle=True, input_shape=(16,))
    _no_advice_to_reexport(e)
    monkeypatch.syspath_prepend(str(tmp_path))  # the fix
    assert hwb.load_model(tmp_path / "net.pt", trust_pickle=True, input_shape=(16,)).output.shape == (2,)


def test_pickle_of_a_class_from_the_training_script_says_so(tmp_path, monkeypatch):
    import sys

    import torch

    class Script(torch.nn.Sequential):
        pass

    Script.__module__, Script.__qualname__ = "__main__", "Script"
    monkeypatch.setattr(sys.modules["__main__"], "Script", Script, raising=False)
    torch.save(Script(torch.nn.Linear(16, 2)), tmp_path / "net.pt")
    monkeypatch.delattr(sys.modules["__main__"], "Script")
    with pytest.raises(hwb.ModelError, match=r"class Script that the training script defined "
                       r"in itself \(__main__\).*module.*PYTHONPATH.*torch\.export") as e:
        hwb.load_model(tmp_path / "net.pt", trust_pickle=True, input_shape=(16,))
    _no_advice_to_reexport(e)


def test_custom_keras_layer_not_importable_says_which_and_how(tmp_path, monkeypatch, store_dir,
                                                            hwb_cli):
    import importlib
    import sys

    import keras

    _module(tmp_path, "hwbt_layers", (
        "import keras\n\n@keras.saving.register_keras_serializable(package='hwbt_layers')\n"
        "class Twice(keras.layers.Layer):\n    def call(self, x):\n        return 2.0 * x\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("hwbt_layers")
    km = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d"), mod.Twice()])
    km.save(tmp_path / "custom.keras")
    # as in a fresh process: neither registered nor on the path
    monkeypatch.delitem(keras.saving.get_custom_objects(), "hwbt_layers>Twice")
    monkeypatch.delitem(sys.modules, "hwbt_layers")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    with pytest.raises(hwb.ModelError, match=r"Twice \(module hwbt_layers\).*not importable.*"
                       r"PYTHONPATH.*--import hwbt_layers") as e:
        hwb.load_model(tmp_path / "custom.keras")
    _no_advice_to_reexport(e)
    # the fix, on the command line; the compile worker imports the module too
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, out, err = hwb_cli("compile", str(tmp_path / "custom.keras"), "--import", "hwbt_layers",
                        "--cache-dir", str(store_dir))
    assert rc == 0, err


def test_quantized_keras2_layer_names_its_package(tmp_path):
    import json

    from legacy_models import keras2_json

    cfg = keras2_json()
    cfg["config"]["layers"][0]["class_name"] = "QDense"
    (tmp_path / "q.json").write_text(json.dumps(cfg))
    (tmp_path / "q_weights.h5").write_bytes(b"")
    with pytest.raises(hwb.ModelError, match=r"QDense.*QKeras.*pip install qkeras") as e:
        hwb.load_model(tmp_path / "q.json")
    _no_advice_to_reexport(e)


@pytest.fixture(scope="module")
def jet(tmp_path_factory) -> tuple[Path, list[np.ndarray]]:
    from legacy_models import write_keras2_pair

    js, _, ws = write_keras2_pair(tmp_path_factory.mktemp("jet"))
    return js, ws


def test_missing_weights_file_is_called_missing(jet, hwb_cli):
    rc, _, err = hwb_cli("compile", str(jet[0]), "--weights", str(jet[0].parent / "nope.h5"))
    assert rc == 1
    assert "weights file not found" in err and "nope.h5" in err and "do not fit" not in err


def test_keras3_weights_under_another_name_load(jet, tmp_path):
    import keras

    km = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
                           keras.layers.Dense(5, activation="softmax")])
    km.set_weights(jet[1])
    km.save_weights(tmp_path / "w.weights.h5")
    (tmp_path / "w.weights.h5").rename(tmp_path / "params.h5")  # Keras reads it by its name
    m = hwb.load_model(jet[0], weights=tmp_path / "params.h5")
    np.testing.assert_allclose(m.reference(X16), numpy_mlp(X16, jet[1]), atol=1e-6)


def test_keras21_list_style_sequential_loads(jet, tmp_path):
    import json
    import shutil

    from legacy_models import keras2_json

    cfg = keras2_json()
    cfg["config"] = cfg["config"]["layers"]  # Keras ≤ 2.1: the bare list of layers
    (tmp_path / "old.json").write_text(json.dumps(cfg))
    shutil.copy(jet[0].parent / "jet_weights.h5", tmp_path / "old_weights.h5")
    m = hwb.load_model(tmp_path / "old.json")
    np.testing.assert_allclose(m.reference(X16), numpy_mlp(X16, jet[1]), atol=1e-6)


def test_npz_to_a_one_input_model(jet, tmp_path, store_dir, hwb_cli):
    np.savez(tmp_path / "one.npz", features=X16)
    rc, out, err = hwb_cli("predict", str(jet[0]), "-i", str(tmp_path / "one.npz"),
                        "--cache-dir", str(store_dir), "--json")
    assert rc == 0, err
    np.savez(tmp_path / "two.npz", a=X16, b=X16)
    rc, _, err = hwb_cli("predict", str(jet[0]), "-i", str(tmp_path / "two.npz"),
                      "--cache-dir", str(store_dir))
    assert rc == 1 and "holding 2 arrays (a, b)" in err and ".npy" in err and "dtype object" not in err
    cm = hwb.compile(jet[0], store=store_dir)
    with pytest.raises(hwb.InputError, match="is a dict.*one input"):
        cm.predict({"a": X16})


def test_fixed_point_precision_out_of_range_says_which_are_taken(store_dir, zoo_model):
    from hwbackends.errors import UnsupportedError

    _need("fpga.da4ml")
    with pytest.raises(UnsupportedError, match=r"auto and any fixed<W,I>.*W ≤ 32.*'fixed<40,8>'"):
        hwb.compile(zoo_model("mlp"), "fpga.da4ml", "fixed<40,8>", store=store_dir)
