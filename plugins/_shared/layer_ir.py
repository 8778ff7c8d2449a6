"""One small layer IR for the targets that generate code from a model's weights (``cpu.native``,
``fpga.da4ml``; ``fpga.hls4ml``'s ``convert.py`` still holds a narrower copy of this extraction).

A :class:`Network` is the input shape (per sample, no batch) and a chain of layers, each with
its weights as float32 NumPy arrays in the layout the emitters use (Keras' own:
``Dense.w`` is ``(n_in, n_out)``, ``Conv1D.w`` is ``(kernel, c_in, c_out)``, recurrent
kernels ``(n_in, gates·units)`` with Keras' gate order). Activations are layers of their own
(:class:`Act`), so an emitter can fuse them where it likes; BatchNormalization folds into the
Dense/Conv1D right before it and is otherwise a per-channel :class:`Affine`.

:func:`extract` reads Keras (``Sequential`` or a functional chain), torch (``nn.Sequential``,
or a ``torch.export`` program of one, through :mod:`torch_export`; a program with Conv1d,
pooling, LSTM/GRU or transposes through :func:`_aten`) and ONNX (the graphs tf2onnx and
torch.onnx write for these layers: :func:`_onnx`). Layers: Dense, ReLU/LeakyReLU/tanh/
sigmoid/softmax, BatchNorm (folded), Conv1D, pooling, Flatten, LSTM and GRU unrolled over
the fixed window; anything else is refused with :class:`UnsupportedError` naming the
layer or op. :func:`forward` is the float64 NumPy reference of the IR: the check that extraction
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
             "BatchNorm1d, Dropout, Flatten (and, in a torch.export program, Conv1d, pooling, "
             "LSTM/GRU); ONNX: see ONNX_OPS")


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
        layers = _torch(model.obj, target, tuple(model.input.shape))
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
def _torch(obj: Any, target: str, in_shape: tuple[int, ...]) -> list[Layer]:
    import torch
    from torch import nn

    if isinstance(obj, nn.Module) and not isinstance(obj, nn.Sequential):
        # A module with its own forward (as the compile worker gets it: a torch.export program)
        obj = torch.export.export(obj.eval(), (torch.zeros((2, *in_shape)),))
    if _aten_wide(obj):
        return _aten(obj, target)
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
#: ONNX ops :func:`extract` takes, as refusals list them.
ONNX_OPS = ("Gemm, MatMul (+ Add), Relu, LeakyRelu, Tanh, Sigmoid, Softmax, Conv (1-D, group 1), "
            "MaxPool/AveragePool (no padding), GlobalAveragePool/GlobalMaxPool, ReduceMean/ReduceMax "
            "over time, LSTM/GRU (forward, one layer, tanh/sigmoid, zero initial state), the last "
            "step of their sequence (Gather/Slice), Flatten/Reshape to (batch, features), "
            "Transpose/Squeeze/Unsqueeze, Identity, Dropout, Cast, and the Shape arithmetic "
            "around them")

# An ONNX tensor's axes are labelled by what they hold of the IR's channels-last state:
# "N" the batch, "T" time, "C" channels, "1" a singleton. Transposes, (un)squeezes and the
# NCHW convolutions tf2onnx and torch.onnx write around a 1-D layer only move labels.
_META_OPS = {"Shape", "Size"}  # ops whose output is only the data's shape
_PASS = {"Identity", "Dropout", "Cast"}
_ZERO_KEEP = {"Expand", "Unsqueeze", "Reshape", "Cast", "Identity", "Tile", "Squeeze"}


@dataclass
class _Walk:
    """The state of a walk over an ONNX graph or a torch.export program."""

    target: str
    consts: dict[str, np.ndarray]
    in_shape: tuple[int, ...]
    layers: list[Layer] = field(default_factory=list)
    perm: np.ndarray | None = None  # flat feature j of the source's tensor is IR feature perm[j]
    kind: str = "ONNX node"
    supported: str = ONNX_OPS
    pad: tuple[int, int] = (0, 0)  # an ONNX Pad of time, for the Conv after it

    def shape(self) -> tuple[int, ...]:
        s = self.in_shape
        for layer in self.layers:
            s = layer.out_shape(s)
        return s

    def refuse(self, name: str, op: str, why: str = "") -> UnsupportedError:
        why = f": {why}" if why else ""
        return UnsupportedError(f"{self.target} cannot compile {self.kind} {name!r} (op {op}){why}. "
                                f"Supported: {self.supported}")

    def const_ints(self, n: Any, idx: int, attrs: dict, key: str) -> list[int] | None:
        """An int list given as input ``idx`` (newer opsets) or attribute ``key``."""
        if len(n.input) > idx and n.input[idx]:
            return [int(v) for v in np.ravel(self.consts[n.input[idx]])]
        return list(attrs[key].ints) if key in attrs else None


def _onnx_attrs(n: Any) -> dict[str, Any]:
    return {a.name: a for a in n.attribute}


def _onnx(proto: Any, target: str) -> list[Layer]:
    """The ONNX graphs tf2onnx and torch.onnx write for the layers :data:`SUPPORTED` lists, as
    IR layers: the data tensors form a chain (each op reading the previous one's output,
    weights as initializers or Constants); side computations on the input's Shape (the
    zero initial state an exported LSTM builds for the batch) are followed only far enough
    to see that they are zeros. Anything else is refused naming the node and op."""
    g = proto.graph
    consts = _onnx_consts(g)
    dims = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
    if len(dims) not in (2, 3):
        raise UnsupportedError(f"{target} compiles ONNX models over (batch, features) or (batch, "
                               f"time, channels) inputs; input {g.input[0].name!r} has {len(dims)} axes")
    w = _Walk(target, consts, tuple(dims[1:]))
    data = {g.input[0].name: ["N", "C"] if len(dims) == 2 else ["N", "T", "C"]}
    meta: dict[str, bool] = {}  # shape-derived tensors → whether they are all zeros
    prev = {g.input[0].name}
    users: dict[str, set[str]] = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, set()).add(n.op_type)
    graph_out = {o.name for o in g.output}
    for n in g.node:
        if n.op_type == "Constant" and n.output[0] in consts:
            continue
        name, op = n.name or f"{n.op_type}_{len(w.layers)}", n.op_type
        if op in ("Loop", "Scan", "If"):
            raise w.refuse(name, op, "control flow (tf2onnx writes a Keras GRU/LSTM it cannot map "
                                     "to an ONNX GRU/LSTM op as a Loop): compile the Keras source")
        ins = [i for i in n.input if i and i not in consts]
        din = [i for i in ins if i in data]
        if din and not any(users.get(o, set()) - _META_OPS or o in graph_out for o in n.output):
            continue  # a view of the data that only its Shape is taken of (torch.onnx writes them)
        if not din or op in _META_OPS:
            _onnx_meta(n, consts, meta)
            continue
        _onnx_operands(w, name, op, ins, din, prev, set(data), meta)
        ax = list(data[din[0]])
        if "H" in ax:  # an LSTM/GRU's Y_h: the layer returns its last state
            _onnx_last_step(w, name, op)
            ax = ["C" if a == "H" else a for a in ax]
        before = len(w.layers)
        outs = _onnx_node(w, n, name, op, ax, din[0], meta)
        if w.pad != (0, 0) and op != "Pad" and len(w.layers) > before:
            raise w.refuse(name, op, "a Pad that a Conv does not follow")
        data.update(outs)
        prev = set(outs)
    out = g.output[0].name
    if out not in prev:
        raise UnsupportedError(f"{target}: ONNX output {out!r} is not the end of the op chain")
    _final_axes(w, data[out])
    return w.layers


def _onnx_consts(g: Any) -> dict[str, np.ndarray]:
    """The graph's initializers and Constant nodes (initializers written another way)."""
    from onnx import numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return consts


