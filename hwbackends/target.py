"""The plugin contract: what a target provides and what it receives.

A target plugin subclasses :class:`Target` and returns instances from its ``hwb_targets``
hook. The lifecycle, driven by :func:`hwbackends.compile`:

1. ``probe()`` (parent process, must be fast and import nothing heavy) says whether and how the
   target can run here;
2. ``compile(model, options, workdir)`` runs in an isolated child process, receives the model
   already converted to one of ``formats``, writes its files into ``workdir`` and returns a
   JSON-able ``dict`` of metadata. The core stores the files content-addressed and verifies
   them on every later load;
3. ``load(artifact, options)`` (parent process) returns an :class:`Executor`;
4. ``Executor.predict_into(x, out)`` is the hot path (``predict_into(xs, outs)``, tuples with
   one array per tensor, for models with several inputs or outputs).

Each rule is stated once, where it applies, and the conformance kit checks exactly that:
light imports and probing in :class:`Target`; what ``compile`` receives in
:meth:`Target.compile`; threads in :class:`CompileOptions`; contiguity, allocation and
thread-safety of the hot path in :class:`Executor`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np

from .errors import ConfigError, ExecutionError, HwbError, InputError, UnsupportedError
from .specs import Availability, TensorSpec, several

if TYPE_CHECKING:  # pragma: no cover
    from .models import Model

#: Bumped when the contract changes incompatibly; plugins declare the version they target
#: (``hwb plugin new`` writes it), and the registry refuses a target written for another.
#: 2: ``Executor._run(xs, outs)`` receives sequences (one array per tensor) for every model,
#: ``_init_io`` takes spec lists, ``MultiExecutor``/``BufferedMultiExecutor`` are gone (one
#: ``Executor``, ``BufferedExecutor._buffers``); ``Target.accepts`` replaces membership tests
#: on ``precisions``; ``Target.exports``/``export`` added.
CONTRACT_VERSION = 2


@dataclass
class CompileOptions:
    """What the caller asked for. ``extra`` holds target-specific options (documented by
    each target in :attr:`Target.option_docs`).

    **Threads.** ``threads`` is how many threads the runtime may use *inside one call*
    (intra-op parallelism), read by ``load()`` (it is not part of the cache key).
    ``None``, the default, means **one thread**: batch-1 latency is what this project serves,
    and waking a thread pool per call costs more than it saves at batch 1 (one plugin measured
    p99 13 µs on one thread vs 1.3 ms with the runtime's default pool). ``N >= 1`` allows up to
    ``N``. Targets read it through :meth:`runtime_threads`; a runtime with no such setting
    (XLA, GPUs, FPGAs) ignores it and says so in its docs."""

    precision: str
    batch_size: int = 1
    threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Representative inputs for calibration (full-int8, fixed-point); never part of the
    #: options' JSON, but its hash is part of the cache key. For a model with several inputs
    #: (only on targets with :attr:`Target.multi_io_calibrated`): a tuple with one
    #: ``(n, *spec.shape)`` float32 array per input, in ``model.inputs`` order.
    calibration: np.ndarray | tuple[np.ndarray, ...] | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ConfigError(f"threads must be None (one thread) or an integer >= 1; got "
                              f"{self.threads!r}")

    def runtime_threads(self) -> int:
        """The thread count to give the runtime: ``threads``, or 1 when it is ``None``."""
        return 1 if self.threads is None else self.threads

    def key_dict(self) -> dict[str, Any]:
        """The options as they enter the cache key (``threads`` is a load-time option)."""
        return {"precision": self.precision, "batch_size": self.batch_size,
                "extra": self.extra}


@dataclass
class Artifact:
    """A compiled variant as stored: a directory of files plus metadata."""

    path: Path
    key: str
    target: str
    precision: str
    fingerprint: str
    batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    meta: dict[str, Any] = field(default_factory=dict)
    toolchain: dict[str, str] = field(default_factory=dict)
    compile_seconds: float = 0.0
    cached: bool = False

    def file(self, name: str) -> Path:
        """Path of one file the target wrote into its ``workdir`` at compile time."""
        return self.path / name

    @property
    def multi_io(self) -> bool:
        """Whether the model has several inputs or outputs (its executor's ``predict_into``
        then takes tuples)."""
        return several(self.inputs, self.outputs)

    def size_bytes(self) -> int:
        """Total size of the artifact's files on disk."""
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())


_F32 = np.dtype(np.float32)


def _spec_tuple(specs: TensorSpec | Sequence[TensorSpec]) -> tuple[TensorSpec, ...]:
    """One spec (the single-tensor form plugins wrote before tuples) or several, as a tuple."""
    return (specs,) if isinstance(specs, TensorSpec) else tuple(specs)


