"""``gpu.tensorrt``: ONNX → TensorRT engine (Python API, TensorRT 10 and 11), replayed as a CUDA graph.

Compile (child, on the GPU machine): the precision is put *in the ONNX graph* first
(:func:`.precision.prepare_onnx`: fp16 tensors with fp32 I/O, or a symmetric int8 Q/DQ graph
calibrated on ``options.calibration``), then the graph is parsed into a strongly typed
network (the only kind TensorRT 11 builds: it has no FP16/INT8 builder flags and no
calibrators) with one optimization profile pinned to the compiled batch size where an input
is still dynamic. :func:`build_plan` says, per TensorRT version, how the network is created;
no version sets a precision flag. The serialized engine is the artifact; it is bound to the
GPU model, compute capability, TensorRT and driver versions, which are all in ``toolchain()``
(so in the cache key) and in the artifact's metadata (checked again at load: an engine from
another GPU or TensorRT is rebuilt, never loaded).

Executor: pinned host buffers and device buffers allocated once, one CUDA stream, tensor
addresses bound once; H2D copy + ``execute_async_v3`` + D2H copy captured in one CUDA graph
that is launched per call (one launch + one sync from Python). CUDA calls go through
``cuda-python`` (``cuda.bindings.runtime``).
"""
from __future__ import annotations

import ctypes
import functools
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from hwbackends.contract import (
    Artifact,
    Availability,
    CompileError,
    CompileOptions,
    Executor,
    Target,
    TensorSpec,
    TritonForm,
    UnavailableError,
    UnsupportedError,
)

from .._nvidia import cuda_stack, gpu_info, no_gpu_reason, stack_mismatch
from .._shared.onnx_io import graph_inputs, graph_outputs, spec_order
from .._util import importable
from .precision import prepare_onnx, qdq_zero_points

ENGINE = "model.engine"
#: The ONNX graph the engine was built from (precision already in it).
GRAPH = "engine_input.onnx"

_F32 = np.dtype(np.float32)


def trt_version() -> str:
    """The installed TensorRT's version, from package metadata (no import)."""
    return cuda_stack().tensorrt


@dataclass(frozen=True)
class BuildPlan:
    """How the network is built on one TensorRT version. Precision never comes from here:
    the builder flags stay empty on every version (the graph carries fp16 / Q/DQ int8)."""

    trt_major: int
    network_flags: tuple[str, ...]  # NetworkDefinitionCreationFlag members to set
    builder_flags: tuple[str, ...] = ()  # BuilderFlag members to set


def build_plan(trt_version: str) -> BuildPlan:
    """The build for a TensorRT version string ('10.16.1.11', '11.4.0.106')."""
    m = re.match(r"(\d+)\.", trt_version or "")
    major = int(m.group(1)) if m else 0
    if major < 10:
        raise UnavailableError(f"gpu.tensorrt needs TensorRT 10 or 11, found "
                               f"{trt_version or 'none'} (pip install 'hwbackends[gpu]')")
    if major == 10:
        # 10.x defaults to weak typing (the builder may pick any precision per layer):
        # STRONGLY_TYPED makes it build exactly the types of the graph, as 11.x always does.
        return BuildPlan(major, ("STRONGLY_TYPED",))
    # 11.x: every network is strongly typed; EXPLICIT_BATCH is gone and STRONGLY_TYPED is
    # accepted and ignored, so no flag is set.
    return BuildPlan(major, ())


def cudart() -> Any:
    """cuda-python's runtime module (new and old layouts)."""
    try:
        from cuda.bindings import runtime
        return runtime
    except ImportError:
        from cuda import cudart as runtime  # cuda-python < 12.6
        return runtime


def _code(err: Any) -> int:
    """The integer of a ``cudaError_t``: an IntEnum in cuda-python 12, a FastEnum (an int
    subclass) in cuda-bindings 12.9+/13, a plain ``Enum`` (``int()`` raises) in early
    releases; ``.value`` is an int in all three."""
    return int(getattr(err, "value", err))