def _onnx_operands(w: _Walk, name: str, op: str, ins: list[str], din: list[str], prev: set[str],
                   data: set[str], meta: dict[str, bool]) -> None:
    """Refuse a node that does not read the previous node's output as its one data input."""
    if len(din) != 1 or din[0] not in prev:
        raise w.refuse(name, op, "the graph is not a chain of single-input ops")
    stray = [i for i in ins if i not in data and i not in meta]
    if stray:
        raise w.refuse(name, op, f"input {stray[0]!r} is neither data, weight nor shape")
    if any(i in meta for i in ins) and op not in ("LSTM", "GRU"):
        raise w.refuse(name, op, "a computed (not constant) operand")


def _final_axes(w: _Walk, labels: list[str]) -> None:
    """Refuse an output whose axes are not the IR's (batch, [time,] channels)."""
    ax = [a for a in labels if a != "1"]
    want = ["N", "C"] if "T" not in ax else ["N", "T", "C"]
    if ax != want or (w.perm is not None and np.any(w.perm != np.arange(len(w.perm)))):
        raise UnsupportedError(f"{w.target}: the model's output axes hold {ax} (batch N, time T, "
                               f"channels C); it compiles outputs laid out {want}")


def _dense(w: _Walk, name: str, op: str, ax: list[str], k: np.ndarray, b: Any) -> None:
    """Append ``y = x @ k + b`` (``k`` (n_in, n_out) in the source's feature order)."""
    if ax != ["N", "C"]:
        raise w.refuse(name, op, f"a matrix product over axes {ax} (a Dense takes (batch, features))")
    if w.perm is not None:  # rows in the source tensor's feature order → the IR's
        rows = np.empty_like(k)
        rows[w.perm] = k
        k, w.perm = rows, None
    w.layers.append(Dense(name, _f32(k), _f32(np.broadcast_to(b, (k.shape[1],)))))


def _flatten(w: _Walk, name: str, op: str, ax: list[str]) -> list[str]:
    """Flatten to (batch, features); a channels-first order is folded into the next Dense."""
    kept = [a for a in ax if a != "1"]
    if ax[0] != "N":
        raise w.refuse(name, op, f"flattening axes {ax} (batch first)")
    if kept == ["N", "T", "C"]:
        w.layers.append(Flatten(name))
    elif kept == ["N", "C", "T"]:
        t, ch = w.shape()
        w.layers.append(Flatten(name))
        w.perm = (np.arange(t)[None, :] * ch + np.arange(ch)[:, None]).ravel()
    elif kept != ["N", "C"]:
        raise w.refuse(name, op, f"flattening axes {ax}")
    return ["N", "C"]


def _onnx_meta(n: Any, consts: dict[str, np.ndarray], meta: dict[str, bool]) -> None:
    """Record a node computed from shapes and constants, and whether its output is zeros."""
    from onnx import numpy_helper

    a = _onnx_attrs(n).get("value")
    fill = numpy_helper.to_array(a.t) if a is not None else np.zeros(1)
    zero = (n.op_type == "ConstantOfShape" and not np.any(fill)) or (
        n.op_type in _ZERO_KEEP and bool(n.input) and _onnx_zero(n.input[0], consts, meta))
    for o in n.output:
        meta[o] = bool(zero)


