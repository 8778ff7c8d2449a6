"""Keras and torch models as users have them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from legacy_models import numpy_mlp, write_keras2_pair

import hwbackends as hwb

X16 = np.random.default_rng(5).standard_normal((6, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def keras2_pair(tmp_path_factory) -> tuple[Path, Path, list[np.ndarray]]:
    """NAME.json + NAME_weights.h5 in Keras 2's HDF5 weights layout."""
    return write_keras2_pair(tmp_path_factory.mktemp("keras2"))


def test_keras2_json_and_h5_weights_load(keras2_pair):
    js, _, ws = keras2_pair
    m = hwb.load_model(js)  # the weights are found next to it
    assert m.format == "keras" and m.input.shape == (16,) and m.output.shape == (5,)
    np.testing.assert_allclose(m.reference(X16), numpy_mlp(X16, ws), rtol=1e-5, atol=1e-6)


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
