"""The ``auto`` search's first guess for fpga.hls4ml: the model in float64 with the rounding
and the lookup tables of the design :func:`.precision.assign` builds at ``f`` fractional bits.

The search needs two builds at least (the answer, and one bit less failing); started from the
error budget alone it spends one to three more. This model takes milliseconds and,
on the zoo and the classifiers of the tests, lands on the search's answer or next to it; the
builds still decide. What it models, from hls4ml 1.3's ``nnet_activation.h``:

* every layer output rounded to ``f`` bits (``AP_RND``), weights to the weight fraction;
* sigmoid/tanh: a table of :func:`.precision.table_size` entries over [-8, 8) / [-4, 4),
  indexed by ``int(x·N/span)`` (ap_fixed → int truncates toward zero, as C does), entries
  rounded to the table type's ``max(f+2, 16)`` bits;
* the stable softmax: ``max - x`` indexing the exp table by its top bits (the input type's
  integer bits, ``TableSize`` entries as ``precision._softmax`` sets them, capped as hls4ml's
  FixSoftmaxTableSize does), entries and their sum at ``f`` bits, the sum indexing the
  inverse table by its top bits;
* the LSTM (``nnet_recurrent.h``; its input, result and accumulator are one type,
  ``precision._unify_recurrent``): per step, every product of the two matmuls rounded to
  ``f`` and summed, the gates through the tables above, the cell state and the output
  rounded to ``f``. On zoo:lstm its rel_err equals the C-simulation's to the digit at
  f=10, 11 and at f=11 with 7 and 9 weight bits.

Not modelled: saturation, accumulators of the other layers, GRU (:func:`first_bits` gives
None for a model with one, and the search starts from the error budget).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from hwbackends.layer_ir import Act, Recurrent, extract

from .._shared.fixed_point import FidelityTarget, int_bits, predict_bits, round_to
from .precision import table_size


def _floor_to(x: np.ndarray, step: float) -> np.ndarray:
    return np.floor(x / step) * step


def _table(x: np.ndarray, f: int, kind: str) -> np.ndarray:
    """hls4ml's sigmoid / tanh: ``index = int(x·N/span) + N/2`` (toward zero, clipped), the
    entry the float function at the index's point."""
    n = table_size(f)
    span = 16.0 if kind == "sigmoid" else 8.0
    idx = np.clip(np.trunc(x * n / span) + n // 2, 0, n - 1)
    v = (idx - n // 2) * span / n
    y = 1.0 / (1.0 + np.exp(-v)) if kind == "sigmoid" else np.tanh(v)
    return round_to(y, max(f + 2, 16))


def _softmax(x: np.ndarray, f: int) -> np.ndarray:
    n = x.shape[-1]
    s = max(1, math.ceil(math.log2(max(n, 2))))
    i_in = int_bits(float(np.abs(x).max()), True, headroom=1)
    bits = int(min(16, max(10, max(i_in - 1, 1 + s) + f - 2)))
    # hls4ml caps the table at the input's and the inverse table type's (ufixed<1+f>) widths
    # (FixSoftmaxTableSize), and the exp table at the normalised input's (ufixed<i_in-1+f>).
    bits = min(bits, i_in + f, 1 + f)
    exp_bits = min(bits, i_in - 1 + f)
    d = np.minimum(x.max(axis=-1, keepdims=True) - x, 2.0 ** (i_in - 1) - 2.0 ** -f)
    e = round_to(np.exp(-_floor_to(d, 2.0 ** (i_in - 1 - exp_bits))), f)
    step = 2.0 ** (1 + s - bits)
    inv = np.minimum(round_to(1.0 / np.maximum(_floor_to(e.sum(axis=-1, keepdims=True), step), step), f),
                     2.0 - 2.0 ** -f)
    return e * inv


def _lstm(layer: Any, x: np.ndarray, f: int, fw: int) -> np.ndarray:
    """hls4ml's io_parallel LSTM over the window (``nnet::lstm_static`` per step)."""
    u = layer.units
    k, r, b = (round_to(a.astype(np.float64), fw) for a in (layer.kernel, layer.recurrent, layer.bias))

    scale = 2.0 ** f
    ks, rs = k * scale, r * scale  # exact: f + fw + a few integer bits < 53

    def matmul(v: np.ndarray, ws: np.ndarray) -> np.ndarray:
        """dense_latency: every product rounded to accum_t (f bits, half up), then summed; one
        input row at a time (a (n, G·u) slab stays in cache: 2x faster than one 3-D array)."""
        acc, tmp = np.zeros((len(v), ws.shape[1])), np.empty((len(v), ws.shape[1]))
        for j in range(ws.shape[0]):
            np.multiply(v[:, j:j + 1], ws[j], out=tmp)
            tmp += 0.5
            np.floor(tmp, out=tmp)
            acc += tmp
        return acc / scale

    def sig(v: np.ndarray) -> np.ndarray:
        return round_to(_table(v, f, "sigmoid"), f)

    def tanh(v: np.ndarray) -> np.ndarray:
        return round_to(_table(v, f, "tanh"), f)

    h, c, seq = np.zeros((len(x), u)), np.zeros((len(x), u)), []
    for t in range(x.shape[1]):
        z = matmul(x[:, t], ks) + b + matmul(h, rs)
        i, fg, g, o = sig(z[:, :u]), sig(z[:, u:2 * u]), tanh(z[:, 2 * u:3 * u]), sig(z[:, 3 * u:])
        c = round_to(g * i + c * fg, f)
        h = round_to(o * tanh(c), f)
        seq.append(h)
    return np.stack(seq, 1) if layer.return_sequences else h


def layer_model(layer: Any, x: np.ndarray, f: int, fw: int) -> np.ndarray | None:
    """The design's own version of ``layer`` (fixed_point.LayerModel), or None: generic."""
    if isinstance(layer, Recurrent):
        return _lstm(layer, x, f, fw) if layer.cell == "lstm" else None
    if not isinstance(layer, Act):
        return None
    if layer.kind in ("sigmoid", "tanh"):
        return _table(x, f, layer.kind)
    if layer.kind == "softmax" and x.ndim == 2:
        return _softmax(x, f)
    return None


def network(model: Any) -> Any:
    """The layer IR of ``model``, or None. Any failure means "no model of the design": the
    search then starts from the error budget and traces the C-simulation, as it would for a
    layer the IR does not read; an accelerator must not fail a compile hls4ml can make."""
    try:
        return extract(model, "fpga.hls4ml", dtype=np.float64)
    except Exception:
        return None


def first_bits(net: Any, x: np.ndarray, ref: np.ndarray,
               target: FidelityTarget) -> tuple[int, int] | None:
    """(data ``f``, weight ``fw``) predicted for ``net`` (:func:`network` of the model as
    :func:`.convert.for_hls4ml` gives it), or None where the model does not apply (no
    network, a GRU)."""
    if net is None or any(isinstance(layer, Recurrent) and layer.cell != "lstm" for layer in net.layers):
        return None
    return predict_bits(net, x, ref, target, layer_model)


#: hls4ml layer classes each layer-IR type may stand for, in a graph converted from the same
#: model (activations split off, BatchNormalization folded before conversion).
_CLASSES = {"Dense": ("Dense",), "Act": ("Activation", "Softmax", "ReLU", "LeakyReLU",
                                         "ParametrizedActivation", "TanH", "Sigmoid"),
            "Conv1D": ("Conv1D",), "Pool1D": ("Pooling1D",), "GlobalPool1D": ("GlobalPooling1D",),
            "Recurrent": ("LSTM", "GRU")}


def float_trace(net: Any, hmodel: Any, x: np.ndarray) -> dict[str, np.ndarray] | None:
    """Every layer's float output on ``x``, keyed by the name of the hls4ml layer it is, for
    the range measurement (:func:`.precision.measure_ranges`) without a C-simulation build.
    None unless the hls4ml graph (``hmodel``, converted from ``model``) is the layer IR's chain
    one for one, class and shape (then the C-simulation's trace measures the ranges).
    ``net``: :func:`network` of the model ``hmodel`` was converted from."""
    from hwbackends.layer_ir import reference

    if net is None:
        return None
    layers = [layer for layer in hmodel.get_layers() if layer.class_name != "Input"]
    if len(layers) != len(net.layers):
        return None
    h, out = np.asarray(x, dtype=np.float64).reshape(len(x), *net.input_shape), {}
    for hl, il in zip(layers, net.layers, strict=True):
        if hl.class_name not in _CLASSES.get(type(il).__name__, ()):
            return None
        h = reference.apply(il, h)
        if tuple(h.shape[1:]) != tuple(int(d) for d in hl.get_output_variable().shape):
            return None
        out[hl.name] = h
    return out
