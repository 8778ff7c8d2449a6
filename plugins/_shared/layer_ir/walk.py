"""The state of a walk over an ONNX graph or a torch.export program, and the steps both
readers share."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hwbackends.errors import UnsupportedError

from .ir import ONNX_OPS, Dense, Flatten, Layer, Recurrent, f32

# An ONNX tensor's axes are labelled by what they hold of the IR's channels-last state:
# "N" the batch, "T" time, "C" channels, "1" a singleton. Transposes, (un)squeezes and the
# NCHW convolutions tf2onnx and torch.onnx write around a 1-D layer only move labels.

@dataclass
class Walk:
    """The state of a walk over an ONNX graph or a torch.export program."""

    target: str
    consts: dict[str, np.ndarray]
    in_shape: tuple[int, ...]
    layers: list[Layer] = field(default_factory=list)
    perm: np.ndarray | None = None  # flat feature j of the source's tensor is IR feature perm[j]
    kind: str = "ONNX node"
    supported: str = ONNX_OPS
    pad: tuple[int, int] = (0, 0)  # an ONNX Pad of time, for the Conv after it

    def shape(self) -> tuple[int, ...]:
        s = self.in_shape
        for layer in self.layers:
            s = layer.out_shape(s)
        return s

    def refuse(self, name: str, op: str, why: str = "") -> UnsupportedError:
        why = f": {why}" if why else ""
        return UnsupportedError(f"{self.target} cannot compile {self.kind} {name!r} (op {op}){why}. "
                                f"Supported: {self.supported}")

    def const_ints(self, n: Any, idx: int, attrs: dict, key: str) -> list[int] | None:
        """An int list given as input ``idx`` (newer opsets) or attribute ``key``."""
        if len(n.input) > idx and n.input[idx]:
            return [int(v) for v in np.ravel(self.consts[n.input[idx]])]
        return list(attrs[key].ints) if key in attrs else None



def final_axes(w: Walk, labels: list[str]) -> None:
    """Refuse an output whose axes are not the IR's (batch, [time,] channels)."""
    ax = [a for a in labels if a != "1"]
    want = ["N", "C"] if "T" not in ax else ["N", "T", "C"]
    if ax != want or (w.perm is not None and np.any(w.perm != np.arange(len(w.perm)))):
        raise UnsupportedError(f"{w.target}: the model's output axes hold {ax} (batch N, time T, "
                               f"channels C); it compiles outputs laid out {want}")


def walk_dense(w: Walk, name: str, op: str, ax: list[str], k: np.ndarray, b: Any) -> None:
    """Append ``y = x @ k + b`` (``k`` (n_in, n_out) in the source's feature order)."""
    if ax != ["N", "C"]:
        raise w.refuse(name, op, f"a matrix product over axes {ax} (a Dense takes (batch, features))")
    if w.perm is not None:  # rows in the source tensor's feature order → the IR's
        rows = np.empty_like(k)
        rows[w.perm] = k
        k, w.perm = rows, None
    w.layers.append(Dense(name, f32(k), f32(np.broadcast_to(b, (k.shape[1],)))))


def walk_flatten(w: Walk, name: str, op: str, ax: list[str]) -> list[str]:
    """Flatten to (batch, features); a channels-first order is folded into the next Dense."""
    kept = [a for a in ax if a != "1"]
    if ax[0] != "N":
        raise w.refuse(name, op, f"flattening axes {ax} (batch first)")
    if kept == ["N", "T", "C"]:
        w.layers.append(Flatten(name))
    elif kept == ["N", "C", "T"]:
        t, ch = w.shape()
        w.layers.append(Flatten(name))
        w.perm = (np.arange(t)[None, :] * ch + np.arange(ch)[:, None]).ravel()
    elif kept != ["N", "C"]:
        raise w.refuse(name, op, f"flattening axes {ax}")
    return ["N", "C"]



def last_step(w: Walk, name: str, op: str) -> None:
    """A Gather/Slice of the last time step, right after a recurrent layer: its last state."""
    last = w.layers[-1] if w.layers else None
    if not (isinstance(last, Recurrent) and last.return_sequences):
        raise w.refuse(name, op, "indexing time is only compiled as the last step of an LSTM/GRU")
    last.return_sequences = False
