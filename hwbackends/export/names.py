"""The names an exported model is served under: the model's own where they are safe.

Every name ``hwb export`` writes into a server's files — the model directory and Triton's
``name``, each input and output tensor — goes through :mod:`hwbackends.identifiers`: the
model's own name where it is a plain identifier (:func:`~hwbackends.identifiers.safe_ident`),
else one derived from its digest, unique across the model's tensors
(:func:`~hwbackends.identifiers.unique_idents`). The mapping back to the model's names is
kept (:class:`Served`) for what ``hwb export`` prints, never written into generated files.

A tensor's own name is what the model calls it: a Keras model's input (``keras.Input(name=)``)
and the layer that produces each output, an ONNX graph's input and output names, a torch
module's argument names. The readers call a single-tensor Keras model's tensors ``input`` /
``output`` (hwbackends/models.py keeps those for its fingerprints); the export serves the
model's own names instead. A torch model's single input and output have no name of their own
(the forward's result is unnamed): those are ``input0`` / ``output0``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..identifiers import ident, safe_ident, unique_idents


@dataclass
class Served:
    """Served name of the model and of each tensor, and the model's own names behind them."""

    name: str
    inputs: list[Any]   # TensorSpec with served names, in the model's order
    outputs: list[Any]
    #: served name → the model's own (only those that differ).
    renamed: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """For people (``hwb export``'s output): each served name that is not the model's."""
        return [f"{k} is the model's {v!r:.120}" for k, v in self.renamed.items()]


def served(model: Any, name: str | None = None) -> Served:
    """The served names of ``model``; ``name``: the user's ``--name`` (must be a plain
    identifier: it names a directory and the server's model)."""
    from ..errors import ConfigError

    if name is not None and safe_ident(name) != name:
        raise ConfigError(f"--name {name!r:.80} is not a plain identifier (letters, digits and "
                          f"single underscores, starting with a letter, at most 63 characters, "
                          f"not a reserved word); it names the model's directory and the "
                          f"server's model: give e.g. --name my_model")
    nm = name or safe_ident(model.name, "model")
    own_in, own_out = own_names(model)
    names = unique_idents([*own_in, *own_out], "tensor")
    k = len(own_in)
    ins = [replace(s, name=n) for s, n in zip(model.inputs, names[:k], strict=True)]
    outs = [replace(s, name=n) for s, n in zip(model.outputs, names[k:], strict=True)]
    renamed = {n: o for n, o in zip(names, [*own_in, *own_out], strict=True) if n != o}
    if nm != model.name and name is None:
        renamed = {nm: model.name, **renamed}
    return Served(nm, ins, outs, renamed)


def own_names(model: Any) -> tuple[list[str], list[str]]:
    """What the model itself calls its inputs and outputs (see the module docstring)."""
    ins = [str(s.name) for s in model.inputs]
    outs = [str(s.name) for s in model.outputs]
    if model.format == "keras" and len(ins) == 1:
        ins = [_keras_name(model.obj.inputs[0], ins[0], False)]
    if model.format == "keras" and len(outs) == 1:
        outs = [_keras_name(model.obj.outputs[0], outs[0], True)]
    if model.format == "torch":
        if len(ins) == 1:
            ins = [ident("input", 0)]
        if len(outs) == 1:
            outs = [ident("output", 0)]
    return ins, outs


def _keras_name(tensor: Any, default: str, layer: bool) -> str:
    """A Keras tensor's name (an input's), or the name of the layer producing it (an output's:
    Keras names output tensors ``keras_tensor_7``, its layers by what the model's author
    wrote)."""
    if layer:
        hist = getattr(tensor, "_keras_history", None)
        op = getattr(hist, "operation", None) or (hist[0] if isinstance(hist, tuple) and hist else None)
        nm = getattr(op, "name", None)
    else:
        nm = getattr(tensor, "name", None)
    return str(nm) if isinstance(nm, str) and nm else default
