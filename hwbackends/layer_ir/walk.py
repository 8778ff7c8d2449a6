"""The state of a walk over an ONNX graph or a torch.export program, and the steps both
readers share."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

from .ir import (
    ONNX_OPS,
    Affine,
    Bidirectional,
    Concat,
    Dense,
    Flatten,
    Layer,
    Recurrent,
    Residual,
    TimeSlice,
    Transpose,
    chain_shape,
    f32,
)

# An ONNX tensor's axes are labelled by what they hold of the IR's channels-last state:
# "N" the batch, "T" time, "C" channels, "1" a singleton. Transposes, (un)squeezes and the
# NCHW convolutions tf2onnx and torch.onnx write around a 1-D layer only move labels.

@dataclass
class Chains:
    """The chains of IR layers between a graph's values, for graphs whose only merges are
    residual adds: a value read a second time starts a side chain from it, and an add of a
    chain's tip with a value before it (or with a side chain from that value) replaces the
    layers in between by one :class:`Residual`. Chain 0 is the model's own."""

    chains: list[list[Layer]]
    shapes: list[tuple[int, ...]]  # each chain's input shape
    bases: list[tuple[int, int] | None] = field(default_factory=lambda: [None])  # a side chain's fork
    at: dict[Any, tuple[int, int]] = field(default_factory=dict)  # value → (chain, position)
    cur: int = 0

    def put(self, value: Any) -> None:
        """``value`` is the current chain's tip."""
        self.at[value] = (self.cur, len(self.chains[self.cur]))

    def tip(self, value: Any) -> bool:
        c, pos = self.at.get(value, (-1, -1))
        return c >= 0 and pos == len(self.chains[c])

    def enter(self, value: Any) -> bool:
        """Make ``value`` the current chain's tip (switching to its chain, or forking a side
        chain from it); False for a value the walk does not know (or one inside a residual)."""
        if value not in self.at:
            return False
        c, pos = self.at[value]
        if pos == len(self.chains[c]):
            self.cur = c
            return True
        self.chains.append([])
        self.shapes.append(chain_shape(self.chains[c][:pos], self.shapes[c]))
        self.bases.append((c, pos))
        self.cur = len(self.chains) - 1
        return True

    def merge(self, a: Any, b: Any, name: str) -> str:
        """Add values ``a`` and ``b`` as a :class:`Residual`; "" or why it is not one."""
        plan = self._plan(a, b) if a in self.at and b in self.at else None
        plan = plan or (self._plan(b, a) if a in self.at and b in self.at else None)
        if plan is None:
            return "the two operands do not branch from one value"
        main, fork, body, short, gone = plan
        self.chains[main][fork:] = [Residual(name, list(body), list(short))]
        self.at = {v: (c, p) for v, (c, p) in self.at.items()
                   if not (c == main and p > fork) and c not in gone}
        self.cur = main
        return ""

    def concat(self, values: list[Any], name: str) -> str:
        """Concatenate ``values`` (in order) as one :class:`Concat` of branches from one value:
        each is that value itself (an identity branch), the tip of the chain going on from it,
        or the tip of a side chain forked from it; "" or why it is not one."""
        if any(v not in self.at for v in values):
            return "an operand the walk does not hold"
        forks: list[tuple[int, int]] = []
        for v in values:
            c, _ = self.at[v]
            forks.append(self.at[v])
            base = self.bases[c]
            if base is not None:
                forks.append(base)
        for main, fork in dict.fromkeys(forks):
            plan = self._concat_plan(values, main, fork)
            if plan is not None:
                branches, gone = plan
                self.chains[main][fork:] = [Concat(name, branches)]
                self.at = {v: (c, p) for v, (c, p) in self.at.items()
                           if not (c == main and p > fork) and c not in gone}
                self.cur = main
                return ""
        return "the operands do not branch from one tensor"

    def _concat_plan(self, values: list[Any], main: int, fork: int
                     ) -> tuple[list[list[Layer]], set[int]] | None:
        """The branches of ``values`` from position ``fork`` of chain ``main`` and the side
        chains they use up, or None when one of them is not such a branch."""
        branches: list[list[Layer]] = []
        gone: set[int] = set()
        took_main = False
        for v in values:
            c, pos = self.at[v]
            if (c, pos) == (main, fork):
                branches.append([])
            elif c == main and pos > fork and self.tip(v) and not took_main:
                branches.append(list(self.chains[main][fork:]))
                took_main = True
            elif c != main and self.tip(v) and self.bases[c] == (main, fork) and c not in gone:
                branches.append(list(self.chains[c]))
                gone.add(c)
            else:
                return None
        return branches, gone

    def _plan(self, a: Any, b: Any) -> tuple[int, int, list[Layer], list[Layer], set[int]] | None:
        """(chain, fork position, body, shortcut, side chains used up) of ``a + b`` with ``b``
        a chain's tip, or None."""
        if not self.tip(b):
            return None
        (ca, pa), (cb, _) = self.at[a], self.at[b]
        if ca == cb:  # b's chain goes on from a: an identity shortcut
            return ca, pa, self.chains[ca][pa:], [], set()
        base_a = self.bases[ca]
        if not self.tip(a) or base_a is None:
            return None
        if base_a[0] == cb:  # a's side chain forks from b's chain
            return cb, base_a[1], self.chains[cb][base_a[1]:], self.chains[ca], {ca}
        if self.bases[cb] == base_a and base_a[1] == len(self.chains[base_a[0]]):
            return base_a[0], base_a[1], self.chains[cb], self.chains[ca], {ca, cb}
        return None


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
    branches: Chains = field(init=False)  # residual branches between the graph's values
    stacked: int = 1  # layers of the stacked LSTM/GRU whose h_n is being indexed
    opset: int = 17  # the ONNX graph's default-domain opset (attribute defaults differ by it)
    #: values made while a channels-first flatten's order was pending (:attr:`perm`): their
    #: features are in the source's order, not the IR's
    source_order: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self.branches = Chains([self.layers], [self.in_shape])

    def enter(self, value: Any, name: str, op: str) -> None:
        """Go on from ``value`` (the chain's tip, or a value read a second time: a branch)."""
        ch = self.branches
        if ch.tip(value) and ch.at[value][0] == ch.cur:
            return
        if self.perm is not None or self.pad != (0, 0) or not ch.enter(value):
            raise self.refuse(name, op, "the graph is not a chain of single-input ops or residual adds")
        self._sync()

    def put(self, value: Any) -> None:
        """``value`` is what the current chain's layers give."""
        self.branches.put(value)
        if self.perm is not None:
            self.source_order.add(value)

    def merge(self, a: Any, b: Any, name: str, op: str) -> None:
        """``a + b`` of two data values: a residual add."""
        permuted = self.perm is not None or a in self.source_order or b in self.source_order
        # (an identity shortcut from a channels-first flatten holds the features in the
        # source's order while the body's Dense put them in the IR's: the fuzz found
        # x + mlp(x) after one compiled, answering 0.25 off)
        why = "a channels-first flatten before it" if permuted else self.branches.merge(a, b, name)
        if why:
            raise self.refuse(name, op, f"a residual add only ({why})")
        self._sync()

    def _sync(self) -> None:
        self.layers = self.branches.chains[self.branches.cur]
        self.in_shape = self.branches.shapes[self.branches.cur]

    def channels_first(self, value: Any, name: str) -> list[str]:
        """The input ``value`` read channels-first, ``(batch, channels, time)`` (its first
        consumer takes channels on axis 1): a :class:`Transpose` to the IR's (time, channels),
        and the labels of the input as the model holds it."""
        self.layers.append(Transpose(f"{name}_channels_first"))
        return ["N", "C", "T"]

    def main(self) -> list[Layer]:
        """The model's chain of layers (its output must be that chain's tip)."""
        return self.branches.chains[0]

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
    """Refuse an output whose axes are not the IR's (batch, [time,] channels); one the model
    holds channels-first, (batch, channels, time), gets a :class:`Transpose` back to it."""
    ax = [a for a in labels if a != "1"]
    want = ["N", "C"] if "T" not in ax else ["N", "T", "C"]
    if labels == ["N", "C", "T"] and w.perm is None:
        w.layers.append(Transpose("output_channels_first"))
        return
    if ax != want or (w.perm is not None and np.any(w.perm != np.arange(len(w.perm)))):
        raise UnsupportedError(f"{w.target}: the model's output axes hold {ax} (batch N, time T, "
                               f"channels C); it compiles outputs laid out {want}")


