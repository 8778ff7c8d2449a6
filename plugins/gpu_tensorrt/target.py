"""``gpu.tensorrt``: ONNX → TensorRT engine (Python API, TensorRT 10), replayed as a CUDA graph.

Compile (child, on the GPU machine): parse the ONNX graph (unsupported nodes are named),
one optimization profile pinned to the compiled batch size, ``FP16`` / ``INT8`` builder
flags, INT8 calibrated by an ``IInt8EntropyCalibrator2`` fed from the representative data
(``options.calibration``). The serialized engine is the artifact; it is bound to the GPU
model, compute capability, TensorRT and driver versions, which are all in ``toolchain()``
(so in the cache key) and in the artifact's metadata (checked again at load: an engine from
another GPU or TensorRT is rebuilt, never loaded).

Executor: pinned host buffers and device buffers allocated once, one CUDA stream, tensor
addresses bound once; H2D copy + ``execute_async_v3`` + D2H copy captured in one CUDA graph
that is launched per call (one launch + one sync from Python). CUDA calls go through
``cuda-python`` (``cuda.bindings.runtime``).
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

from hwbackends.errors import CompileError, UnavailableError, UnsupportedError
from hwbackends.specs import Availability, TensorSpec
from hwbackends.target import Artifact, CompileOptions, Executor, Target

from .._nvidia import gpu_info, no_gpu_reason
from .._util import importable, version

ENGINE = "model.engine"

_F32 = np.dtype(np.float32)


def trt_version() -> str:
    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_cu12_libs"):
        v = version(dist)
        if v:
            return v
    return ""


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


def _ptr(handle: Any) -> int:
    # int() of a cuda-python handle (cudaStream_t, ...) is the handle's value, which is what
    # TensorRT and the runtime take; getPtr() is the address *of* the handle (&stream), never
    # a valid stream, so there is deliberately no fallback to it.
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


class EntropyCalibrator:
    """Factory for an ``IInt8EntropyCalibrator2`` over representative inputs (TensorRT is
    imported lazily, so the class is built at compile time)."""

    @staticmethod
    def create(data: np.ndarray, batch: int, cache: Path) -> Any:
        import tensorrt as trt

        rt = cudart()

        class _Calib(trt.IInt8EntropyCalibrator2):
            def __init__(self) -> None:
                trt.IInt8EntropyCalibrator2.__init__(self)
                self.data = np.ascontiguousarray(data, dtype=np.float32)
                self.batch = batch
                self.i = 0
                self.nbytes = self.data[:batch].nbytes
                self.dptr = _ck(rt.cudaMalloc(self.nbytes))

            def get_batch_size(self) -> int:
                return self.batch

            def get_batch(self, names: list[str]) -> list[int] | None:
                if self.i + self.batch > len(self.data):
                    return None
                chunk = np.ascontiguousarray(self.data[self.i:self.i + self.batch])
                _ck(rt.cudaMemcpy(self.dptr, chunk.ctypes.data, self.nbytes,
                                  rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
                self.i += self.batch
                return [_ptr(self.dptr)]

            def read_calibration_cache(self) -> bytes | None:
                return cache.read_bytes() if cache.exists() else None

            def write_calibration_cache(self, blob: Any) -> None:
                cache.write_bytes(bytes(blob))

            def free(self) -> None:
                _ck(rt.cudaFree(self.dptr))

        return _Calib()


def build_engine(onnx_bytes: bytes, input_name: str, shape: tuple[int, ...], precision: str,
                 calibration: np.ndarray | None, workdir: Path, workspace: int = 1 << 30) -> tuple[bytes, str]:
    """The serialized engine and the builder's log."""
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
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errs = [_parser_error(parser.get_error(k)) for k in range(parser.num_errors)]
        raise UnsupportedError("gpu.tensorrt cannot parse the ONNX graph: " + "; ".join(errs))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    # The ONNX graph had its batch fixed, so usually no input is dynamic and no profile is
    # needed; a profile is required only when some input dimension is still -1 (e.g. a
    # sequence axis), and then it is pinned to the one shape we run.
    profile = None
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    if any(int(d) < 0 for t in inputs for d in t.shape):
        profile = builder.create_optimization_profile()
        profile.set_shape(input_name, shape, shape, shape)
        config.add_optimization_profile(profile)
    calib = None
    if precision in ("fp16", "int8"):
        config.set_flag(trt.BuilderFlag.FP16)
    if precision == "int8":
        if calibration is None or len(calibration) < shape[0]:
            raise UnsupportedError("gpu.tensorrt:int8 needs calibration data (calibration_data=…)")
        config.set_flag(trt.BuilderFlag.INT8)
        calib = EntropyCalibrator.create(calibration, shape[0], workdir / "calibration.cache")
        config.int8_calibrator = calib  # implicit quantization: deprecated in TRT 10.1, still built
        if profile is not None:
            config.set_calibration_profile(profile)
    try:
        blob = builder.build_serialized_network(network, config)
    finally:
        if calib is not None:
            calib.free()
    if blob is None:
        raise CompileError("TensorRT failed to build the engine:\n" + "\n".join(logger.lines[-30:]),
                           target="gpu.tensorrt", precision=precision)
    return bytes(blob), "\n".join(logger.lines)


