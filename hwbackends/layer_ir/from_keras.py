"""Keras models (``Sequential`` or a functional chain) as IR layers."""
from __future__ import annotations

from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

from . import batchnorm
from .ir import (
    ACTIVATIONS,
    SUPPORTED,
    Act,
    Affine,
    Attention,
    Bidirectional,
    Conv1D,
    Conv2D,
    Dense,
    Flatten,
    GlobalPool1D,
    Layer,
    LayerNorm,
    Pad1D,
    Pad2D,
    Pool1D,
    Pool2D,
    Recurrent,
    Reshape,
    TimeSlice,
    f32,
    first,
    ungroup,
)
from .walk import Chains

_KERAS_SKIP = {"InputLayer", "Dropout", "GaussianNoise", "GaussianDropout", "ActivityRegularization",
               "SpatialDropout1D", "SpatialDropout2D", "AlphaDropout"}


def _refuse(target: str, layer: Any, why: str = "") -> UnsupportedError:
    cls = type(layer).__name__
    why = f": {why}" if why else ""
    return UnsupportedError(f"{target} cannot compile layer {layer.name!r} ({cls}){why}. "
                            f"Supported: {SUPPORTED}")


#: Keras 3 activation functions that are an IR kind with parameters: name → (kind, alpha,
#: beta). keras.activations.leaky_relu's default slope is 0.2; selu is an ELU scaled;
#: hard_sigmoid is relu6(x + 3) / 6.
_KERAS_ACTS = {
    "leaky_relu": ("leaky_relu", 0.2, 0.0), "elu": ("elu", 1.0, 1.0),
    "selu": ("elu", 1.67326324, 1.05070098), "softplus": ("softplus", 1.0, float("inf")),
    "exponential": ("exp", 0.0, 0.0), "relu6": ("clip", 0.0, 6.0),
    "hard_sigmoid": ("hard_sigmoid", 1.0 / 6.0, 0.5),
}
#: IR kinds Keras names alike and that take no parameters
_KERAS_PLAIN = ("linear", "relu", "tanh", "sigmoid", "softmax", "gelu", "log_softmax", "softsign")


def _keras_act(target: str, layer: Any, fn: Any) -> Act:
    name = getattr(fn, "__name__", str(fn))
    name = {"None": "linear"}.get(name, name)
    if name in _KERAS_ACTS:
        kind, a, b = _KERAS_ACTS[name]
        return Act(f"{layer.name}_act", kind, a, b)
    if name not in _KERAS_PLAIN or name not in ACTIVATIONS:
        raise _refuse(target, layer, f"activation {name!r}")
    return Act(f"{layer.name}_act", name)


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
    import keras

    if not isinstance(km, keras.Sequential):
        return _functional(km, target)
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


def _functional(km: Any, target: str) -> list[Layer]:
    """A functional model whose graph is a chain with residual adds (:class:`.walk.Chains`):
    ``Add`` of two tensors, ``Concatenate`` of branches from one tensor (an inception module),
    self-attention (query = value = key), ``x[:, i]`` slices of time."""
    if len(km.inputs) != 1 or len(km.outputs) != 1:
        raise UnsupportedError(f"{target} compiles Keras models with one input and one output")
    ch = Chains([[]], [tuple(int(d) for d in km.inputs[0].shape[1:])])
    ch.at[id(km.inputs[0])] = (0, 0)
    for op in km.operations:
        cls = type(op).__name__
        if cls == "InputLayer":
            continue
        nodes = [nd for nd in op._inbound_nodes if all(id(t) in ch.at or t is None for t in nd.input_tensors)]
        if len(nodes) != 1:
            raise _refuse(target, op, "a layer called more than once (shared weights)" if nodes else
                          "it reads a tensor the chain of layers and residual adds does not hold")
        ins = [id(t) for t in nodes[0].input_tensors]
        outs = nodes[0].output_tensors
        if len(outs) != 1:
            raise _refuse(target, op, "more than one output")
        if cls == "Add" and len(ins) == 2:
            why = ch.merge(ins[0], ins[1], op.name)
            if why:
                raise _refuse(target, op, f"a residual add only ({why})")
        elif cls == "Concatenate" and len(ins) >= 2:
            axis, rank = op.get_config().get("axis", -1), len(outs[0].shape)
            if axis not in (-1, rank - 1):
                raise _refuse(target, op, f"a concatenation on axis {axis} (the last axis, the "
                                          f"channels, only)")
            why = ch.concat(ins, op.name)
            if why:
                raise _refuse(target, op, f"a concatenation of branches from one tensor only ({why})")
        else:
            if cls == "MultiHeadAttention":
                _k_mha_mask(target, op, nodes[0])  # a mask tensor is refused by its name
            if len(set(ins)) != 1 or not ch.enter(ins[0]):
                raise _refuse(target, op, "the graph branches or merges here; chains with residual "
                                          "adds (Add) and self-attention are compiled")
            ch.chains[ch.cur] += _k_layer(target, op, nodes[0])
        ch.put(id(outs[0]))
    if not (ch.tip(id(km.outputs[0])) and ch.at[id(km.outputs[0])][0] == 0):
        raise UnsupportedError(f"{target}: the Keras output is not the end of the chain of layers")
    return ch.chains[0]


