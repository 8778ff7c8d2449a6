"""One small layer IR for the targets that generate code from a model's weights (``cpu.native``,
``fpga.da4ml``; ``fpga.hls4ml``'s ``convert.py`` still holds a narrower copy of this extraction).

A :class:`Network` is the input shape (per sample, no batch) and a chain of layers, each with
its weights as float32 NumPy arrays in the layout the emitters use (Keras' own:
``Dense.w`` is ``(n_in, n_out)``, ``Conv1D.w`` is ``(kernel, c_in, c_out)``, recurrent
kernels ``(n_in, gates·units)`` with Keras' gate order). Activations are layers of their own
(:class:`Act`), so an emitter can fuse them where it likes; BatchNormalization folds into the
Dense/Conv1D right before it and is otherwise a per-channel :class:`Affine`.

:func:`extract` reads Keras (``Sequential`` or a functional chain) and torch
(``nn.Sequential``, or a ``torch.export`` program of one, through
:mod:`torch_export`); anything else is refused with :class:`UnsupportedError` naming the
layer. :func:`forward` is the float64 NumPy reference of the IR: the check that extraction
kept the model's function, and the range measurement for int8 calibration.

``extract(..., dtype=np.float64)`` keeps the weights in float64 (a float32 source converts
exactly; BatchNormalization is folded in float64 from its unrounded scale), for targets that
quantize the weights themselves. :func:`dense_chain` views a network of Dense layers and
activations as :class:`DenseAct` (each Dense with the activation after it fused in, a
BatchNormalization folded): what targets building one circuit per matrix take.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from hwbackends.errors import UnsupportedError

from . import batchnorm
from .torch_export import as_sequential

#: Element-wise activations an :class:`Act` may hold (``softmax`` is over the last axis).
ACTIVATIONS = ("linear", "relu", "leaky_relu", "tanh", "sigmoid", "softmax")
#: What :func:`extract` takes, as refusals list it.
SUPPORTED = ("Dense, Activation/ReLU/LeakyReLU/Softmax (relu, leaky_relu, tanh, sigmoid, "
             "softmax), BatchNormalization, Conv1D (valid/same/causal), MaxPooling1D/"
             "AveragePooling1D (valid), GlobalAverage/MaxPooling1D, Flatten, LSTM, GRU "
             "(tanh/sigmoid), Dropout; torch: Linear, ReLU, Tanh, Sigmoid, Softmax, "
             "BatchNorm1d, Dropout, Flatten")


@dataclass
class Layer:
    name: str

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape


@dataclass
class Dense(Layer):
    """``y = x @ w + b`` over the last axis."""

    w: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0), np.float32))
    b: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*shape[:-1], self.w.shape[1])


@dataclass
class Act(Layer):
    kind: str = "linear"
    alpha: float = 0.0  # leaky_relu's negative slope


@dataclass
class Affine(Layer):
    """``y = x * scale + shift`` per channel (last axis): an unfoldable batch normalization."""

    scale: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))
    shift: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))


@dataclass
class Conv1D(Layer):
    """Channels-last 1-D convolution; ``pad`` is (left, right) zero padding of the time axis."""

    w: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0, 0), np.float32))
    b: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))
    stride: int = 1
    dilation: int = 1
    pad: tuple[int, int] = (0, 0)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        t = shape[0] + self.pad[0] + self.pad[1]
        span = (self.w.shape[0] - 1) * self.dilation + 1
        return ((t - span) // self.stride + 1, self.w.shape[2])


@dataclass
class Pool1D(Layer):
    kind: str = "max"  # max | avg
    size: int = 2
    stride: int = 2

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return ((shape[0] - self.size) // self.stride + 1, shape[1])


@dataclass
class GlobalPool1D(Layer):
    kind: str = "avg"

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[1],)


@dataclass
class Flatten(Layer):
    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (int(np.prod(shape)),)


@dataclass
class Recurrent(Layer):
    """LSTM (gates i, f, c, o) or GRU (gates z, r, h) over the whole fixed window, Keras
    semantics: zero initial state; ``kernel`` (n_in, G·u), ``recurrent`` (u, G·u), ``bias``
    (G·u,) — for a GRU with ``reset_after`` (2, G·u): input bias, recurrent bias."""

    cell: str = "lstm"  # lstm | gru
    kernel: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0), np.float32))
    recurrent: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0), np.float32))
    bias: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))
    units: int = 0
    return_sequences: bool = False
    reset_after: bool = True

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[0], self.units) if self.return_sequences else (self.units,)


@dataclass
class Network:
    """The input shape (per sample) and the layer chain; :meth:`shapes` gives every layer's
    output shape."""

    name: str
    input_shape: tuple[int, ...]
    layers: list[Layer]

    def shapes(self) -> list[tuple[int, ...]]:
        out, s = [], tuple(self.input_shape)
        for layer in self.layers:
            s = layer.out_shape(s)
            out.append(s)
        return out

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.shapes()[-1] if self.layers else tuple(self.input_shape)


def _f32(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, np.float32))


def extract(model: Any, target: str, *, dtype: Any = np.float32) -> Network:
    """``model`` (a :class:`hwbackends.models.Model` in format keras or torch) as a
    :class:`Network`. ``target`` names the caller in refusals; ``dtype`` (float32 or float64)
    is the weights' dtype (see the module's doc)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise UnsupportedError(f"layer_ir.extract keeps weights as float32 or float64, not {dtype}")
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise UnsupportedError(f"{target} compiles models with one input and one output")
    if model.format == "keras":
        layers = _keras(model.obj, target)
    elif model.format == "torch":
        layers = _torch(model.obj, target)
    elif model.format == "onnx":
        layers = _onnx(model.obj, target)
    else:
        raise UnsupportedError(f"{target} reads Keras, PyTorch or ONNX models; got format {model.format!r}")
    net = Network(model.name, tuple(model.input.shape), [_cast(layer, dtype) for layer in _fold(layers, dtype)])
    _check_shapes(net, target)
    if net.output_shape != tuple(model.output.shape):
        raise UnsupportedError(f"{target}: the layers give output shape {net.output_shape}, the "
                               f"model's is {tuple(model.output.shape)}")
    return net