def _ck(result: Any) -> Any:
    """cuda-python returns (error, *values): raise on error, return the value(s)."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if _code(err) != 0:
        raise RuntimeError(f"CUDA error {getattr(err, 'name', err)} ({_code(err)})")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


@functools.lru_cache(maxsize=1)
def _native_handle_fn() -> Callable[[Any], int] | None:
    try:
        from cuda.bindings.utils import get_cuda_native_handle
    except ImportError:  # cuda-python before 12.9
        return None
    return get_cuda_native_handle


def native_handle(handle: Any) -> int:
    """The value of a cuda-python handle (cudaStream_t, cudaGraphExec_t, …), which is what
    TensorRT and the runtime take. cuda-python 13 deprecates ``int(handle)`` for
    ``cuda.bindings.utils.get_cuda_native_handle``; device/host pointers are plain ints and
    older releases lack the function, so ``int()`` stays the fallback. ``getPtr()`` is the
    address *of* the handle (&stream), never a valid stream: deliberately not used."""
    if isinstance(handle, int):
        return handle
    fn = _native_handle_fn()
    if fn is not None:
        try:
            return int(fn(handle))
        except TypeError:  # a type the function does not know
            pass
    return int(handle)


def _instantiate(rt: Any, graph: Any) -> Any:
    """cudaGraphInstantiate(graph, flags) in cuda-python 12+/13; the 11.x binding had the
    CUDA 11 signature, where cudaGraphInstantiateWithFlags(graph, flags) is the same call."""
    try:
        return _ck(rt.cudaGraphInstantiate(graph, 0))
    except TypeError:
        return _ck(rt.cudaGraphInstantiateWithFlags(graph, 0))


def _parser_error(e: Any) -> str:
    """One ONNX-parser error; node_name()/node_operator() exist only in TensorRT 10's parser."""
    name = getattr(e, "node_name", None)
    op = getattr(e, "node_operator", None)
    where = (name() if name else "") or str(e.node())
    return f"node {where}" + (f" ({op()})" if op else "") + f": {e.desc()}"


def current_binding() -> dict[str, str]:
    """What an engine is bound to on this machine."""
    info = gpu_info()
    return {"tensorrt": trt_version(), **(info.as_dict() if info else {"gpu": "none"})}


def profile_shapes(network_inputs: list[tuple[str, tuple[int, ...]]],
                   shapes: dict[str, tuple[int, ...]]) -> list[tuple[str, tuple[int, ...]]]:
    """The optimization-profile entries to set: one ``(name, shape)`` per network input that
    still has a dynamic (-1) dimension, pinned to the one shape it is run at (``shapes``, by
    graph input name). Empty when every input is static (no profile needed). A dynamic input
    with no declared shape, or one whose static dimensions disagree, is refused."""
    entries = []
    for name, dims in network_inputs:
        if not any(int(d) < 0 for d in dims):
            continue
        want = shapes.get(name)
        if want is None:
            raise UnsupportedError(f"gpu.tensorrt: network input {name!r} has dynamic shape "
                                   f"{tuple(dims)} and the model declares no shape for it "
                                   f"(declared: {sorted(shapes)})")
        if len(want) != len(dims) or any(int(d) >= 0 and int(d) != w for d, w in zip(dims, want, strict=True)):
            raise UnsupportedError(f"gpu.tensorrt: network input {name!r} has shape {tuple(dims)}, "
                                   f"the model declares {tuple(want)}")
        entries.append((name, tuple(int(w) for w in want)))
    return entries


