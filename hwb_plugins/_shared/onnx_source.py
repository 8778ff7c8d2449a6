"""Which of the user's layers an ONNX node a converter wrote comes from, so a target that
refuses an ONNX op can name the layer the user wrote instead of the op.

* ``torch.onnx`` (dynamo) writes each node's module path and classes itself
  (``pkg.torch.onnx.name_scopes``, ``pkg.torch.onnx.class_hierarchy``);
* the TorchScript exporter and tf2onnx name nodes by scope (``/enc/norm1/LayerNormalization``,
  ``functional_1/tcn_conv_1/Pad``): the converter plugin records the matching module or Keras
  layer on the node as ``hwb.source_layer`` (:func:`annotate_torch`, :func:`annotate_keras`).

:func:`layer_of` reads either; a graph the user wrote as ONNX has neither (its node is theirs).
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any

#: The node metadata key the converters write: JSON ``[[path, class], …]``, outermost first.
KEY = "hwb.source_layer"


def _props(node: Any) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def _set(node: Any, chain: list[tuple[str, str]]) -> None:
    if chain:
        p = node.metadata_props.add()
        p.key, p.value = KEY, json.dumps(chain)


def chain_of(node: Any) -> list[tuple[str, str]]:
    """``[(path, class), …]`` of the user's layers holding ``node``, outermost first ([] when
    unknown)."""
    props = _props(node)
    if KEY in props:
        return [tuple(x) for x in json.loads(props[KEY])]
    scopes, classes = props.get("pkg.torch.onnx.name_scopes"), props.get("pkg.torch.onnx.class_hierarchy")
    if scopes and classes:
        try:
            s, c = ast.literal_eval(scopes), ast.literal_eval(classes)
        except (ValueError, SyntaxError):
            return []
        # [root, module…, the aten op]: the modules between them, each with its class
        return [(p, k.rsplit(".", 1)[-1]) for p, k in zip(s[1:-1], c[1:-1], strict=False) if p]
    return []


def layer_of(node: Any) -> str:
    """``layer 'enc' (TransformerEncoderLayer, in its 'enc.norm1': LayerNorm)``, or "" when
    the node's layer is unknown."""
    chain = chain_of(node)
    if not chain:
        return ""
    (path, cls), inner = chain[0], chain[1:]
    return f"layer {path!r} ({cls}" + (f", in its {inner[-1][0]!r}: {inner[-1][1]}" if inner else "") + ")"


def annotate_torch(proto: Any, module: Any) -> None:
    """Record on each node of a TorchScript-exported graph the modules of ``module`` its scope
    name (``/enc/norm1/Op``) walks through."""
    named = dict(module.named_modules())
    for node in proto.graph.node:
        if KEY in _props(node) or "pkg.torch.onnx.name_scopes" in _props(node):
            continue
        parts = [p for p in node.name.split("/")[:-1] if p]
        chain = []
        for k in range(1, len(parts) + 1):
            path = ".".join(parts[:k])
            if path in named:
                chain.append((path, type(named[path]).__name__))
        _set(node, chain)


def annotate_keras(proto: Any, km: Any) -> None:
    """Record on each node of a tf2onnx graph the Keras layer of ``km`` its scope names
    (``functional_1/tcn_conv_1/Pad``: Keras 3 adds ``_1`` to a layer's scope)."""
    layers = {layer.name: type(layer).__name__ for layer in _layers(km)}
    for node in proto.graph.node:
        for part in node.name.split("/")[:-1]:
            # the scope of layer 'dense' is 'dense_1', of layer 'dense_1' 'dense_1_1'
            name = next((n for n in (re.sub(r"_\d+$", "", part), part) if n in layers), None)
            if name:
                _set(node, [(name, layers[name])])
                break


def _layers(km: Any) -> list[Any]:
    out = []
    for layer in getattr(km, "layers", []):
        out.append(layer)
        if getattr(layer, "layers", None):
            out.extend(_layers(layer))
    return out