class _Pinned:
    """A page-locked host buffer viewed as a numpy array (freed with the executor)."""

    def __init__(self, rt: Any, shape: tuple[int, ...], dtype: Any):
        self.nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.ptr = _ck(rt.cudaMallocHost(self.nbytes))
        raw = (ctypes.c_byte * self.nbytes).from_address(_ptr(self.ptr))
        self.array = np.frombuffer(raw, dtype=dtype).reshape(shape)


class TensorRTExecutor(Executor):
    def __init__(self, engine_bytes: bytes, batch: int, inp: TensorSpec, out: TensorSpec,
                 cuda_graph: bool = True):
        import tensorrt as trt

        rt = self._rt = cudart()
        self._init_io(inp, out, batch)
        self._logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self._logger)
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise UnavailableError("gpu.tensorrt: TensorRT refused the engine (built for another "
                                   "GPU or TensorRT version); it will be rebuilt")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        ins = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outs = [n for n in names if n not in ins]
        if len(ins) != 1 or len(outs) != 1:
            raise UnsupportedError(f"gpu.tensorrt: engine has inputs {ins} and outputs {outs}; "
                                   f"one of each is supported")
        if not self.context.set_input_shape(ins[0], inp.batched(batch)):
            raise UnsupportedError(f"gpu.tensorrt: the engine refuses input shape "
                                   f"{inp.batched(batch)} for {ins[0]!r}")
        # The host/device buffers are sized from the declared specs: an engine whose I/O
        # tensor holds more elements would read/write past them, so refuse it here.
        for name, spec in ((ins[0], inp), (outs[0], out)):
            got = tuple(int(d) for d in self.context.get_tensor_shape(name))
            if int(np.prod(got)) != int(np.prod(spec.batched(batch))):
                raise UnsupportedError(f"gpu.tensorrt: engine tensor {name!r} has shape {got}, "
                                       f"the model declares {tuple(spec.batched(batch))}")
        self.stream = _ck(rt.cudaStreamCreate())
        self._bufs = []
        for name, spec in ((ins[0], inp), (outs[0], out)):
            dtype = trt.nptype(self.engine.get_tensor_dtype(name))
            host = _Pinned(rt, spec.batched(batch), dtype)
            dev = _ck(rt.cudaMalloc(host.nbytes))
            self.context.set_tensor_address(name, _ptr(dev))
            self._bufs.append((host, dev))
        (self._hin, self._din), (self._hout, self._dout) = self._bufs
        self._hx, self._hy = self._hin.array, self._hout.array
        self._stream_ptr = _ptr(self.stream)
        # One plain run first: TensorRT does lazy initialisation that must not be captured.
        self._enqueue()
        _ck(rt.cudaStreamSynchronize(self.stream))
        self.graph_exec = self._graph = None
        if cuda_graph:
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
        self._launch = run

    def _enqueue(self) -> None:
        rt = self._rt
        _ck(rt.cudaMemcpyAsync(self._din, self._hin.ptr, self._hin.nbytes,
                               rt.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream))
        if not self.context.execute_async_v3(self._stream_ptr):
            raise RuntimeError("execute_async_v3 failed")
        _ck(rt.cudaMemcpyAsync(self._hout.ptr, self._dout, self._hout.nbytes,
                               rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream))

    def _run(self, x: np.ndarray, out: np.ndarray) -> None:
        self._hx[...] = x
        self._launch()
        out[...] = self._hy

    def close(self) -> None:
        rt = self._rt
        if not self._bufs:
            return
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
        self._bufs = []
        rt.cudaStreamDestroy(self.stream)
        # The numpy views pointed at the freed pinned memory: a call after close must fail
        # cleanly, not write into freed memory.
        self._hx, self._hy = np.empty(self._xshape, _F32), np.empty(self._yshape, _F32)

        def closed() -> None:
            raise RuntimeError("gpu.tensorrt executor is closed")
        self._launch = closed


