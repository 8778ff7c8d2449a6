"""The float64 NumPy reference of the IR, and the Dense-only view of a network."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

from . import batchnorm
from .ir import (
    ACTIVATIONS,
    Act,
    Affine,
    Attention,
    Bidirectional,
    Concat,
    Conv1D,
    Conv2D,
    Dense,
    Flatten,
    GlobalPool1D,
    Layer,
    LayerNorm,
    Network,
    Pad1D,
    Pad2D,
    Pool1D,
    Pool2D,
    Recurrent,
    Reshape,
    Residual,
    TimeSlice,
    Transpose,
)


# -- the float64 reference of the IR -----------------------------------------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x: np.ndarray) -> np.ndarray:  # exact: x·Φ(x)
    from math import erf
    return 0.5 * x * (1.0 + np.vectorize(erf, otypes=[np.float64])(x / np.sqrt(2.0)))


def _softplus(x: np.ndarray, a: float, thr: float) -> np.ndarray:
    z = a * x
    return np.where(z > thr, x, (np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))) / a)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _sqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # NaN below 0, as the framework gives
        return np.sqrt(x)


def _prelu(x: np.ndarray, slope: np.ndarray | None) -> np.ndarray:
    s = np.asarray(slope, np.float64)
    return np.where(x > 0, x, (s if s.size > 1 else s.reshape(())) * x)


#: kind → f(x, alpha, beta, slope), parameters as :class:`~.ir.Act` holds them
_ACT: dict[str, Any] = {
    "linear": lambda x, a, b, s: x,
    "relu": lambda x, a, b, s: np.maximum(x, 0),
    "leaky_relu": lambda x, a, b, s: np.where(x >= 0, x, a * x),
    "tanh": lambda x, a, b, s: np.tanh(x),
    "sigmoid": lambda x, a, b, s: _sigmoid(x),
    "softmax": lambda x, a, b, s: _softmax(x),
    "gelu": lambda x, a, b, s: _gelu(x),
    "gelu_tanh": lambda x, a, b, s: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3))),
    "elu": lambda x, a, b, s: b * np.where(x > 0, x, a * np.expm1(np.minimum(x, 0))),
    "softplus": lambda x, a, b, s: _softplus(x, a, b),
    "log_softmax": lambda x, a, b, s: _log_softmax(x),
    "clip": lambda x, a, b, s: np.minimum(np.maximum(x, a), b),
    "hard_sigmoid": lambda x, a, b, s: np.clip(a * x + b, 0.0, 1.0),
    "prelu": lambda x, a, b, s: _prelu(x, s),
    "exp": lambda x, a, b, s: np.exp(x),
    "neg": lambda x, a, b, s: -x,
    "sqrt": lambda x, a, b, s: _sqrt(x),
    "softsign": lambda x, a, b, s: x / (1.0 + np.abs(x)),
}


def activate(x: np.ndarray, kind: str, alpha: float = 0.0, beta: float = 0.0,
             slope: np.ndarray | None = None) -> np.ndarray:
    """``kind`` (:data:`~.ir.ACTIVATIONS`, parameters as :class:`~.ir.Act` holds them) on ``x``."""
    if kind not in _ACT:
        raise ValueError(f"activation {kind!r} has no reference")
    return _ACT[kind](x, alpha, beta, slope)


def apply(layer: Layer, x: np.ndarray) -> np.ndarray:
    """One layer on a batch ``x`` of shape ``(n, *in_shape)``, in float64."""
    if isinstance(layer, Dense):
        return x @ layer.w.astype(np.float64) + layer.b
    if isinstance(layer, Act):
        return activate(x, layer.kind, layer.alpha, layer.beta, layer.slope)
    if isinstance(layer, Affine):
        return x * layer.scale + layer.shift
    if isinstance(layer, Transpose):
        return np.transpose(x, (0, *(p + 1 for p in layer.perm)))
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
    if isinstance(layer, (Conv2D, Pool2D, Pad2D, Reshape, Concat)):
        return _apply_2d(layer, x)
    return _apply_desk(layer, x)


def _taps(xp: np.ndarray, size: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
          out: tuple[int, int]) -> list[tuple[int, int, np.ndarray]]:
    """Per window tap ``(i, j)`` the padded input's cells it reads for every output cell:
    ``(n, out_rows, out_cols, channels)``."""
    (oh, ow), (sh, sw), (dh, dw) = out, stride, dilation
    return [(i, j, xp[:, i * dh: i * dh + (oh - 1) * sh + 1: sh, j * dw: j * dw + (ow - 1) * sw + 1: sw])
            for i in range(size[0]) for j in range(size[1])]


def _apply_2d(layer: Layer, x: np.ndarray) -> np.ndarray:
    """The layers over ``(rows, cols, channels)``, a reshape, a concatenation of branches."""
    if isinstance(layer, Reshape):
        return x.reshape(len(x), *layer.shape)
    if isinstance(layer, Concat):
        return np.concatenate([run_chain(b, x) for b in layer.branches], axis=-1)
    pad = ((0, 0), *layer.pad, (0, 0))  # type: ignore[attr-defined]
    if isinstance(layer, Pad2D):
        if layer.mode == "constant":
            return np.pad(x, pad, constant_values=layer.value)
        return np.pad(x, pad, mode=layer.mode)
    oh, ow, _ = layer.out_shape(x.shape[1:])
    if isinstance(layer, Conv2D):
        w = layer.w.astype(np.float64)
        y = np.zeros((len(x), oh, ow, w.shape[3])) + layer.b
        for i, j, cells in _taps(np.pad(x, pad), w.shape[:2], layer.stride, layer.dilation, (oh, ow)):
            y = y + cells @ w[i, j]
        return y
    assert isinstance(layer, Pool2D)
    taps = _taps(np.pad(x, pad, constant_values=-np.inf if layer.kind == "max" else 0.0),
                 layer.size, layer.stride, layer.dilation, (oh, ow))
    if layer.kind == "max":
        return np.max(np.stack([c for _, _, c in taps]), axis=0)
    total = np.sum(np.stack([c for _, _, c in taps]), axis=0)
    if layer.count_pad:
        return total / len(taps)
    inside = np.pad(np.ones((1, *x.shape[1:3], 1)), pad)
    count = np.sum(np.stack([c for _, _, c in _taps(inside, layer.size, layer.stride, layer.dilation,
                                                     (oh, ow))]), axis=0)
    return total / count


def _apply_desk(layer: Layer, x: np.ndarray) -> np.ndarray:
    """Padding, slicing, residual, layer norm, bidirectional recurrence, attention."""
    if isinstance(layer, Pad1D):
        return np.pad(x, ((0, 0), layer.pad, (0, 0)))
    if isinstance(layer, TimeSlice):
        return x[:, layer.start:layer.stop] if layer.keep else x[:, layer.start]
    if isinstance(layer, Residual):
        return run_chain(layer.body, x) + run_chain(layer.shortcut, x)
    if isinstance(layer, LayerNorm):
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + layer.eps) * layer.gamma.astype(np.float64) + layer.beta
    if isinstance(layer, Bidirectional):
        f = _recurrent(layer.forward, x)
        b = _recurrent(layer.backward, x[:, ::-1])
        return np.concatenate([f, b[:, ::-1] if layer.backward.return_sequences else b], -1)
    if isinstance(layer, Attention):
        return _attention(layer, x)
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


def _attention(layer: Attention, x: np.ndarray) -> np.ndarray:
    h = layer.heads
    q, k, v = (x @ w.astype(np.float64) + b for w, b in ((layer.wq, layer.bq), (layer.wk, layer.bk),
                                                      (layer.wv, layer.bv)))
    d = q.shape[-1] // h
    outs = []
    for j in range(h):
        sl = slice(j * d, (j + 1) * d)
        s = q[..., sl] @ np.swapaxes(k[..., sl], 1, 2) / np.sqrt(d)
        if layer.causal:  # query t sees keys 0..t
            s = np.where(np.tri(s.shape[-2], s.shape[-1], dtype=bool), s, -np.inf)
        outs.append(activate(s, "softmax") @ v[..., sl])
    return np.concatenate(outs, -1) @ layer.wo.astype(np.float64) + layer.bo


def run_chain(layers: list[Layer], x: np.ndarray) -> np.ndarray:
    """``layers`` applied in turn to the batch ``x`` (float64)."""
    y = np.asarray(x, np.float64)
    for layer in layers:
        y = apply(layer, y)
    return y


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
