"""Keras / PyTorch sequential models → the dense layers da4ml builds hardware from.

da4ml builds hardware from constant matrices, so all the target needs from a model is, per
layer, its weight matrix, bias and activation: the shared layer IR
(:mod:`hwbackends.layer_ir`, also ``cpu.native``'s) read in float64 and viewed as
:class:`DenseLayer` (BatchNormalization folded into the preceding Dense). What this target
adds is its scope: which activations it implements and why it refuses what the IR reads but
da4ml cannot build (recurrent and convolution layers).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hwbackends import layer_ir
from hwbackends.contract import UnsupportedError
from hwbackends.layer_ir import DenseAct as DenseLayer
from hwbackends.layer_ir import activate, batchnorm

__all__ = ["ACTIVATIONS", "SUPPORTED", "DenseLayer", "activate", "extract"]

TARGET = "fpga.da4ml"
#: Activations this target implements (tables for the nonlinear ones, see design.py).
ACTIVATIONS = ("linear", "relu", "tanh", "sigmoid", "softmax")
#: What this target builds (its refusals and docs/targets-fpga.md list it).
SUPPORTED = ("Dense/Linear, Activation/ReLU/Softmax (relu, tanh, sigmoid, softmax), "
              "BatchNormalization (folded), Flatten, Dropout; Conv1D (any padding, stride, "
              "dilation) at the start, followed by relu/tanh/sigmoid/linear and a Flatten, "
              "built as its constant matrix; a channels-first (batch, channels, time) input "
              "read as the model holds it (PyTorch Conv1d/BatchNorm1d)")
_RECURRENT_HINT = (
    "recurrent layers are outside da4ml's scope (it compiles feed-forward graphs). What would "
    "make it possible: unrolling the fixed window by hand (per tick: the gate matmuls as adder "
    "trees, sigmoid/tanh as lookup tables, the cell state as a fixed-point add/multiply); for "
    "zoo:lstm (16 ticks × 32 units) that is 16 copies of a 40→128 matmul plus 2,560 table "
    "lookups, well beyond one FPGA's LUTs at full parallelism. Use fpga.hls4ml for the LSTM's "
    "numerics, or a smaller window/hidden size")
_WHY_NOT = {
    layer_ir.Recurrent: _RECURRENT_HINT,
    layer_ir.Conv1D: ("a Conv1D is built as its constant matrix only at the start of the "
                      "model, followed by relu/tanh/sigmoid/linear activations and a Flatten "
                      f"(pooling, BatchNormalization or softmax before the Flatten are not); "
                      f"supported: {SUPPORTED}"),
    **{cls: f"da4ml builds dense feed-forward graphs over a feature vector; supported: {SUPPORTED}"
       for cls in (layer_ir.Pool1D, layer_ir.GlobalPool1D)},
}


def extract(model: Any) -> list[DenseLayer]:
    """The model's layers as :class:`DenseLayer` (activations merged into their Dense)."""
    if model.format not in ("keras", "torch"):
        raise UnsupportedError(f"{TARGET} compiles Keras or PyTorch models; got format {model.format!r}")
    try:
        net = layer_ir.extract(model, TARGET, dtype=np.float64)
    except UnsupportedError as e:
        raise own_refusal(e) from None
    return layer_ir.dense_chain(conv_as_dense(net), TARGET, ACTIVATIONS, _WHY_NOT)


#: Element-wise activations: the same on the flattened (time, channel) tensor.
_ELEMENTWISE = ("linear", "relu", "tanh", "sigmoid")