class TensorRTTarget(Target):
    name = "gpu.tensorrt"
    family = "gpu"
    precisions = ("fp32", "fp16", "int8")
    calibrated = ("int8",)
    formats = ("onnx",)
    description = "TensorRT engine on an NVIDIA GPU, CUDA-graph replay, pinned buffers"
    option_docs = {
        "workspace_mb": "builder workspace limit in MiB (default 1024)",
        "cuda_graph": "true (default): capture copy + execute_async_v3 + copy in one CUDA graph",
    }

    def probe(self) -> Availability:
        reasons = []
        if not importable("tensorrt"):
            reasons.append("tensorrt not importable (pip install tensorrt)")
        if not (importable("cuda.bindings") or importable("cuda.cudart")):
            reasons.append("cuda-python not importable (pip install cuda-python)")
        gpu = no_gpu_reason()
        if gpu:
            reasons.append(gpu)
        if reasons:
            return Availability.unavailable("; ".join(reasons))
        info = gpu_info()
        return Availability.hardware(info.name if info else "CUDA GPU",
                                     f"TensorRT {trt_version()} on the GPU")

    def toolchain(self) -> dict[str, str]:
        # Light: package metadata and one cached nvidia-smi query; no CUDA context.
        return current_binding()

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        import onnx

        from hwb_plugins._shared.onnx_batch import fix_batch

        copy = onnx.ModelProto()
        copy.CopyFrom(model.obj)
        proto = fix_batch(copy, options.batch_size)
        inits = {i.name for i in proto.graph.initializer}
        in_name = next(i.name for i in proto.graph.input if i.name not in inits)
        mb = int(options.extra.get("workspace_mb", 1024))
        blob, log = build_engine(proto.SerializeToString(), in_name,
                                 model.input.batched(options.batch_size), options.precision,
                                 options.calibration, workdir, mb << 20)
        (workdir / ENGINE).write_bytes(blob)
        return {"file": ENGINE, "bytes": len(blob), "bound_to": current_binding(),
                "build_log": log[-4000:], "converted_from": model.meta.get("converted_from", "onnx")}

    def load(self, artifact: Artifact, options: CompileOptions) -> TensorRTExecutor:
        bound, here = artifact.meta.get("bound_to", {}), current_binding()
        if bound != here:
            # The core evicts an artifact that fails to load and rebuilds it.
            raise UnavailableError(f"gpu.tensorrt engine was built for {bound}, this machine is "
                                   f"{here}; rebuilding")
        return TensorRTExecutor(artifact.file(ENGINE).read_bytes(), artifact.batch_size,
                                artifact.inputs[0], artifact.outputs[0],
                                cuda_graph=bool(options.extra.get("cuda_graph", True)))