def _k_layer(target: str, op: Any, node: Any) -> list[Layer]:
    """The IR layers of one Keras layer or op (``x[:, i]`` is a GetItem op)."""
    cls = type(op).__name__
    if cls in _KERAS_SKIP:
        return []
    if cls == "GetItem":
        return _k_getitem(target, op, node)
    if cls == "MultiHeadAttention":
        layers = _k_attention(target, op, op.get_config(), op.get_weights())
        layers[0].causal = _k_mha_mask(target, op, node)  # type: ignore[attr-defined]
        return layers
    conv = _KERAS.get(cls)
    if conv is None or not hasattr(op, "get_config"):
        raise _refuse(target, op)
    return conv(target, op, op.get_config(), op.get_weights())


def _k_getitem(target: str, op: Any, node: Any) -> list[Layer]:
    """``x[:, i]`` / ``x[:, a:b]`` of a (batch, time, channels) tensor."""
    args = node.arguments.args
    x, key = args[0], args[1] if len(args) > 1 else None
    key = tuple(key) if isinstance(key, (tuple, list)) else (key,)
    steps = x.shape[1] if len(x.shape) == 3 else None
    if (steps is None or len(key) != 2 or key[0] != slice(None)
            or not isinstance(key[1], (int, slice))):
        raise _refuse(target, op, f"indexing {key} of a tensor of shape {tuple(x.shape)} (only "
                                  f"x[:, i] or x[:, a:b] of (batch, time, channels))")
    if isinstance(key[1], int):
        i = key[1] % steps
        return [TimeSlice(op.name, i, i + 1, False)]
    a, b, step = key[1].indices(steps)
    if step != 1 or b <= a:
        raise _refuse(target, op, f"a time slice {key[1]} (contiguous, non-empty slices only)")
    return [TimeSlice(op.name, a, b, True)]


