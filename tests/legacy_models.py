"""Model files as older toolchains wrote them (shared by the loading and CLI tests): a Keras
2.x ``model.to_json()`` architecture with its HDF5 weights, and its NumPy forward pass."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def numpy_mlp(x: np.ndarray, w: list[np.ndarray]) -> np.ndarray:
    """The 16 → 8 relu → 5 softmax network of :func:`keras2_json` in NumPy."""
    h = np.maximum(x @ w[0] + w[1], 0)
    z = h @ w[2] + w[3]
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def keras2_json() -> dict:
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


def write_keras2_pair(d: Path, stem: str = "jet",
                      weights_name: str = "{stem}_weights.h5") -> tuple[Path, Path, list[np.ndarray]]:
    """``d/STEM.json`` + the weights in Keras 2's HDF5 layout (named ``weights_name``); returns
    both paths and the weights."""
    import h5py
    import keras
    from keras.src.legacy.saving import legacy_h5_format

    km = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu", name="fc1"),
                           keras.layers.Dense(5, activation="softmax", name="output")])
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in km.get_weights()]
    km.set_weights(ws)
    (d / f"{stem}.json").write_text(json.dumps(keras2_json()))
    weights = d / weights_name.format(stem=stem)
    with h5py.File(weights, "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, km)
    return d / f"{stem}.json", weights, ws


def keras2_functional_json() -> dict:
    """A Keras 2.x functional ``model.to_json()`` as hls4ml's ``KERAS_1layer.json``:
    ``class_name`` ``Model``, an explicit ``InputLayer`` and ``input_layers`` /
    ``output_layers`` as lists of ``[name, node, tensor]`` (Keras 3 rebuilds ``model.input``
    as a *list* of one tensor from it)."""
    seq = keras2_json()["config"]["layers"]
    fc1, out = (dict(layer, name=layer["config"]["name"]) for layer in seq)
    fc1["config"] = {k: v for k, v in fc1["config"].items() if k != "batch_input_shape"}
    inp = {"name": "input_1", "class_name": "InputLayer", "inbound_nodes": [],
           "config": {"batch_input_shape": [None, 16], "dtype": "float32", "sparse": False,
                      "name": "input_1"}}
    fc1["inbound_nodes"] = [[["input_1", 0, 0, {}]]]
    out["inbound_nodes"] = [[["fc1", 0, 0, {}]]]
    return {"class_name": "Model", "keras_version": "2.1.2", "backend": "tensorflow",
            "config": {"name": "model_1", "layers": [inp, fc1, out],
                       "input_layers": [["input_1", 0, 0]],
                       "output_layers": [["output", 0, 0]]}}


def write_keras2_functional(d: Path, stem: str = "KERAS_1layer") -> tuple[Path, list[np.ndarray]]:
    """``d/STEM.json`` (:func:`keras2_functional_json`) + ``d/STEM_weights.h5`` (the name
    hls4ml's example-models use, found by the loader); returns the JSON path and the weights."""
    _, _, ws = write_keras2_pair(d, stem)
    (d / f"{stem}.json").write_text(json.dumps(keras2_functional_json()))
    return d / f"{stem}.json", ws
