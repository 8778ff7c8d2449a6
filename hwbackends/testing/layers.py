"""Whether an ``UnsupportedError`` names the layer or op it cannot compile."""
from __future__ import annotations

import re

from ..models import Model

_NAMED = re.compile(r"\b(layer|op|ops|operator|node|module)\b\W{0,3}[\w./:-]+", re.I)


def layer_names(model: Model) -> set[str]:
    """Names and class names of the layers/ops of a source model (for UnsupportedError)."""
    names: set[str] = set()
    obj = model.obj
    if model.format == "keras":
        for layer in getattr(obj, "layers", []):
            names |= {layer.name, type(layer).__name__}
    elif model.format == "torch":
        mods = obj.module() if hasattr(obj, "module") and not hasattr(obj, "named_modules") else obj
        for n, mod in getattr(mods, "named_modules", lambda: [])():
            names |= {n, type(mod).__name__} - {""}
    elif model.format == "onnx":
        for node in obj.graph.node:
            names |= {node.op_type, node.name} - {""}
    return {n for n in names if len(n) > 1}


def names_layer(model: Model, message: str) -> bool:
    """Whether an error message names a layer or op of ``model`` (or says 'layer X'/'op X')."""
    low = message.lower()
    if any(n.lower() in low for n in layer_names(model)):
        return True
    return bool(_NAMED.search(message))
