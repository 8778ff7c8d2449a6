"""Automatic fixed-point precision (``precision="auto"``) for hls4ml designs.

Method (documented with results in docs/targets-fpga.md):

1. **Ranges.** The maximum magnitude of every layer's output of hls4ml's graph (split
   activations, fused layers and all): from the float model's layers where the graph is the
   layer IR's chain one for one (:func:`.emulate.float_trace`), else by converting at a wide
   precision with tracing on every layer and running the calibration data through hls4ml's
   own ``ModelGraph.trace`` (C-simulation). Weight ranges come from the converted graph's
   weight arrays.
2. **Integer bits per tensor** from its range (+1 bit of headroom for results, because
   validation data can exceed calibration data; results saturate instead of wrapping).
   Non-negative results (ReLU) use ``ufixed`` and save the sign bit. Recurrent layers keep
   ≥ 4 integer bits: their cell state (typed as the result in hls4ml's LSTM) outgrows the
   output, which tanh bounds.
3. **Fractional bits**: one number ``f`` shared by all weights and results (width = integer
   bits + f per tensor), chosen as the smallest ``f`` whose C-simulation meets the
   fidelity target on the calibration data. The search starts from the float model's answer
   (:mod:`.emulate`, LSTM included; for a GRU a guess from the target's error budget) and
   gallops/bisects, assuming fidelity is monotone in ``f``; every trial is one g++ build
   (~4–8 s), so the search is two builds when the guess is right.
   Activation tables of sigmoid/tanh layers grow with ``f`` (size and precision): their
   resolution, not the data types, limits an LSTM's accuracy.
4. Accumulators stay ``auto``: hls4ml infers exact ones from the operand types.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hwbackends.contract import Fidelity, compare

from .._shared.fixed_point import (  # noqa: F401 — re-exported: the search lives in _shared
    F_MAX,
    F_MIN,
    SEARCH_MARGIN,
    FidelityTarget,
    Trial,
    error_ratio,
    first_guess,
    int_bits,
    narrow_weights,
    search,
)

WEIGHT_KEYS = ("weight", "bias", "recurrent_weight", "recurrent_bias")
RECURRENT = ("LSTM", "GRU", "SimpleRNN")
TABLE_ACTIVATIONS = ("sigmoid", "tanh", "hard_sigmoid", "softsign", "elu", "selu", "softplus")
TRACE_PRECISION = "fixed<40,20>"


@dataclass
class Ranges:
    """Per-layer value ranges seen on the calibration data."""

    results: dict[str, tuple[float, float]] = field(default_factory=dict)
    weights: dict[str, dict[str, float]] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)
    activations: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    #: Input elements per output element (pooling windows), for accumulator sizing.
    fan_in: dict[str, int] = field(default_factory=dict)


def fixed(integer: int, frac: int, signed: bool = True, quant: str = "RND", ovf: str = "SAT") -> str:
    kind = "fixed" if signed else "ufixed"
    return f"{kind}<{integer + frac},{integer},{quant},{ovf}>"


def measure_ranges(hmodel: Any, x: np.ndarray,
                   trace: Callable[[np.ndarray], tuple[Any, dict[str, np.ndarray]]] | None = None) -> Ranges:
    """Trace ``hmodel`` (converted at a wide precision, every layer traced) on ``x``, with
    ``trace`` (default: hls4ml's own ``hmodel.trace``; the target passes build.trace)."""
    _, trace = (trace or hmodel.trace)(np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float32))
    r = Ranges()
    for layer in hmodel.get_layers():
        r.classes[layer.name] = layer.class_name
        shape = layer.get_output_variable().shape
        r.sizes[layer.name] = int(shape[-1]) if len(shape) else 1
        if layer.inputs:
            r.inputs[layer.name] = _producer(hmodel, layer.inputs[0])
            try:
                n_in = int(np.prod(layer.get_input_variable().shape))
                r.fan_in[layer.name] = max(1, n_in // max(1, int(np.prod(shape))))
            except Exception:  # layers without a single input variable
                pass
        act = layer.get_attr("activation")
        if isinstance(act, str):
            r.activations[layer.name] = act.lower()
        if layer.class_name == "Input":
            r.results[layer.name] = (float(x.min()), float(x.max()))
        elif layer.name in trace:
            t = np.asarray(trace[layer.name], dtype=np.float64)
            r.results[layer.name] = (float(t.min()), float(t.max()))
        ws = {}
        for key, w in layer.weights.items():
            data = getattr(w, "data_unquantized", None)
            data = w.data if data is None else data
            ws[key] = float(np.max(np.abs(data))) if np.size(data) else 0.0
        if ws:
            r.weights[layer.name] = ws
    return r


def _producer(hmodel: Any, tensor: str) -> str:
    """The name of the layer whose output is ``tensor``."""
    for layer in hmodel.get_layers():
        if tensor in layer.outputs:
            return layer.name
    return tensor


def table_size(f: int) -> int:
    """hls4ml's sigmoid/tanh tables cover [-8, 8): a step below 2^-f needs 16·2^f entries;
    we stay 2 bits coarser (the tables' slope is ≤ 1) and keep hls4ml's 1024 as the floor."""
    return int(min(65536, max(1024, 2 ** (f + 2))))


def assign(cfg: dict[str, Any], ranges: Ranges, f: int, fw: int | None = None) -> dict[str, Any]:
    """A copy of hls4ml's per-layer config with the types for fractional bits ``f`` (data)
    and ``fw`` (weights and biases; default ``f``)."""
    fw = f if fw is None else fw
    import copy
    out = copy.deepcopy(cfg)
    for name, lc in out.get("LayerName", {}).items():
        prec = lc.get("Precision")
        if not isinstance(prec, dict):
            continue
        cls = ranges.classes.get(name, "")
        if "result" in prec and name in ranges.results:
            lo, hi = ranges.results[name]
            signed = lo < 0
            i = int_bits(max(abs(lo), abs(hi)), signed, headroom=1)
            if any(r in cls for r in RECURRENT):
                i, signed = max(i, 4), True
            prec["result"] = fixed(i, f, signed)
        for key in WEIGHT_KEYS:
            if key in prec and key in ranges.weights.get(name, {}):
                prec[key] = fixed(int_bits(ranges.weights[name][key]), fw)
        recurrent = any(r in cls for r in RECURRENT)
        src = ranges.inputs.get(name)
        if "Pooling" in cls and "accum" in prec and src in ranges.results:
            # hls4ml's 'auto' here is the input type: a sum over the window overflows it.
            lo, hi = ranges.results[src]
            n = ranges.fan_in.get(name, 1)
            prec["accum"] = fixed(int_bits(max(abs(lo), abs(hi)) * n, True, headroom=1), f)
        if cls == "Softmax":
            _softmax(prec, lc, ranges, name, f)
            _table_types(prec, lc)
            continue
        if "table" in prec and (recurrent or ranges.activations.get(name) in TABLE_ACTIVATIONS):
            # Values of sigmoid/tanh are within (-1, 1): 2 integer bits suffice.
            prec["table"] = fixed(2, max(f + 2, 16), True, "RND", "SAT")
            lc["TableSize"] = table_size(f)
        _table_types(prec, lc)
    _unify_recurrent(out, ranges, f)
    return out


#: Type attributes hls4ml 1.3 takes only as layer-config keys (``table_t``: ``Layer.__init__``
#: converts a string under a key ending in ``_t``), never from ``Precision``: its
#: ``config_from_keras_model`` writes ``Precision['table']`` and nothing reads it, so a table
#: type set there silently stays hls4ml's default ``fixed<18,8>``.
CONFIG_TYPES = ("table", "exp_table", "inv_table", "inv_inp")


def _table_types(prec: dict[str, Any], lc: dict[str, Any]) -> None:
    """Copy the table types of ``Precision`` to the ``*_t`` keys hls4ml reads."""
    for key in CONFIG_TYPES:
        if key in prec:
            lc[f"{key}_t"] = prec[key]


def _unify_recurrent(cfg: dict[str, Any], ranges: Ranges, f: int) -> None:
    """hls4ml's io_parallel LSTM/GRU feed the hidden state (result type) back through the
    kernel written for the input type, and pass accumulators as results (nnet_recurrent.h):
    input, result and accumulator must be one type. Use the widest integer part of the three."""
    layers = cfg.get("LayerName", {})
    for name, cls in ranges.classes.items():
        if not any(r in cls for r in RECURRENT) or name not in layers:
            continue
        src = ranges.inputs.get(name)
        group = [layers[name]["Precision"]] + ([layers[src]["Precision"]] if src in layers else [])
        i = 4
        for prec in group:
            m = re.match(r"u?fixed<(\d+),(-?\d+)", str(prec.get("result", "")))
            if m:
                i = max(i, int(m.group(2)))
        typ = fixed(i, f, True)
        for prec in group:
            prec["result"] = typ
        if "accum" in layers[name]["Precision"]:
            layers[name]["Precision"]["accum"] = typ


def _softmax(prec: dict[str, Any], lc: dict[str, Any], ranges: Ranges, name: str, f: int) -> None:
    """hls4ml's stable softmax indexes its exp table with the top bits of (max - x), whose
    type is derived from the *input* type, and its inverse table with the top bits of the sum
    of exponentials. With hls4ml's defaults (inputs inferred as wide as fixed<38,18>, sums as
    fixed<18,8>) both indexes are coarse (steps of 128 and 0.25) and outputs collapse towards
    1/n: the classic "hls4ml does not match Keras" softmax. Size the types by what they hold:
    exponentials and the inverse in [0, 1], the sum in [1, n]; and the tables so that one
    step is ~2^-(f-2)."""
    s = max(1, math.ceil(math.log2(max(ranges.sizes.get(name, 2), 2))))
    unit = fixed(1, f, signed=False)
    total = fixed(1 + s, f, signed=False)
    for key, typ in (("exp_table", unit), ("inv_table", unit), ("accum", total), ("inv_inp", total)):
        if key in prec:
            prec[key] = typ
    prec["result"] = unit
    # Index of the exp table: (max - x) has the input's integer bits - 1 (ufixed).
    src = ranges.inputs.get(name)
    i_in = int_bits(max(abs(v) for v in ranges.results[src]), True, headroom=1) if src in ranges.results else 4
    lc["TableSize"] = 2 ** int(min(16, max(10, max(i_in - 1, 1 + s) + f - 2)))


def design_bits(hmodel: Any) -> dict[str, int]:
    """Bits the design uses: weights (count × width) and layer outputs (size × width)."""
    wbits = obits = 0
    widths: dict[str, int] = {}
    for layer in hmodel.get_layers():
        for w in layer.weights.values():
            width = int(getattr(w.type.precision, "width", 32))
            wbits += width * int(np.size(w.data))
        var = layer.get_output_variable()
        width = int(getattr(var.type.precision, "width", 32))
        widths[layer.name] = width
        obits += width * int(np.prod(var.shape))
    return {"weight_bits": wbits, "activation_bits": obits, "total_bits": wbits + obits,
            "result_widths": widths}


def evaluate_fn(build: Callable[[int], Any], x: np.ndarray, ref: np.ndarray
                ) -> Callable[[int], tuple[Fidelity, float]]:
    """Wrap a ``build(f) -> (CsimLibrary, seconds)`` into the search's ``evaluate``."""
    def evaluate(f: int) -> tuple[Fidelity, float]:
        t0 = time.perf_counter()
        lib, _ = build(f)
        y = lib.run(x).reshape(ref.shape)
        return compare(ref, y), time.perf_counter() - t0
    return evaluate
