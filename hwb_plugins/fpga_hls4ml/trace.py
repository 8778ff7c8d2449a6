"""Where precision is lost: per-layer outputs of the fixed-point design vs the source model.

Rebuilds the stored design's hls4ml config with ``Trace`` on every layer (one hls4ml build,
with hls4ml's own ``build_lib.sh``), runs ``ModelGraph.trace`` on the inputs, and compares
each traced layer with the same layer of the Keras model, run layer by layer with fused
activations split off as hls4ml's graph splits them (``dense_1`` → ``dense_1`` +
``dense_1_relu``), as hls4ml's ``profiling.get_ymodel_keras`` does (that module needs pandas,
which this project does not install).

    from hwb_plugins.fpga_hls4ml.trace import trace_layers
    for row in trace_layers(model, cm, x): print(row)
    hwb fpga-trace zoo:mlp --precision 'ap_fixed<16,6>'
"""
from __future__ import annotations

import copy
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

from . import convert
from .build import trace


@dataclass(frozen=True)
class LayerDiff:
    """One layer: its fixed-point output type and its error against the float model."""

    layer: str
    type: str
    max_abs: float
    rel_err: float  # max abs error / the float output's range
    corr: float
    ref_range: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return (f"{self.layer:<22} {self.type:<28} max_abs={self.max_abs:<10.4g} "
                f"rel={self.rel_err:<9.4g} corr={self.corr:.6f}  float range "
                f"[{self.ref_range[0]:.3g}, {self.ref_range[1]:.3g}]")


def trace_layers(model: Any, compiled: Any, x: np.ndarray) -> list[LayerDiff]:
    """Per-layer comparison for a :class:`CompiledModel` of ``fpga.hls4ml`` built from the
    Keras ``model`` (a :class:`hwbackends.models.Model`)."""
    if getattr(model, "format", None) != "keras":
        raise UnsupportedError("the per-layer trace compares with Keras layer outputs; pass the "
                               "Keras model (PyTorch/ONNX layer outputs are not mapped)")
    if compiled.target != "fpga.hls4ml":
        raise UnsupportedError(f"trace_layers needs an fpga.hls4ml variant, got {compiled.variant}")
    model = convert.for_hls4ml(model)  # the layers hls4ml built (BatchNormalization folded)
    names = convert.renaming(model)  # rows show the user's layer names
    meta = compiled.artifact.meta
    cfg = copy.deepcopy(meta["hls4ml_config"])
    cfg["Model"]["TraceOutput"] = True
    for lc in cfg.get("LayerName", {}).values():
        lc["Trace"] = True
    opts = convert.HlsOptions.from_extra({k: v for k, v in meta["options"].items() if v is not None})
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = Path(tempfile.mkdtemp(prefix="hwb-trace-"))
    try:
        hm = convert.convert(model, cfg, opts, out)
        _, fixed = trace(hm, out, x.reshape(len(x), -1))
        ref = keras_layer_outputs(model.obj, x)
        types = {layer.name: str(layer.get_output_variable().type.precision) for layer in hm.get_layers()}
        rows = []
        for layer in hm.get_layers():
            name = layer.name
            if name not in fixed or name not in ref:
                continue
            a = np.asarray(ref[name], dtype=np.float64).reshape(len(x), -1)
            b = np.asarray(fixed[name], dtype=np.float64).reshape(len(x), -1)
            if a.shape != b.shape:
                continue
            err = np.abs(a - b)
            ptp = float(np.ptp(a)) or 1.0
            corr = float(np.corrcoef(a.ravel(), b.ravel())[0, 1]) if a.std() > 0 and b.std() > 0 else (
                1.0 if np.allclose(a, b) else 0.0)
            rows.append(LayerDiff(names.user(name), types.get(name, "?"), float(err.max()), float(err.max()) / ptp,
                                  corr, (float(a.min()), float(a.max()))))
        return rows
    finally:
        shutil.rmtree(out, ignore_errors=True)


def keras_layer_outputs(km: Any, x: np.ndarray) -> dict[str, np.ndarray]:
    """Every layer's output of a sequential Keras model, fused activations split off and
    named ``<layer>_<activation>`` (hls4ml's naming)."""
    import keras

    names = {type(layer).__name__ for layer in km.layers}
    if not isinstance(km, keras.Sequential) and len(km.layers) > 1 + len(km.inputs):
        # A chain of single-input layers is fine; branches are not mapped.
        for layer in km.layers[1:]:
            if isinstance(layer.input, (list, tuple)):
                raise UnsupportedError("the per-layer trace maps sequential models only; "
                                       f"this one branches ({', '.join(sorted(names))})")
    out: dict[str, np.ndarray] = {}
    h = x
    for layer in km.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        act = getattr(layer, "activation", None)
        fused = (act is not None and not isinstance(layer, keras.layers.Activation)
                 and getattr(act, "__name__", "linear") != "linear"
                 and not isinstance(layer, (keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN)))
        if fused:
            layer.activation = keras.activations.linear
            try:
                z = np.asarray(layer(h))
            finally:
                layer.activation = act
            out[layer.name] = z
            h = np.asarray(act(z))
            out[f"{layer.name}_{act.__name__}"] = h
        else:
            h = np.asarray(layer(h))
            out[layer.name] = h
    return out
