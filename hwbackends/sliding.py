"""The sliding window and the stream: one tick in, the answer out (``CompiledModel.sliding()``
and ``CompiledModel.streaming()``).

A model over a window of ``T`` steps (input shape ``(T, *step)``) is, in trading, run on a
window that slides by one tick: the answer at tick ``t`` is the model on the ``T`` most recent
steps, with zero state at the window's start (STAC-ML Tacana's semantics). A :class:`Window`
holds that window: :meth:`Window.push_into` takes one step's features ``x_t`` (shape
``input.shape[1:]``) and writes into ``out`` (shape ``output.shape``, one sample) exactly what
``predict_into`` returns for the window ending at ``x_t``. Before ``T`` steps were pushed, the
window is zero-filled at its start: the answer is ``predict_into`` on
``[0, …, 0, x_0, …, x_t]`` (so is it after :meth:`Window.reset`).

Two forms give those answers:

* **recompute** (:class:`RecomputeSteps`, every model on every target): the window is kept in a
  ring buffer and ``predict_into`` runs on it each tick; nothing to prepare;
* **incremental**, where a target offers one (:meth:`hwbackends.target.Executor.incremental`):
  only the work that needs ``x_t`` runs in ``push_into``; the rest (advancing the windows in
  flight, the next window's recurrent products) runs in :meth:`Window.prepare`, which a
  strategy may call while it waits for the next tick. ``push_into`` runs a pending prepare
  first itself, so a caller that never calls it still gets the right answers (then paying
  for it on the tick).

**Many windows, one model.** ``sliding(streams=N)`` / ``streaming(streams=N)`` return
:class:`Windows`: ``N`` independent windows over the one set of weights (one per symbol a
desk runs the model on): ``push_into(i, x_t, out)`` for window ``i``, ``push_many(ids, xs,
outs)`` for the ticks of several symbols that arrive together (answered together: a target's
form computes their input products as one matrix product), ``prepare()`` for every window
with work pending, ``reset(i)`` (``reset()``: all). Every window's answers are those of its
own ticks (:meth:`hwbackends.target.Executor.incremental_streams`); the fallback keeps ``N``
recomputed windows.

``streaming()`` is the other semantics (VOLLO's): a stateful model whose state is never reset
between ticks; each push advances it by one step and answers; :meth:`Window.reset` zeroes it.
It exists only as a target's incremental form (``predict_into`` cannot express it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from .errors import InputError, UnsupportedError
from .inputs import as_sample
from .specs import TensorSpec

_F32 = np.dtype(np.float32)


class Windowed(Protocol):
    """What this module reads of a compiled model (``CompiledModel`` is one; naming the
    protocol, not the class, keeps the import one way: compiled → sliding)."""

    multi_io: bool
    model_name: str
    variant: str
    batch_size: int
    executor: Any
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    input: TensorSpec
    output: TensorSpec
    nan_policy: str

    def predict_into(self, xs: Any, outs: Any) -> None: ...


@dataclass
class Steps:
    """What a target's incremental form (or the core's fallback) provides: the calls behind a
    :class:`Window`.

    ``push_into(x_t, out)`` writes the answer (and, with ``auto_prepare``, prepares the next
    tick after writing ``out``); ``prepare()`` does the work for the next tick that does not
    need it (a no-op when nothing is pending); ``reset()`` empties the window (zero-filled) or
    zeroes the stream's state. ``form`` is ``"incremental"`` or ``"recompute"``. A target whose
    state lives outside this object (a C library's globals) calls :attr:`revoke` on the
    :class:`Steps` it handed out before when it hands out new ones over the same state: the
    :class:`Window` that the core built over the old ones then refuses every call."""

    push_into: Callable[[np.ndarray, np.ndarray], None]
    prepare: Callable[[], None]
    reset: Callable[[], None]
    form: str = "incremental"
    #: Set by the core (:class:`Window`): makes the window refuse every later call, saying why.
    revoke: Callable[[str], None] = field(default=lambda why: None, repr=False)


@dataclass
class StreamSteps:
    """What a target's many-window form (or the core's fallback) provides: the calls behind
    :class:`Windows` (:meth:`hwbackends.target.Executor.incremental_streams` says what each
    does). ``reset(i)`` takes ``-1`` for every window."""

    push_into: Callable[[int, np.ndarray, np.ndarray], None]
    push_many: Callable[[np.ndarray, np.ndarray, np.ndarray], None]
    prepare: Callable[[], None]
    reset: Callable[[int], None]
    form: str = "incremental"


class Window:
    """The handle ``cm.sliding()`` / ``cm.streaming()`` return (see the module docstring).

    ``push_into`` *is* the form's own call (for cpu.native one C function), so a tick costs what
    the target costs. One caller at a time, like ``predict_into``; it takes no lock."""

    def __init__(self, steps: Steps, *, window: int, step_shape: tuple[int, ...],
                 output_shape: tuple[int, ...], stateful: bool, nan_policy: str = "reject"):
        self.form = steps.form
        #: What :meth:`push` does with a NaN/Inf tick (the compiled model's ``nan_policy``).
        self.nan_policy = nan_policy
        #: The window's length in steps (``input.shape[0]``); for a stream, the compiled one.
        self.window = window
        self.step_shape = step_shape
        self.output_shape = output_shape
        self.stateful = stateful
        self.push_into = steps.push_into
        self.prepare = steps.prepare
        self.reset = steps.reset
        steps.revoke = self._revoke

    def push(self, x_t: Any) -> np.ndarray:
        """The validating form of :meth:`push_into`, as ``predict`` is of ``predict_into``:
        ``x_t`` any array-like of one step's shape, checked (a NaN/Inf tick is an
        :class:`InputError` under ``nan_policy="reject"``, before it reaches the window);
        returns a new array of the answer."""
        x = as_sample(x_t, TensorSpec("x_t", self.step_shape), self.nan_policy, where="push")
        out = np.empty(self.output_shape, np.float32)
        self.push_into(x, out)
        return out

    def _revoke(self, why: str) -> None:
        def refused(*_: Any) -> None:
            raise UnsupportedError(why)
        self.push_into = self.prepare = self.reset = refused  # type: ignore[method-assign]

    def __repr__(self) -> str:
        kind = "stream" if self.stateful else f"window of {self.window}"
        return f"<Window {kind} × {self.step_shape} ({self.form})>"


class Windows:
    """The handle ``cm.sliding(streams=N)`` / ``cm.streaming(streams=N)`` return: ``N``
    windows (streams) of one compiled model (see the module docstring). ``push_into`` and
    ``push_many`` *are* the form's own calls (for cpu.native, C functions over the library's
    window handles). One caller at a time over the whole object, like ``predict_into``."""

    def __init__(self, steps: StreamSteps, *, streams: int, window: int,
                 step_shape: tuple[int, ...], output_shape: tuple[int, ...], stateful: bool,
                 nan_policy: str = "reject"):
        self.form = steps.form
        #: What :meth:`push` does with a NaN/Inf tick (the compiled model's ``nan_policy``).
        self.nan_policy = nan_policy
        self.streams = streams
        self.window = window
        self.step_shape = step_shape
        self.output_shape = output_shape
        self.stateful = stateful
        self.push_into = steps.push_into
        self.push_many = steps.push_many
        self.prepare = steps.prepare
        self._reset = steps.reset

    def push(self, i: int, x_t: Any) -> np.ndarray:
        """The validating form of :meth:`push_into` (see :meth:`Window.push`) on window ``i``."""
        check_id(i, self.streams)
        x = as_sample(x_t, TensorSpec("x_t", self.step_shape), self.nan_policy, where="push")
        out = np.empty(self.output_shape, np.float32)
        self.push_into(int(i), x, out)
        return out

    def reset(self, i: int | None = None) -> None:
        """Empty window ``i`` (zero-filled; a stream's state zeroed), or every window."""
        if i is None:
            self._reset(-1)
            return
        check_id(i, self.streams)
        self._reset(int(i))

    def __len__(self) -> int:
        return self.streams

    def __repr__(self) -> str:
        kind = "streams" if self.stateful else f"windows of {self.window}"
        return f"<Windows {self.streams} {kind} × {self.step_shape} ({self.form})>"


def check_streams(streams: Any) -> int:
    """``streams`` as a count of windows (1 … :data:`MAX_STREAMS`), else InputError."""
    if isinstance(streams, bool) or not isinstance(streams, (int, np.integer)):
        raise InputError(f"streams must be a whole number of windows (1 to {MAX_STREAMS}); got "
                         f"{type(streams).__name__} {streams!r}")
    if not 1 <= int(streams) <= MAX_STREAMS:
        raise InputError(f"streams={streams}: expected 1 to {MAX_STREAMS} windows (one per symbol)")
    return int(streams)


#: The most windows one ``sliding(streams=N)`` keeps (each holds its own state: a desk with
#: more symbols opens several).
MAX_STREAMS = 1 << 16


def check_id(i: Any, streams: int) -> None:
    """Raise InputError unless ``i`` names one of ``streams`` windows."""
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= int(i) < streams:
        raise InputError(f"stream id {i!r}: expected a whole number 0 to {streams - 1} (this "
                         f"object holds {streams} windows)")


def check_many(ids: Any, xs: Any, outs: Any, streams: int, step: tuple[int, ...],
               out_shape: tuple[int, ...]) -> None:
    """Raise InputError saying what is wrong with ``push_many``'s arguments."""
    if not isinstance(ids, np.ndarray) or ids.ndim != 1 or ids.dtype != np.int64 or not ids.flags.c_contiguous:
        raise InputError("push_many: ids must be a C-contiguous 1-D numpy int64 array of stream ids; "
                         f"got {type(ids).__name__} {getattr(ids, 'dtype', '')} {getattr(ids, 'shape', '')}. "
                         "Build it once outside the hot path: np.asarray(ids, np.int64)")
    k = ids.shape[0]
    for label, a, shape, writeable in (("xs", xs, (k, *step), False), ("outs", outs, (k, *out_shape), True)):
        if not isinstance(a, np.ndarray) or tuple(a.shape) != shape or a.dtype != _F32 or not a.flags.c_contiguous:
            raise InputError(f"push_many: {label} must be a C-contiguous float32 array of shape {shape} "
                             f"(one row per id); got {type(a).__name__} {getattr(a, 'dtype', '')} "
                             f"{tuple(getattr(a, 'shape', ()))}")
        if writeable and not a.flags.writeable:
            raise InputError("push_many: outs is read-only; pass a writeable preallocated array")
    if k and (ids.min() < 0 or ids.max() >= streams):
        raise InputError(f"push_many: stream ids must be 0 to {streams - 1}; got {ids.min()} … {ids.max()}")
    if np.unique(ids).size != k:
        raise InputError("push_many: ids must be distinct (one tick per window per call); push a "
                         "window's next tick in a later call")


def step_shapes(cm: Windowed) -> tuple[int, tuple[int, ...]]:
    """``(window length, one step's shape)`` of ``cm``'s input; UnsupportedError for a model
    with no window (several inputs or outputs, a scalar input)."""
    if cm.multi_io:
        raise UnsupportedError(
            f"sliding()/streaming() take a model with one input and one output; "
            f"{cm.model_name} has {len(cm.inputs)} inputs and {len(cm.outputs)} outputs. Keep "
            f"the window yourself and call predict_into")
    shape = tuple(cm.input.shape)
    if not shape:
        raise UnsupportedError(f"{cm.model_name}'s input is a scalar: there is no time axis to "
                               f"slide (sliding() slides the input's first axis)")
    return int(shape[0]), shape[1:]


class RecomputeSteps:
    """The fallback form: the last ``T`` steps in a ring buffer, ``predict_into`` on them.

    The ring holds every step twice (``ring[k]`` and ``ring[k + T]``), so the window ending at
    the newest step is always the contiguous slice ``ring[k + 1 : k + 1 + T]``; with batch size
    1 those ``T`` slices are made once and handed to ``predict_into`` as they are (no copy, no
    allocation per tick); a larger compiled batch copies the window into row 0 of a staging
    batch (the other rows stay zero)."""

    form = "recompute"

    def __init__(self, cm: Windowed):
        t, step = step_shapes(cm)
        self._t, self._step = t, step
        self._ring = np.zeros((2 * t, *step), np.float32)
        self._k = 0
        self._predict = cm.predict_into
        b = cm.batch_size
        self._y = np.zeros(cm.output.batched(b), np.float32)
        self._y0 = self._y[0]
        if b == 1:
            self._views = [self._ring[k + 1:k + 1 + t][None] for k in range(t)]
            self._x = None
        else:
            self._views = [self._ring[k + 1:k + 1 + t] for k in range(t)]
            self._x = np.zeros(cm.input.batched(b), np.float32)
        self._out_shape = tuple(cm.output.shape)

    def steps(self) -> Steps:
        return Steps(self.push_into, self.prepare, self.reset, self.form)

    def push_into(self, x_t: np.ndarray, out: np.ndarray) -> None:
        """Write ``x_t`` into the ring and the answer of the window ending at it into ``out``."""
        try:
            ok = (x_t.shape == self._step and out.shape == self._out_shape and x_t.dtype is _F32
                  and out.dtype is _F32 and out.flags.writeable)
        except AttributeError:
            ok = False
        if not ok:
            check_step(x_t, out, self._step, self._out_shape)
        k, t = self._k, self._t
        self._ring[k] = x_t
        self._ring[k + t] = x_t
        view = self._views[k]
        self._k = k + 1 if k + 1 < t else 0
        if self._x is None:
            self._predict(view, self._y)
        else:
            self._x[0] = view
            self._predict(self._x, self._y)
        out[...] = self._y0

    def prepare(self) -> None:
        """Nothing to prepare: the whole window is computed on the tick."""

    def reset(self) -> None:
        """Empty the window: zero-filled, as at the start."""
        self._ring[...] = 0.0
        self._k = 0


class RecomputeStreams:
    """The fallback's ``N`` windows: one :class:`RecomputeSteps` ring each, ``predict_into``
    on the window a tick ends (``push_many``: each tick in turn)."""

    form = "recompute"

    def __init__(self, cm: Windowed, streams: int):
        self._rings = [RecomputeSteps(cm) for _ in range(streams)]
        self._n = streams
        t, self._step = step_shapes(cm)
        self._out_shape = tuple(cm.output.shape)

    def steps(self) -> StreamSteps:
        return StreamSteps(self.push_into, self.push_many, self.prepare, self.reset, self.form)

    def push_into(self, i: int, x_t: np.ndarray, out: np.ndarray) -> None:
        """Push ``x_t`` into window ``i``; its answer into ``out``."""
        if not (type(i) is int and 0 <= i < self._n):
            check_id(i, self._n)  # raises unless a numpy integer in range
        self._rings[int(i)].push_into(x_t, out)

    def push_many(self, ids: np.ndarray, xs: np.ndarray, outs: np.ndarray) -> None:
        """Push ``xs[j]`` into window ``ids[j]``, its answer into ``outs[j]``."""
        check_many(ids, xs, outs, self._n, self._step, self._out_shape)
        for j, i in enumerate(ids.tolist()):
            self._rings[i].push_into(xs[j], outs[j])

    def prepare(self) -> None:
        """Nothing to prepare: each window is computed on its tick."""

    def reset(self, i: int) -> None:
        """Empty window ``i`` (``-1``: every window)."""
        for ring in (self._rings if i == -1 else [self._rings[i]]):
            ring.reset()


def check_step(x_t: Any, out: Any, step: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
    """Raise InputError saying what is wrong with ``push_into``'s ``x_t`` / ``out``."""
    for label, a, shape, writeable in (("x_t", x_t, step, False), ("out", out, out_shape, True)):
        if not isinstance(a, np.ndarray):
            raise InputError(f"push_into: {label} must be a numpy.ndarray of shape {shape} and "
                             f"dtype float32; got {type(a).__name__}")
        if tuple(a.shape) != tuple(shape):
            what = "one step's features (input.shape[1:])" if label == "x_t" else "one sample's output"
            raise InputError(f"push_into: {label} has shape {tuple(a.shape)}; expected {shape}, "
                             f"{what}, without a batch dimension")
        if a.dtype != _F32:
            raise InputError(f"push_into: {label} has dtype {a.dtype}; expected float32. Convert "
                             f"once outside the hot path: {label}.astype(np.float32)")
        if writeable and not a.flags.writeable:
            raise InputError("push_into: out is read-only; pass a writeable preallocated array")
    if not (x_t.flags.c_contiguous and out.flags.c_contiguous):
        raise InputError("push_into: x_t and out must be C-contiguous; use np.ascontiguousarray() "
                         "once outside the hot path")


def open_window(cm: Windowed, *, stateful: bool, auto_prepare: bool) -> Window:
    """The :class:`Window` of ``cm``: the executor's incremental form when it offers one for
    these semantics, else (sliding only) :class:`RecomputeSteps`."""
    t, step = step_shapes(cm)
    hook = getattr(cm.executor, "incremental", None)
    steps = hook(stateful=stateful, auto_prepare=auto_prepare) if hook is not None else None
    if steps is None:
        if stateful:
            raise UnsupportedError(
                f"{cm.variant} offers no streaming form for {cm.model_name}: a stream (state "
                f"never reset) needs a target's incremental form; cpu.native has one for "
                f"recurrent models (LSTM/GRU layers, then a Dense head). Use sliding() for a "
                f"window with zero state at its start")
        steps = RecomputeSteps(cm).steps()
    return Window(steps, window=t, step_shape=step, output_shape=tuple(cm.output.shape),
                  stateful=stateful, nan_policy=cm.nan_policy)


def open_windows(cm: Windowed, streams: Any, *, stateful: bool, auto_prepare: bool) -> Windows:
    """``streams`` :class:`Windows` of ``cm``: the executor's many-window form when it offers
    one for these semantics, else (sliding only) :class:`RecomputeStreams`."""
    n = check_streams(streams)
    t, step = step_shapes(cm)
    hook = getattr(cm.executor, "incremental_streams", None)
    steps = hook(n, stateful=stateful, auto_prepare=auto_prepare) if hook is not None else None
    if steps is None:
        if stateful:
            raise UnsupportedError(
                f"{cm.variant} offers no streaming form for {cm.model_name}: streams (state "
                f"never reset) need a target's incremental form; cpu.native has one for "
                f"recurrent models (LSTM/GRU layers, then a Dense head). Use sliding(streams=N) "
                f"for windows with zero state at their start")
        steps = RecomputeStreams(cm, n).steps()
    return Windows(steps, streams=n, window=t, step_shape=step,
                   output_shape=tuple(cm.output.shape), stateful=stateful,
                   nan_policy=cm.nan_policy)
