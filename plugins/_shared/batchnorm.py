"""BatchNormalization folded into the Dense/Linear layer before it (``fpga.da4ml``,
``fpga.hls4ml``).

At inference a batch normalization is an affine map per unit, ``y = x·scale + shift`` with
``scale = γ/√(σ² + ε)`` and ``shift = β − μ·scale``; after ``z = x @ W + b`` it is
``x @ (W·scale) + (b·scale + shift)``: the same Dense with other weights and no extra layer.
That holds only when nothing sits between the two (an activation) and nothing else reads the
Dense's output; any other batch normalization is refused by name, with where it must be.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hwbackends.errors import UnsupportedError

WHERE = ("it folds a BatchNormalization into the Dense/Linear layer right before it (no "
         "activation between them, the Dense's output read by nothing else)")


def affine(gamma: Any, beta: Any, mean: Any, var: Any, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, shift)`` (float64) of a batch normalization in inference mode."""
    gamma, beta, mean, var = (np.asarray(a, np.float64) for a in (gamma, beta, mean, var))
    scale = gamma / np.sqrt(var + float(eps))
    return scale, beta - mean * scale


def keras_affine(bn: Any) -> tuple[np.ndarray, np.ndarray]:
    """:func:`affine` of a Keras ``BatchNormalization`` (``scale``/``center`` may be off)."""
    ws = list(bn.get_weights())
    n = ws[-1].shape[0]
    gamma = ws.pop(0) if bn.scale else np.ones(n)
    beta = ws.pop(0) if bn.center else np.zeros(n)
    return affine(gamma, beta, ws[0], ws[1], bn.epsilon)


def torch_affine(bn: Any) -> tuple[np.ndarray, np.ndarray]:
    """:func:`affine` of a torch ``BatchNorm1d`` (eval mode: the running statistics)."""
    n = bn.running_mean.shape[0]
    gamma = bn.weight.detach().cpu().numpy() if bn.weight is not None else np.ones(n)
    beta = bn.bias.detach().cpu().numpy() if bn.bias is not None else np.zeros(n)
    return affine(gamma, beta, bn.running_mean.cpu().numpy(), bn.running_var.cpu().numpy(), bn.eps)


def fold(w: np.ndarray, b: np.ndarray | None, scale: np.ndarray,
         shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weights ``(W·scale, b·scale + shift)`` of ``x @ W + b`` followed by the affine map
    (``w`` is ``(n_in, n_out)``; ``b`` None for a layer without bias)."""
    b = np.zeros(w.shape[-1]) if b is None else np.asarray(b, np.float64)
    return np.asarray(w, np.float64) * scale, b * scale + shift


def _is_bn(layer: Any) -> bool:
    return type(layer).__name__ == "BatchNormalization"


def _producer(km: Any, bn: Any) -> tuple[Any, int]:
    """The layer whose output ``bn`` normalizes, and how many places read that output (other
    layers, or the model's outputs). A ``Sequential`` is a chain: its previous layer, read
    once (its node lists double when it is loaded from a file, so they are not counted)."""
    import keras

    if isinstance(km, keras.Sequential):
        i = km.layers.index(bn)
        return (km.layers[i - 1] if i else None), 1
    tensor = bn.input
    readers = sum(1 for nodes in km._nodes_by_depth.values() for node in nodes
                  if any(t is tensor for t in node.input_tensors))
    readers += sum(1 for t in km.outputs if t is tensor)
    return tensor._keras_history.operation, readers


def _why_not(bn: Any, dense: Any, readers: int) -> str:
    """Why ``bn`` cannot fold into ``dense`` (the layer that produces its input), or ''."""
    if dense is None:
        return "it is the model's first layer (it normalizes the inputs)"
    if type(dense).__name__ != "Dense":
        return f"its input comes from {dense.name!r} ({type(dense).__name__}), not a Dense"
    act = getattr(dense.activation, "__name__", "linear")
    if act != "linear":
        return f"the Dense {dense.name!r} before it applies activation {act!r} first"
    axis = bn.axis[0] if isinstance(bn.axis, (list, tuple)) and len(bn.axis) == 1 else bn.axis
    if axis not in (-1, len(bn.input.shape) - 1):
        return f"it normalizes axis {bn.axis}, not the Dense's units (the last axis)"
    if readers != 1:
        return f"the output of the Dense {dense.name!r} is also read elsewhere"
    return ""


def fold_keras(km: Any, target: str) -> Any:
    """``km`` itself when it has no ``BatchNormalization``; else a copy in which each one is
    folded into the Dense before it (and gone from the graph). Raises
    :class:`UnsupportedError` naming a batch normalization that cannot fold."""
    import keras

    bns = [layer for layer in km.layers if _is_bn(layer)]
    if not bns:
        return km
    into: dict[str, Any] = {}
    for bn in bns:
        dense, readers = _producer(km, bn)
        why = _why_not(bn, dense, readers)
        if why:
            raise UnsupportedError(
                f"{target} cannot compile layer {bn.name!r} (BatchNormalization): {why}; {WHERE}. "
                f"Move it right after a Dense without activation (put the activation after "
                f"it), or fold it into the weights before compiling")
        into[dense.name] = bn
    folded = {bn.name for bn in bns}

    def clone(layer: Any) -> Any:
        cfg = layer.get_config()
        if layer.name in into:
            cfg["use_bias"] = True
        return type(layer).from_config(cfg)

    def call(layer: Any, *args: Any, **kwargs: Any) -> Any:
        return args[0] if layer.name in folded else layer(*args, **kwargs)

    if isinstance(km, keras.Sequential):
        new = keras.Sequential([keras.Input(tuple(km.inputs[0].shape[1:])),
                                *(clone(layer) for layer in km.layers if layer.name not in folded)],
                               name=km.name)
    else:  # the folded layers are cloned, then not called: the Dense's output goes on
        new = keras.models.clone_model(km, clone_function=clone, call_function=call)
    for layer in new.layers:
        if layer.name in into:
            old = km.get_layer(layer.name)
            w, *b = old.get_weights()
            layer.set_weights([a.astype(np.float32) for a in
                               fold(w, b[0] if b else None, *keras_affine(into[layer.name]))])
        elif layer.name not in folded and layer.weights:
            layer.set_weights(km.get_layer(layer.name).get_weights())
    return new
