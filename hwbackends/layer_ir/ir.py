"""The IR itself: a :class:`Network` of layers with their weights (see the package doc)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Element-wise activations an :class:`Act` may hold (``softmax`` and ``log_softmax`` are over
#: the last axis); their parameters are :class:`Act`'s.
ACTIVATIONS = ("linear", "relu", "leaky_relu", "tanh", "sigmoid", "softmax", "gelu", "gelu_tanh",
               "elu", "softplus", "log_softmax", "clip", "exp", "neg", "sqrt", "prelu",
               "hard_sigmoid", "softsign")
#: What :func:`extract` takes, as refusals list it.
SUPPORTED = ("Dense, Activation/ReLU/LeakyReLU/Softmax (relu, leaky_relu, tanh, sigmoid, "
             "softmax, gelu, elu, selu, softplus, log_softmax, exponential, relu6, hard_sigmoid, "
             "softsign), ELU, PReLU (per channel or shared), BatchNormalization, LayerNormalization, Conv1D (valid/same/causal), "
             "ZeroPadding1D, Cropping1D, MaxPooling1D/AveragePooling1D (valid), GlobalAverage/"
             "MaxPooling1D, Conv2D (valid/same, strides, dilation, groups), ZeroPadding2D, "
             "MaxPooling2D/AveragePooling2D (valid/same), GlobalAverage/MaxPooling2D, Reshape, "
             "Concatenate (last axis, of branches from one tensor), "
             "Flatten, LSTM, GRU (tanh/sigmoid), Bidirectional (concat), "
             "MultiHeadAttention (self-attention; use_causal_mask, no attention_mask), Add (residual), x[:, i] / x[:, a:b], Dropout; "
             "torch: see TORCH_OPS; ONNX: see ONNX_OPS")


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
    """An element-wise activation (:data:`ACTIVATIONS`) and its parameters:

    * ``leaky_relu``: ``x > 0 ? x : alpha·x``;
    * ``elu``: ``beta · (x > 0 ? x : alpha·(eˣ − 1))`` (``beta`` 1: ELU; SELU is
      alpha 1.6732632, beta 1.0507010);
    * ``softplus``: ``log(1 + e^(alpha·x)) / alpha``, or ``x`` where ``alpha·x > beta``
      (torch's ``threshold``; ``inf``: none);
    * ``clip``: ``min(max(x, alpha), beta)`` (ReLU6, Hardtanh, Clip);
    * ``hard_sigmoid``: ``min(max(alpha·x + beta, 0), 1)``;
    * ``prelu``: ``x > 0 ? x : slope[c]·x``, ``slope`` one per channel (the last axis) or one;
    * ``exp``, ``neg``, ``sqrt``, ``softsign`` (``x / (1 + |x|)``), ``log_softmax`` (last axis)."""

    kind: str = "linear"
    alpha: float = 0.0  # leaky_relu's negative slope; see above
    beta: float = 0.0
    slope: np.ndarray | None = field(repr=False, default=None)


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


def _pairs(v: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    (a, b), (c, d) = v
    return (int(a), int(b)), (int(c), int(d))


@dataclass
class Conv2D(Layer):
    """Channels-last 2-D convolution over ``(rows, cols, channels)``: ``w`` is ``(kh, kw,
    c_in, c_out)`` (Keras' layout), ``stride`` and ``dilation`` (rows, cols), ``pad``
    ``((top, bottom), (left, right))`` zeros. A grouped convolution is read as its
    block-diagonal dense kernel (zeros between the groups): the same function."""

    w: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0, 0, 0), np.float32))
    b: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    pad: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        (t, b), (lft, r) = _pairs(self.pad)
        out = []
        for n, p, k, d, s in ((shape[0], t + b, self.w.shape[0], self.dilation[0], self.stride[0]),
                              (shape[1], lft + r, self.w.shape[1], self.dilation[1], self.stride[1])):
            out.append((n + p - (k - 1) * d - 1) // s + 1)
        return (out[0], out[1], self.w.shape[3])


@dataclass
class Pool2D(Layer):
    """Max or average pooling over ``(rows, cols, channels)``, per channel: ``size``,
    ``stride``, ``dilation`` (rows, cols) and ``pad`` ``((top, bottom), (left, right))``.
    Padded cells never win a max; an average counts them (as zeros) only with ``count_pad``
    (torch's ``count_include_pad``, ONNX's attribute; Keras' ``'same'`` does not)."""

    kind: str = "max"  # max | avg
    size: tuple[int, int] = (2, 2)
    stride: tuple[int, int] = (2, 2)
    dilation: tuple[int, int] = (1, 1)
    pad: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    count_pad: bool = False

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        (t, b), (lft, r) = _pairs(self.pad)
        out = []
        for n, p, k, d, s in ((shape[0], t + b, self.size[0], self.dilation[0], self.stride[0]),
                              (shape[1], lft + r, self.size[1], self.dilation[1], self.stride[1])):
            out.append((n + p - (k - 1) * d - 1) // s + 1)
        return (out[0], out[1], shape[2])


@dataclass
class Pad2D(Layer):
    """Padding of rows and columns ``((top, bottom), (left, right))``: ``mode`` ``constant``
    (with ``value``), ``reflect`` (mirrored, the edge not repeated) or ``edge`` (the edge
    repeated); :func:`extract` folds a zero padding into a Conv2D right after it."""

    pad: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    mode: str = "constant"
    value: float = 0.0

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        (t, b), (lft, r) = _pairs(self.pad)
        return (shape[0] + t + b, shape[1] + lft + r, *shape[2:])


@dataclass
class Reshape(Layer):
    """The per-sample tensor read as ``shape`` in row-major order (its memory unchanged): a
    Keras ``Reshape``, or ``(rows, cols, channels)`` as ``(rows·cols, channels)`` before a
    global pooling."""

    shape: tuple[int, ...] = ()

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(int(d) for d in self.shape)


@dataclass
class Concat(Layer):
    """``y = concat(branch(x) for branch in branches)`` on the last axis (the channels): sub-
    chains from one value (an empty one is the identity), as an inception module's. A layer
    holding chains for the reason :class:`Residual` is one: the chain stays a chain for every
    consumer."""

    branches: list[list[Layer]] = field(default_factory=list)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        outs = [chain_shape(b, shape) for b in self.branches]
        return (*outs[0][:-1], sum(o[-1] for o in outs))


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
class Transpose(Layer):
    """The per-sample axes permuted: output axis ``i`` is input axis ``perm[i]``. The default
    swaps two, ``(A, B) → (B, A)``: a channels-first input ``(channels, time)`` as the IR's
    channels-last ``(time, channels)``; ``(1, 2, 0)`` takes ``(channels, rows, cols)`` to
    ``(rows, cols, channels)``. Read from the op that consumes the model's input (a Conv,
    pool or batch norm over axis 1), and back for an output the model keeps channels-first."""

    perm: tuple[int, ...] = (1, 0)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape[p] for p in self.perm)


@dataclass
class Pad1D(Layer):
    """Zero padding of the time axis: ``pad`` (left, right) steps (``F.pad``, ZeroPadding1D,
    an ONNX Pad); :func:`extract` folds it into a Conv1D right after it."""

    pad: tuple[int, int] = (0, 0)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[0] + self.pad[0] + self.pad[1], *shape[1:])


@dataclass
class TimeSlice(Layer):
    """Steps ``start:stop`` of the time axis (``x[:, a:b]``; a Conv's right padding cut
    off); ``keep=False`` takes one step and drops the axis (``x[:, -1]``)."""

    start: int = 0
    stop: int = 1
    keep: bool = True

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (self.stop - self.start, *shape[1:]) if self.keep else tuple(shape[1:])


@dataclass
class Residual(Layer):
    """``y = body(x) + shortcut(x)``: two sub-chains from one value, added (an empty
    ``shortcut`` is the identity). Why a layer holding chains and not a graph of named values:
    every model desks write merges only this way (TCN blocks, a transformer's two residuals),
    and the chain stays a chain for every consumer — emitters recurse into the two lists, a
    target that cannot add refuses one layer type by name, and the float reference, int8
    calibration and shape checks keep their one loop."""

    body: list[Layer] = field(default_factory=list)
    shortcut: list[Layer] = field(default_factory=list)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return chain_shape(self.body, shape)


@dataclass
class LayerNorm(Layer):
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over the last axis (per time step)."""

    gamma: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))
    beta: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))
    eps: float = 1e-5


@dataclass
class Bidirectional(Layer):
    """Two recurrent layers over the window, ``backward`` over it reversed, outputs
    concatenated on channels (forward first); with ``return_sequences`` the backward
    sequence is put back in time order (Keras', torch's and ONNX's convention)."""

    forward: Recurrent = field(default_factory=lambda: Recurrent("fw"))
    backward: Recurrent = field(default_factory=lambda: Recurrent("bw"))

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        f, b = self.forward.out_shape(shape), self.backward.out_shape(shape)
        return (*f[:-1], f[-1] + b[-1])


@dataclass
class Attention(Layer):
    """Multi-head self-attention over the fixed window (T, C): per head
    ``softmax(q·kᵀ / sqrt(d)) · v`` with ``q = x·wq + bq`` (``wq`` (C, heads·d)), likewise k and
    v; heads concatenated and projected by ``wo`` (heads·d, C_out) + ``bo``. ``causal``: query
    step t attends keys 0..t only (Keras ``use_causal_mask=True``, torch ``is_causal=True``);
    no other mask is represented (a front end refuses one by name)."""

    wq: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0), np.float32))
    bq: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))
    wk: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0), np.float32))
    bk: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))
    wv: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0), np.float32))
    bv: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))
    wo: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0), np.float32))
    bo: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.float32))
    heads: int = 1
    causal: bool = False

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[0], self.wo.shape[1])