class Executor:
    """A loaded variant: what :meth:`Target.load` returns. Subclass it, call
    :meth:`_init_io` once in ``__init__`` and implement :meth:`_run`; the inherited
    :meth:`predict_into` is the hot path and holds the contract's one input guard and one
    error path, so a subclass writes only the model call.

    **One shape inside.** Tensors travel as tuples, one array per tensor, in spec order
    (``artifact.inputs`` / ``artifact.outputs``): ``_init_io`` takes the spec lists and
    ``_run(xs, outs)`` receives sequences (one array per tensor), whether the model has one
    tensor each way or several.
    Only the public call differs, at the edge: a model with one input and one output is
    called ``predict_into(x, out)`` with arrays (``_init_io`` binds that single-array call
    once, so the hot path pays nothing for tuples), a model with several
    ``predict_into(xs, outs)`` with tuples.

    **The call.** ``predict_into(x, out)`` takes ``x`` of shape ``(batch_size, *input.shape)``
    and ``out`` of shape ``(batch_size, *output.shape)``, both ``float32`` numpy arrays, writes
    the result into ``out`` and returns ``None`` (several tensors: a tuple of such arrays each
    way). A wrong array raises :class:`~hwbackends.errors.InputError` saying what was expected
    and naming the tensor when there are several (numpy, JAX and torch would otherwise
    *silently* broadcast a ``(1, 1)`` array into a ``(1, 32)`` buffer, or cast a float64):
    the guard compares shape and dtype by identity before :meth:`_run`, and when :meth:`_run`
    raises, :func:`check_io` turns a wrong array into the InputError (a right array's
    failure propagates unchanged).

    **Contiguity.** Not required: an executor gives the right result for strided ``x``/``out``
    (numpy assignment and framework copies handle strides). An executor that hands raw
    pointers to a library (ctypes, DMA) sets :attr:`contiguous` ``= True``; the guard then
    refuses a non-C-contiguous or read-only array with InputError instead.

    **Allocation.** ``predict_into`` allocates nothing per call, not even a temporary: write
    through buffers made in ``__init__`` (``np.matmul(..., out=)``, in-place ufuncs). The kit
    measures the *peak* traced memory of a call, so a per-call scratch array fails it (the
    single-array call hands ``_run`` one-element lists made once, not new tuples; ``zip``
    over the tensors costs a small transient object, far inside the kit's bound).

    **Thread-safety.** An executor is never run on two threads at once, so ``_run`` need not
    lock: the serving engine calls each executor from its one worker thread, a router lane
    serves one caller thread, and a router deadline worker never starts a call while an
    abandoned one still runs. Calls may come from different threads one after another (do
    not keep thread-local state). ``CompileOptions.threads`` is a different thing: how many
    threads the runtime may use *inside* one call (see :class:`CompileOptions`).

    **Dynamic batch.** ``_init_io(..., batch=None)`` accepts any batch size (every array must
    have as many rows as the first input); for targets with ``static_batch = False``.

    An executor may set ``availability`` (an :class:`~hwbackends.specs.Availability`): it then
    overrides ``Target.probe()``'s answer for this variant, because only ``load`` knows whether
    it found the device (an FPGA board with a matching bitstream) or fell back to the stand-in
    (the C-simulation). An optional ``close()`` releases device resources."""

    #: Whether ``_run`` needs C-contiguous, writeable arrays (raw pointers); see above.
    contiguous: ClassVar[bool] = False
    batch_size: int
    availability: Availability | None = None

    def _init_io(self, inputs: TensorSpec | Sequence[TensorSpec],
                 outputs: TensorSpec | Sequence[TensorSpec], batch: int | None) -> None:
        """Record the compiled input/output specs (``artifact.inputs``/``outputs``; one
        :class:`TensorSpec` is taken as a list of one) and batch size (``None``: any batch),
        and bind the public call: the single-array one when there is one tensor each way."""
        self.batch_size = batch if batch is not None else 1
        self._dynamic = batch is None
        self._in_specs, self._out_specs = _spec_tuple(inputs), _spec_tuple(outputs)
        # A dynamic-batch executor never matches these (0 rows), so every call takes the
        # checked path of _check, which accepts any row count.
        rows = batch if batch is not None else 0
        self._xshapes = tuple(s.batched(rows) for s in self._in_specs)
        self._yshapes = tuple(s.batched(rows) for s in self._out_specs)
        self._xshape, self._yshape = self._xshapes[0], self._yshapes[0]
        self._strict = self.contiguous
        #: One input and one output: ``predict_into`` takes arrays, else tuples.
        self.single = not several(self._in_specs, self._out_specs)
        self._one_x: list[Any] = [None]
        self._one_out: list[Any] = [None]
        # Bound once here, so the hot path is one call with no dispatch. A subclass that
        # overrides predict_into itself keeps its own (it may call this class's, which
        # dispatches).
        try:  # a call bound by an earlier _init_io (the class was swapped since)
            del self.predict_into
        except AttributeError:
            pass
        # (not vars(self).pop: materialising the instance dict makes every attribute read on
        # the hot path slower, measured +8 % on the guard with a no-op model)
        if type(self).predict_into is Executor.predict_into:
            self.predict_into = self._predict_one if self.single else self._predict_many  # type: ignore[method-assign]

    def predict_into(self, x: Any, out: Any) -> None:
        """Run the variant on ``x`` and write the result into ``out``; allocate nothing.
        Arrays for a model with one input and one output, tuples for several. Raises
        :class:`~hwbackends.errors.InputError` for a wrong array."""
        if self.single:
            self._predict_one(x, out)
        else:
            self._predict_many(x, out)

    def _predict_one(self, x: np.ndarray, out: np.ndarray) -> None:
        """The single-array call (bound as ``predict_into`` by :meth:`_init_io`)."""
        try:
            ok = (x.shape == self._xshape and out.shape == self._yshape and x.dtype is _F32
                  and out.dtype is _F32)
            if self._strict and ok:
                ok = x.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable
        except AttributeError:
            ok = False
        if not ok:
            self._check((x,), (out,))
        # _run takes sequences: one-element lists made once at init, so this call allocates
        # nothing (a tuple per call would be 2 × 48 traced bytes); never two calls at once.
        xs, outs = self._one_x, self._one_out
        xs[0], outs[0] = x, out
        try:
            self._run(xs, outs)
        except Exception as exc:
            self._failed((x,), (out,), exc)
        finally:
            xs[0] = outs[0] = None  # keep no reference to the caller's arrays

    def _predict_many(self, xs: Any, outs: Any) -> None:
        """The tuple call of a model with several inputs or outputs."""
        try:
            ok = (len(xs) == len(self._xshapes) and len(outs) == len(self._yshapes)
                  and all(a.shape == s and a.dtype is _F32 for a, s in zip(xs, self._xshapes, strict=False))
                  and all(a.shape == s and a.dtype is _F32 for a, s in zip(outs, self._yshapes, strict=False)))
            if self._strict and ok:
                ok = (all(a.flags.c_contiguous for a in (*xs, *outs))
                      and all(a.flags.writeable for a in outs))
        except (AttributeError, TypeError):
            ok = False
        if not ok:
            self._check(xs, outs)
        try:
            self._run(xs, outs)
        except Exception as exc:
            self._failed(xs, outs, exc)

    def native_entry(self) -> Any:
        """Optional: the model call as raw C functions, for callers that run it without
        Python (the shared-memory server's poll loop calls them on the request's memory with
        the GIL released): a ``PyCapsule`` named ``"hwbackends.native_entry"`` holding a
        versioned ``hwb_native_entry`` struct, static for the life of the process (ABI 3:
        ``predict``, the sliding window's ``push``/``prepare``/``reset``, and its handles
        ``window_new``/``window_push``/``window_push_many``/…; its layout and
        rules: hwbackends/serve/include/hwb_native.h). ``None`` (the default): there is none,
        callers use :meth:`predict_into`.

        The header is the one definition: include it (``hwb serve --print-include`` prints its
        directory) rather than restating the struct. In short: ``predict`` computes exactly
        what :meth:`predict_into` computes (same bits), is reentrant and thread-safe, touches
        no Python object and returns nonzero on failure; ``push``/``prepare``/``reset`` are
        :meth:`incremental`'s window (one caller at a time) or NULL, and ``window_*`` the
        same window as handles the caller makes and frees (:meth:`incremental_streams`' form,
        one per symbol) or NULL. Only for a model with one
        input and one output."""
        return None

    def incremental(self, *, stateful: bool = False, auto_prepare: bool = True) -> Any:
        """Optional: an exact incremental form of the sliding window (``stateful=False``) or
        of the stream (``stateful=True``), behind ``CompiledModel.sliding()`` /
        ``streaming()`` (hwbackends/sliding.py states both semantics). ``None`` (the default):
        there is none; ``sliding()`` then recomputes the window with :meth:`predict_into`
        each tick and ``streaming()`` is refused.

        Return a :class:`hwbackends.sliding.Steps`: ``push_into(x_t, out)`` takes one step's
        features (shape ``input.shape[1:]``) and writes ``out`` (``output.shape``, one sample):
        for the window, what :meth:`predict_into` gives on the window ending at ``x_t``, zero
        state at its start, zero-filled before it is full (within the precision's fidelity; in
        fp32 within 1e-5); for the stream, the model after one more step from the state left
        by the last push (zero after ``reset``). Only what needs ``x_t`` runs there; the rest
        runs in ``prepare()`` (a no-op when nothing is pending), which ``push_into`` runs first
        when the caller did not, and after writing ``out`` when ``auto_prepare``. ``reset()``
        returns to the start. A wrong array raises :class:`~hwbackends.errors.InputError`; no
        allocation per call; one caller at a time (the rules of :meth:`predict_into`). When the
        state is shared (a C library's globals) and new ``Steps`` are handed out over it, call
        the old ones' ``revoke(reason)`` first. The conformance kit's ``sliding`` check
        compares ``push_into`` with ``predict_into`` over many ticks."""
        return None

    def incremental_streams(self, streams: int, *, stateful: bool = False,
                            auto_prepare: bool = True) -> Any:
        """Optional: ``streams`` independent windows (or streams) of :meth:`incremental`'s form
        over this executor's one set of weights, behind ``CompiledModel.sliding(streams=N)`` /
        ``streaming(streams=N)`` (one per symbol a desk runs the model on). ``None`` (the
        default): there is none; ``sliding(streams=N)`` then keeps ``N`` recomputed windows
        and ``streaming(streams=N)`` is refused.

        Return a :class:`hwbackends.sliding.StreamSteps`: ``push_into(i, x_t, out)`` is
        :meth:`incremental`'s ``push_into`` on window ``i`` (``0 <= i < streams``, else
        :class:`~hwbackends.errors.InputError`); ``push_many(ids, xs, outs)`` pushes
        ``xs[j]`` into window ``ids[j]`` and writes its answer into ``outs[j]`` (``ids`` an
        int64 array of distinct ids, ``xs`` ``(k, *input.shape[1:])``, ``outs`` ``(k,
        *output.shape)``): the same answers as ``k`` ``push_into`` calls, computed together
        where the form can (the input products as one matrix product over the ``k`` ticks);
        ``prepare()`` prepares every window with work pending; ``reset(i)`` empties window
        ``i`` (``-1``: all). Each window's answers are those of its own ticks only: no state
        is shared between windows, and the windows' state is this object's (two objects never
        share one). The conformance kit's ``sliding`` check drives interleaved pushes,
        ``push_many`` and resets against each window's own ``predict_into``."""
        return None

    def close(self) -> None:
        """Optional: release device resources (a board, a native library's handles). The core
        calls it through :func:`close_executor` when it drops an executor it loaded (a
        refused reload, a checked import) and from ``CompiledModel.close()``; the default
        holds nothing."""

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        """The model call: write one output per buffer of ``outs`` for the inputs ``xs``
        (sequences in spec order, one array each: the caller's tuples, or for one tensor each
        way one-element lists the executor reuses, so keep no reference to them; they
        already passed the guard: shape and dtype, contiguity when :attr:`contiguous`)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _run(xs, outs)")

    def _failed(self, xs: Any, outs: Any, exc: Exception) -> None:
        """The model call raised ``exc``: an :class:`InputError` for wrong arrays (the guard's
        full check), ``exc`` itself when it is an :class:`HwbError`, else an
        :class:`ExecutionError` naming it (``__cause__``); never the runtime's raw exception."""
        self._check(xs, outs)
        if isinstance(exc, HwbError):
            raise exc
        msg = " ".join(str(exc).split())
        raise ExecutionError(f"the variant's runtime failed on arrays of the right shape and "
                             f"dtype ({type(exc).__name__}: {msg[:300]}"
                             f"{'…' if len(msg) > 300 else ''}): a value outside what the model "
                             f"takes (an index past a table) or the runtime itself; check the "
                             f"input's values, and compare with the ref target") from exc

    def _check(self, xs: Any, outs: Any) -> None:
        """The one error path: raise InputError if ``xs``/``outs`` (tuples) are wrong; return
        if they are fine (an equal dtype that is not the canonical object, a dynamic batch)."""
        batch = self.batch_size
        if self._dynamic and isinstance(xs, (tuple, list)) and xs:
            first = xs[0]
            if getattr(first, "ndim", 0) == len(self._xshapes[0]):
                batch = len(first)
        check_io(xs, outs, self._in_specs, self._out_specs, batch, contiguous=self._strict)