def build_engine(onnx_bytes: bytes, shapes: dict[str, tuple[int, ...]], plan: BuildPlan,
                 workspace: int = 1 << 30, precision: str = "") -> tuple[bytes, str]:
    """The serialized engine and the builder's log. ``onnx_bytes`` already carries the
    precision (:func:`.precision.prepare_onnx`); ``shapes`` is the batched shape of every
    graph input, by name (the profile, where one is needed)."""
    import tensorrt as trt

    class _Log(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.lines: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity <= trt.ILogger.Severity.WARNING:
                self.lines.append(f"[{severity.name}] {msg}")

    logger = _Log()
    builder = trt.Builder(logger)
    flags = 0
    for name in plan.network_flags:
        flags |= 1 << int(getattr(trt.NetworkDefinitionCreationFlag, name))
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errs = [_parser_error(parser.get_error(k)) for k in range(parser.num_errors)]
        raise UnsupportedError("gpu.tensorrt cannot parse the ONNX graph: " + "; ".join(errs))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    for name in plan.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, name))
    # The ONNX graph had its batch fixed, so usually no input is dynamic and no profile is
    # needed; a profile is required only when some input dimension is still -1 (e.g. a
    # sequence axis), and then every such input is pinned to the one shape we run.
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    entries = profile_shapes([(t.name, tuple(t.shape)) for t in inputs], shapes)
    if entries:
        profile = builder.create_optimization_profile()
        for name, shape in entries:
            profile.set_shape(name, shape, shape, shape)
        config.add_optimization_profile(profile)
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise CompileError("TensorRT failed to build the engine:\n" + "\n".join(logger.lines[-30:]),
                           target="gpu.tensorrt", precision=precision)
    return bytes(blob), "\n".join(logger.lines)


class _Pinned:
    """A page-locked host buffer viewed as a numpy array (freed with the executor)."""

    def __init__(self, rt: Any, shape: tuple[int, ...], dtype: Any):
        self.nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.ptr = _ck(rt.cudaMallocHost(self.nbytes))
        raw = (ctypes.c_byte * self.nbytes).from_address(native_handle(self.ptr))
        self.array = np.frombuffer(raw, dtype=dtype).reshape(shape)


def engine_io(names: list[str], is_input: list[bool], want_in: list[str] | None,
              want_out: list[str] | None) -> tuple[list[str], list[str]]:
    """The engine's input and output tensor names in the model's spec order.

    ``names``/``is_input``: the engine's I/O tensors and their modes, in engine order;
    ``want_in``/``want_out``: the graph names in spec order that ``compile`` recorded (the
    artifact's ``meta["io"]``), or ``None`` for an artifact without them (then the engine's
    order, which is the ONNX graph's). A recorded name the engine lacks is refused."""
    ins = [n for n, i in zip(names, is_input, strict=True) if i]
    outs = [n for n, i in zip(names, is_input, strict=True) if not i]
    for label, want, have in (("input", want_in, ins), ("output", want_out, outs)):
        if want is not None and sorted(want) != sorted(have):
            raise UnsupportedError(f"gpu.tensorrt: the engine's {label} tensors are {have}, the "
                                   f"artifact records {want}; rebuild it (hwb compile --rebuild)")
    return (list(want_in) if want_in is not None else ins,
            list(want_out) if want_out is not None else outs)