def walk_affine(w: Walk, name: str, op: str, scale: Any, shift: Any) -> None:
    """Append ``y = x·scale + shift`` per feature (an eval-mode batch norm). After a
    channels-first flatten (:attr:`Walk.perm`) the vectors, in the source tensor's feature
    order, are put in the IR's; a vector of another length than the features is refused."""
    n = w.shape()[-1]
    scale, shift = (np.asarray(v, np.float64).ravel() for v in (scale, shift))
    if scale.size != n or shift.size != n:
        raise w.refuse(name, op, f"it normalizes {scale.size} features; its input has {n} on the "
                                 f"axis it acts on (shape {w.shape()})")
    if w.perm is not None:
        ir_scale, ir_shift = np.empty_like(scale), np.empty_like(shift)
        ir_scale[w.perm], ir_shift[w.perm] = scale, shift
        scale, shift = ir_scale, ir_shift
    w.layers.append(Affine(name, scale, shift))


def walk_dense(w: Walk, name: str, op: str, ax: list[str], k: np.ndarray, b: Any) -> None:
    """Append ``y = x @ k + b`` (``k`` (n_in, n_out) in the source's feature order): over
    (batch, features), or per time step over the channels of (batch, time, channels) in either
    order of batch and time (a transformer's feed-forward; the IR's Dense acts on the last axis)."""
    per_step = ax[-1:] == ["C"] and sorted(ax) == ["C", "N", "T"] and w.perm is None
    if np.ndim(k) != 2 or (ax != ["N", "C"] and not per_step):
        raise w.refuse(name, op, f"a matrix product of a {np.ndim(k)}-D weight over axes {ax} (a Dense "
                                 f"takes a 2-D weight over (batch, features) "
                                 f"or the channels of (batch, time, channels))")
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



