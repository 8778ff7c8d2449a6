"""Keras / PyTorch sequential models → a plain list of dense layers (weights as NumPy).

da4ml builds hardware from constant matrices, so all the target needs from a model is, per
layer, its weight matrix, bias and activation. BatchNormalization folds into the preceding
Dense (inference: an affine map per unit). Anything else is refused by name, with what would
make it possible.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hwbackends.errors import UnsupportedError

from .._shared import batchnorm
from .._shared.torch_export import as_sequential

#: Activations this target implements (tables for the nonlinear ones, see design.py).
ACTIVATIONS = ("linear", "relu", "tanh", "sigmoid", "softmax")
_KERAS_SKIP = {"InputLayer", "Dropout", "GaussianNoise", "ActivityRegularization", "Flatten"}
_RECURRENT_HINT = (
    "recurrent layers are outside da4ml's scope (it compiles feed-forward graphs). What would "
    "make it possible: unrolling the fixed window by hand (per tick: the gate matmuls as adder "
    "trees, sigmoid/tanh as lookup tables, the cell state as a fixed-point add/multiply); for "
    "zoo:lstm (16 ticks × 32 units) that is 16 copies of a 40→128 matmul plus 2,560 table "
    "lookups, well beyond one FPGA's LUTs at full parallelism. Use fpga.hls4ml for the LSTM's "
    "numerics, or a smaller window/hidden size")


@dataclass
class DenseLayer:
    """``y = act(x @ w + b)``; ``w`` is (n_in, n_out)."""

    name: str
    w: np.ndarray
    b: np.ndarray
    activation: str = "linear"

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Float reference of this layer (range measurement for the precision search)."""
        return activate(x @ self.w + self.b, self.activation)


def activate(y: np.ndarray, act: str) -> np.ndarray:
    if act == "relu":
        return np.maximum(y, 0)
    if act == "tanh":
        return np.tanh(y)
    if act == "sigmoid":
        return 1 / (1 + np.exp(-y))
    if act == "softmax":
        e = np.exp(y - y.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return y


def extract(model: Any) -> list[DenseLayer]:
    """The model's layers as :class:`DenseLayer` (activations merged into their Dense)."""
    if model.format == "keras":
        layers = _keras(model.obj)
    elif model.format == "torch":
        layers = _torch(model.obj)
    else:
        raise UnsupportedError(f"fpga.da4ml compiles Keras or PyTorch models; got format {model.format!r}")
    if not layers:
        raise UnsupportedError("fpga.da4ml found no Dense/Linear layer in the model")
    if len(model.input.shape) != 1:
        raise UnsupportedError(f"fpga.da4ml compiles models over a flat feature vector; the input "
                               f"has shape {model.input.shape}")
    return layers


def _set_activation(layers: list[DenseLayer], act: str, where: str) -> None:
    act = act.lower()
    if act not in ACTIVATIONS:
        raise UnsupportedError(f"fpga.da4ml: activation {act!r} ({where}) is not implemented; "
                               f"supported: {', '.join(ACTIVATIONS)}")
    if act == "linear":
        return
    if not layers or layers[-1].activation != "linear":
        raise UnsupportedError(f"fpga.da4ml: activation {act!r} ({where}) must follow a Dense/Linear "
                               f"layer without an activation of its own")
    layers[-1].activation = act


def _keras(m: Any) -> list[DenseLayer]:
    out: list[DenseLayer] = []
    for layer in m.layers:
        cls = type(layer).__name__
        if cls in _KERAS_SKIP:
            continue
        if cls == "Dense":
            w, b = (layer.get_weights() + [None])[:2]
            b = np.zeros(w.shape[1], np.float32) if b is None else b
            out.append(DenseLayer(layer.name, np.asarray(w, np.float64), np.asarray(b, np.float64)))
            _set_activation(out, _keras_act(layer.activation), layer.name)
        elif cls == "Activation":
            _set_activation(out, _keras_act(layer.activation), layer.name)
        elif cls == "ReLU":
            _set_activation(out, "relu", layer.name)
        elif cls == "Softmax":
            _set_activation(out, "softmax", layer.name)
        elif cls == "BatchNormalization":
            _fold_bn(out, layer.name, *batchnorm.keras_affine(layer))
        elif cls in ("LSTM", "GRU", "SimpleRNN"):
            raise UnsupportedError(f"fpga.da4ml cannot compile layer {layer.name!r} ({cls}): {_RECURRENT_HINT}")
        else:
            raise UnsupportedError(f"fpga.da4ml cannot compile layer {layer.name!r} ({cls}); supported: "
                                   f"Dense, Activation/ReLU/Softmax, BatchNormalization (folded), Dropout")
    return out


def _keras_act(fn: Any) -> str:
    name = getattr(fn, "__name__", str(fn))
    return "linear" if name in ("linear", "None") else name


def _fold_bn(layers: list[DenseLayer], name: str, scale: np.ndarray, shift: np.ndarray) -> None:
    if not layers or layers[-1].activation != "linear":
        raise UnsupportedError(f"fpga.da4ml cannot compile BatchNormalization {name!r}: {batchnorm.WHERE}; "
                               f"it must directly follow a Dense/Linear without activation")
    last = layers[-1]
    last.w, last.b = batchnorm.fold(last.w, last.b, scale, shift)


def _torch(m: Any) -> list[DenseLayer]:
    import torch.nn as nn

    # The compile worker receives torch.export programs (the core's transport format).
    m = as_sequential(m, "fpga.da4ml", "Pass an nn.Sequential of those modules, or its Keras twin")
    mods = list(m.children()) if isinstance(m, nn.Sequential) else None
    if mods is None:
        raise UnsupportedError(f"fpga.da4ml compiles torch.nn.Sequential models; got "
                               f"{type(m).__name__} (recurrent or custom forward: {_RECURRENT_HINT})")
    out: list[DenseLayer] = []
    acts = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Softmax: "softmax"}
    for i, mod in enumerate(mods):
        if isinstance(mod, nn.Linear):
            w = mod.weight.detach().cpu().numpy().T.astype(np.float64)
            b = (mod.bias.detach().cpu().numpy().astype(np.float64) if mod.bias is not None
                 else np.zeros(w.shape[1]))
            out.append(DenseLayer(f"linear_{i}", w, b))
        elif type(mod) in acts:
            _set_activation(out, acts[type(mod)], f"module {i}")
        elif isinstance(mod, nn.BatchNorm1d):
            _fold_bn(out, f"module {i}", *batchnorm.torch_affine(mod))
        elif isinstance(mod, (nn.Dropout, nn.Identity, nn.Flatten)):
            continue
        else:
            raise UnsupportedError(f"fpga.da4ml cannot compile module {i} ({type(mod).__name__}); "
                                   f"supported: Linear, ReLU, Tanh, Sigmoid, Softmax, BatchNorm1d (folded), Dropout")
    return out
