"""Keras models (``Sequential`` or a functional chain) as IR layers."""
from __future__ import annotations

from typing import Any

import numpy as np

from hwbackends.errors import UnsupportedError

from .. import batchnorm
from .ir import (
    ACTIVATIONS,
    SUPPORTED,
    Act,
    Affine,
    Conv1D,
    Dense,
    Flatten,
    GlobalPool1D,
    Layer,
    Pool1D,
    Recurrent,
    f32,
    first,
)

_KERAS_SKIP = {"InputLayer", "Dropout", "GaussianNoise", "GaussianDropout", "ActivityRegularization",
               "SpatialDropout1D", "AlphaDropout"}


def _refuse(target: str, layer: Any, why: str = "") -> UnsupportedError:
    cls = type(layer).__name__
    why = f": {why}" if why else ""
    return UnsupportedError(f"{target} cannot compile layer {layer.name!r} ({cls}){why}. "
                            f"Supported: {SUPPORTED}")


def _keras_act(target: str, layer: Any, fn: Any) -> Act:
    name = getattr(fn, "__name__", str(fn))
    name = {"None": "linear", "leaky_relu": "leaky_relu"}.get(name, name)
    if name not in ACTIVATIONS:
        raise _refuse(target, layer, f"activation {name!r}")
    # keras.activations.leaky_relu's default slope (Keras 3)
    return Act(f"{layer.name}_act", name, 0.2 if name == "leaky_relu" else 0.0)


def _chain(km: Any, target: str) -> list[Any]:
    """The layers of a Sequential, or of a functional model that is a plain chain."""
    import keras

    layers = [layer for layer in km.layers if type(layer).__name__ != "InputLayer"]
    if isinstance(km, keras.Sequential):
        return layers
    prev = km.inputs[0]
    for layer in layers:
        if layer.input is not prev:
            raise _refuse(target, layer, "the functional graph branches or merges here; only "
                                         "chains of layers are compiled")
        prev = layer.output
    return layers


def read_keras(km: Any, target: str) -> list[Layer]:
    out: list[Layer] = []
    for layer in _chain(km, target):
        cls = type(layer).__name__
        if cls in _KERAS_SKIP:
            continue
        conv = _KERAS.get(cls)
        if conv is None:
            raise _refuse(target, layer)
        out += conv(target, layer, layer.get_config(), layer.get_weights())
    return out


def _k_dense(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    b = ws[1] if cfg.get("use_bias", True) else np.zeros(ws[0].shape[1])
    return [Dense(layer.name, f32(ws[0]), f32(b)), _keras_act(target, layer, layer.activation)]


def _k_relu(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    if cfg.get("max_value") is not None or cfg.get("threshold", 0.0):
        raise _refuse(target, layer, "max_value/threshold")
    slope = float(cfg.get("negative_slope", 0.0))
    return [Act(layer.name, "leaky_relu" if slope else "relu", slope)]


def _k_softmax(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    if cfg.get("axis", -1) not in (-1, [-1]):
        raise _refuse(target, layer, f"softmax over axis {cfg.get('axis')}")
    return [Act(layer.name, "softmax")]


def _k_batchnorm(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    axis, last = cfg.get("axis", -1), len(layer.input.shape) - 1
    if axis not in (-1, [-1], last, [last]):
        raise _refuse(target, layer, f"normalizes axis {axis}, not the channels")
    scale, shift = batchnorm.keras_affine(layer)  # float64: _fold/_cast round them per dtype
    return [Affine(layer.name, np.asarray(scale, np.float64), np.asarray(shift, np.float64))]


def _k_conv1d(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    if cfg.get("data_format", "channels_last") != "channels_last" or cfg.get("groups", 1) != 1:
        raise _refuse(target, layer, "channels_first or grouped convolution")
    k, d, s = cfg["kernel_size"][0], cfg["dilation_rate"][0], cfg["strides"][0]
    span = (k - 1) * d
    pad = {"valid": (0, 0), "causal": (span, 0)}.get(cfg["padding"])
    if cfg["padding"] == "same":
        if s != 1:
            raise _refuse(target, layer, "padding 'same' with strides > 1")
        pad = (span // 2, span - span // 2)
    b = ws[1] if cfg.get("use_bias", True) else np.zeros(ws[0].shape[2])
    return [Conv1D(layer.name, f32(ws[0]), f32(b), s, d, pad),
            _keras_act(target, layer, layer.activation)]



def _k_pool(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    if cfg.get("padding", "valid") != "valid" or cfg.get("data_format", "channels_last") != "channels_last":
        raise _refuse(target, layer, "padding 'same' or channels_first")
    size = first(cfg["pool_size"])
    stride = first(cfg.get("strides") or size)
    kind = "max" if type(layer).__name__.startswith("Max") else "avg"
    return [Pool1D(layer.name, kind, size, stride)]


def _k_global_pool(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    if cfg.get("keepdims") or cfg.get("data_format", "channels_last") != "channels_last":
        raise _refuse(target, layer, "keepdims or channels_first")
    return [GlobalPool1D(layer.name, "avg" if "Average" in type(layer).__name__ else "max")]


def _keras_recurrent(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    cls = type(layer).__name__
    if (cfg.get("activation") != "tanh" or cfg.get("recurrent_activation") != "sigmoid"):
        raise _refuse(target, layer, f"activation {cfg.get('activation')!r}/recurrent_activation "
                                     f"{cfg.get('recurrent_activation')!r} (tanh/sigmoid only)")
    for flag in ("go_backwards", "stateful", "return_state"):
        if cfg.get(flag):
            raise _refuse(target, layer, f"{flag}=True")
    units, gates = int(cfg["units"]), 4 if cls == "LSTM" else 3
    reset_after = bool(cfg.get("reset_after", False)) if cls == "GRU" else False
    if cfg.get("use_bias", True):
        bias = ws[2]
    else:
        bias = np.zeros((2, gates * units) if reset_after else gates * units)
    return [Recurrent(layer.name, cls.lower(), f32(ws[0]), f32(ws[1]), f32(bias), units,
                      bool(cfg.get("return_sequences")), reset_after)]


#: Keras layer class → its IR layers.
_KERAS = {
    "Dense": _k_dense, "ReLU": _k_relu, "Softmax": _k_softmax, "BatchNormalization": _k_batchnorm,
    "Conv1D": _k_conv1d, "MaxPooling1D": _k_pool, "AveragePooling1D": _k_pool,
    "GlobalAveragePooling1D": _k_global_pool, "GlobalMaxPooling1D": _k_global_pool,
    "LSTM": _keras_recurrent, "GRU": _keras_recurrent,
    "Activation": lambda t, layer, cfg, ws: [_keras_act(t, layer, layer.activation)],
    "LeakyReLU": lambda t, layer, cfg, ws: [Act(layer.name, "leaky_relu",
                                               float(cfg.get("negative_slope", cfg.get("alpha", 0.3))))],
    "Flatten": lambda t, layer, cfg, ws: [Flatten(layer.name)],
}
