"""The state of a walk over an ONNX graph or a torch.export program, and the steps both
readers share."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

from .ir import (
    ONNX_OPS,
    Act,
    Affine,
    Bidirectional,
    Concat,
    Dense,
    Flatten,
    GlobalPool1D,
    Layer,
    Pool2D,
    Recurrent,
    Reshape,
    Residual,
    TimeSlice,
    Transpose,
    chain_shape,
    f32,
)

# An ONNX tensor's axes are labelled by what they hold of the IR's channels-last state:
# "N" the batch, "T" time, "C" channels, "1" a singleton; over an image "Y" its rows and "X"
# its columns (the IR holds (rows, cols, channels)). Transposes, (un)squeezes and the NCHW
# convolutions tf2onnx and torch.onnx write around a 1-D layer only move labels.

#: The IR's order of the axes it holds (channels last): a state's labels sorted by this.
IR_ORDER = {"T": 0, "Y": 0, "X": 1, "C": 2}


def ir_labels(labels: list[str]) -> list[str]:
    """The labels of ``labels``' axes as the IR holds them: batch and singletons dropped,
    channels last."""
    return sorted((a for a in labels if a in IR_ORDER), key=IR_ORDER.__getitem__)

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
        each is that value itself (an identity branch) or a value reached from it through the
        chains (the chain going on from it, side chains forked from it or from inside another
        branch: torch.onnx computes branches' equal first layers once, so one branch's layers
        may fork inside another's; each branch then holds its whole path, the shared layers
        repeated). The latest fork that reaches every value is taken; "" or why it is not one."""
        if any(v not in self.at for v in values):
            return "an operand the walk does not hold"
        forks: list[tuple[int, int]] = []
        for v in values:
            point: tuple[int, int] | None = self.at[v]
            while point is not None:  # the value's own position, then every fork above it
                forks.append(point)
                point = self.bases[point[0]]
        for main, fork in sorted(dict.fromkeys(forks), key=lambda f: (-self._depth(f[0]), -f[1])):
            plan = self._concat_plan(values, main, fork)
            if plan is not None:
                branches, gone = plan
                self.chains[main][fork:] = [Concat(name, branches)]
                while True:  # chains forked from a used one go with it
                    more = {c for c, base in enumerate(self.bases) if base is not None and base[0] in gone} - gone
                    if not more:
                        break
                    gone |= more
                self.at = {v: (c, p) for v, (c, p) in self.at.items()
                           if not (c == main and p > fork) and c not in gone}
                self.cur = main
                return ""
        return "the operands do not branch from one tensor"

    def _depth(self, c: int) -> int:
        """How many forks chain ``c`` is from the model's own chain."""
        n = 0
        while self.bases[c] is not None:
            c, n = self.bases[c][0], n + 1  # type: ignore[index]
        return n

    def _concat_plan(self, values: list[Any], main: int, fork: int
                     ) -> tuple[list[list[Layer]], set[int]] | None:
        """The branches of ``values`` from position ``fork`` of chain ``main`` (each the layers
        on its path from there) and the side chains they use up, or None when one of them is
        not reached from there."""
        branches: list[list[Layer]] = []
        gone: set[int] = set()
        for v in values:
            c, pos = self.at[v]
            layers: list[Layer] = []
            while c != main:
                base = self.bases[c]
                if base is None:
                    return None
                layers = list(self.chains[c][:pos]) + layers
                gone.add(c)
                c, pos = base
            if pos < fork:
                return None
            branches.append(list(self.chains[main][fork:pos]) + layers)
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
    #: the pending flatten: its index in :attr:`layers` and the axis order that puts the IR's
    #: tensor in the source's before it (:func:`final_axes`, for an output flattened so)
    flat_at: tuple[int, tuple[int, ...]] | None = None

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
        """The input ``value`` read channels-first, ``(batch, channels, time)`` or ``(batch,
        channels, rows, cols)`` (its first consumer takes channels on axis 1): a
        :class:`Transpose` to the IR's (time, channels) or (rows, cols, channels), and the
        labels of the input as the model holds it."""
        if len(self.in_shape) == 3:
            self.layers.append(Transpose(f"{name}_channels_first", (1, 2, 0)))
            return ["N", "C", "Y", "X"]
        self.layers.append(Transpose(f"{name}_channels_first"))
        return ["N", "C", "T"]

    def concat(self, values: list[Any], name: str, op: str) -> None:
        """A concatenation of data values on the channels: branches from one value."""
        if self.perm is not None or any(v in self.source_order for v in values):
            raise self.refuse(name, op, "a concatenation after a channels-first flatten")
        why = self.branches.concat(values, name)
        if why:
            raise self.refuse(name, op, f"a concatenation of branches from one tensor only ({why})")
        self._sync()

    def main(self) -> list[Layer]:
        """The model's chain of layers (its output must be that chain's tip)."""
        return self.branches.chains[0]

    def in_labels(self, ax: list[str]) -> list[str]:
        """The labels of the IR state's axes, in its order, for a tensor labelled ``ax``."""
        return ir_labels(ax)

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
    """Refuse an output whose axes are not the IR's (batch, [time,] channels) or (batch, rows,
    cols, channels) in some order: one the model holds in another order (channels-first)
    gets a :class:`Transpose` to it, and singleton axes it keeps a :class:`Reshape`."""
    ax = [a for a in labels if a != "1"]
    if w.perm is not None and ax == ["N", "C"] and w.flat_at is not None and all(
            isinstance(x, Act) and x.slope is None for x in w.layers[w.flat_at[0] + 1:]):
        # an output flattened channels-first, only element-wise ops after it: the IR's tensor
        # put in the source's order before its flatten
        at, order = w.flat_at
        w.layers.insert(at, Transpose(f"{w.layers[at].name}_source_order", order))
        w.perm = w.flat_at = None
    if labels[:1] != ["N"] or any(a not in IR_ORDER for a in ax[1:]) or len(set(ax)) != len(ax) or (
            w.perm is not None and (len(ax) != 2 or np.any(w.perm != np.arange(len(w.perm))))):
        raise UnsupportedError(f"{w.target}: the model's output axes hold {ax} (batch N, time T, "
                               f"rows Y, cols X, channels C); it compiles outputs of the batch "
                               f"then these axes")
    held, want = ir_labels(ax), ax[1:]
    if want != held:
        w.layers.append(Transpose("output_channels_first", tuple(held.index(a) for a in want)))
    if "1" in labels[1:]:
        size = dict(zip(want, w.shape(), strict=True))
        w.layers.append(Reshape("output_singletons", tuple(size.get(a, 1) for a in labels[1:])))