class _TensorRTRunner:
    """What both TensorRT executors share: the engine and its context, one stream, one pinned
    host + one device buffer per I/O tensor (addresses bound once by name), the copies in,
    ``execute_async_v3`` and the copies out, captured as one CUDA graph. ``_hins``/``_houts``
    are the host arrays in spec order; the executor classes add the call (one array or
    tuples)."""

    _in_specs: tuple[TensorSpec, ...]
    _out_specs: tuple[TensorSpec, ...]
    batch_size: int

    def _setup(self, engine_bytes: bytes, io: dict[str, list[str]] | None, cuda_graph: bool) -> None:
        self._rt = cudart()
        self._bufs: list[tuple[_Pinned, Any]] = []
        self._copies_in: list[tuple[Any, _Pinned]] = []
        self._copies_out: list[tuple[_Pinned, Any]] = []
        self.stream = self.graph_exec = self._graph = None
        try:
            self._open_engine(engine_bytes)
            ins, outs = self._io_names(io)
            self._check_shapes(ins, outs)
            self._allocate(ins, outs)
            self._warm_up()
            if cuda_graph:
                self._capture()
        except BaseException:
            self.close()  # nothing allocated so far outlives a failed load
            raise
        self._launch = self._make_launch()

    def _open_engine(self, engine_bytes: bytes) -> None:
        import tensorrt as trt

        self._trt = trt
        self._logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self._logger)
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise UnavailableError("gpu.tensorrt: TensorRT refused the engine (built for another "
                                   "GPU or TensorRT version); it will be rebuilt")
        self.context = self.engine.create_execution_context()

    def _io_names(self, io: dict[str, list[str]] | None) -> tuple[list[str], list[str]]:
        """The engine's input and output tensor names, in spec order, one per spec."""
        mode = self._trt.TensorIOMode.INPUT
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        ins, outs = engine_io(names, [self.engine.get_tensor_mode(n) == mode for n in names],
                              (io or {}).get("inputs"), (io or {}).get("outputs"))
        if len(ins) != len(self._in_specs) or len(outs) != len(self._out_specs):
            raise UnsupportedError(f"gpu.tensorrt: engine has inputs {ins} and outputs {outs}; "
                                   f"the model declares {len(self._in_specs)} input(s) and "
                                   f"{len(self._out_specs)} output(s)")
        return ins, outs

    def _check_shapes(self, ins: list[str], outs: list[str]) -> None:
        for name, spec in zip(ins, self._in_specs, strict=True):
            batched = spec.batched(self.batch_size)
            if not self.context.set_input_shape(name, batched):
                raise UnsupportedError(f"gpu.tensorrt: the engine refuses input shape "
                                       f"{batched} for {name!r}")
        # The host/device buffers are sized from the declared specs: an engine whose I/O
        # tensor holds more elements would read/write past them, so refuse it here.
        for name, spec in zip([*ins, *outs], [*self._in_specs, *self._out_specs], strict=True):
            got = tuple(int(d) for d in self.context.get_tensor_shape(name))
            if int(np.prod(got)) != int(np.prod(spec.batched(self.batch_size))):
                raise UnsupportedError(f"gpu.tensorrt: engine tensor {name!r} has shape {got}, "
                                       f"the model declares {tuple(spec.batched(self.batch_size))}")

    def _allocate(self, ins: list[str], outs: list[str]) -> None:
        """Pinned host + device buffer per I/O tensor, in the engine's I/O dtype (float32 for
        every prepared graph: fp16 and int8 keep fp32 I/O), each bound once by name."""
        rt = self._rt
        self.stream = _ck(rt.cudaStreamCreate())
        for name, spec in zip([*ins, *outs], [*self._in_specs, *self._out_specs], strict=True):
            dtype = self._trt.nptype(self.engine.get_tensor_dtype(name))
            host = _Pinned(rt, spec.batched(self.batch_size), dtype)
            try:
                dev = _ck(rt.cudaMalloc(host.nbytes))
            except BaseException:
                rt.cudaFreeHost(host.ptr)
                raise
            self._bufs.append((host, dev))
            self.context.set_tensor_address(name, native_handle(dev))
        n = len(ins)
        self._copies_in = [(dev, host) for host, dev in self._bufs[:n]]
        self._copies_out = list(self._bufs[n:])
        self._hins = tuple(h.array for h, _ in self._bufs[:n])
        self._houts = tuple(h.array for h, _ in self._bufs[n:])
        self._stream_ptr = native_handle(self.stream)

    def _warm_up(self) -> None:
        # One plain run first: TensorRT does lazy initialisation that must not be captured.
        self._enqueue()
        _ck(self._rt.cudaStreamSynchronize(self.stream))

    def _capture(self) -> None:
        """copies in + execute_async_v3 + copies out, captured once as a CUDA graph."""
        rt = self._rt
        _ck(rt.cudaStreamBeginCapture(self.stream,
                                      rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal))
        try:
            self._enqueue()
        finally:  # always end the capture, or the stream stays unusable
            ended = rt.cudaStreamEndCapture(self.stream)
        try:
            graph = _ck(ended)
        except RuntimeError as exc:
            raise UnsupportedError(f"gpu.tensorrt: this engine cannot be captured in a CUDA "
                                   f"graph ({exc}); compile with options={{'cuda_graph': "
                                   f"False}}") from exc
        self._graph = graph
        self.graph_exec = _instantiate(rt, graph)

    def _make_launch(self) -> Callable[[], None]:
        """The per-call launch with every attribute bound to a local (no lookups per call)."""
        rt = self._rt
        launch, sync, gexec, stream = rt.cudaGraphLaunch, rt.cudaStreamSynchronize, self.graph_exec, self.stream
        enqueue = self._enqueue

        def run() -> None:  # one graph launch + one sync; the sync reports any async error
            if gexec is not None:
                err = launch(gexec, stream)[0]
                if _code(err) != 0:  # a launch error is not reported by the sync
                    raise RuntimeError(f"cudaGraphLaunch failed: {getattr(err, 'name', err)}")
            else:
                enqueue()
            err = sync(stream)[0]
            if _code(err) != 0:
                raise RuntimeError(f"CUDA error in the TensorRT graph (device lost?): "
                                   f"{getattr(err, 'name', err)}")
        return run

    def _enqueue(self) -> None:
        """One copy in per input tensor, the engine, one copy out per output tensor."""
        rt = self._rt
        h2d, d2h = rt.cudaMemcpyKind.cudaMemcpyHostToDevice, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for dev, host in self._copies_in:
            _ck(rt.cudaMemcpyAsync(dev, host.ptr, host.nbytes, h2d, self.stream))
        if not self.context.execute_async_v3(self._stream_ptr):
            raise RuntimeError("execute_async_v3 failed")
        for host, dev in self._copies_out:
            _ck(rt.cudaMemcpyAsync(host.ptr, dev, host.nbytes, d2h, self.stream))

    @property
    def cuda_graph(self) -> bool:
        return self.graph_exec is not None

    def close(self) -> None:
        rt = self._rt
        if self.stream is not None:
            rt.cudaStreamSynchronize(self.stream)
        if self.graph_exec is not None:
            rt.cudaGraphExecDestroy(self.graph_exec)
        if self._graph is not None:
            rt.cudaGraphDestroy(self._graph)
        self.graph_exec = self._graph = None
        self.context = None  # TensorRT objects go before the memory they point at
        for host, dev in self._bufs:
            rt.cudaFreeHost(host.ptr)
            rt.cudaFree(dev)
        self._bufs, self._copies_in, self._copies_out = [], [], []
        if self.stream is not None:
            rt.cudaStreamDestroy(self.stream)
        self.stream = None
        # The numpy views pointed at the freed pinned memory: a call after close must fail
        # cleanly, not write into freed memory.
        self._hins = tuple(np.empty(s.batched(self.batch_size), _F32) for s in self._in_specs)
        self._houts = tuple(np.empty(s.batched(self.batch_size), _F32) for s in self._out_specs)

        def closed() -> None:
            raise RuntimeError("gpu.tensorrt executor is closed")
        self._launch = closed


