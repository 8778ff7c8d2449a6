"""A Keras model as hls4ml's converters see it: every name one we generated.

hls4ml's writer puts layer and tensor names as they are into C++ identifiers, ``//`` comments,
``typedef`` lines, its build scripts and its YAML (``<name>_result_t``, the top function's
argument). A Keras layer name is free text (Keras forbids only ``/``): a newline in one makes
the rest of the name a line of the firmware, run at ``dlopen`` by a static initializer (issue
33). So ``fpga.hls4ml`` (its project) and ``cpu.native``'s ``fixed`` precision (the types it
reads from hls4ml's graph) hand hls4ml a rebuild of the model whose layers, inputs and the
model itself carry names from :func:`hwbackends.identifiers.ident` only, and keep the mapping
to show the user's names in reports and errors (:meth:`Renamed.user`).

PyTorch models need no renaming: in the compile worker they are ``torch.export`` programs
rebuilt as an ``nn.Sequential`` whose children are named ``0``, ``1``, …
(:func:`.torch_export.as_sequential`), so no text of the file reaches hls4ml.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hwbackends.contract import UnsupportedError, ident

#: Prefix of a generated layer name (``hwb0``, ``hwb1``, …): hls4ml's own names are
#: ``layerN_out``, ``wN``, ``configN``, never ``hwbN``; derived ones append ``_relu`` etc.
PREFIX = "hwb"
MODEL_NAME = "hwbmodel"
_GENERATED = re.compile(rf"({PREFIX}\d+)(_\w*)?")
#: Keras classes that hold other layers (their names sit in their own config).
_NESTED = ("Functional", "Sequential", "Model")
#: Keras wrappers and the keys of the layers they wrap (renamed ``<wrapper>_0``, ``_1``).
_WRAPPED = ("layer", "backward_layer")


@dataclass(frozen=True)
class Renamed:
    """A Keras model with generated names, and the user's name of each."""

    obj: Any
    names: dict[str, str] = field(default_factory=dict)  # generated → the user's

    def user(self, name: str) -> str:
        """The user's name for an hls4ml layer name (``hwb3_relu`` → ``<user's>_relu``);
        other text unchanged."""
        m = _GENERATED.fullmatch(name)
        if m and m.group(1) in self.names:
            return self.names[m.group(1)] + (m.group(2) or "")
        return name

    def user_keys(self, d: dict[str, Any]) -> dict[str, Any]:
        """``d`` with its keys (hls4ml layer names) as the user's names."""
        return {self.user(k): v for k, v in d.items()}


def generated(km: Any) -> bool:
    """Whether ``km`` is already a rebuild by :func:`rename_keras`."""
    return getattr(km, "name", None) == MODEL_NAME and all(
        _GENERATED.fullmatch(layer.name) for layer in km.layers)


def rename_keras(km: Any, target: str) -> Renamed:
    """A copy of Keras model ``km`` (same classes, configs and weights) whose layers (the
    input layers included) are named ``hwb0``, ``hwb1``, … in the order of ``km.layers``'
    config, and the model ``hwbmodel``."""
    import keras

    cfg = km.get_config()
    layers = cfg.get("layers") or []
    nested = [lc.get("class_name") for lc in layers if lc.get("class_name") in _NESTED]
    if nested:
        raise UnsupportedError(f"{target} converts flat Keras models; this one nests a {nested[0]} "
                               f"(its layers' names sit inside it). Flatten the model into one "
                               f"Sequential or functional graph, or pick another target")
    old = [lc["config"]["name"] for lc in layers]
    new = [ident(PREFIX, i) for i in range(len(old))]
    ren = dict(zip(old, new, strict=True))
    for lc, n in zip(layers, new, strict=True):
        lc["config"]["name"] = n
        if "name" in lc:
            lc["name"] = n
        for k, key in enumerate(_WRAPPED):
            inner = lc["config"].get(key)
            if isinstance(inner, dict) and isinstance(inner.get("config"), dict):
                inner["config"]["name"] = f"{n}_{k}"
        if "inbound_nodes" in lc:
            lc["inbound_nodes"] = _history(lc["inbound_nodes"], ren)
    for key in ("input_layers", "output_layers"):
        if key in cfg:
            cfg[key] = _refs(cfg[key], ren)
    cfg["name"] = MODEL_NAME
    try:
        copy = type(km).from_config(cfg) if isinstance(km, keras.Sequential) else \
            keras.Model.from_config(cfg)
        for layer in km.layers:
            copy.get_layer(ren[layer.name]).set_weights(layer.get_weights())
    except UnsupportedError:
        raise
    except Exception as exc:
        raise UnsupportedError(
            f"{target} rebuilds the Keras model with generated layer names before hls4ml "
            f"sees it (no text of a model file reaches generated code), and this model could "
            f"not be rebuilt from its config ({type(exc).__name__}: {str(exc)[:200]}). Save it "
            f"with Keras' own layers, or pick another target") from exc
    return Renamed(copy, {n: o for o, n in ren.items()})


def _history(node: Any, ren: dict[str, str]) -> Any:
    """``node`` (an inbound-node config) with each ``keras_history`` layer renamed."""
    if isinstance(node, dict):
        out = {k: _history(v, ren) for k, v in node.items()}
        hist = out.get("keras_history")
        if isinstance(hist, (list, tuple)) and hist and hist[0] in ren:
            out["keras_history"] = [ren[hist[0]], *hist[1:]]
        return out
    if isinstance(node, (list, tuple)):
        return [_history(v, ren) for v in node]
    return node


def _refs(refs: Any, ren: dict[str, str]) -> Any:
    """``input_layers``/``output_layers``: ``[name, node, tensor]`` triples (maybe nested)."""
    if isinstance(refs, (list, tuple)):
        if len(refs) == 3 and isinstance(refs[0], str) and refs[0] in ren:
            return [ren[refs[0]], *refs[1:]]
        return [_refs(r, ren) for r in refs]
    return refs