def _check_shapes(net: Network, target: str) -> None:
    s = tuple(net.input_shape)
    for layer in net.layers:
        need = {Conv1D: 2, Pool1D: 2, GlobalPool1D: 2, Recurrent: 2}.get(type(layer))
        if need is not None and len(s) != need:
            raise UnsupportedError(f"{target} cannot compile layer {layer.name!r} "
                                   f"({type(layer).__name__}) on an input of shape {s}: it takes "
                                   f"(time, channels)")
        if isinstance(layer, Dense) and s[-1] != layer.w.shape[0]:
            raise UnsupportedError(f"{target}: layer {layer.name!r} (Dense) takes {layer.w.shape[0]} "
                                   f"features; its input has shape {s}")
        if isinstance(layer, Dense) and len(s) != 1:
            raise UnsupportedError(f"{target} cannot compile layer {layer.name!r} (Dense) on a "
                                   f"{len(s)}-D input {s}: put a Flatten or a pooling layer before it")
        s = layer.out_shape(s)
        if min(s) < 1:
            raise UnsupportedError(f"{target}: layer {layer.name!r} ({type(layer).__name__}) "
                                   f"leaves no output (shape {s})")


def _cast(layer: Layer, dtype: np.dtype) -> Layer:
    """``layer`` with its arrays in ``dtype`` (C-contiguous)."""
    arrays = {f.name: np.ascontiguousarray(getattr(layer, f.name), dtype) for f in fields(layer)
              if isinstance(getattr(layer, f.name), np.ndarray)}
    return replace(layer, **arrays) if arrays else layer


def _fold(layers: list[Layer], dtype: np.dtype) -> list[Layer]:
    """Fold each :class:`Affine` into the Dense/Conv1D right before it. The converters give
    an Affine's scale/shift in float64; the float32 IR folds their float32 values (what an
    unfolded Affine holds), the float64 IR the unrounded ones."""
    out: list[Layer] = []
    for layer in layers:
        prev = out[-1] if out else None
        if isinstance(layer, Affine) and isinstance(prev, (Dense, Conv1D)):
            scale, shift = (layer.scale, layer.shift) if dtype == np.float64 else (
                _f32(layer.scale), _f32(layer.shift))
            w, b = batchnorm.fold(prev.w, prev.b, scale.astype(np.float64), shift.astype(np.float64))
            prev.w, prev.b = (w, b) if dtype == np.float64 else (_f32(w), _f32(b))
            continue
        out.append(layer)
    return [layer for layer in out if not (isinstance(layer, Act) and layer.kind == "linear")]