class TensorRTExecutor(_TensorRTRunner, Executor):
    """One pinned + device buffer, one ``set_input_shape``/``set_tensor_address`` and one copy
    per tensor name (tuples in spec order inside), all in the one captured CUDA graph."""

    def __init__(self, engine_bytes: bytes, batch: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], cuda_graph: bool = True,
                 io: dict[str, list[str]] | None = None):
        self._init_io(inputs, outputs, batch)
        self._setup(engine_bytes, io, cuda_graph)

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        for h, x in zip(self._hins, xs, strict=True):
            h[...] = x
        self._launch()
        for o, h in zip(outs, self._houts, strict=True):
            o[...] = h


class TensorRTTarget(Target):
    name = "gpu.tensorrt"
    family = "gpu"
    precisions = ("fp32", "fp16", "int8")
    calibrated = ("int8",)
    formats = ("onnx",)
    install = "hwbackends[gpu]"
    description = "TensorRT engine on an NVIDIA GPU, CUDA-graph replay, pinned buffers"
    #: Several inputs/outputs: one profile entry, buffer, address and copy per tensor name.
    multi_io = True
    #: int8's Q/DQ graph is calibrated on every input (a dict per batch, keyed by input name).
    multi_io_calibrated = True
    #: 2: artifacts record their graph I/O names in spec order (meta["io"]).
    version = "2"
    option_docs = {
        "workspace_mb": "builder workspace limit in MiB (default 1024)",
        "cuda_graph": "true (default): capture copy + execute_async_v3 + copy in one CUDA graph",
    }

    def probe(self) -> Availability:
        reasons = []
        if not importable("tensorrt"):
            reasons.append("tensorrt not importable (pip install 'hwbackends[gpu]')")
        if not (importable("cuda.bindings") or importable("cuda.cudart")):
            reasons.append("cuda-python not importable (pip install 'hwbackends[gpu]')")
        gpu = no_gpu_reason()
        if gpu:
            reasons.append(gpu)
        stack = cuda_stack()
        bad = stack_mismatch(stack)
        if bad:
            reasons.append(bad)
        if reasons:
            found = stack.summary()
            return Availability.unavailable("; ".join(reasons) + (f" [found: {found}]" if found else ""),
                                            **stack.as_dict())
        info = gpu_info()
        return Availability.hardware(info.name if info else "CUDA GPU", stack.summary(),
                                     **stack.as_dict())

    def toolchain(self) -> dict[str, str]:
        # Light: package metadata and one cached nvidia-smi query; no CUDA context.
        return current_binding()

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        import onnx

        from hwb_plugins._shared.onnx_batch import fix_batch

        plan = build_plan(trt_version())
        copy = onnx.ModelProto()
        copy.CopyFrom(model.obj)
        proto = fix_batch(copy, options.batch_size)
        io = graph_io(proto, model.inputs, model.outputs)
        # The precision is in the graph TensorRT parses (it is the only place TensorRT 11
        # takes it from); the graph is kept in the artifact for inspection.
        graph = prepare_onnx(proto, options.precision, calibration_by_input(io, options.calibration))
        onnx.save(graph, str(workdir / GRAPH))
        mb = int(options.extra.get("workspace_mb", 1024))
        shapes = {n: s.batched(options.batch_size) for n, s in zip(io["inputs"], model.inputs, strict=True)}
        blob, log = build_engine(graph.SerializeToString(), shapes, plan, mb << 20,
                                 precision=options.precision)
        (workdir / ENGINE).write_bytes(blob)
        return {"file": ENGINE, "bytes": len(blob), "bound_to": current_binding(), "io": io,
                "graph": GRAPH, "qdq_nodes": len(qdq_zero_points(graph)),
                "build_plan": asdict(plan),
                "build_log": log[-4000:], "converted_from": model.meta.get("converted_from", "onnx")}

    def triton(self) -> TritonForm:
        from .export import TensorRTTriton

        return TensorRTTriton(ENGINE)

    def load(self, artifact: Artifact, options: CompileOptions) -> Executor:
        bound, here = artifact.meta.get("bound_to", {}), current_binding()
        if bound != here:
            # The core evicts an artifact that fails to load and rebuilds it.
            raise UnavailableError(f"gpu.tensorrt engine was built for {bound}, this machine is "
                                   f"{here}; rebuilding")
        engine = artifact.file(ENGINE).read_bytes()
        graph, io = bool(options.extra.get("cuda_graph", True)), artifact.meta.get("io")
        return TensorRTExecutor(engine, artifact.batch_size, artifact.inputs, artifact.outputs,
                                cuda_graph=graph, io=io)


def graph_io(proto: Any, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> dict[str, list[str]]:
    """The graph's input and output names in spec order (what the engine's tensors are called:
    the ONNX parser keeps the graph's names); stored in the artifact's ``meta["io"]``."""
    ins, outs = graph_inputs(proto), graph_outputs(proto)
    if len(ins) != len(inputs) or len(outs) != len(outputs):
        raise UnsupportedError(f"gpu.tensorrt: the ONNX graph has inputs {ins} and outputs {outs}; "
                               f"the model declares {[s.name for s in inputs]} and "
                               f"{[s.name for s in outputs]}")
    return {"inputs": spec_order(ins, inputs), "outputs": spec_order(outs, outputs)}


def calibration_by_input(io: dict[str, list[str]], calibration: Any) -> Any:
    """``options.calibration`` (one array, or a tuple in spec order) keyed by graph input name,
    which :func:`.precision.prepare_onnx` takes whatever the graph's input order."""
    if calibration is None or not isinstance(calibration, tuple):
        return calibration
    return dict(zip(io["inputs"], calibration, strict=True))