def close_executor(executor: Any) -> None:
    """Close a loaded executor: its ``close()``, the no-op :meth:`Executor.close` unless it
    overrides it. What ``load()`` returned may be any object with ``predict_into`` (the
    contract asks for an :class:`Executor`, the core accepts a duck type), so one without
    ``close`` is left as it is: the one place that asks."""
    close = getattr(executor, "close", None)
    if callable(close):
        close()


class BufferedExecutor(Executor):
    """An executor over runtime-owned buffers (LiteRT tensor views, ONNX Runtime's bound
    OrtValues, …): copy each input in, invoke once, copy each output out. Subclasses call
    :meth:`~Executor._init_io`, then :meth:`_buffers` with the arrays the runtime reads and
    writes (one per tensor, in spec order) and a zero-argument callable that runs the model
    once; they write no ``_run``.

    With one tensor each way its single-array call is the base class's with :meth:`_run`
    inlined: this is the sub-2-µs CPU path, where one more Python call is a measurable share
    (docs/performance.md). The error path is the same :meth:`~Executor._check`. Strided
    arrays are handled by the copies."""

    _ins: tuple[np.ndarray, ...]
    _outs: tuple[np.ndarray, ...]
    #: The only input and output buffer, when there is one each way (the inlined path's).
    _in: np.ndarray
    _out: np.ndarray
    _invoke: Callable[[], Any]

    def _buffers(self, ins: Sequence[np.ndarray], outs: Sequence[np.ndarray],
                 invoke: Callable[[], Any]) -> None:
        """Record the runtime's buffers (spec order) and its one-call ``invoke``."""
        self._ins, self._outs, self._invoke = tuple(ins), tuple(outs), invoke
        self._in, self._out = self._ins[0], self._outs[0]

    def _predict_one(self, x: np.ndarray, out: np.ndarray) -> None:
        """The base class's single-array call with ``_run`` inlined (same guard, same error
        path)."""
        try:
            ok = (x.shape == self._xshape and out.shape == self._yshape and x.dtype is _F32
                  and out.dtype is _F32)
        except AttributeError:
            ok = False
        if not ok:
            self._check((x,), (out,))
        try:
            self._in[...] = x
            self._invoke()
            out[...] = self._out
        except Exception as exc:
            self._failed((x,), (out,), exc)

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        """Copy each input into its buffer, invoke once, copy each buffer into its output
        (what the single-array call inlines; a subclass that converts the tensors, like an
        int8-IO one, overrides this and binds :meth:`Executor._predict_one`)."""
        for buf, x in zip(self._ins, xs, strict=True):
            buf[...] = x
        self._invoke()
        for o, buf in zip(outs, self._outs, strict=True):
            o[...] = buf


