"""Keras and torch models as users have them (issue 14, item 3)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import hwbackends as hwb

X16 = np.random.default_rng(5).standard_normal((6, 16)).astype(np.float32)


def _numpy_mlp(x: np.ndarray, w: list[np.ndarray]) -> np.ndarray:
    h = np.maximum(x @ w[0] + w[1], 0)
    z = h @ w[2] + w[3]
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _keras2_json() -> dict:
    """A Keras 2.x ``model.to_json()`` as in hls4ml's example-models (batch_input_shape on
    the first layer, Keras 2 initializer configs)."""
    init = {"class_name": "VarianceScaling",
            "config": {"scale": 1.0, "mode": "fan_avg", "distribution": "uniform", "seed": None}}
    dense = {"trainable": True, "dtype": "float32", "use_bias": True, "kernel_initializer": init,
             "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": None,
             "bias_regularizer": None, "activity_regularizer": None, "kernel_constraint": None,
             "bias_constraint": None}
    return {"class_name": "Sequential", "keras_version": "2.2.4", "backend": "tensorflow",
            "config": {"name": "sequential_1", "layers": [
                {"class_name": "Dense", "config": dict(dense, name="fc1", units=8, activation="relu",
                                                       batch_input_shape=[None, 16])},
                {"class_name": "Dense", "config": dict(dense, name="output", units=5,
                                                       activation="softmax")}]}}


@pytest.fixture(scope="module")
def keras2_pair(tmp_path_factory) -> tuple[Path, Path, list[np.ndarray]]:
    """NAME.json + NAME_weights.h5 in Keras 2's HDF5 weights layout."""
    import h5py
    import keras
    from keras.src.legacy.saving import legacy_h5_format

    d = tmp_path_factory.mktemp("keras2")
    km = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu", name="fc1"),
                           keras.layers.Dense(5, activation="softmax", name="output")])
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in km.get_weights()]
    km.set_weights(ws)
    (d / "jet.json").write_text(json.dumps(_keras2_json()))
    with h5py.File(d / "jet_weights.h5", "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, km)
    return d / "jet.json", d / "jet_weights.h5", ws


def test_keras2_json_and_h5_weights_load(keras2_pair):
    js, _, ws = keras2_pair
    m = hwb.load_model(js)  # the weights are found next to it
    assert m.format == "keras" and m.input.shape == (16,) and m.output.shape == (5,)
    np.testing.assert_allclose(m.reference(X16), _numpy_mlp(X16, ws), rtol=1e-5, atol=1e-6)


def test_keras2_json_without_weights_names_the_files_it_looked_for(keras2_pair, tmp_path):
    lone = tmp_path / "lone.json"
    lone.write_text(keras2_pair[0].read_text())
    with pytest.raises(hwb.ModelError, match="without weights.*lone_weights.h5.*weights="):
        hwb.load_model(lone)


def test_weights_only_h5_is_named_as_such(keras2_pair):
    with pytest.raises(hwb.ModelError, match="weights-only HDF5.*no architecture.*load_weights"):
        hwb.load_model(keras2_pair[1])


def test_unbuilt_sequential_needs_and_takes_input_shape():
    import keras

    km = keras.Sequential([keras.layers.Dense(4, name="d")])
    with pytest.raises(hwb.ModelError, match="not built.*input_shape="):
        hwb.load_model(km)
    m = hwb.load_model(km, input_shape=(16,))
    assert m.input.shape == (16,) and m.output.shape == (4,)
    assert m.reference(X16).shape == (6, 4)


def test_input_shape_contradicting_the_model_is_refused(keras2_pair):
    with pytest.raises(hwb.ModelError, match=r"input_shape=\(8,\).*takes samples of shape \(16,\)"):
        hwb.load_model(keras2_pair[0], input_shape=(8,))


def test_whole_module_torch_pickle_loads_only_when_trusted(tmp_path):
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    torch.save(net, tmp_path / "net.pt")
    with pytest.raises(hwb.ModelError, match="pickle of a whole module.*runs code.*trust_pickle=True") as e:
        hwb.load_model(tmp_path / "net.pt", input_shape=(16,))
    assert "corrupt" not in str(e.value) and "complete" not in str(e.value)
    m = hwb.load_model(tmp_path / "net.pt", input_shape=(16,), trust_pickle=True)
    with torch.no_grad():
        want = net(torch.from_numpy(X16)).numpy()
    np.testing.assert_allclose(m.reference(X16), want, rtol=1e-6)
    torch.save(net.state_dict(), tmp_path / "sd.pt")
    with pytest.raises(hwb.ModelError, match="state dict.*load_state_dict"):
        hwb.load_model(tmp_path / "sd.pt", input_shape=(16,), trust_pickle=True)
