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
from hwbackends.layer_ir import activate

__all__ = ["ACTIVATIONS", "SUPPORTED", "DenseLayer", "activate", "extract"]

TARGET = "fpga.da4ml"
#: Activations this target implements (tables for the nonlinear ones, see design.py).
ACTIVATIONS = ("linear", "relu", "tanh", "sigmoid", "softmax")
#: What this target builds (its refusals and docs/targets-fpga.md list it).
SUPPORTED = ("Dense/Linear, Activation/ReLU/Softmax (relu, tanh, sigmoid, softmax), "
              "BatchNormalization (folded), Flatten, Dropout; Conv1D (any padding, stride, "
              "dilation) at the start, followed by relu/tanh/sigmoid/linear and a Flatten, "
              "built as its constant matrix")
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
    activations only; otherwise ``net`` is returned unchanged (and refused by name)."""
    import dataclasses

    if not net.layers or not isinstance(net.layers[0], layer_ir.Conv1D) or len(net.input_shape) != 2:
        return net
    s, layers = tuple(net.input_shape), []
    for i, layer in enumerate(net.layers):
        if isinstance(layer, layer_ir.Flatten):
            layers.extend(net.layers[i:])
            return dataclasses.replace(net, input_shape=(int(np.prod(net.input_shape)),),
                                       layers=layers)
        if isinstance(layer, layer_ir.Conv1D):
            out = layer.out_shape(s)
            layers.append(layer_ir.Dense(name=layer.name, w=_toeplitz(layer, s, out),
                                         b=np.tile(np.asarray(layer.b, np.float64), out[0])))
            s = out
        elif isinstance(layer, layer_ir.Act) and layer.kind in _ELEMENTWISE:
            layers.append(layer)
        else:
            return net
    return net


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