# -- Keras -------------------------------------------------------------------------------------
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


def _keras(km: Any, target: str) -> list[Layer]:
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
    return [Dense(layer.name, _f32(ws[0]), _f32(b)), _keras_act(target, layer, layer.activation)]


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
    return [Conv1D(layer.name, _f32(ws[0]), _f32(b), s, d, pad),
            _keras_act(target, layer, layer.activation)]


def _first(v: Any) -> int:
    return int(v[0] if isinstance(v, (list, tuple)) else v)


def _k_pool(target: str, layer: Any, cfg: dict, ws: list) -> list[Layer]:
    if cfg.get("padding", "valid") != "valid" or cfg.get("data_format", "channels_last") != "channels_last":
        raise _refuse(target, layer, "padding 'same' or channels_first")
    size = _first(cfg["pool_size"])
    stride = _first(cfg.get("strides") or size)
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
    return [Recurrent(layer.name, cls.lower(), _f32(ws[0]), _f32(ws[1]), _f32(bias), units,
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


# -- torch -------------------------------------------------------------------------------------
def _torch(obj: Any, target: str) -> list[Layer]:
    from torch import nn

    m = as_sequential(obj, target, "Pass an nn.Sequential of those modules, or its Keras twin")
    if not isinstance(m, nn.Sequential):
        raise UnsupportedError(f"{target} compiles torch nn.Sequential models; module "
                               f"{type(m).__name__} has its own forward. Supported: {SUPPORTED}")
    acts = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Softmax: "softmax"}
    out: list[Layer] = []
    for i, mod in enumerate(m.children()):
        name = f"{i}_{type(mod).__name__.lower()}"
        if isinstance(mod, nn.Linear):
            w = mod.weight.detach().cpu().numpy().T
            b = mod.bias.detach().cpu().numpy() if mod.bias is not None else np.zeros(w.shape[1])
            out.append(Dense(name, _f32(w), _f32(b)))
        elif type(mod) in acts:
            if isinstance(mod, nn.Softmax) and mod.dim not in (-1, 1, None):
                raise UnsupportedError(f"{target} cannot compile module {i} (Softmax over dim {mod.dim})")
            out.append(Act(name, acts[type(mod)]))
        elif isinstance(mod, nn.LeakyReLU):
            out.append(Act(name, "leaky_relu", float(mod.negative_slope)))
        elif isinstance(mod, nn.BatchNorm1d):
            scale, shift = batchnorm.torch_affine(mod)  # float64, as in _k_batchnorm
            out.append(Affine(name, np.asarray(scale, np.float64), np.asarray(shift, np.float64)))
        elif isinstance(mod, (nn.Dropout, nn.Identity, nn.Flatten)):
            continue
        else:
            raise UnsupportedError(f"{target} cannot compile module {i} ({type(mod).__name__}). "
                                   f"Supported: {SUPPORTED}")
    return out


# -- ONNX --------------------------------------------------------------------------------------
#: ONNX ops an MLP chain may hold, as refusals list them.
ONNX_OPS = "Gemm, MatMul (+ Add), Relu, LeakyRelu, Tanh, Sigmoid, Softmax, Flatten, Identity, Dropout"


def _onnx(proto: Any, target: str) -> list[Layer]:
    """A chain of ONNX nodes (each reading the previous one's output, weights as initializers)
    as IR layers: the MLPs tf2onnx and torch.onnx write. Recurrent and convolution ops are
    refused by name (their Keras/torch source compiles directly)."""
    from onnx import numpy_helper

    g = proto.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:  # Constant nodes are initializers written another way
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    out: list[Layer] = []
    prev = g.input[0].name
    for n in g.node:
        if n.op_type == "Constant":
            continue
        name = n.name or f"{n.op_type}_{len(out)}"
        data = [i for i in n.input if i and i not in consts]
        if data != [prev]:
            raise UnsupportedError(f"{target} cannot compile ONNX node {name!r} (op {n.op_type}): "
                                   f"the graph is not a chain of single-input ops. Supported: {ONNX_OPS}")
        attrs = {a.name: a for a in n.attribute}
        op = n.op_type
        if op == "Gemm":
            w = consts[n.input[1]].astype(np.float32)
            if attrs.get("transB") and attrs["transB"].i:
                w = w.T
            if (attrs.get("transA") and attrs["transA"].i) or any(
                    k in attrs and attrs[k].f != 1.0 for k in ("alpha", "beta")):
                raise UnsupportedError(f"{target} cannot compile ONNX node {name!r} (op Gemm with "
                                       f"transA/alpha/beta)")
            b = consts[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(w.shape[1])
            out.append(Dense(name, _f32(w), _f32(np.broadcast_to(b, (w.shape[1],)))))
        elif op == "MatMul" and n.input[1] in consts:
            w = consts[n.input[1]]
            out.append(Dense(name, _f32(w), np.zeros(w.shape[1], np.float32)))
        elif op == "Add" and isinstance(out[-1:] and out[-1], Dense) and len(data) == 1:
            bias = next(consts[i] for i in n.input if i in consts)
            out[-1].b = _f32(out[-1].b + np.broadcast_to(bias, out[-1].b.shape))
        elif op in ("Relu", "Tanh", "Sigmoid"):
            out.append(Act(name, op.lower()))
        elif op == "LeakyRelu":
            out.append(Act(name, "leaky_relu", attrs["alpha"].f if "alpha" in attrs else 0.01))
        elif op == "Softmax" and (attrs["axis"].i if "axis" in attrs else -1) in (-1, 1):
            out.append(Act(name, "softmax"))
        elif op in ("Identity", "Dropout", "Flatten"):
            pass  # per-sample vectors: the identity
        else:
            raise UnsupportedError(f"{target} cannot compile ONNX node {name!r} (op {op}). "
                                   f"Supported: {ONNX_OPS}; compile the Keras or torch source instead")
        prev = n.output[0]
    return out


# -- the float64 reference of the IR -----------------------------------------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def activate(x: np.ndarray, kind: str, alpha: float = 0.0) -> np.ndarray:
    if kind == "relu":
        return np.maximum(x, 0)
    if kind == "leaky_relu":
        return np.where(x >= 0, x, alpha * x)
    if kind == "tanh":
        return np.tanh(x)
    if kind == "sigmoid":
        return _sigmoid(x)
    if kind == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return x


def apply(layer: Layer, x: np.ndarray) -> np.ndarray:
    """One layer on a batch ``x`` of shape ``(n, *in_shape)``, in float64."""
    if isinstance(layer, Dense):
        return x @ layer.w.astype(np.float64) + layer.b
    if isinstance(layer, Act):
        return activate(x, layer.kind, layer.alpha)
    if isinstance(layer, Affine):
        return x * layer.scale + layer.shift
    if isinstance(layer, Conv1D):
        xp = np.pad(x, ((0, 0), layer.pad, (0, 0)))
        k, d, s = layer.w.shape[0], layer.dilation, layer.stride
        t_out = (xp.shape[1] - (k - 1) * d - 1) // s + 1
        y = np.zeros((x.shape[0], t_out, layer.w.shape[2])) + layer.b
        for j in range(k):
            y += xp[:, j * d: j * d + (t_out - 1) * s + 1: s] @ layer.w[j].astype(np.float64)
        return y
    if isinstance(layer, Pool1D):
        t_out = (x.shape[1] - layer.size) // layer.stride + 1
        win = np.stack([x[:, t * layer.stride: t * layer.stride + layer.size] for t in range(t_out)], 1)
        return win.max(axis=2) if layer.kind == "max" else win.mean(axis=2)
    if isinstance(layer, GlobalPool1D):
        return x.max(axis=1) if layer.kind == "max" else x.mean(axis=1)
    if isinstance(layer, Flatten):
        return x.reshape(len(x), -1)
    if isinstance(layer, Recurrent):
        return _recurrent(layer, x)
    raise UnsupportedError(f"no reference for layer {layer.name!r} ({type(layer).__name__})")


def _recurrent(layer: Recurrent, x: np.ndarray) -> np.ndarray:
    u = layer.units
    k, r = layer.kernel.astype(np.float64), layer.recurrent.astype(np.float64)
    b = layer.bias.astype(np.float64)
    h = np.zeros((len(x), u))
    c = np.zeros((len(x), u))
    seq = []
    for t in range(x.shape[1]):
        if layer.cell == "lstm":
            z = x[:, t] @ k + h @ r + b
            i, f, g, o = _sigmoid(z[:, :u]), _sigmoid(z[:, u:2 * u]), np.tanh(z[:, 2 * u:3 * u]), _sigmoid(z[:, 3 * u:])
            c = f * c + i * g
            h = o * np.tanh(c)
        else:
            bi, br = (b[0], b[1]) if layer.reset_after else (b, np.zeros_like(b))
            xz = x[:, t] @ k + bi
            if layer.reset_after:
                hz = h @ r + br
                zg, rg = _sigmoid(xz[:, :u] + hz[:, :u]), _sigmoid(xz[:, u:2 * u] + hz[:, u:2 * u])
                hh = np.tanh(xz[:, 2 * u:] + rg * hz[:, 2 * u:])
            else:
                hz = h @ r[:, :2 * u]
                zg, rg = _sigmoid(xz[:, :u] + hz[:, :u]), _sigmoid(xz[:, u:2 * u] + hz[:, u:2 * u])
                hh = np.tanh(xz[:, 2 * u:] + (rg * h) @ r[:, 2 * u:])
            h = zg * h + (1 - zg) * hh
        seq.append(h)
    return np.stack(seq, 1) if layer.return_sequences else h


def forward(net: Network, x: np.ndarray, upto: int | None = None) -> list[np.ndarray]:
    """The float64 outputs of every layer (up to ``upto`` layers) for a batch ``x``."""
    outs, y = [], np.asarray(x, np.float64)
    for layer in net.layers[:upto]:
        y = apply(layer, y)
        outs.append(y)
    return outs


# -- the Dense-only view (targets that build one circuit per weight matrix) ---------------------
@dataclass
class DenseAct:
    """``y = act(x @ w + b)``; ``w`` is (n_in, n_out): a :class:`Dense` with the activation
    after it fused in."""

    name: str
    w: np.ndarray
    b: np.ndarray
    activation: str = "linear"

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Float reference of this layer."""
        return activate(x @ self.w + self.b, self.activation)


def dense_chain(net: Network, target: str, activations: tuple[str, ...] = ACTIVATIONS,
                why_not: dict[type, str] | None = None) -> list[DenseAct]:
    """``net`` (over a flat input) as :class:`DenseAct` layers: each activation fused into the
    Dense right before it, an :class:`Affine` after a Dense without activation folded into it
    (float64, keeping ``w``'s dtype), Flatten dropped (the identity on a vector). Anything
    else, an activation not in ``activations``, or one not right after a bare Dense is refused
    naming the layer (``why_not``: the target's reason for a layer type it cannot take), as
    is a network over anything but a flat vector."""
    supported = (f"Dense/Linear, activations {', '.join(activations)}, BatchNormalization "
                 f"(folded into the Dense before it), Flatten, Dropout")
    out: list[DenseAct] = []
    for layer in net.layers:
        bare = bool(out) and out[-1].activation == "linear"
        if isinstance(layer, Dense):
            out.append(DenseAct(layer.name, layer.w, layer.b))
        elif isinstance(layer, Act):
            if layer.kind not in activations:
                raise UnsupportedError(f"{target}: activation {layer.kind!r} ({layer.name}) is not "
                                       f"implemented; supported: {', '.join(activations)}")
            if not bare:
                raise UnsupportedError(f"{target}: activation {layer.kind!r} ({layer.name}) must "
                                       f"follow a Dense/Linear layer without an activation of its own")
            out[-1].activation = layer.kind
        elif isinstance(layer, Affine):
            if not bare:
                raise UnsupportedError(f"{target} cannot compile BatchNormalization {layer.name!r}: "
                                       f"{batchnorm.WHERE}; it must directly follow a Dense/Linear "
                                       f"without activation")
            w, b = batchnorm.fold(out[-1].w, out[-1].b, layer.scale.astype(np.float64),
                                  layer.shift.astype(np.float64))
            out[-1].w, out[-1].b = w.astype(out[-1].w.dtype), b.astype(out[-1].b.dtype)
        elif not isinstance(layer, Flatten):
            why = (why_not or {}).get(type(layer))
            kind = layer.cell.upper() if isinstance(layer, Recurrent) else type(layer).__name__
            raise UnsupportedError(f"{target} cannot compile layer {layer.name!r} ({kind}): "
                                   + (why or f"supported: {supported}"))
    if not out:
        raise UnsupportedError(f"{target} found no Dense/Linear layer in the model")
    if len(net.input_shape) != 1:  # after the layers: their refusal says more
        raise UnsupportedError(f"{target} compiles models over a flat feature vector; the input "
                               f"has shape {tuple(net.input_shape)}")
    return out