def _onnx_zero(name: str, consts: dict[str, np.ndarray], meta: dict[str, bool]) -> bool:
    return meta.get(name, False) or (name in consts and not np.any(consts[name]))


def _onnx_spatial(w: _Walk, name: str, op: str, ax: list[str]) -> int:
    """The index of time among an N, C, spatial… tensor's spatial axes (others singletons)."""
    if ax[:2] != ["N", "C"] or "T" not in ax[2:] or any(a != "1" for a in ax[2:] if a != "T"):
        raise w.refuse(name, op, f"its input's axes hold {ax}; it takes (batch, channels, time) "
                                 f"with singleton axes only beside time")
    return ax.index("T") - 2


def _onnx_window(w: _Walk, name: str, op: str, attrs: dict, t: int, rank: int,
                 kernel: list[int]) -> tuple[int, int, int, tuple[int, int]]:
    """(kernel, stride, dilation, pad) along time of a Conv/Pool; other axes must be trivial."""
    strides = list(attrs["strides"].ints) if "strides" in attrs else [1] * rank
    dil = list(attrs["dilations"].ints) if "dilations" in attrs else [1] * rank
    pads = list(attrs["pads"].ints) if "pads" in attrs else [0] * 2 * rank
    auto = attrs["auto_pad"].s.decode() if "auto_pad" in attrs else "NOTSET"
    for i in range(rank):
        if i != t and (kernel[i], strides[i], dil[i], pads[i], pads[i + rank]) != (1, 1, 1, 0, 0):
            raise w.refuse(name, op, "a window over a singleton axis")
    k, s, d = kernel[t], strides[t], dil[t]
    pad = (pads[t], pads[t + rank])
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if s != 1:
            raise w.refuse(name, op, f"auto_pad {auto} with strides > 1")
        span = (k - 1) * d
        lo = span // 2 if auto == "SAME_UPPER" else span - span // 2
        pad = (lo, span - lo)
    elif auto not in ("NOTSET", "VALID"):
        raise w.refuse(name, op, f"auto_pad {auto}")
    return k, s, d, pad


def _onnx_last_step(w: _Walk, name: str, op: str) -> None:
    """A Gather/Slice of the last time step, right after a recurrent layer: its last state."""
    last = w.layers[-1] if w.layers else None
    if not (isinstance(last, Recurrent) and last.return_sequences):
        raise w.refuse(name, op, "indexing time is only compiled as the last step of an LSTM/GRU")
    last.return_sequences = False


def _onnx_node(w: _Walk, n: Any, name: str, op: str, ax: list[str], x: str,
               meta: dict[str, bool]) -> dict[str, list[str]]:
    """Append ``n``'s IR layers; the labels of its data outputs."""
    for part in (_onnx_elementwise, _onnx_dense):
        out = part(w, n, name, op, ax)
        if out is not None:
            return out
    return _onnx_layer(w, n, name, op, ax, meta)


def _onnx_elementwise(w: _Walk, n: Any, name: str, op: str, ax: list[str]) -> dict[str, list[str]] | None:
    """Activations and the ops that only move axes (None: not one of those)."""
    attrs, o = _onnx_attrs(n), n.output[0]
    if op in _PASS:
        if op == "Cast" and attrs["to"].i != 1:
            raise w.refuse(name, op, "a cast to other than float32")
        return {o: ax}
    if op in ("Relu", "Tanh", "Sigmoid"):
        w.layers.append(Act(name, op.lower()))
        return {o: ax}
    if op == "LeakyRelu":
        w.layers.append(Act(name, "leaky_relu", attrs["alpha"].f if "alpha" in attrs else 0.01))
        return {o: ax}
    if op == "Softmax":
        axis = attrs["axis"].i if "axis" in attrs else -1
        if ax[axis] != "C" or w.perm is not None:
            raise w.refuse(name, op, f"softmax over axis {axis} (holding {ax[axis]}), not the channels")
        w.layers.append(Act(name, "softmax"))
        return {o: ax}
    if op == "Transpose":
        perm = list(attrs["perm"].ints) if "perm" in attrs else list(range(len(ax)))[::-1]
        return {o: [ax[i] for i in perm]}
    if op == "Unsqueeze":
        axes = sorted(a % (len(ax) + len(w.const_ints(n, 1, attrs, "axes") or []))
                      for a in w.const_ints(n, 1, attrs, "axes") or [])
        out = list(ax)
        for a in axes:
            out.insert(a, "1")
        return {o: out}
    if op == "Squeeze":
        axes = w.const_ints(n, 1, attrs, "axes")
        axes = [a % len(ax) for a in axes] if axes is not None else [i for i, a in enumerate(ax) if a == "1"]
        if any(ax[a] != "1" for a in axes):
            raise w.refuse(name, op, f"squeezing axes {axes} of {ax} (only singletons)")
        return {o: [a for i, a in enumerate(ax) if i not in axes]}
    return None