def chain_shape(layers: list[Layer], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The output shape of ``layers`` applied in turn to ``shape``."""
    for layer in layers:
        shape = layer.out_shape(shape)
    return tuple(shape)


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



#: ONNX ops :func:`extract` takes, as refusals list them.
ONNX_OPS = ("Gemm, MatMul (+ Add), Relu, LeakyRelu, Tanh, Sigmoid, Softmax, Elu, Selu, Softplus, "
            "LogSoftmax (last axis), Clip (constant bounds), Exp, Neg, Sqrt, PRelu (one slope or one "
            "per channel), HardSigmoid, Softsign, BatchNormalization (eval, over the channels), "
            "Conv (1-D or 2-D, any group), "
            "MaxPool/AveragePool (2-D: pads, dilations; 1-D likewise), GlobalAveragePool/GlobalMaxPool, "
            "ReduceMean/ReduceMax over time, ReduceMean/ReduceMax/ReduceSum over an image's rows "
            "and/or columns, Pad of an image (constant/reflect/edge), Concat of branches on the "
            "channels, Reshape merging adjacent axes, LSTM/GRU (forward or bidirectional, stacked nodes, tanh/sigmoid, zero "
            "initial state), LayerNormalization (last axis), Pad (zeros along time), Gather/Slice "
            "of time, Add of two branches from one tensor (residual), Flatten/Reshape to (batch, "
            "features), "
            "Transpose/Squeeze/Unsqueeze, Identity, Dropout, Cast, and the Shape arithmetic "
            "around them")

TORCH_OPS = ("Linear, ReLU, LeakyReLU, Tanh, Sigmoid, Softmax, GELU, ELU, SELU, Softplus, LogSoftmax, "
             "ReLU6/Hardtanh/clamp (number bounds), Hardsigmoid, PReLU (one slope, or one per "
             "channel on dim 1), exp, neg, sqrt, BatchNorm1d (eval), LayerNorm "
             "(over the channels), Dropout (eval), Conv1d/Conv2d (any groups), F.pad with zeros "
             "along time, F.pad of an image (constant/reflect/replicate), MaxPool1d/AvgPool1d (no "
             "padding), MaxPool2d/AvgPool2d, AdaptiveAvgPool1d(1)/2d(1), BatchNorm2d (eval), "
             "torch.cat of branches on the channels, mean/amax over time or an image's rows/cols, LSTM/GRU "
             "(stacked, bidirectional, zero initial state), time indexing and contiguous slices "
             "(x[:, -1], x[..., :-p]), residual adds (a + b of two branches from one tensor), "
             "transpose/permute/(un)squeeze, flatten/view to (batch, features) or merging adjacent "
             "axes, Linear per time "
             "step, self-attention (nn.MultiheadAttention, F.scaled_dot_product_attention, "
             "softmax(q·kᵀ)·v; is_causal=True or no mask, no attn_mask, self-attention only), "
             "nn.TransformerEncoderLayer (eval)")

def ungroup(w: np.ndarray, groups: int) -> np.ndarray:
    """A grouped convolution's kernel ``(…, c_in / groups, c_out)`` as the dense ``(…, c_in,
    c_out)`` kernel computing the same function: group ``g``'s outputs read only its inputs,
    zeros elsewhere (a depthwise convolution is ``groups = c_in``)."""
    w = np.asarray(w)
    if groups == 1:
        return w
    cig, co = w.shape[-2], w.shape[-1]
    cog = co // groups
    out = np.zeros((*w.shape[:-2], cig * groups, co), w.dtype)
    for g in range(groups):
        out[..., g * cig:(g + 1) * cig, g * cog:(g + 1) * cog] = w[..., g * cog:(g + 1) * cog]
    return out


def f32(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, np.float32))


def first(v: Any) -> int:
    return int(v[0] if isinstance(v, (list, tuple)) else v)