def conv_as_dense(net: layer_ir.Network) -> layer_ir.Network:
    """``net`` with each Conv1D over the fixed window as the constant matrix it is: on the
    row-major flattened ``(T, C)`` input, ``W[t·C + c, t'·Co + o] = w[k, c, o]`` where
    ``t = t'·stride + k·dilation − pad_left`` (zero padding: no entry), the bias tiled over
    ``t'`` — a Dense da4ml builds as adder trees (the zero entries cost nothing). Done only
    when the convolutions start the network and are followed, up to a Flatten, by element-wise
    activations only; otherwise ``net`` is returned unchanged (and refused by name).

    An input the model reads channels-first, ``(C, T)`` (the IR's leading Transpose), and
    batch norms over its channels before the first Conv1D or Flatten are taken into that
    first matrix: its rows permuted to the source's ``c·T + t`` order, the affine maps folded
    in (:func:`batchnorm.fold_input`: exact, the matrix holds the convolution's zero padding
    as absent entries), so the model's own layout is fed as it is."""
    import dataclasses

    layers, shape = list(net.layers), tuple(net.input_shape)
    order = None  # per IR feature (t·C + c), the source's flat index of a channels-first input
    if len(shape) == 2 and layers and isinstance(layers[0], layer_ir.Transpose):
        c, t = shape
        order = (np.arange(c)[None, :] * t + np.arange(t)[:, None]).ravel()
        shape, layers = (t, c), layers[1:]
    affines = []
    while len(shape) == 2 and layers and isinstance(layers[0], layer_ir.Affine):
        affines.append(layers.pop(0))
    body = _conv_chain(layers, shape) if layers and isinstance(layers[0], layer_ir.Conv1D) else (
        layers[1:] if len(shape) == 2 and layers and isinstance(layers[0], layer_ir.Flatten) else None)
    if body is None or not body or not isinstance(body[0], layer_ir.Dense):
        if order is None:
            return net
        at = next((x for x in (layers if body is None else body) if not isinstance(
            x, (layer_ir.Conv1D, layer_ir.Flatten, layer_ir.Act))), layers[0] if layers else None)
        what = f"layer {at.name!r} ({type(at).__name__})" if at is not None else "the model"
        raise UnsupportedError(f"{TARGET} cannot compile {what} over the model's channels-first "
                               f"input: it reads a (batch, channels, time) input into its first "
                               f"matrix when BatchNorm1d and Conv1d layers (element-wise "
                               f"activations between) lead to a Flatten and a Dense; supported: "
                               f"{SUPPORTED}")
    first = body[0]
    w, b = np.asarray(first.w, np.float64), np.asarray(first.b, np.float64)
    for aff in reversed(affines):
        w, b = batchnorm.fold_input(w, b, np.tile(np.asarray(aff.scale, np.float64), shape[0]),
                                    np.tile(np.asarray(aff.shift, np.float64), shape[0]))
    if order is not None:
        rows = np.empty_like(w)
        rows[order] = w
        w = rows
    body[0] = dataclasses.replace(first, w=w, b=b)
    return dataclasses.replace(net, input_shape=(int(np.prod(net.input_shape)),), layers=body)


def _conv_chain(layers: list[Any], shape: tuple[int, ...]) -> list[Any] | None:
    """The Conv1D layers (and element-wise activations) up to a Flatten over ``shape`` as
    their Toeplitz Dense layers, then the layers after the Flatten; None when anything else
    comes before the Flatten, or there is none."""
    s, out = tuple(shape), []
    for i, layer in enumerate(layers):
        if isinstance(layer, layer_ir.Flatten):
            return out + list(layers[i + 1:])
        if isinstance(layer, layer_ir.Conv1D):
            o = layer.out_shape(s)
            out.append(layer_ir.Dense(name=layer.name, w=_toeplitz(layer, s, o),
                                      b=np.tile(np.asarray(layer.b, np.float64), o[0])))
            s = o
        elif isinstance(layer, layer_ir.Act) and layer.kind in _ELEMENTWISE:
            out.append(layer)
        else:
            return None
    return None


def _toeplitz(conv: layer_ir.Conv1D, shape: tuple[int, ...], out: tuple[int, ...]) -> np.ndarray:
    (t_in, c_in), (t_out, c_out) = shape, out
    w = np.asarray(conv.w, np.float64)  # (kernel, c_in, c_out)
    m = np.zeros((t_in * c_in, t_out * c_out))
    for tp in range(t_out):
        for k in range(w.shape[0]):
            t = tp * conv.stride + k * conv.dilation - conv.pad[0]
            if 0 <= t < t_in:
                m[t * c_in:(t + 1) * c_in, tp * c_out:(tp + 1) * c_out] += w[k]
    return m


def own_refusal(e: UnsupportedError) -> UnsupportedError:
    """The layer IR's refusal with this target's supported set in place of the IR's: the IR
    reads many layers (cpu.native's list: LSTM, Conv1D, attention …) da4ml does not build, so
    its list would promise them. Its refusals end in ``". Supported: <the IR's list>"``."""
    msg = str(e)
    head = msg.split(". Supported: ", 1)[0]
    hint = f" ({_RECURRENT_HINT})" if "own forward" in msg else ""
    return UnsupportedError(f"{head}{hint}. {TARGET} (da4ml) compiles: {SUPPORTED}. For "
                            f"other layers pick fpga.hls4ml (hls4ml's layer set) or a CPU target")
