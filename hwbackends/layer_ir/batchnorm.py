"""BatchNormalization folded into a neighbouring Dense/Linear or Conv1D (``fpga.da4ml``'s
shared rule :data:`WHERE`; ``fpga.hls4ml`` and cpu.native ``fixed`` through
:func:`fold_keras`, rule :data:`FOLDS`).

At inference a batch normalization is an affine map per channel, ``y = x·scale + shift`` with
``scale = γ/√(σ² + ε)`` and ``shift = β − μ·scale``. Two exact folds:

* **into the layer before it** (:func:`fold`): after ``z = x ⊛ W + b`` (a Dense, or a Conv1D
  whose output channels are the last axis) it is ``x ⊛ (W·scale) + (b·scale + shift)``. Exact
  for any padding (the padded zeros are the conv's input, untouched), provided nothing sits
  between the two (an activation) and nothing else reads the layer's output;
* **into the layer after it** (:func:`fold_input`): ``(x·scale + shift) ⊛ W + b`` is
  ``x ⊛ (scale·W) + (b + Σ shift·W)``, exact for a Dense (it acts on the last axis) and for a
  Conv1D with ``'valid'`` padding only: with ``'same'``/``'causal'`` padding the conv pads the
  *normalized* signal with zeros, which are ``−shift/scale`` in the raw signal, not zeros.

Any other batch normalization is refused by name, saying why neither fold applies.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

WHERE = ("it folds a BatchNormalization into the Dense/Linear layer right before it (no "
         "activation between them, the Dense's output read by nothing else)")
#: :func:`fold_keras`'s rule, as the refusals and the FPGA docs table say it.
FOLDS = ("a BatchNormalization is folded into the Dense or Conv1D right before it (any padding; "
         "no activation between them, that layer's output read by nothing else), else into the "
         "Dense or 'valid'-padded Conv1D right after it (its output read by nothing else)")
#: The layer classes a batch normalization folds into.
FOLD_INTO = ("Dense", "Conv1D")


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
    """The weights ``(W·scale, b·scale + shift)`` of ``x ⊛ W + b`` followed by the affine map
    (``w`` is ``(…, n_in, n_out)``: a Dense's ``(n_in, n_out)``, a Keras Conv1D's ``(k,
    c_in, c_out)``; ``b`` None for a layer without bias)."""
    b = np.zeros(w.shape[-1]) if b is None else np.asarray(b, np.float64)
    return np.asarray(w, np.float64) * scale, b * scale + shift


def fold_input(w: np.ndarray, b: np.ndarray | None, scale: np.ndarray,
               shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weights ``(scale·W, b + Σ shift·W)`` of the affine map followed by ``x ⊛ W + b``
    (``w`` as in :func:`fold`; the map acts on its ``n_in`` axis). Exact for a Dense and an
    unpadded convolution only (see the module's docstring)."""
    w = np.asarray(w, np.float64)
    b = np.zeros(w.shape[-1]) if b is None else np.asarray(b, np.float64)
    return w * scale[:, None], b + (w * shift[:, None]).reshape(-1, w.shape[-1]).sum(0)


def _is_bn(layer: Any) -> bool:
    return type(layer).__name__ == "BatchNormalization"


def _calls(km: Any, layer: Any) -> int:
    """How many times ``layer`` is called in functional model ``km`` (a shared layer is
    called more than once; folding into it would change its other calls too)."""
    return sum(1 for nodes in km._nodes_by_depth.values() for node in nodes
               if node.operation is layer)


def _readers(km: Any, tensor: Any) -> list[Any]:
    """The layers of functional ``km`` that read ``tensor``, plus None per model output that
    is ``tensor``."""
    out: list[Any] = [node.operation for nodes in km._nodes_by_depth.values() for node in nodes
                      if any(t is tensor for t in node.input_tensors)]
    return out + [None for t in km.outputs if t is tensor]


def _producer(km: Any, bn: Any) -> tuple[Any, int]:
    """The layer whose output ``bn`` normalizes (None for the model's input), and how many
    places read that output (other layers, or the model's outputs). A ``Sequential`` is a
    chain: its previous layer, read once (its node lists double when it is loaded from a
    file, so they are not counted)."""
    import keras

    if isinstance(km, keras.Sequential):
        i = km.layers.index(bn)
        return (km.layers[i - 1] if i else None), 1
    tensor = bn.input
    op = tensor._keras_history.operation
    op = None if type(op).__name__ == "InputLayer" else op
    if op is not None and _calls(km, op) != 1:
        return op, 2
    return op, len(_readers(km, tensor))


def _consumer(km: Any, bn: Any) -> tuple[Any, int]:
    """The layer that reads ``bn``'s output (None when that is the model's output), and how
    many places read it."""
    import keras

    if isinstance(km, keras.Sequential):
        i = km.layers.index(bn)
        return (km.layers[i + 1] if i + 1 < len(km.layers) else None), 1
    readers = _readers(km, bn.output)
    nxt = readers[0] if len(readers) == 1 else None
    if nxt is not None and _calls(km, nxt) != 1:
        return nxt, 2
    return nxt, len(readers)


