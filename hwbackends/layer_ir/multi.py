"""Networks with several inputs and several outputs, in the shape desks write them: each input
through its own chain of layers (possibly empty), the chains merged once — concatenated on the
feature (last) axis, or added when their shapes match — a shared trunk, then one head (a
chain) per output. An output taken from a point inside the trunk is a head over a shorter
trunk: the trunk is the longest chain every output shares, so a head may be empty.

Why chains around one merge and not a graph of named values: the IR's single-chain layers,
checks, folding and emitters stay as they are (a :class:`MultiNetwork` is made of ordinary
chains, each one a :class:`~.ir.Network`'s ``layers``), and every desk model with several
inputs or outputs is this shape (book and trade features apart, a return forecast and a
direction probability out). A model with one input and one output is never a MultiNetwork:
:func:`~.read.extract` reads it as before.

:func:`extract_multi` reads one from Keras (a functional model: ``keras.Input`` per input, a
``Concatenate``/``Add``, several outputs), torch (a module whose ``forward`` takes several
tensors and returns a tuple, through ``torch.export``) and ONNX (a graph with several inputs or
outputs, a ``Concat`` of the last axis or an ``Add``). Each chain is read by the format's own
reader (:mod:`.from_keras`, :mod:`.from_torch`, :mod:`.from_onnx`) from the part of the model
between two values (:mod:`.split`), so every layer and refusal of a single-chain model holds
inside a chain too. :func:`forward_multi` is the float64 reference."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

import numpy as np

from hwbackends.contract import UnsupportedError

from .ir import Layer, chain_shape

#: How the inputs' chains meet.
MERGES = ("concat", "add", "none")


@dataclass
class Branch:
    """One model input (``input``: its index in the model's inputs) and the chain over it."""

    name: str
    input: int
    input_shape: tuple[int, ...]
    layers: list[Layer]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return chain_shape(self.layers, self.input_shape)


@dataclass
class Head:
    """One model output and the chain from the trunk's end to it (empty: the trunk's end)."""

    name: str
    layers: list[Layer]


@dataclass
class MultiNetwork:
    """``branches`` in merge order (a concatenation's operand order; one branch and merge
    ``"none"`` for a model with one input), ``trunk`` after the merge, one :class:`Head` per
    model output in the model's order."""

    name: str
    branches: list[Branch]
    merge: str
    trunk: list[Layer]
    heads: list[Head]

    @property
    def input_shapes(self) -> list[tuple[int, ...]]:
        """Per model input (the model's order), its shape."""
        return [b.input_shape for b in sorted(self.branches, key=lambda b: b.input)]

    @property
    def merged_shape(self) -> tuple[int, ...]:
        """The trunk's input shape."""
        outs = [b.output_shape for b in self.branches]
        if self.merge == "concat":
            return (*outs[0][:-1], sum(s[-1] for s in outs))
        return outs[0]

    @property
    def trunk_shape(self) -> tuple[int, ...]:
        return chain_shape(self.trunk, self.merged_shape)

    @property
    def output_shapes(self) -> list[tuple[int, ...]]:
        return [chain_shape(h.layers, self.trunk_shape) for h in self.heads]

    def chains(self) -> list[tuple[str, list[Layer], tuple[int, ...]]]:
        """Every chain with its input shape: ``(what, layers, shape)``."""
        out = [(f"input {b.name!r}", b.layers, b.input_shape) for b in self.branches]
        out.append(("trunk", self.trunk, self.merged_shape))
        out += [(f"output {h.name!r}", h.layers, self.trunk_shape) for h in self.heads]
        return out


def merge(kind: str, parts: Sequence[np.ndarray]) -> np.ndarray:
    """The branches' outputs (one batch each) merged as ``kind`` does."""
    if kind == "concat":
        return np.concatenate(list(parts), axis=-1)
    if kind == "add":
        y = np.asarray(parts[0], np.float64)
        for p in parts[1:]:
            y = y + p
        return y
    return np.asarray(parts[0], np.float64)


def forward_multi(net: MultiNetwork, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The float64 outputs (the model's order) for ``xs``, one batch per input in the model's
    input order."""
    from .reference import run_chain

    parts = [run_chain(b.layers, np.asarray(xs[b.input], np.float64)) for b in net.branches]
    trunk = run_chain(net.trunk, merge(net.merge, parts))
    return [run_chain(h.layers, trunk) for h in net.heads]


def extract_multi(model: Any, target: str, *, dtype: Any = np.float32) -> MultiNetwork:
    """``model`` (a :class:`hwbackends.models.Model` with several inputs or outputs, format
    keras, torch or onnx) as a :class:`MultiNetwork`; anything else is refused with
    :class:`UnsupportedError` naming what (see the module's doc)."""
    from . import split
    from .read import finish_chain

    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise UnsupportedError(f"layer_ir.extract_multi keeps weights as float32 or float64, not {dtype}")
    in_shapes = [tuple(int(d) for d in s.shape) for s in model.inputs]
    parts = split.parts(model, target, in_shapes)
    branches = [Branch(model.inputs[i].name, i, in_shapes[i],
                       finish_chain(layers, in_shapes[i], dtype, target, f"input {model.inputs[i].name!r}"))
                for i, layers in parts.branches]
    kind = parts.merge
    outs = [b.output_shape for b in branches]
    if kind == "concat" and (len({len(s) for s in outs}) != 1 or len({s[:-1] for s in outs}) != 1):
        raise UnsupportedError(f"{target}: the inputs' chains give shapes {outs}; a concatenation "
                               f"on the last axis needs one rank and equal leading axes")
    if kind == "add" and len(set(outs)) != 1:
        raise UnsupportedError(f"{target}: the inputs' chains give shapes {outs}; an add of them "
                               f"needs one shape")
    probe = MultiNetwork(model.name, branches, kind, [], [])
    merged = probe.merged_shape
    chains = [finish_chain(layers, merged, dtype, target, f"output {model.outputs[k].name!r}")
              for k, layers in enumerate(parts.outputs)]
    n = common_prefix(chains)
    net = MultiNetwork(model.name, branches, kind, chains[0][:n],
                       [Head(model.outputs[k].name, c[n:]) for k, c in enumerate(chains)])
    for k, (got, spec) in enumerate(zip(net.output_shapes, model.outputs, strict=True)):
        if got != tuple(spec.shape):
            raise UnsupportedError(f"{target}: the layers give output {k} ({spec.name!r}) shape "
                                   f"{got}; the model's is {tuple(spec.shape)}")
    return net


def common_prefix(chains: list[list[Layer]]) -> int:
    """How many leading layers every chain shares (the same layer type, parameters and weights):
    each output read from the merge on its own repeats the trunk, which is computed once."""
    n = min(len(c) for c in chains)
    for i in range(n):
        if not all(same_layer(chains[0][i], c[i]) for c in chains[1:]):
            return i
    return n


def same_layer(a: Any, b: Any) -> bool:
    """Whether two IR layers (or values inside one) are equal, weights compared by value."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=True)))
    if isinstance(a, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same_layer(x, y) for x, y in zip(a, b, strict=True)))
    if isinstance(a, Layer):
        return type(a) is type(b) and all(same_layer(getattr(a, f.name), getattr(b, f.name))
                                          for f in fields(a))
    return bool(a == b)


__all__ = ["MERGES", "Branch", "Head", "MultiNetwork", "common_prefix",
           "extract_multi", "forward_multi", "merge", "same_layer"]