def _onnx_dense(w: _Walk, n: Any, name: str, op: str, ax: list[str]) -> dict[str, list[str]] | None:
    """Gemm/MatMul, per-channel Add/Mul, Pad, Flatten/Reshape (None: not one of those)."""
    attrs, c, o = _onnx_attrs(n), w.consts, n.output[0]
    if op in ("Gemm", "MatMul"):
        if n.input[1] not in c:
            raise w.refuse(name, op, "a matrix product with computed weights")
        k = c[n.input[1]].astype(np.float32)
        b = np.zeros(k.shape[-1], np.float32)
        if op == "Gemm":
            if "transB" in attrs and attrs["transB"].i:
                k = k.T
            if (attrs.get("transA") and attrs["transA"].i) or any(
                    key in attrs and attrs[key].f != 1.0 for key in ("alpha", "beta")):
                raise w.refuse(name, op, "transA/alpha/beta")
            b = c[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(k.shape[1])
        _dense(w, name, op, ax, k, b)
        return {o: ax}
    if op == "Add" and isinstance(w.layers[-1:] and w.layers[-1], Dense) and ax == ["N", "C"]:
        dense = w.layers[-1]
        bias = next(c[i] for i in n.input if i in c)
        dense.b = _f32(dense.b + np.broadcast_to(bias, dense.b.shape))
        return {o: ax}
    if op in ("Add", "Mul", "Pad"):
        return _onnx_affine(w, n, name, op, ax)
    if op in ("Flatten", "Reshape"):
        if op == "Flatten" and (attrs["axis"].i if "axis" in attrs else 1) != 1:
            raise w.refuse(name, op, "flattening from an axis other than 1")
        if op == "Reshape":
            to = [int(v) for v in c[n.input[1]]] if n.input[1] in c else None
            if to is None or len(to) != 2 or to[0] not in (0, -1) or (
                    to[1] not in (-1, int(np.prod(w.shape())))):
                raise w.refuse(name, op, "a reshape other than to (batch, features)")
        return {o: _flatten(w, name, op, ax)}
    return None


def _onnx_layer(w: _Walk, n: Any, name: str, op: str, ax: list[str],
                meta: dict[str, bool]) -> dict[str, list[str]]:
    """Conv, pooling, the last step of a sequence, LSTM/GRU; anything else is refused."""
    attrs, c, o = _onnx_attrs(n), w.consts, n.output[0]
    if op == "Conv":
        t = _onnx_spatial(w, name, op, ax)
        wt = c.get(n.input[1])
        if wt is None:
            raise w.refuse(name, op, "a computed kernel")
        if (attrs["group"].i if "group" in attrs else 1) != 1:
            raise w.refuse(name, op, f"group {attrs['group'].i} (grouped convolution)")
        k, s, d, pad = _onnx_window(w, name, op, attrs, t, wt.ndim - 2, list(wt.shape[2:]))
        pad, w.pad = (pad[0] + w.pad[0], pad[1] + w.pad[1]), (0, 0)
        kern = np.moveaxis(wt.reshape(wt.shape[0], wt.shape[1], k), 2, 0).transpose(0, 2, 1)
        b = c[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(wt.shape[0])
        w.layers.append(Conv1D(name, _f32(kern), _f32(b), s, d, pad))
        return {o: ax}
    if op in ("MaxPool", "AveragePool"):
        t = _onnx_spatial(w, name, op, ax)
        if len(n.output) > 1 and n.output[1] or (attrs.get("ceil_mode") and attrs["ceil_mode"].i):
            raise w.refuse(name, op, "indices output or ceil_mode")
        k, s, d, pad = _onnx_window(w, name, op, attrs, t, len(ax) - 2, list(attrs["kernel_shape"].ints))
        if d != 1 or pad != (0, 0):
            raise w.refuse(name, op, "padding or dilation")
        w.layers.append(Pool1D(name, "max" if op == "MaxPool" else "avg", k, s))
        return {o: ax}
    if op in ("GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax"):
        if op.startswith("Global"):
            _onnx_spatial(w, name, op, ax)
            axes, keep = [ax.index("T")], True
        else:
            axes = [a % len(ax) for a in w.const_ints(n, 1, attrs, "axes") or []]
            keep = bool(attrs["keepdims"].i) if "keepdims" in attrs else True
            if [ax[a] for a in axes if ax[a] != "1"] != ["T"]:
                raise w.refuse(name, op, f"reducing axes {axes} of {ax} (only time is)")
        w.layers.append(GlobalPool1D(name, "max" if "Max" in op else "avg"))
        return {o: [("1" if a == "T" else a) for i, a in enumerate(ax) if keep or i not in axes]}
    if op in ("Gather", "Slice"):
        return _onnx_index(w, n, name, op, ax, attrs)
    if op in ("LSTM", "GRU"):
        return _onnx_recurrent(w, n, name, op, ax, attrs, meta)
    raise w.refuse(name, op)


def _onnx_affine(w: _Walk, n: Any, name: str, op: str, ax: list[str]) -> dict[str, list[str]]:
    """Per-channel Mul/Add by a constant (the batch normalization tf2onnx writes; a bias after
    a Conv or Dense) and a zero Pad of time (before a causal Conv)."""
    c, o = w.consts, n.output[0]
    if op == "Pad":
        pads = w.const_ints(n, 1, _onnx_attrs(n), "pads") or []
        mode = _onnx_attrs(n).get("mode")
        value = c.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        r = len(ax)
        if ("T" not in ax or len(pads) != 2 * r or (mode is not None and mode.s != b"constant")
                or (value is not None and np.any(value))
                or any(pads[i] or pads[i + r] for i in range(r) if ax[i] != "T")):
            raise w.refuse(name, op, "padding other than zeros along time")
        t = ax.index("T")
        w.pad = (w.pad[0] + pads[t], w.pad[1] + pads[t + r])
        return {o: ax}
    k = [c[i] for i in n.input if i in c]
    if len(k) != 1 or w.perm is not None:
        raise w.refuse(name, op, "an element-wise op on computed operands")
    v = np.asarray(k[0], np.float64)
    v = v.reshape((1,) * (len(ax) - v.ndim) + v.shape)
    if v.ndim != len(ax) or any(d != 1 and a != "C" for d, a in zip(v.shape, ax, strict=True)):
        raise w.refuse(name, op, f"an operand of shape {k[0].shape} over axes {ax} (per channel only)")
    v = np.broadcast_to(v.ravel(), (w.shape()[-1],)).astype(np.float64)
    last = w.layers[-1] if w.layers else None
    if op == "Add" and isinstance(last, (Dense, Conv1D)):
        last.b = _f32(last.b + v)
    elif op == "Add" and isinstance(last, Affine):
        last.shift = last.shift + v
    else:
        ones, zeros = np.ones_like(v), np.zeros_like(v)
        w.layers.append(Affine(name, v if op == "Mul" else ones, zeros if op == "Mul" else v))
    return {o: ax}


def _onnx_index(w: _Walk, n: Any, name: str, op: str, ax: list[str], attrs: dict) -> dict[str, list[str]]:
    """The last time step of a recurrent layer's sequence, by Gather (index -1) or Slice."""
    c, o = w.consts, n.output[0]
    steps = w.shape()[0] if "T" in ax else 0
    if op == "Gather":
        axis = (attrs["axis"].i if "axis" in attrs else 0) % len(ax)
        idx = c.get(n.input[1])
        if ax[axis] == "1" and idx is not None and idx.ndim == 0 and int(idx) in (0, -1):
            return {o: [a for i, a in enumerate(ax) if i != axis]}  # Y_h[-1]: one layer
        if ax[axis] != "T" or idx is None or idx.ndim != 0 or int(idx) % max(steps, 1) != steps - 1:
            raise w.refuse(name, op, f"gathering along {ax[axis]} (only the last time step is)")
        _onnx_last_step(w, name, op)
        return {o: [a for i, a in enumerate(ax) if i != axis]}
    starts, ends = (w.const_ints(n, i, attrs, k) for i, k in ((1, "starts"), (2, "ends")))
    axes = w.const_ints(n, 3, attrs, "axes") or list(range(len(starts or [])))
    stepv = w.const_ints(n, 4, attrs, "steps") or [1] * len(axes)
    if (starts is None or ends is None or len(axes) != 1 or ax[axes[0] % len(ax)] != "T"
            or stepv != [1] or starts[0] % steps != steps - 1 or ends[0] < steps):
        raise w.refuse(name, op, "slicing other than the last time step")
    _onnx_last_step(w, name, op)
    return {o: ["1" if a == "T" else a for a in ax]}


def _onnx_recurrent(w: _Walk, n: Any, name: str, op: str, ax: list[str], attrs: dict,
                    meta: dict[str, bool]) -> dict[str, list[str]]:
    """ONNX LSTM (gates i, o, f, c) / GRU (z, r, h) as a Keras-order :class:`Recurrent`."""
    c = w.consts
    layout = attrs["layout"].i if "layout" in attrs else 0
    if [a for a in ax if a != "1"] != (["T", "N", "C"] if layout == 0 else ["N", "T", "C"]) or "1" in ax:
        raise w.refuse(name, op, f"its input's axes hold {ax}")
    direction = attrs["direction"].s.decode() if "direction" in attrs else "forward"
    if direction != "forward":
        raise w.refuse(name, op, f"direction {direction!r} (forward only)")
    acts = [a.decode().lower() for a in attrs["activations"].strings] if "activations" in attrs else []
    want = ["sigmoid", "tanh", "tanh"] if op == "LSTM" else ["sigmoid", "tanh"]
    if acts and acts != want:
        raise w.refuse(name, op, f"activations {acts} (tanh/sigmoid only)")
    for key in ("clip", "input_forget"):
        if key in attrs and (attrs[key].f if key == "clip" else attrs[key].i):
            raise w.refuse(name, op, f"{key}")
    ins = list(n.input) + [""] * (8 - len(n.input))
    if ins[4]:
        raise w.refuse(name, op, "sequence_lens (the whole window is run)")
    for i in ins[5:7] + ([ins[7]] if op == "LSTM" else []):
        if i and not _onnx_zero(i, c, meta):
            raise w.refuse(name, op, f"input {i!r}: only a zero initial state (and no peepholes) is compiled")
    if ins[1] not in c or ins[2] not in c:
        raise w.refuse(name, op, "computed weights")
    u = int(attrs["hidden_size"].i)
    g = 4 if op == "LSTM" else 3
    wx, wh = c[ins[1]][0].astype(np.float64), c[ins[2]][0].astype(np.float64)
    bias = c[ins[3]][0].astype(np.float64) if ins[3] else np.zeros(2 * g * u)
    order = [0, 2, 3, 1] if op == "LSTM" else [0, 1, 2]  # ONNX i,o,f,c → Keras i,f,c,o

    def keras(m: np.ndarray) -> np.ndarray:  # (G·u, …) in ONNX order → (…, G·u) in Keras'
        return np.concatenate([m[j * u:(j + 1) * u] for j in order]).T

    reset_after = True
    if op == "LSTM":
        b = keras(bias[:g * u] + bias[g * u:])
    else:
        reset_after = bool(attrs["linear_before_reset"].i) if "linear_before_reset" in attrs else False
        b = np.stack([bias[:g * u], bias[g * u:]]) if reset_after else bias[:g * u] + bias[g * u:]
    w.layers.append(Recurrent(name, op.lower(), _f32(keras(wx)), _f32(keras(wh)), _f32(b), u,
                              True, reset_after))
    y = ["T", "1", "N", "C"] if layout == 0 else ["N", "T", "1", "C"]
    out = {n.output[0]: y} if n.output[0] else {}
    if len(n.output) > 1 and n.output[1]:  # Y_h: consumed, it makes the layer return its last state
        out[n.output[1]] = ["1", "N", "H"] if layout == 0 else ["N", "1", "H"]
    return out


# -- torch.export programs beyond the MLP chain ------------------------------------------------
#: aten ops whose presence sends a torch.export program through :func:`_aten` (what
#: ``torch_export.as_sequential`` does not rebuild).
_ATEN_WIDE = {"aten.lstm.input", "aten.gru.input", "aten.conv1d.default", "aten.conv1d.padding",
              "aten.max_pool1d.default", "aten.avg_pool1d.default", "aten.adaptive_avg_pool1d.default",
              "aten.transpose.int", "aten.permute.default", "aten.select.int", "aten.slice.Tensor",
              "aten.mean.dim", "aten.amax.default", "aten.leaky_relu.default"}
#: torch ops :func:`_aten` takes, as refusals list them.
TORCH_OPS = ("Linear, ReLU, LeakyReLU, Tanh, Sigmoid, Softmax, BatchNorm1d (eval), Dropout (eval), "
             "Conv1d (group 1), MaxPool1d/AvgPool1d (no padding), AdaptiveAvgPool1d(1), mean/amax "
             "over time, LSTM/GRU (one layer, unidirectional, zero initial state) and the last step "
             "of their output, transpose/permute/(un)squeeze, flatten/view to (batch, features)")
_ATEN_ACTS = {"aten.relu.default": "relu", "aten.tanh.default": "tanh", "aten.sigmoid.default": "sigmoid"}
_ATEN_PASS = {"aten.dropout.default", "aten.alias.default", "aten.clone.default",
              "aten.contiguous.default", "aten.detach.default"}


def _aten_wide(obj: Any) -> bool:
    import torch
    return isinstance(obj, torch.export.ExportedProgram) and any(
        str(n.target) in _ATEN_WIDE for n in obj.graph.nodes if n.op == "call_function")


def _aten(ep: Any, target: str) -> list[Layer]:
    """A ``torch.export`` program whose data flows through one chain of the ops
    :data:`TORCH_OPS` lists (modules' own ``forward`` included: an LSTM's output indexed at
    its last step, transposes to and from Conv1d's channels-first layout), as IR layers.
    Tensors are labelled as in :func:`_onnx`; anything else is refused naming the op."""
    sig = ep.graph_signature
    names = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    consts = {p: ep.state_dict[t] for p, t in names.items()}
    consts.update({p: ep.constants[t] for p, t in
                   getattr(sig, "inputs_to_lifted_tensor_constants", {}).items()})
    user = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name not in consts]
    if len(user) != 1:
        raise UnsupportedError(f"{target} compiles torch models with one tensor input")
    in_shape = tuple(int(d) for d in user[0].meta["val"].shape[1:])
    if len(in_shape) not in (1, 2):
        raise UnsupportedError(f"{target} compiles torch models over (batch, features) or (batch, "
                               f"time, channels) inputs; this one takes {in_shape}")
    w = _Walk(target, {}, in_shape)
    w.kind, w.supported = "torch op", TORCH_OPS
    data: dict[Any, list[str]] = {user[0]: ["N", "C"] if len(in_shape) == 1 else ["N", "T", "C"]}
    meta: dict[Any, bool] = {}
    prev: set[Any] = {user[0]}
    rec: Any = None  # the last recurrent node, whose getitems are its outputs
    for n in ep.graph.nodes:
        if n.op != "call_function":
            if n.op == "output":
                out = n.args[0][0] if isinstance(n.args[0], (list, tuple)) else n.args[0]
                if out not in prev:
                    raise UnsupportedError(f"{target}: the torch output is not the end of the op chain")
                _final_axes(w, data[out])
            continue
        op = str(n.target)
        flat = [a for a in _aten_flat(n.args) if hasattr(a, "op")]
        din = [a for a in flat if a in data]
        if op in ("aten.sym_size.int", "aten.sym_numel.default"):  # the dynamic batch's size
            din = []
        if not din and op != "<built-in function getitem>":
            meta[n] = op in ("aten.zeros.default", "aten.zeros_like.default", "aten.new_zeros.default")
            continue
        if op == "<built-in function getitem>":
            data[n] = _aten_getitem(w, n, rec)
            prev.add(n)
            continue
        if len(din) != 1 or din[0] not in prev or any(a in data for a in flat if a is not din[0]):
            raise w.refuse(n.name, op, "the graph is not a chain of single-input ops")
        ax = list(data[din[0]])
        if "cell" in ax:
            raise w.refuse(n.name, op, "an LSTM's cell state (only its output or h_n is compiled)")
        if "H" in ax:
            _onnx_last_step(w, n.name, op)
            ax = ["C" if a == "H" else a for a in ax]
        data[n] = _aten_node(w, n, op, ax, consts, meta)
        prev = {n}
        if op in ("aten.lstm.input", "aten.gru.input"):
            rec = n
    return w.layers


def _aten_getitem(w: _Walk, n: Any, rec: Any) -> list[str]:
    """The labels of ``lstm(...)[i]``: the output sequence, h_n (its last state), c_n."""
    if n.args[0] is not rec:
        raise w.refuse(n.name, str(n.target), "indexing a tuple that is not an LSTM/GRU's output")
    i = int(n.args[1])
    if i == 0:
        return ["N", "T", "C"] if rec.args[8] else ["T", "N", "C"]
    return ["1", "N", "H"] if i == 1 else ["cell"]


def _aten_flat(args: Any) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out += _aten_flat(a) if isinstance(a, (list, tuple)) else [a]
    return out


def _aten_node(w: _Walk, n: Any, op: str, ax: list[str], consts: dict, meta: dict) -> list[str]:
    """Append the IR layers of aten node ``n``; its output's labels."""
    args, name = list(n.args), n.name

    def t(a: Any) -> np.ndarray | None:
        return None if a is None else consts[a.name].detach().cpu().numpy().astype(np.float64)

    if op in _ATEN_PASS:
        if op == "aten.dropout.default" and args[2]:
            raise w.refuse(name, op, "dropout in training mode")
        return ax
    if op in _ATEN_ACTS:
        w.layers.append(Act(name, _ATEN_ACTS[op]))
        return ax
    if op == "aten.leaky_relu.default":
        w.layers.append(Act(name, "leaky_relu", float(args[1]) if len(args) > 1 else 0.01))
        return ax
    if op in ("aten.softmax.int", "aten._softmax.default"):
        if ax[args[1]] != "C" or w.perm is not None:
            raise w.refuse(name, op, f"softmax over dim {args[1]} (holding {ax[args[1]]}), not the channels")
        w.layers.append(Act(name, "softmax"))
        return ax
    if op == "aten.linear.default":
        k = t(args[1]).T
        b = t(args[2]) if len(args) > 2 and args[2] is not None else np.zeros(k.shape[1])
        _dense(w, name, op, ax, k, b)
        return ax
    if op == "aten.batch_norm.default":
        if args[5] or ax[1] != "C":
            raise w.refuse(name, op, "batch norm in training mode or over other than the channels")
        wt, bt, mean, var = (t(a) for a in args[1:5])
        scale = (wt if wt is not None else 1.0) / np.sqrt(var + float(args[7]))
        shift = (bt if bt is not None else 0.0) - mean * scale
        w.layers.append(Affine(name, np.asarray(scale, np.float64), np.asarray(shift, np.float64)))
        return ax
    return _aten_layout(w, n, op, ax, t, meta)


def _aten_layout(w: _Walk, n: Any, op: str, ax: list[str], t: Any, meta: dict) -> list[str]:
    """Ops that move axes, flatten, Conv1d."""
    args, name = list(n.args), n.name
    if op == "aten.transpose.int":
        out = list(ax)
        a, b = args[1] % len(ax), args[2] % len(ax)
        out[a], out[b] = ax[b], ax[a]
        return out
    if op == "aten.permute.default":
        return [ax[i] for i in args[1]]
    if op == "aten.unsqueeze.default":
        out = list(ax)
        out.insert(args[1] % (len(ax) + 1), "1")
        return out
    if op in ("aten.squeeze.dim", "aten.squeeze.dims"):
        dims = [d % len(ax) for d in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]])]
        return [a for i, a in enumerate(ax) if i not in dims or a != "1"]
    if op in ("aten.flatten.using_ints", "aten.view.default", "aten.reshape.default"):
        if op == "aten.flatten.using_ints":
            ok = (args[1] if len(args) > 1 else 0) == 1 and (args[2] if len(args) > 2 else -1) in (-1, len(ax) - 1)
        else:
            shp = args[1]
            ok = len(shp) == 2 and (shp[1] == -1 or shp[1] == int(np.prod(w.shape())))
        if not ok:
            raise w.refuse(name, op, "a reshape other than to (batch, features)")
        return _flatten(w, name, op, ax)
    if op in ("aten.conv1d.default", "aten.conv1d.padding"):
        return _aten_conv(w, n, op, ax, t)
    return _aten_pool(w, n, op, ax, t, meta)