def reduce_image(w: Walk, name: str, op: str, ax: list[str], axes: list[int], keep: bool) -> list[str]:
    """A mean / max / sum over an image's rows, columns or both (``axes`` of ``ax``): both read as a sequence of
    cells pooled over it; one a 2-D pooling over it, the other kept as (time, channels)."""
    over = sorted(ax[a] for a in axes if ax[a] != "1")
    kind = "max" if "Max" in op else "avg"
    h, wd, ch = w.shape()
    if over == ["X", "Y"]:
        w.layers += [Reshape(f"{name}_cells", (h * wd, ch)), GlobalPool1D(name, kind)]
        n_cells, gone = h * wd, {"Y", "X"}
    elif over in (["Y"], ["X"]):
        size = (h, 1) if over == ["Y"] else (1, wd)
        w.layers += [Pool2D(name, kind, size, (1, 1)), Reshape(f"{name}_axis", (wd if over == ["Y"] else h, ch))]
        n_cells, gone = size[0] * size[1], set(over)
    else:
        raise w.refuse(name, op, f"reducing axes {axes} of {ax} (the rows, the columns or both)")
    if op == "ReduceSum":  # the mean times the cells: a sum to the answers' rounding
        w.layers.append(Affine(f"{name}_sum", np.full(ch, float(n_cells)), np.zeros(ch)))
    out = [("1" if a in gone else a) for i, a in enumerate(ax) if keep or i not in axes]
    # with one image axis left, it is the IR's time axis
    return [("T" if a in ("Y", "X") else a) for a in out] if len(gone) == 1 else out


