"""The model-loading options of the ``hwb`` commands (``--trust-pickle``, ``--weights``,
``--input-shape``) with real legacy files: a whole-module ``torch.save`` pickle and a Keras 2
JSON architecture whose HDF5 weights are not where the loader looks by itself."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from legacy_models import numpy_mlp, write_keras2_pair

from hwbackends.cli import build_parser
from hwbackends.cli.source import model_from_args, parse_shapes
from hwbackends.context import RunContext
from hwbackends.errors import ConfigError

X = np.random.default_rng(9).standard_normal((5, 16)).astype(np.float32)



@pytest.fixture(scope="module")
def pickle_file(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """``torch.save(module)``: the legacy whole-module pickle, and torch's output on X."""
    import torch

    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    path = tmp_path_factory.mktemp("pickle") / "net.pt"
    torch.save(net, path)
    with torch.no_grad():
        return path, net(torch.from_numpy(X)).numpy()


@pytest.fixture(scope="module")
def keras2(tmp_path_factory) -> tuple[Path, Path, list[np.ndarray]]:
    # "params.h5" is none of the names looked for next to jet.json: only --weights finds it
    return write_keras2_pair(tmp_path_factory.mktemp("keras2"), "jet", "params.h5")


def test_pickle_is_refused_without_the_flag_and_says_which(pickle_file, store_dir, hwb_cli):
    path, _ = pickle_file
    rc, _, err = hwb_cli("compile", str(path), "-t", "ref", "--cache-dir", str(store_dir))
    assert rc == 1
    assert "ModelError" in err and "runs code" in err
    assert "--trust-pickle" in err and "trust_pickle=True" in err


def test_trusted_pickle_compiles_and_predicts(pickle_file, store_dir, tmp_path, hwb_cli):
    path, want = pickle_file
    flags = ["--trust-pickle", "--input-shape", "16", "--cache-dir", str(store_dir)]
    rc, out, err = hwb_cli("compile", str(path), "-t", "cpu.onnxruntime", "--json", *flags)
    assert rc == 0, err
    d = json.loads(out)
    assert d["variant"] == "cpu.onnxruntime:fp32" and d["fidelity"]["corr"] > 0.99999
    np.save(tmp_path / "x.npy", X)
    rc, _, err = hwb_cli("predict", str(path), "-t", "ref", "-i", str(tmp_path / "x.npy"),
                      "--output", str(tmp_path / "y.npy"), *flags)
    assert rc == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, atol=1e-6)


def test_trusted_pickle_without_a_shape_asks_for_input_shape(pickle_file, store_dir, hwb_cli):
    rc, _, err = hwb_cli("compile", str(pickle_file[0]), "-t", "ref", "--trust-pickle",
                      "--cache-dir", str(store_dir))
    assert rc == 1 and "--input-shape" in err


def test_keras2_json_needs_and_takes_weights(keras2, store_dir, hwb_cli):
    js, weights, ws = keras2
    rc, _, err = hwb_cli("compile", str(js), "-t", "ref", "--cache-dir", str(store_dir))
    assert rc == 1 and "without weights" in err and "--weights" in err
    rc, out, err = hwb_cli("compile", str(js), "-t", "cpu.onnxruntime", "--weights",
                        str(weights), "--json", "--cache-dir", str(store_dir))
    assert rc == 0, err
    assert json.loads(out)["fidelity"]["corr"] > 0.99999
    args = build_parser().parse_args(["predict", str(js), "-i", "x.npy", "--weights", str(weights)])
    m = model_from_args(args)  # what every command hands on: the model loaded with the weights
    np.testing.assert_allclose(m.reference(X), numpy_mlp(X, ws), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("command", ["compile", "predict", "bench", "fleet", "serve", "fpga-trace"])
def test_every_model_command_takes_the_loading_options(command, keras2):
    extra = {"predict": ["-i", "x.npy"], "fleet": ["--fleet", "local"]}.get(command, [])
    args = build_parser().parse_args([command, "m.pt", *extra, "--trust-pickle", "--weights", "w.h5",
                                      "--input-shape", "16", "--input-shape", "4,2"])
    assert args.trust_pickle and args.weights == "w.h5" and args.input_shape == ["16", "4,2"]
    help_text = build_parser()._subparsers._group_actions[0].choices[command].format_help()
    assert "Unpickling runs code" in help_text


def test_without_options_the_model_argument_is_handed_on_as_given():
    args = argparse.Namespace(model="zoo:signal", trust_pickle=False, weights=None, input_shape=None)
    assert model_from_args(args) == "zoo:signal"


def test_input_shapes_parse_and_bad_ones_are_refused():
    assert parse_shapes(["16"]) == (16,)
    assert parse_shapes(["16", "32,8"]) == [(16,), (32, 8)]
    assert parse_shapes(None) is None
    for bad in ("", "a,b", "0", "-3"):
        with pytest.raises(ConfigError, match="positive integers"):
            parse_shapes([bad])


def test_fleet_ships_a_self_contained_copy(pickle_file, keras2, tmp_path):
    """hwb fleet sends the model file to other machines: a model that needs a loading option
    is re-saved here as one file the nodes load without it (no unpickling, no weights file)."""
    import hwbackends as hwb
    from hwbackends.cli.source import portable_model_file

    parser = build_parser()
    plain = parser.parse_args(["fleet", "zoo:signal", "--fleet", "local"])
    assert portable_model_file(plain, tmp_path) == "zoo:signal"
    args = parser.parse_args(["fleet", str(pickle_file[0]), "--fleet", "local", "--trust-pickle",
                              "--input-shape", "16"])
    shipped = Path(portable_model_file(args, tmp_path / "p"))
    assert shipped.suffix == ".pt2" and shipped.parent == tmp_path / "p"
    np.testing.assert_allclose(hwb.load_model(shipped).reference(X), pickle_file[1], atol=1e-6)
    js, weights, ws = keras2
    args = parser.parse_args(["fleet", str(js), "--fleet", "local", "--weights", str(weights)])
    shipped = Path(portable_model_file(args, tmp_path / "k"))
    assert shipped.name == "jet.keras"
    np.testing.assert_allclose(hwb.load_model(shipped).reference(X), numpy_mlp(X, ws),
                               rtol=1e-5, atol=1e-6)


def test_strategies_toml_takes_the_loading_options(keras2, store_dir, tmp_path):
    from hwbackends.errors import ConfigError
    from hwbackends.router import Router

    js, weights, ws = keras2
    cfg = tmp_path / "s.toml"
    body = ('[tiers.t]\np99_us = 100000\n[router]\nisolate_compile = false\n'
            '[router.bench]\nn = 100\nwarmup = 10\n'
            f'[strategies.jet]\nmodel = "{js}"\ntier = "t"\ntargets = ["cpu.onnxruntime"]\n'
            'precisions = ["fp32"]\n')
    cfg.write_text(body + f'weights = "{weights}"\n')
    r = Router.from_config(cfg, context=RunContext.at(store_dir))
    try:
        np.testing.assert_allclose(r.predict("jet", X), numpy_mlp(X, ws), rtol=1e-4, atol=1e-5)
    finally:
        r.close()
    cfg.write_text(body + 'weights = "missing.h5"\n')
    with pytest.raises(ConfigError, match="weights file .*missing.h5 does not exist"):
        Router.from_config(cfg, context=RunContext.at(store_dir))