class Target:
    """Base class of every target. Subclasses set the class attributes and implement
    ``probe``, ``compile`` and ``load`` (required: the kit fails a target without them);
    ``toolchain`` is optional but belongs in every target whose output depends on a library
    version.

    **Light imports.** ``hwb targets`` imports every installed plugin and calls every
    ``probe()``: the plugin module, ``hwb_targets()`` and ``probe()`` import only the standard
    library, the core and its light dependencies (numpy, pluggy, pydantic), and no single module
    may cost over 150 ms of CPU to import (with what it imports). Frameworks and vendor SDKs are
    imported inside ``compile``/``load``/``toolchain``. The kit measures this in a fresh
    interpreter, timing every import, so it holds for any package, not a list of known heavy
    ones."""

    #: Unique dotted name, ``family.runtime``: ``cpu.litert``, ``fpga.hls4ml``.
    name: ClassVar[str] = ""
    #: ``cpu``, ``gpu``, ``tpu``, ``fpga`` or ``ref``.
    family: ClassVar[str] = ""
    #: Precisions offered; the first is the default. What ``hwb targets`` lists and a sweep
    #: (``hwb bench`` with no ``-p``) builds; :meth:`accepts` may take more.
    precisions: ClassVar[tuple[str, ...]] = ("fp32",)
    #: The family of further precision names :meth:`accepts` takes, in words for messages and
    #: listings (``"any ap_fixed<W,I> with 1 ≤ W ≤ 64"``); "" when only ``precisions``.
    precision_rule: ClassVar[str] = ""
    #: The precisions (of ``precisions``) that need calibration data: for them the core passes
    #: representative inputs in ``CompileOptions.calibration`` and hashes them into the cache key.
    calibrated: ClassVar[tuple[str, ...]] = ()
    #: The target's own version: bump it when ``compile()`` writes different files for the same
    #: model and options. Part of the cache key, so a bump rebuilds every artifact.
    version: ClassVar[str] = "1"
    #: Source formats ``compile`` accepts (``keras``, ``torch``, ``onnx``); the core converts
    #: the model into the first reachable one through the registered converters.
    formats: ClassVar[tuple[str, ...]] = ()
    #: One line for ``hwb targets``.
    description: ClassVar[str] = ""
    #: Target-specific ``extra`` options: name -> one-line documentation.
    option_docs: ClassVar[dict[str, str]] = {}
    #: The pip requirement that installs the Python packages this target needs
    #: (``"hwbackends[keras]"``; a third-party plugin names its own package): ``hwb targets``
    #: shows it for a target that is unavailable. "" when the core is enough.
    install: ClassVar[str] = ""
    #: Whether the batch size is fixed at compile time (most fast paths are).
    static_batch: ClassVar[bool] = True
    #: The contract version this target was written for.
    contract_version: ClassVar[int] = CONTRACT_VERSION
    #: Seconds a compile may take before the child is killed.
    compile_timeout: ClassVar[float] = 600.0
    #: Whether the target compiles models with several inputs or outputs; its executor then
    #: takes tuples for them (one :class:`Executor` serves both shapes). The core refuses a
    #: multi-IO model before the compile worker starts when this is False.
    multi_io: ClassVar[bool] = False
    #: Whether its :attr:`calibrated` precisions also take models with several inputs/outputs
    #: (needs :attr:`multi_io`): ``options.calibration`` is then a tuple with one array per
    #: input, in ``model.inputs`` order. The core refuses a calibrated precision for a multi-IO
    #: model, before the worker starts, on a target that leaves this False.
    multi_io_calibrated: ClassVar[bool] = False
    #: Why a build takes minutes (``"Verilator + yosys synthesis: minutes per model"``), or
    #: "" (the default) for a target that builds in seconds. A slow target is left out of the
    #: default target set (``*``) of ``hwb bench``/``hwb demo`` and of a strategy that allows
    #: every target: it is built only where a pattern names it (``fpga.*``, its name).
    slow_compile: ClassVar[str] = ""
    #: Whether the artifact is the same whatever the batch size (``load`` sizes the executor
    #: from ``artifact.batch_size``). The batch is then left out of the store key: one build
    #: serves every batch size, so a batch sweep does not rebuild (or re-search) per size.
    batch_independent: ClassVar[bool] = False
    #: Deployment formats the target writes itself through :meth:`export` (``("c",)`` for a
    #: native shared library with a C header); empty for most targets.
    exports: ClassVar[tuple[str, ...]] = ()

    def probe(self) -> Availability:
        """Whether and how this target can run here. Fast; never raises."""
        raise NotImplementedError

    def accepts(self, precision: str) -> bool:
        """Whether ``compile`` takes ``precision``: one of :attr:`precisions`, or (a target
        that overrides this and sets :attr:`precision_rule`) a member of a family such as every
        ``ap_fixed<W,I>``. The one test every caller uses (``hwb compile``/``bench``/``fleet``,
        ``strategies.toml``, the router, the kit); fast, no heavy imports."""
        return precision in self.precisions

    def check_precision(self, precision: str) -> None:
        """Raise :class:`~hwbackends.errors.UnsupportedError` naming what the target offers
        when it does not :meth:`accept <accepts>` ``precision``."""
        if not self.accepts(precision):
            rule = f" and {self.precision_rule}" if self.precision_rule else ""
            raise UnsupportedError(f"target {self.name} offers precisions "
                                   f"{', '.join(self.precisions)}{rule}; got {precision!r}")

    def toolchain(self) -> dict[str, str]:
        """Versions of everything that shapes the artifact (library, compiler, device).
        Part of the cache key: a change rebuilds. Called in the caller's process (the key is
        computed before any build) and on every fleet node: keep it light (no heavy import).
        Artifacts travel between fleet nodes whose ``toolchain()`` is equal, and ``load()``
        runs wherever the artifact lands, so an artifact of native code built for the host
        (``-march=native``) must include the host's instruction set:
        ``{"isa": hwbackends.machine.isa(), …}``."""
        return {}

    def check_options(self, options: CompileOptions) -> None:
        """Refuse, before a build starts, options that cannot work here (raise
        :class:`~hwbackends.errors.UnsupportedError` saying what to change): an option value out
        of range, a tool an option needs that is not installed (``synth=true`` without the
        vendor HLS tool). Called in the caller's process when the artifact is not in the store,
        so a mistake costs no build. Fast, no heavy imports; the default accepts everything."""

    def compile(self, model: "Model", options: CompileOptions, workdir: Path) -> dict[str, Any]:
        """Write the artifact's files into ``workdir``; return JSON-able metadata, stored as
        ``Artifact.meta`` and given back to ``load``. One key of it means something to the
        core: ``hardware_estimate``, for a target whose executor here is a simulation but whose
        build yields the device's timing (``fpga.da4ml``: cycles from an RTL testbench) — a
        dict with ``label = "modelled"`` (else ignored), ``basis`` (how it was obtained),
        ``latency_cycles`` and ``end_to_end = {"total_ns", "logic_ns", "io_assumption_ns",
        "io_assumption"}``: the modelled per-call latency, logic plus a stated I/O assumption.
        A strategy with ``allow_modelled = true`` ranks the variant by ``total_ns``, labelled
        modelled; further keys (resources, clock, ``source`` tools) are shown, not
        interpreted. Leave it out when the target measures on the device or a stand-in.
        Raise :class:`~hwbackends.errors.UnsupportedError` naming the layer/op that cannot be
        compiled. Runs in a child process (the compile worker), never in the caller's.

        **What ``model`` is** (a :class:`hwbackends.models.Model`):

        - ``model.format`` is one of this target's ``formats``: the core converted the user's
          model through the registered converters first;
        - ``model.obj`` is the model in that format: a ``keras.Model``, an
          ``onnx.ModelProto``, or a torch module / ``torch.export.ExportedProgram``;
        - ``model.inputs`` / ``model.outputs`` are :class:`~hwbackends.specs.TensorSpec` lists
          *per sample* (no batch dimension); ``model.input`` / ``model.output`` are the
          first. Several of either (``model.multi_io``) reach only targets with
          :attr:`multi_io` ``= True``;
        - the batch dimension of ``model.obj`` is **dynamic** (``None`` in Keras, a symbolic
          dim in ONNX and torch.export). A target with ``static_batch = True`` must fix it to
          ``options.batch_size`` itself (for ONNX: set ``dim[0]`` of every graph input and
          output), and its executor then serves exactly that batch;
        - ``model.representative(n)`` gives realistic inputs (the model's validation data when
          it has some); the core already puts them in ``options.calibration`` for the
          precisions listed in ``calibrated``;
        - ``model.reference(x)`` runs the source framework in fp32 (slow; for checks only);
        - ``model.name`` and ``model.fingerprint`` identify it (the fingerprint is part of
          the cache key: do not hash the model yourself)."""
        raise NotImplementedError

    def load(self, artifact: Artifact, options: CompileOptions) -> Executor:
        """Load a stored artifact and return a ready executor (buffers allocated, I/O bound,
        graphs captured); runs in the caller's process on every cache hit, so keep it fast.
        Read ``options.runtime_threads()`` here."""
        raise NotImplementedError

    def export(self, artifact: Artifact, fmt: str, outdir: Path) -> list[Path]:
        """Write ``artifact`` in deployment format ``fmt`` (one of :attr:`exports`) into
        ``outdir`` and return the files written; what ``hwb export --format FMT`` calls for
        formats the target itself owns (``c``: a shared library and its header). The model
        servers' formats the core writes do not come here: ``triton`` asks :meth:`triton`,
        ``tf-serving`` serves the source model. Raise
        :class:`~hwbackends.errors.UnsupportedError` for a format it does not offer; the
        default offers none."""
        raise UnsupportedError(
            f"target {self.name} exports no format {fmt!r} (it offers: "
            f"{', '.join(self.exports) or 'none'}); choose a format it lists in `hwb targets`")

    def triton(self) -> "TritonForm | None":
        """How Triton serves this target's variants (``hwb export --format triton``): a
        :class:`TritonForm`, or ``None`` (the default) when Triton cannot, which the export
        says. Fast, no heavy imports (import the form's module here, its runtimes inside
        its methods)."""
        return None

    def summary_lines(self, meta: dict[str, Any]) -> list[str]:
        """Lines about this variant's build that ``hwb compile`` prints after its own
        (model, artifact, fidelity, data), for people: a modelled estimate, synthesis, bit
        widths. ``meta`` is the artifact's metadata, what :meth:`compile` returned. Each line
        starts with two spaces and a label padded to 9 characters (``bits`` then 6 spaces),
        like the core's.
        Fast, no heavy imports; only the target's own keys are read, and a missing key is a
        line left out, not an error. The default prints nothing."""
        return []

    def report_meta(self, meta: dict[str, Any]) -> dict[str, Any] | None:
        """What the results file keeps of this variant's artifact metadata for the plugin's
        own report sections (``hwb_report_sections`` read it back as the row's ``fpga``
        key): a small JSON-able dict, or ``None`` (the default) to keep nothing. The
        ``hardware_estimate`` is kept by the core already; leave it out."""
        return None

    def __repr__(self) -> str:
        return f"<Target {self.name}>"