def _aten_pool(w: _Walk, n: Any, op: str, ax: list[str], t: Any, meta: dict) -> list[str]:
    """Pooling, the last step of a sequence, LSTM/GRU; anything else is refused."""
    args, name = list(n.args), n.name
    if op in ("aten.max_pool1d.default", "aten.avg_pool1d.default"):
        if ax != ["N", "C", "T"]:
            raise w.refuse(name, op, f"its input's axes hold {ax}; it takes (batch, channels, time)")
        k = _first(args[1])
        s = _first(args[2]) if len(args) > 2 and args[2] else k
        pad = _first(args[3]) if len(args) > 3 else 0
        rest = args[4:] if op.startswith("aten.max") else args[4:5]
        if pad or (op.startswith("aten.max") and len(args) > 4 and _first(args[4]) != 1) or any(
                a is True for a in rest):
            raise w.refuse(name, op, "padding, dilation or ceil_mode")
        w.layers.append(Pool1D(name, "max" if "max" in op else "avg", k, s))
        return ax
    if op == "aten.adaptive_avg_pool1d.default":
        if ax != ["N", "C", "T"] or _first(args[1]) != 1:
            raise w.refuse(name, op, "an adaptive pool to other than one step")
        w.layers.append(GlobalPool1D(name, "avg"))
        return ["N", "C", "1"]
    if op in ("aten.mean.dim", "aten.amax.default"):
        dims = [d % len(ax) for d in args[1]]
        keep = bool(args[2]) if len(args) > 2 else False
        if [ax[d] for d in dims] != ["T"]:
            raise w.refuse(name, op, f"reducing dims {dims} of {ax} (only time is)")
        w.layers.append(GlobalPool1D(name, "avg" if "mean" in op else "max"))
        return [("1" if a == "T" else a) for i, a in enumerate(ax) if keep or i not in dims]
    if op == "aten.select.int" and ax[args[1] % len(ax)] == "1" and args[2] in (0, -1):
        return [a for i, a in enumerate(ax) if i != args[1] % len(ax)]  # h_n[-1]: one layer
    if op == "aten.select.int":
        steps = w.shape()[0] if "T" in ax else 0
        if ax[args[1] % len(ax)] != "T" or args[2] % max(steps, 1) != steps - 1:
            raise w.refuse(name, op, "selecting other than the last time step")
        _onnx_last_step(w, name, op)
        return [a for i, a in enumerate(ax) if i != args[1] % len(ax)]
    if op == "aten.slice.Tensor":
        steps = w.shape()[0] if "T" in ax else 0
        start = args[2] if len(args) > 2 and args[2] is not None else 0
        end = args[3] if len(args) > 3 and args[3] is not None else steps
        if ax[args[1] % len(ax)] != "T" or start % steps != steps - 1 or end < steps or (
                len(args) > 4 and args[4] != 1):
            raise w.refuse(name, op, "slicing other than the last time step")
        _onnx_last_step(w, name, op)
        return ["1" if a == "T" else a for a in ax]
    if op in ("aten.lstm.input", "aten.gru.input"):
        return _aten_recurrent(w, n, op, ax, t, meta)
    raise w.refuse(name, op)