def time_slice(w: Walk, name: str, op: str, start: int, stop: int, step: int, keep: bool) -> None:
    """Steps ``start:stop`` (Python's slice semantics) of time; ``keep=False``: one step, the
    axis dropped."""
    steps = w.shape()[0]
    a, b, s = slice(start, stop, step).indices(steps)
    if s != 1 or b - a < 1:
        raise w.refuse(name, op, f"a time slice {start}:{stop}:{step} of {steps} steps (contiguous, "
                                 f"non-empty slices only)")
    w.layers.append(TimeSlice(name, a, b, keep))


def squeeze_time(w: Walk, name: str, op: str, ax: list[str], dims: list[int]) -> list[str]:
    """The labels after squeezing ``dims``: singletons go; time goes only where it holds one
    step (``x[:, a:a+1]`` then a squeeze: that step, the axis dropped); other axes stay (as
    torch's squeeze keeps an axis that is not of size 1)."""
    if any(ax[d] == "T" for d in dims) and w.shape()[0] == 1:
        time_slice(w, name, op, 0, 1, 1, False)
        return [a for i, a in enumerate(ax) if i not in dims or a not in ("1", "T")]
    return [a for i, a in enumerate(ax) if i not in dims or a != "1"]


def permuted(w: Walk, v: np.ndarray) -> np.ndarray:
    """A per-feature vector in the source tensor's feature order, put in the IR's after a
    channels-first flatten (:attr:`Walk.perm`; a layer norm's gamma/beta: its mean and
    variance over all features do not depend on their order)."""
    if w.perm is None:
        return np.asarray(v)
    out = np.empty_like(np.asarray(v))
    out[w.perm] = v
    return out


def last_step(w: Walk, name: str, op: str) -> None:
    """A Gather/Slice of the last time step, right after a recurrent layer: its last state."""
    last = w.layers[-1] if w.layers else None
    if isinstance(last, Bidirectional):
        raise w.refuse(name, op, "h_n of a bidirectional LSTM/GRU (its last entry is the backward "
                                 "state at step 0): take output[:, -1] instead")
    if not (isinstance(last, Recurrent) and last.return_sequences):
        raise w.refuse(name, op, "indexing time is only compiled as the last step of an LSTM/GRU")
    last.return_sequences = False