@dataclass
class TritonFile:
    """The model file a :class:`TritonForm` wrote for one of Triton's own backends
    (:meth:`TritonForm.native`), and what ``config.pbtxt`` says about it."""

    #: The files written, inside the version directory.
    files: list[Path]
    #: How Triton runs them: ``{"backend": "onnxruntime"}``, ``{"platform": "tensorrt_plan"}``.
    keys: dict[str, str]
    #: The backend's ``parameters`` (Triton takes them as strings).
    parameters: dict[str, str] = field(default_factory=dict)
    #: Whether the instances run on the GPU (``KIND_GPU``; else ``KIND_CPU``).
    gpu: bool = False
    #: ``(inputs, outputs)`` as the file binds them when it cannot take the served names (an
    #: engine's bindings): the core refuses one that is not a plain identifier. ``None``: the
    #: file takes the served names.
    bound: tuple[list[TensorSpec], list[TensorSpec]] | None = None
    #: The one batch size the file runs (the config then has ``max_batch_size: 0`` and the
    #: batch in its dims); ``None``: any batch.
    static_batch: int | None = None
    #: Lines for people and for the config's comment (what the file is bound to): the
    #: form's own words, never text from the model.
    notes: list[str] = field(default_factory=list)


class TritonForm:
    """How Triton serves a target's variants: what :meth:`Target.triton` returns and
    ``hwb export --format triton`` asks. The core measures, plans the batching, compiles the
    variant at each batch size it serves, names the tensors (plain identifiers) and writes
    ``config.pbtxt``; the form says what Triton runs, in one flavour or both:

    - **native**: one of Triton's own backends runs the model file :meth:`native` writes
      from the compiled artifacts (ONNX Runtime's ``model.onnx``, a TensorRT plan);
    - **python**: Triton's python backend runs the core's ``model.py`` over the
      :attr:`artifact_file` of the variant compiled at each served batch size (``1/bN/``):
      ``model.py`` pads a batch into the smallest size that holds it and calls the runner
      module :attr:`runtime`, copied beside it as ``1/hwb_runtime.py``.

    Native is the default where both are offered; the core falls back on python (and says
    why) when :meth:`native` refuses a graph. A subclass sets what it offers; the base
    offers neither."""

    #: The artifact's file Triton's model is made from, copied into ``1/bN/`` per batch size.
    artifact_file: ClassVar[str] = ""
    #: Whether :meth:`native` writes a file for one of Triton's own backends.
    native_backend: ClassVar[bool] = False
    #: Whether the native file holds one batch size (an engine whose optimization profile is
    #: its batch): the core then compiles the variant once, at the export's max batch size
    #: (default: the target's), that batch caps the settings, and Triton passes requests as
    #: they come. Else the variant is compiled at every batch size the settings serve.
    one_batch: ClassVar[bool] = False
    #: The python backend's runner, or ``None``: no python flavour. A module file that imports
    #: numpy and its runtime only (it runs in Triton's python stub, which has no hwbackends)
    #: and defines ``load(path, threads, inputs, outputs)`` returning a function from a list
    #: of input arrays (in ``inputs`` order) to a list of output arrays; ``inputs``/``outputs``
    #: are dicts with ``name`` (served), ``index`` (:meth:`positions`), ``shape``, ``dtype``.
    runtime: ClassVar[Path | None] = None
    #: The runtime's name in ``hwb_model.json``, for people (``"onnxruntime"``).
    runtime_name: ClassVar[str] = ""

    def check(self, artifact: Artifact, portable: bool) -> None:
        """Refuse, with :class:`~hwbackends.errors.UnsupportedError` saying what to change,
        the artifact of a :attr:`one_batch` form that the native file cannot be made from,
        right after its compile. ``portable``: the user asked for a file that runs on other
        versions of its runtime (``hwb export --trt-version-compatible``). The default
        accepts every artifact."""

    def native(self, version_dir: Path, compiled: dict[int, Any], inputs: list[TensorSpec],
               outputs: list[TensorSpec], threads: int) -> TritonFile:
        """Write the native model file into ``version_dir`` and describe it. ``compiled``:
        batch size → ``CompiledModel`` of the variant (for a :attr:`one_batch` form, the one
        compiled; else each with its :attr:`artifact_file` staged at
        ``version_dir/bN/``, which the core removes afterwards); ``inputs``/``outputs``: the
        model's specs under the served names; ``threads``: intra-op threads per instance.
        Raise :class:`~hwbackends.errors.UnsupportedError` when the file cannot be made (a
        graph whose batch is fixed inside): the core falls back on the python flavour where
        the form has one. The default offers no native file."""
        raise UnsupportedError("this target has no native Triton backend")

    def positions(self, compiled: Any, path: Path) -> tuple[list[int], list[int]]:
        """Where each input and output (in spec order) is among the runtime's own, by
        position: the runner finds tensors by these, never by a name from the model.
        ``compiled``: a ``CompiledModel`` of the variant; ``path``: its staged
        :attr:`artifact_file`. The default is spec order."""
        return list(range(len(compiled.inputs))), list(range(len(compiled.outputs)))


