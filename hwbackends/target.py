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
4. ``Executor.predict_into(x, out)`` is the hot path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, runtime_checkable

import numpy as np

from .errors import InputError
from .specs import Availability, TensorSpec

if TYPE_CHECKING:  # pragma: no cover
    from .models import Model

#: Bumped when the contract changes incompatibly; plugins declare the version they target.
CONTRACT_VERSION = 1


@dataclass
class CompileOptions:
    """What the caller asked for. ``extra`` holds target-specific options (documented by
    each target in :attr:`Target.option_docs`)."""

    precision: str
    batch_size: int = 1
    threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Representative inputs for calibration (full-int8, fixed-point); never part of the
    #: options' JSON, but its hash is part of the cache key.
    calibration: np.ndarray | None = None

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

    def size_bytes(self) -> int:
        """Total size of the artifact's files on disk."""
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())


@runtime_checkable
class Executor(Protocol):
    """A loaded artifact. ``predict_into`` is the hot path: ``x`` is a C-contiguous array of
    shape ``(batch_size, *input.shape)`` in the input dtype, ``out`` a preallocated array of
    shape ``(batch_size, *output.shape)``; it allocates nothing and does no Python work beyond
    the library call. On a wrong array it raises :class:`~hwbackends.errors.InputError`
    before calling the library (NumPy assignment would silently broadcast or cast it): a few
    cheap attribute checks first, then :func:`check_io` to build the message.

    An executor may carry an ``availability`` attribute (an
    :class:`~hwbackends.specs.Availability`): it then overrides ``Target.probe()``'s answer for
    this variant, because only ``load`` knows whether it found the device (an FPGA board with a
    matching bitstream) or fell back to the stand-in (the C-simulation)."""

    batch_size: int

    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None:
        """Run the variant on ``x`` and write the result into ``out``; allocate nothing."""
        ...


_F32 = np.dtype(np.float32)


class IOGuard:
    """The input guard every executor needs: numpy (and JAX, torch) would otherwise *silently*
    broadcast a wrong shape (a ``(1, 1)`` array into a ``(1, 32)`` buffer) or cast a wrong
    dtype. Executors call :meth:`_init_io` once and :meth:`_guard` first thing in
    ``predict_into``. Contiguity is not required: executors copy ``x`` into their own buffer
    (or hand it to a framework that copies), which handles strided arrays correctly."""

    batch_size: int

    def _init_io(self, inp: TensorSpec, out: TensorSpec, batch: int) -> None:
        self.batch_size = batch
        self._in_spec, self._out_spec = inp, out
        self._xshape, self._yshape = inp.batched(batch), out.batched(batch)

    def _guard(self, x: Any, out: Any) -> None:
        """Return if ``x``/``out`` have the compiled shapes and float32; else raise InputError."""
        try:
            if (x.shape == self._xshape and out.shape == self._yshape and x.dtype is _F32
                    and out.dtype is _F32):
                return
        except AttributeError:
            pass
        check_io(x, out, self._in_spec, self._out_spec, self.batch_size, contiguous=False)


class BufferedExecutor(IOGuard):
    """The shared hot path of executors over runtime-owned buffers (LiteRT tensor views, ONNX
    Runtime's bound OrtValues, …): the guard, copy ``x`` in, run, copy the output out.
    Subclasses call :meth:`_init_io` and set ``_in`` and ``_out`` (the arrays the runtime reads
    and writes) and ``_run`` (a zero-argument callable that runs the model once). The guard is
    inlined here rather than calling :meth:`_guard`: this is the sub-2-µs CPU path, where one
    more Python call is a measurable share (docs/performance.md)."""

    _in: np.ndarray
    _out: np.ndarray
    _run: Callable[[], Any]

    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None:
        # Contiguity is not checked: the copies below handle strided arrays correctly.
        try:
            ok = (x.shape == self._xshape and out.shape == self._yshape and x.dtype is _F32
                  and out.dtype is _F32)
        except AttributeError:
            ok = False
        if not ok:
            check_io(x, out, self._in_spec, self._out_spec, self.batch_size, contiguous=False)
        try:
            self._in[...] = x
            self._run()
            out[...] = self._out
        except Exception:
            check_io(x, out, self._in_spec, self._out_spec, self.batch_size)
            raise


class Target:
    """Base class of every target. Subclasses set the class attributes and implement the four
    methods. Keep module-level imports light: heavy frameworks are imported inside
    ``compile``/``load``/``toolchain`` so that ``hwb targets`` stays fast."""

    #: Unique dotted name, ``family.runtime``: ``cpu.litert``, ``fpga.hls4ml``.
    name: ClassVar[str] = ""
    #: ``cpu``, ``gpu``, ``tpu``, ``fpga`` or ``ref``.
    family: ClassVar[str] = ""
    #: Precisions offered; the first is the default.
    precisions: ClassVar[tuple[str, ...]] = ("fp32",)
    #: Source formats ``compile`` accepts (``keras``, ``torch``, ``onnx``); the core converts
    #: the model into the first reachable one through the registered converters.
    formats: ClassVar[tuple[str, ...]] = ()
    #: One line for ``hwb targets``.
    description: ClassVar[str] = ""
    #: Target-specific ``extra`` options: name -> one-line documentation.
    option_docs: ClassVar[dict[str, str]] = {}
    #: Whether the batch size is fixed at compile time (most fast paths are).
    static_batch: ClassVar[bool] = True
    #: The contract version this target was written for.
    contract_version: ClassVar[int] = CONTRACT_VERSION
    #: Seconds a compile may take before the child is killed.
    compile_timeout: ClassVar[float] = 600.0

    def probe(self) -> Availability:
        """Whether and how this target can run here. Fast; never raises."""
        raise NotImplementedError

    def toolchain(self) -> dict[str, str]:
        """Versions of everything that shapes the artifact (library, compiler, device).
        Part of the cache key: a change rebuilds. Called in the child process."""
        return {}

    def compile(self, model: "Model", options: CompileOptions, workdir: Path) -> dict[str, Any]:
        """Write the artifact's files into ``workdir``; return JSON-able metadata.
        Raise :class:`~hwbackends.errors.UnsupportedError` naming the layer/op that cannot be
        compiled. Runs in a child process."""
        raise NotImplementedError

    def load(self, artifact: Artifact, options: CompileOptions) -> Executor:
        """Load a stored artifact and return a warmed-up-ready executor."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Target {self.name}>"


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


def check_io(x: Any, out: Any, inp: TensorSpec, outp: TensorSpec, batch: int,
             contiguous: bool = True) -> None:
    """Raise :class:`InputError` describing what is wrong with ``x``/``out``; return if fine.
    ``contiguous=False`` for executors that copy (and so accept strided arrays correctly).
    Executors call it only after their cheap shape/dtype/contiguity checks failed (or the
    library raised), so the hot path never pays for building the message."""
    want_x = inp.batched(batch)
    want_o = outp.batched(batch)
    for label, arr, shape, dtype in (("input", x, want_x, inp.dtype), ("out", out, want_o, outp.dtype)):
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
    if not out.flags.writeable:
        raise InputError("out is read-only; pass a writeable preallocated array")
