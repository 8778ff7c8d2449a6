"""A Keras file's cost is taken from what it declares, before Keras builds the model.

The hostile files are written here by hand: a ``.keras`` zip whose ``config.json`` declares a
``Dense(40000)`` over a 40000-wide input (1.6e9 parameters, 6.0 GiB of float32 weights; the
default limit is 4 GiB) and no weights at all, so nothing about the file's size gives it away;
the same as a Keras 2 functional JSON and as a Keras 3 functional config. ``hwb compile`` must
refuse each in ≤ 3 s under 500 MB of RSS, naming the figure and the limit. A real small Keras
model's declared cost agrees with the built model's (:func:`hwbackends.cost.keras_cost`)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from hwbackends import cost

WIDE = 40_000


def sequential(width: int = WIDE, units: int = WIDE) -> dict:
    return {"module": "keras", "class_name": "Sequential", "config": {"name": "wide", "layers": [
        {"module": "keras.layers", "class_name": "InputLayer",
         "config": {"batch_shape": [None, width], "dtype": "float32", "name": "input_layer"}},
        {"module": "keras.layers", "class_name": "Dense",
         "config": {"name": "dense", "units": units, "activation": "linear", "use_bias": True}}]},
        "build_config": {"input_shape": [None, width]}}


def functional3(width: int = WIDE) -> dict:
    """Keras 3 functional: the inbound tensor carries its shape; no build_config."""
    tensor = {"class_name": "__keras_tensor__", "config": {
        "shape": [None, width], "dtype": "float32", "keras_history": ["in", 0, 0]}}
    return {"module": "keras", "class_name": "Functional", "config": {"name": "f", "layers": [
        {"class_name": "InputLayer", "name": "in", "config": {"batch_shape": [None, width],
                                                              "name": "in"}, "inbound_nodes": []},
        {"class_name": "Dense", "name": "d", "config": {"name": "d", "units": width},
         "inbound_nodes": [{"args": [tensor], "kwargs": {}}]}],
        "input_layers": [["in", 0, 0]], "output_layers": [["d", 0, 0]]}}


def functional2(width: int = WIDE) -> dict:
    """Keras 2 JSON: inbound nodes name the layer; the shape comes from the InputLayer."""
    return {"class_name": "Model", "config": {"name": "f", "layers": [
        {"class_name": "InputLayer", "name": "in",
         "config": {"batch_input_shape": [None, width], "name": "in"}, "inbound_nodes": []},
        {"class_name": "Dense", "name": "d", "config": {"name": "d", "units": width},
         "inbound_nodes": [[["in", 0, 0, {}]]]}],
        "input_layers": [["in", 0, 0]], "output_layers": [["d", 0, 0]]}, "keras_version": "2.15.0"}


def keras_zip(path: Path, cfg: dict) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("metadata.json", json.dumps({"keras_version": "3.13.0"}))
        z.writestr("config.json", json.dumps(cfg))
    return path


def hwb_peak(*argv: str) -> tuple[int, str, float, float]:
    """``hwb ARGV`` in a fresh process: (exit code, stderr, seconds, peak RSS in MB)."""
    # VmHWM: this process's own peak (ru_maxrss would carry the forking parent's across exec)
    code = ("import sys\nfrom hwbackends.cli import main\nrc = main(sys.argv[1:])\n"
            "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0]\n"
            "sys.stderr.write('\\nPEAK %d\\n' % int(hwm.split()[1]))\nsys.exit(rc)")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       timeout=120)
    took = time.monotonic() - t0
    peak = int(r.stderr.rsplit("PEAK ", 1)[1].split()[0]) / 1024
    return r.returncode, r.stderr.rsplit("\nPEAK", 1)[0], took, peak


@pytest.mark.parametrize("form", ["keras-sequential", "keras-functional", "keras2-json", "keras2-h5"])
def test_a_declared_6gb_keras_model_is_refused_fast_and_small(form, tmp_path: Path):
    if form == "keras-sequential":
        f = keras_zip(tmp_path / "wide.keras", sequential())
    elif form == "keras-functional":
        f = keras_zip(tmp_path / "wide.keras", functional3())
    elif form == "keras2-json":
        f = tmp_path / "wide.json"
        f.write_text(json.dumps(functional2()))
    else:  # a Keras 2 HDF5 model: the architecture in the model_config attribute
        h5py = pytest.importorskip("h5py")
        f = tmp_path / "wide.h5"
        with h5py.File(f, "w") as h:
            h.attrs["model_config"] = json.dumps(functional2())
            h.attrs["keras_version"] = "2.15.0"
            h.create_group("model_weights")
    rc, err, took, peak = hwb_peak("compile", str(f), "-t", "ref")
    assert rc == 1, err
    assert "CostError" in err and "6.0 GiB of weight bytes" in err and "limit of 4.0 GiB" in err, err
    assert "Traceback" not in err and len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
    assert took <= 3.0, f"refused after {took:.1f} s"
    assert peak < 500, f"peak RSS {peak:.0f} MB"


def test_the_declared_cost_is_the_arithmetic_of_the_declaration():
    c = cost.keras_config_cost(sequential())
    assert c.params == WIDE * WIDE + WIDE and c.weight_bytes == 4 * c.params
    assert c.macs == WIDE * WIDE and c.activation_bytes == 4 * (WIDE + WIDE)  # input + output
    assert cost.keras_config_cost(functional3()).params == c.params
    assert cost.keras_config_cost(functional2()).params == c.params
    huge = sequential(units=10 ** 30)  # a number past any int64 is capped, not trusted
    with pytest.raises(cost.CostError, match="over the limit"):
        cost.Limits().check(cost.keras_config_cost(huge), "huge")


@pytest.mark.parametrize("bad", [{"config": "x"}, {"config": {"layers": [1, None, "x"]}},
                                 {"config": {"layers": [{"class_name": "Dense", "config": {
                                     "units": -5, "batch_shape": [None, "a"]}}]}}])
def test_a_malformed_declaration_counts_nothing_and_never_raises(bad):
    c = cost.keras_config_cost(bad)
    assert c.params == 0


def test_a_real_keras_model_declares_what_it_builds(tmp_path: Path):
    keras = pytest.importorskip("keras")
    x = keras.Input((6, 3))
    h = keras.layers.LSTM(8, return_sequences=True)(x)
    h = keras.layers.GRU(5)(h)
    h = keras.layers.Dense(4, activation="relu")(h)
    km = keras.Model(x, keras.layers.Dense(1)(h))
    km.save(tmp_path / "m.keras")
    declared = cost.keras_config_cost(cost.keras_declared_config(tmp_path / "m.keras"))
    assert declared.params == km.count_params() == cost.keras_cost(km).params
    assert not declared.notes