@dataclass(frozen=True)
class Converter:
    """A format conversion a plugin offers through ``hwb_converters``.

    ``convert(model, workdir)`` returns a new :class:`~hwbackends.models.Model` in format
    ``dst`` with the same fingerprint, specs and data; it runs in the compile child process.
    """

    name: str
    src: str
    dst: str
    convert: Callable[["Model", Path], "Model"]
    available: Callable[[], str | None] = lambda: None  # None = usable, else the reason


def check_io(xs: Any, outs: Any, inputs: TensorSpec | Sequence[TensorSpec],
             outputs: TensorSpec | Sequence[TensorSpec], batch: int,
             contiguous: bool = False) -> None:
    """Raise :class:`InputError` describing what is wrong with ``xs``/``outs``; return if
    fine. ``xs``/``outs`` are tuples (or lists) with one array per spec of ``inputs`` /
    ``outputs``, in that order; one array with one :class:`TensorSpec` each way is taken as a
    tuple of one. The message names the tensor when there are several. ``contiguous=True``
    also refuses non-C-contiguous arrays (for executors that hand raw pointers to a library;
    see :attr:`Executor.contiguous`). :meth:`Executor.predict_into` calls it only after its
    cheap shape/dtype checks failed (or the model call raised), so the hot path never pays
    for building the message."""
    if isinstance(inputs, TensorSpec) and isinstance(outputs, TensorSpec):
        xs, outs = (xs,), (outs,)
    ins, outsp = _spec_tuple(inputs), _spec_tuple(outputs)
    named = several(ins, outsp)
    for label, arrs, specs in (("inputs", xs, ins), ("outs", outs, outsp)):
        names = ", ".join(s.name for s in specs)
        if not isinstance(arrs, (tuple, list)):
            raise InputError(f"this variant has several inputs/outputs: {label} must be a tuple "
                             f"of {len(specs)} numpy arrays ({names}); got {type(arrs).__name__}")
        if len(arrs) != len(specs):
            raise InputError(f"got {len(arrs)} {label}; this variant takes {len(specs)} ({names}), "
                             f"in that order")
    for x, spec in zip(xs, ins, strict=True):
        _check_array(f"input {spec.name!r}" if named else "input", x, spec, batch, contiguous)
    for o, spec in zip(outs, outsp, strict=True):
        label = f"out {spec.name!r}" if named else "out"
        _check_array(label, o, spec, batch, contiguous)
        if not o.flags.writeable:
            raise InputError(f"{label} is read-only; pass a writeable preallocated array")


def _check_array(label: str, arr: Any, spec: TensorSpec, batch: int, contiguous: bool) -> None:
    shape, dtype = spec.batched(batch), spec.dtype
    if not isinstance(arr, np.ndarray):
        raise InputError(f"{label} must be a numpy.ndarray of shape {shape} and dtype {dtype}; "
                         f"got {type(arr).__name__}")
    if tuple(arr.shape) != tuple(shape):
        raise InputError(f"{label} has shape {tuple(arr.shape)}; this variant was compiled "
                         f"for {shape} (batch_size={batch}). Use predict() for other batch "
                         f"sizes, or compile with batch_size={arr.shape[0] if arr.ndim else 1}.")
    if arr.dtype != np.dtype(dtype):
        raise InputError(f"{label} has dtype {arr.dtype}; expected {dtype}. "
                         f"Convert once outside the hot path: x.astype(np.{dtype}).")
    if contiguous and not arr.flags.c_contiguous:
        raise InputError(f"{label} must be C-contiguous; use np.ascontiguousarray() once.")