def _aten_conv(w: _Walk, n: Any, op: str, ax: list[str], t: Any) -> list[str]:
    args, name = list(n.args) + [None] * 7, n.name
    if ax != ["N", "C", "T"]:
        raise w.refuse(name, op, f"its input's axes hold {ax}; Conv1d takes (batch, channels, time): "
                                 f"transpose a (batch, time, channels) input first")
    wt = t(args[1])
    s, d, groups = _first(args[3] or 1), _first(args[5] or 1), args[6] or 1
    if groups != 1:
        raise w.refuse(name, op, f"groups={groups} (grouped convolution)")
    k = wt.shape[2]
    span = (k - 1) * d
    if isinstance(args[4], str):
        if args[4] == "same" and s != 1:
            raise w.refuse(name, op, "padding 'same' with stride > 1")
        pad = (span // 2, span - span // 2) if args[4] == "same" else (0, 0)
    else:
        p = _first(args[4] or 0)
        pad = (p, p)
    b = t(args[2]) if args[2] is not None else np.zeros(wt.shape[0])
    w.layers.append(Conv1D(name, _f32(wt.transpose(2, 1, 0)), _f32(b), s, d, pad))
    return ax


def _aten_recurrent(w: _Walk, n: Any, op: str, ax: list[str], t: Any, meta: dict) -> list[str]:
    """``aten.lstm.input(x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
    batch_first)`` (gates i, f, g, o: Keras' order) / ``aten.gru`` (r, z, n → Keras z, r, h)."""
    x, hx, params, has_bias, layers, _, train, bidir, batch_first = n.args
    name, cell = n.name, "lstm" if "lstm" in op else "gru"
    for bad, why in ((layers != 1, f"num_layers={layers} (stacked; one layer per module is "
                                   f"compiled)"),
                     (bool(bidir), "bidirectional=True"), (bool(train), "training mode")):
        if bad:
            raise w.refuse(name, op, why)
    if ax != (["N", "T", "C"] if batch_first else ["T", "N", "C"]):
        raise w.refuse(name, op, f"its input's axes hold {ax}")
    for h in hx if isinstance(hx, (list, tuple)) else [hx]:
        if not meta.get(h, False):
            raise w.refuse(name, op, "an initial state other than zeros")
    g = 4 if cell == "lstm" else 3
    if len(params) != (4 if has_bias else 2):
        raise w.refuse(name, op, "proj_size (a projected LSTM)")
    wi, wh = t(params[0]), t(params[1])
    u = wh.shape[1]
    bi, bh = (t(params[2]), t(params[3])) if has_bias else (np.zeros(g * u), np.zeros(g * u))
    order = [0, 1, 2, 3] if cell == "lstm" else [1, 0, 2]

    def keras(m: np.ndarray) -> np.ndarray:
        return np.concatenate([m[j * u:(j + 1) * u] for j in order]).T

    b = keras(bi + bh) if cell == "lstm" else np.stack([keras(bi), keras(bh)])
    w.layers.append(Recurrent(name, cell, _f32(keras(wi)), _f32(keras(wh)), _f32(b), u, True, True))
    return ["tuple"]


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