def _k_pad(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    p = cfg["padding"]
    left, right = (p, p) if isinstance(p, int) else (int(p[0]), int(p[1]))
    return [Pad1D(layer.name, (left, right))]


def _k_crop(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    c = cfg["cropping"]
    a, b = (c, c) if isinstance(c, int) else (int(c[0]), int(c[1]))
    steps = int(layer.input.shape[1])
    if a + b >= steps:
        raise _refuse(target, layer, f"cropping {a}+{b} of {steps} steps leaves none")
    return [TimeSlice(layer.name, a, steps - b, True)]


def _k_layernorm(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    axis, last = cfg.get("axis", -1), len(layer.input.shape) - 1
    if axis not in (-1, [-1], last, [last]) or cfg.get("rms_scaling"):
        raise _refuse(target, layer, f"normalizes axis {axis} (or rms_scaling); the last axis only")
    c = int(layer.input.shape[-1])
    ws = list(ws)
    gamma = ws.pop(0) if cfg.get("scale", True) else np.ones(c)
    beta = ws.pop(0) if cfg.get("center", True) else np.zeros(c)
    return [LayerNorm(layer.name, f32(gamma), f32(beta), float(cfg.get("epsilon", 1e-3)))]


def _k_bidirectional(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    if cfg.get("merge_mode", "concat") != "concat":
        raise _refuse(target, layer, f"merge_mode {cfg.get('merge_mode')!r} (concat only)")
    sides = []
    for sub in (layer.forward_layer, layer.backward_layer):
        if type(sub).__name__ not in ("LSTM", "GRU"):
            raise _refuse(target, layer, f"a {type(sub).__name__} inside (LSTM/GRU only)")
        sub_cfg = {**sub.get_config(), "go_backwards": False}
        sides += _keras_recurrent(target, sub, sub_cfg, sub.get_weights())
    fw, bw = sides
    return [Bidirectional(layer.name, fw, bw)]  # type: ignore[arg-type]


def _k_mha_mask(target: str, op: Any, node: Any) -> bool:
    """How a MultiHeadAttention call masks: ``use_causal_mask=True`` is causal attention (the
    IR's ``causal``); an ``attention_mask`` tensor, or a Keras mask carried by the query or
    value (``Masking``, ``mask_zero``), is refused by name — the IR holds no other mask."""
    kw = dict(getattr(node.arguments, "kwargs", {}) or {})
    if kw.get("attention_mask") is not None:
        raise _refuse(target, op, "attention_mask (a mask tensor) is not compiled; causal "
                                  "attention written as use_causal_mask=True is")
    for t in node.input_tensors:
        if getattr(t, "_keras_mask", None) is not None:
            raise _refuse(target, op, "its input carries a Keras mask (Masking / mask_zero), "
                                      "which the attention would apply and this target "
                                      "does not compile")
    return bool(kw.get("use_causal_mask", False))


def _k_attention(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    """Keras MultiHeadAttention as self-attention: kernels (C, heads, d), biases (heads, d),
    the output kernel (heads, d, C_out); Keras scales the query by 1/sqrt(key_dim)."""
    heads, dk = int(cfg["num_heads"]), int(cfg["key_dim"])
    dv = int(cfg.get("value_dim") or dk)
    axes = cfg.get("attention_axes")
    if (dv != dk or cfg.get("use_gate") or cfg.get("output_shape") not in (None, ())
            or axes not in (None, (1,), [1]) or not cfg.get("use_bias", True)):
        raise _refuse(target, layer, "value_dim != key_dim, use_gate, output_shape, use_bias=False "
                                     "or attention over other axes than time")
    qk, qb, kk, kb, vk, vb, ok, ob = ws
    c = qk.shape[0]
    return [Attention(layer.name, f32(qk.reshape(c, heads * dk)), f32(qb.reshape(-1)),
                      f32(kk.reshape(c, heads * dk)), f32(kb.reshape(-1)),
                      f32(vk.reshape(c, heads * dk)), f32(vb.reshape(-1)),
                      f32(ok.reshape(heads * dk, -1)), f32(ob), heads)]


def _k_dense(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    b = ws[1] if cfg.get("use_bias", True) else np.zeros(ws[0].shape[1])
    return [Dense(layer.name, f32(ws[0]), f32(b)), _keras_act(target, layer, layer.activation)]


def _k_relu(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    slope = float(cfg.get("negative_slope", 0.0))
    if cfg.get("threshold", 0.0) or (cfg.get("max_value") is not None and slope):
        raise _refuse(target, layer, "threshold, or max_value with negative_slope")
    if cfg.get("max_value") is not None:  # ReLU(max_value=6): ReLU6
        return [Act(layer.name, "clip", 0.0, float(cfg["max_value"]))]
    return [Act(layer.name, "leaky_relu" if slope else "relu", slope)]


def _k_elu(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    return [Act(layer.name, "elu", float(cfg.get("alpha", 1.0)), 1.0)]


def _k_prelu(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    """Keras PReLU: one slope per element of a sample unless ``shared_axes``; compiled when
    they are one per channel (time shared) or one."""
    a = np.asarray(ws[0], np.float64)
    if a.ndim == 2:  # (time, channels): one per channel only if every step has the same
        if not np.all(a == a[:1]):
            raise _refuse(target, layer, "slopes that differ per time step (pass "
                                         "shared_axes=[1] for one slope per channel)")
        a = a[0]
    return [Act(layer.name, "prelu", slope=a.ravel() if a.size > 1 else a.reshape(1))]


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


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _same_pad(n: int, k: int, s: int, d: int) -> tuple[int, int]:
    """TensorFlow's ``'same'`` padding of one axis of ``n`` cells: ``ceil(n / s)`` outputs, the
    extra cell (an odd total) at the end."""
    total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
    return total // 2, total - total // 2


def _k_spatial(target: str, layer: Any, cfg: dict, size: tuple[int, int], stride: tuple[int, int],
               dilation: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The ``((top, bottom), (left, right))`` padding of a 2-D Keras layer ('valid'/'same')."""
    if cfg.get("data_format", "channels_last") != "channels_last":
        raise _refuse(target, layer, "data_format channels_first (Keras on CPU runs channels_last)")
    if cfg.get("padding", "valid") == "valid":
        return (0, 0), (0, 0)
    if cfg["padding"] != "same":
        raise _refuse(target, layer, f"padding {cfg['padding']!r}")
    h, w = (int(d) for d in layer.input.shape[1:3])
    return (_same_pad(h, size[0], stride[0], dilation[0]), _same_pad(w, size[1], stride[1], dilation[1]))


def _k_conv2d(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    """Conv2D (groups read as a block-diagonal kernel) and DepthwiseConv2D (kernel (kh, kw,
    c_in, multiplier): group per input channel)."""
    s, d = _pair(cfg["strides"]), _pair(cfg["dilation_rate"])
    k = ws[0]
    if type(layer).__name__ == "DepthwiseConv2D":
        ci, mult = k.shape[2], k.shape[3]
        k, groups = k.reshape(k.shape[0], k.shape[1], 1, ci * mult), ci
    else:
        groups = int(cfg.get("groups", 1))
    pad = _k_spatial(target, layer, cfg, k.shape[:2], s, d)
    b = ws[1] if cfg.get("use_bias", True) else np.zeros(k.shape[3])
    return [Conv2D(layer.name, f32(ungroup(k, groups)), f32(b), s, d, pad),
            _keras_act(target, layer, layer.activation)]


def _k_pool2d(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    size = _pair(cfg["pool_size"])
    stride = _pair(cfg.get("strides") or size)
    pad = _k_spatial(target, layer, cfg, size, stride, (1, 1))
    kind = "max" if type(layer).__name__.startswith("Max") else "avg"
    return [Pool2D(layer.name, kind, size, stride, (1, 1), pad, False)]


def _k_global_pool2d(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    """A global pooling over rows and columns: the cells read as a sequence, pooled over it."""
    if cfg.get("data_format", "channels_last") != "channels_last":
        raise _refuse(target, layer, "data_format channels_first")
    h, w, c = (int(d) for d in layer.input.shape[1:4])
    out: list[Layer] = [Reshape(f"{layer.name}_cells", (h * w, c)),
                        GlobalPool1D(layer.name, "avg" if "Average" in type(layer).__name__ else "max")]
    return out + ([Reshape(f"{layer.name}_keepdims", (1, 1, c))] if cfg.get("keepdims") else [])


def _k_pad2d(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    if cfg.get("data_format", "channels_last") != "channels_last":
        raise _refuse(target, layer, "data_format channels_first")
    p = cfg["padding"]
    # an int, (rows, cols) each symmetric, or ((top, bottom), (left, right))
    rows, cols = (_pair(p), _pair(p)) if isinstance(p, int) else (_pair(p[0]), _pair(p[1]))
    return [Pad2D(layer.name, (rows, cols))]


def _k_reshape(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    shape = tuple(int(d) for d in layer.output.shape[1:])
    return [Reshape(layer.name, shape)]


#: Keras layer class → its IR layers.
_KERAS = {
    "Dense": _k_dense, "ReLU": _k_relu, "Softmax": _k_softmax, "BatchNormalization": _k_batchnorm,
    "Conv1D": _k_conv1d, "MaxPooling1D": _k_pool, "AveragePooling1D": _k_pool,
    "GlobalAveragePooling1D": _k_global_pool, "GlobalMaxPooling1D": _k_global_pool,
    "LSTM": _keras_recurrent, "GRU": _keras_recurrent,
    "Activation": lambda t, layer, cfg, ws: [_keras_act(t, layer, layer.activation)],
    "ELU": _k_elu, "PReLU": _k_prelu,
    "LeakyReLU": lambda t, layer, cfg, ws: [Act(layer.name, "leaky_relu",
                                               float(cfg.get("negative_slope", cfg.get("alpha", 0.3))))],
    "Flatten": lambda t, layer, cfg, ws: [Flatten(layer.name)],
    "ZeroPadding1D": _k_pad, "Cropping1D": _k_crop, "LayerNormalization": _k_layernorm,
    "Bidirectional": _k_bidirectional, "MultiHeadAttention": _k_attention,
    "Conv2D": _k_conv2d, "DepthwiseConv2D": _k_conv2d, "MaxPooling2D": _k_pool2d,
    "AveragePooling2D": _k_pool2d, "GlobalAveragePooling2D": _k_global_pool2d,
    "GlobalMaxPooling2D": _k_global_pool2d, "ZeroPadding2D": _k_pad2d, "Reshape": _k_reshape,
}