def _last_axis(bn: Any) -> bool:
    axis = bn.axis[0] if isinstance(bn.axis, (list, tuple)) and len(bn.axis) == 1 else bn.axis
    return axis in (-1, len(bn.input.shape) - 1)


def _kind(layer: Any) -> str:
    return f"{layer.name!r} ({type(layer).__name__})"


def _why_not_after(bn: Any, prev: Any, readers: int) -> str:
    """Why ``bn`` cannot fold into ``prev`` (the layer whose output it normalizes), or ''."""
    if prev is None:
        return "it normalizes the model's inputs"
    if type(prev).__name__ not in FOLD_INTO:
        return f"its input comes from {_kind(prev)}"
    act = getattr(prev.activation, "__name__", "linear")
    if act != "linear":
        return f"{_kind(prev)} before it applies activation {act!r} first"
    if getattr(prev, "data_format", "channels_last") != "channels_last":
        return f"{_kind(prev)} before it is channels_first"
    if not _last_axis(bn):
        return f"it normalizes axis {bn.axis}, not the channels of {_kind(prev)} (the last axis)"
    if readers != 1:
        return f"the output of {_kind(prev)} is also read elsewhere"
    return ""


def _why_not_before(bn: Any, nxt: Any, readers: int) -> str:
    """Why ``bn`` cannot fold into ``nxt`` (the layer that reads its output), or ''."""
    if readers != 1:
        return "its output is read by more than one layer"
    if nxt is None:
        return "its output is the model's output"
    cls = type(nxt).__name__
    if cls not in FOLD_INTO:
        return f"its output goes to {_kind(nxt)}"
    if not _last_axis(bn):
        return f"it normalizes axis {bn.axis}, not the input channels of {_kind(nxt)}"
    if cls == "Conv1D":
        if nxt.padding != "valid":
            return (f"{_kind(nxt)} after it pads with {nxt.padding!r} padding (its zeros would "
                    f"not be normalized; only 'valid' folds exactly)")
        if nxt.data_format != "channels_last" or nxt.groups != 1:
            return f"{_kind(nxt)} after it is channels_first or grouped"
    return ""


def fold_keras(km: Any, target: str) -> Any:
    """``km`` itself when it has no ``BatchNormalization``; else a copy in which each one is
    folded into the Dense/Conv1D before it, or else after it (:data:`FOLDS`), and gone from
    the graph. Raises :class:`UnsupportedError` naming a batch normalization that folds into
    neither, with both reasons."""
    import keras

    bns = [layer for layer in km.layers if _is_bn(layer)]
    if not bns:
        return km
    after: dict[str, Any] = {}  # layer name → the BN that follows it (folded into its output)
    before: dict[str, Any] = {}  # layer name → the BN in front of it (folded into its input)
    for bn in bns:
        prev, readers = _producer(km, bn)
        why = _why_not_after(bn, prev, readers)
        if not why:
            after[prev.name] = bn
            continue
        nxt, readers = _consumer(km, bn)
        why_next = _why_not_before(bn, nxt, readers)
        if why_next:
            raise UnsupportedError(
                f"{target} cannot compile layer {bn.name!r} (BatchNormalization): {why}, and "
                f"{why_next}; {FOLDS}. Move it right after a Dense/Conv1D without activation "
                f"(put the activation after it), or fold it into the weights before compiling")
        before[nxt.name] = bn
    folded = {bn.name for bn in bns}

    def clone(layer: Any) -> Any:
        cfg = layer.get_config()
        if layer.name in after or layer.name in before:
            cfg["use_bias"] = True
        return type(layer).from_config(cfg)

    def call(layer: Any, *args: Any, **kwargs: Any) -> Any:
        return args[0] if layer.name in folded else layer(*args, **kwargs)

    if isinstance(km, keras.Sequential):
        new = keras.Sequential([keras.Input(tuple(km.inputs[0].shape[1:])),
                                *(clone(layer) for layer in km.layers if layer.name not in folded)],
                               name=km.name)
    else:  # the folded layers are cloned, then not called: their input goes on
        new = keras.models.clone_model(km, clone_function=clone, call_function=call)
    for layer in new.layers:
        if layer.name in after or layer.name in before:
            w, *b = km.get_layer(layer.name).get_weights()
            wb = (w, b[0] if b else None)
            if layer.name in before:  # the input side first, then the output side
                wb = fold_input(*wb, *keras_affine(before[layer.name]))
            if layer.name in after:
                wb = fold(*wb, *keras_affine(after[layer.name]))
            layer.set_weights([a.astype(np.float32) for a in wb])
        elif layer.name not in folded and layer.weights:
            layer.set_weights(km.get_layer(layer.name).get_weights())
    return new