def reshape_merge(w: Walk, name: str, op: str, ax: list[str], to: list[int], batch: Any = None) -> list[str]:
    """A reshape to ``to`` that merges a run of axes (an image's columns into its channels, as
    a DeepLOB's events before its LSTM): :func:`walk_merge`. ``to[0]`` is the batch: 0 or -1
    (ONNX), or ``batch`` (the size a torch program was traced with)."""
    sizes = dict(zip(w.in_labels(ax), w.shape(), strict=True))
    dims = [sizes.get(a, 1) for a in ax[1:]]
    want = list(to[1:])
    if (to[0] not in (0, -1) and to[0] != batch) or len(want) >= len(dims):
        raise w.refuse(name, op, f"a reshape to {to} of axes {ax} (to (batch, features), or merging "
                                 f"adjacent axes)")
    if -1 in want:
        known = int(np.prod([d for d in want if d != -1]))
        want = [int(np.prod(dims)) // max(known, 1) if d == -1 else d for d in want]
    want = [dims[i] if d == 0 else d for i, d in enumerate(want)]
    for start in range(len(dims)):
        for stop in range(start + 2, len(dims) + 1):
            if dims[:start] + [int(np.prod(dims[start:stop]))] + dims[stop:] == want:
                return walk_merge(w, name, op, ax, start + 1, stop + 1)
    raise w.refuse(name, op, f"a reshape to {to} of axes {ax} (shape {dims}): it merges no run of them")


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
    """Flatten to (batch, features); another order than the IR's (channels-first) is folded
    into the next Dense (:attr:`Walk.perm`)."""
    kept = [a for a in ax if a != "1"]
    if ax[0] != "N" or "N" in kept[1:]:
        raise w.refuse(name, op, f"flattening axes {ax} (batch first)")
    held = ir_labels(kept)
    if sorted(kept[1:]) != sorted(held) or len(set(kept)) != len(kept):
        raise w.refuse(name, op, f"flattening axes {ax}")
    if kept[1:] != held:  # flat feature j of the source's order is IR feature perm[j]
        shape = w.shape()
        order = tuple(held.index(a) for a in kept[1:])
        w.perm = np.arange(int(np.prod(shape))).reshape(shape).transpose(order).ravel()
        w.flat_at = (len(w.layers), order)
    if len(held) > 1:
        w.layers.append(Flatten(name))
    return ["N", "C"]


def walk_merge(w: Walk, name: str, op: str, ax: list[str], start: int, stop: int) -> list[str]:
    """Axes ``start:stop`` of ``ax`` merged into one (a reshape): where they are a run of the
    IR's own axes in its order, the same floats read as a :class:`Reshape` (an image's
    ``(rows, cols, channels)`` as ``(rows, cols·channels)``, the events of a DeepLOB before its
    LSTM); what is left of two axes is (time, channels), of one a flat vector."""
    run = [a for a in ax[start:stop] if a != "1"]
    rest = [a for a in ax if a != "1"]
    held = ir_labels(rest)
    if start < 1 or rest[1:] != held or not run or w.perm is not None:
        raise w.refuse(name, op, f"merging axes {start}:{stop} of {ax} (a run of the channels-last "
                                 f"axes, in their order)")
    if len(run) == 1:
        return ax[:start] + run + ax[stop:]
    first = held.index(run[0])
    shape = w.shape()
    dims = [*shape[:first], int(np.prod(shape[first:first + len(run)])), *shape[first + len(run):]]
    labels = held[:first] + ["M"] + held[first + len(run):]
    if len(dims) == 1:
        w.layers.append(Flatten(name))
        return ["N", "C"]
    w.layers.append(Reshape(name, tuple(dims)))
    # the merged tensor as the IR holds it: two axes are (time, channels), the last the channels
    names = ["T", "C"] if len(dims) == 2 else ["Y", "X", "C"]
    relabel = dict(zip(labels, names, strict=True))
    out = ax[:start] + ["M"] + ax[stop:]
    return [relabel.get(a, a) for a in out]



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
