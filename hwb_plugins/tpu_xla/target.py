"""``tpu.xla``: the model as one JAX function, compiled ahead of time by XLA.

Compile (child process): ONNX (Keras and PyTorch models arrive converted by the converter
plugins) → JAX function (:mod:`.onnx_jax`) with a static batch → ``jax.export`` for the
``cpu``, ``cuda`` and ``tpu`` platforms at once → the serialized bytes are the artifact, so
one artifact runs on whichever XLA device the loading machine has. The child also compiles it
once for its own device so an XLA failure surfaces there, isolated.

Load (parent): deserialize, ``jax.jit(exported.call).lower(static shape).compile()`` on
``jax.devices()[0]``. Mode: *hardware* only on a TPU; on a GPU or CPU XLA backend the same
artifact runs *emulated*, with the device named (``XLA:cpu``).

Nothing here imports TensorFlow: the target runs on a machine with only JAX installed.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hwbackends.contract import (
    Artifact,
    Availability,
    CompileOptions,
    Executor,
    Target,
    TensorSpec,
    TritonForm,
    UnavailableError,
    UnsupportedError,
)

from .._shared.onnx_batch import batch_meta, fix_batch
from .._util import importable, version

#: Platforms every artifact is exported for (jax.export lowers once per platform).
EXPORT_PLATFORMS = ("cpu", "cuda", "tpu")
ARTIFACT = "model.jax_export"

def _cuda_plugin() -> bool:
    return any(importable(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin",
                                       "jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"))


def predicted_platform() -> tuple[str, str]:
    """Which XLA platform ``jax.devices()[0]`` will be, guessed without importing jax
    (probe must stay fast): (platform, why)."""
    forced = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    tpu_dev = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    if forced:
        return ("cuda" if forced == "gpu" else forced), f"JAX_PLATFORMS={os.environ['JAX_PLATFORMS']}"
    if importable("libtpu") and tpu_dev:
        return "tpu", f"libtpu installed, {tpu_dev[0]} present"
    if _cuda_plugin() and os.path.exists("/dev/nvidia0"):
        return "cuda", "no TPU (libtpu/ /dev/accel* absent); JAX CUDA plugin and /dev/nvidia0 present"
    why = []
    if not importable("libtpu"):
        why.append("libtpu not installed")
    if not tpu_dev:
        why.append("no /dev/accel* TPU device")
    return "cpu", "no TPU here (" + ", ".join(why or ["no TPU device"]) + ")"


def share_gpu_memory() -> None:
    """JAX grabs 75% of GPU memory when its GPU client starts; on a box where gpu.torch (or
    the compile worker) shares the GPU that starves the others. Allocate on demand instead,
    unless the user chose otherwise (read when the client is created)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def sync_cpu_dispatch() -> bool:
    """Turn off JAX's asynchronous CPU dispatch if the CPU client does not exist yet; returns
    whether the setting is in force (False: JAX was initialised earlier in this process, or
    ``HWB_XLA_ASYNC_DISPATCH=1`` keeps JAX's default, e.g. to compare)."""
    import jax

    if os.environ.get("HWB_XLA_ASYNC_DISPATCH") == "1":
        return not jax.config.read("jax_cpu_enable_async_dispatch")

    try:
        from jax._src import xla_bridge
        initialised = bool(getattr(xla_bridge, "_backends", {}))
    except Exception:  # private API moved: set it anyway, it is harmless
        initialised = False
    if not initialised:
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    return not jax.config.read("jax_cpu_enable_async_dispatch")


def _device_for(blob: bytes) -> tuple[Any, Any, str]:
    """Deserialize an artifact and pick the device it runs on (refusing a platform mismatch)."""
    import jax
    from jax import export

    # Run CPU executables on the calling thread instead of handing each call to XLA's
    # dispatch thread: zoo MLP p50 48 → 10 µs, LSTM p99 2.2 ms → 82 µs (docs/performance.md).
    # It is read when the CPU client is created, so it must precede jax.devices(); it is
    # process-wide, changes only *when* CPU results are computed, and no other backend.
    share_gpu_memory()
    sync_cpu_dispatch()
    exported = export.deserialize(bytearray(blob))
    device = jax.devices()[0]
    plat = "cuda" if device.platform == "gpu" else device.platform
    if plat not in exported.platforms:
        raise UnavailableError(f"tpu.xla artifact was exported for {', '.join(exported.platforms)} "
                               f"but this machine's XLA device is {device.platform}; recompile "
                               f"(hwb compile --rebuild)")
    return exported, device, device.platform


class XlaExecutor(Executor):
    """The hot path is the compiled XLA executable called on the caller's arrays (one per
    input): one host→device transfer in per input, one device→host copy into each output;
    no tracing, no dispatch through ``jax.jit``'s cache (the executable is called
    directly)."""

    def __init__(self, blob: bytes, batch: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec]):
        import jax

        exported, self.device, self.platform = _device_for(blob)
        self.sync_dispatch = self.platform == "cpu" and not jax.config.read("jax_cpu_enable_async_dispatch")
        self._init_io(inputs, outputs, batch)
        specs = [jax.ShapeDtypeStruct(s, np.float32) for s in self._xshapes]
        self.compiled = jax.jit(exported.call).lower(*specs).compile()
        self._call = self.compiled
        # compile exports a function returning a tuple (one array per output); artifacts
        # exported before that, for one tensor each way, return the bare array: read which
        # from the artifact, so stored ones need no rebuild.
        self._bare = jax.tree_util.treedef_is_leaf(exported.out_tree)

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        ys = self._call(*xs)
        if self._bare:
            outs[0][...] = ys
            return
        for o, y in zip(outs, ys, strict=True):
            o[...] = y


def fixed_batch(proto: Any, batch: int) -> Any:
    """A copy of the ONNX graph with the batch dimension of its inputs/outputs fixed."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return fix_batch(copy, batch)


class XlaTarget(Target):
    name = "tpu.xla"
    family = "tpu"
    precisions = ("fp32", "bf16")
    formats = ("onnx",)
    install = "hwbackends[tpu]"
    description = "XLA via JAX (AOT): TPU = hardware; GPU/CPU XLA backend = emulated"
    multi_io = True
    option_docs: dict[str, str] = {}

    def probe(self) -> Availability:
        if not (importable("jax") and importable("jaxlib")):
            return Availability.unavailable("jax not installed (pip install jax)")
        if not importable("onnx"):
            return Availability.unavailable("onnx not installed: tpu.xla reads models as ONNX "
                                            "(pip install onnx)")
        plat, why = predicted_platform()
        if plat == "tpu":
            return Availability.hardware("XLA:tpu", why)
        return Availability.emulated(f"XLA:{plat}", f"{why}: the XLA artifact runs on the {plat} "
                                     f"backend instead of a TPU")

    def toolchain(self) -> dict[str, str]:
        return {"jax": version("jax"), "jaxlib": version("jaxlib"), "onnx": version("onnx"),
                "tf2onnx": version("tf2onnx"), "torch": version("torch")}

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        share_gpu_memory()  # the compile worker stays alive: it must not hold the GPU's memory
        import jax
        from jax import export

        from .onnx_jax import to_jax  # large: not imported by `hwb targets`

        proto = fixed_batch(model.obj, options.batch_size)
        fn = jax.jit(to_jax(proto, options.precision, self.name))
        specs = [jax.ShapeDtypeStruct(s.batched(options.batch_size), np.float32)
                 for s in model.inputs]
        try:
            exp = export.export(fn, platforms=EXPORT_PLATFORMS)(*specs)
        except UnsupportedError:
            raise
        except Exception as first:  # a platform whose lowering fails: keep the local one
            local = jax.devices()[0].platform.replace("gpu", "cuda")
            try:
                exp = export.export(fn, platforms=(local,))(*specs)
            except Exception:
                raise first from None
        got = [tuple(a.shape) for a in exp.out_avals]
        want = [s.batched(options.batch_size) for s in model.outputs]
        if got != want:
            raise UnsupportedError(f"{self.name}: the JAX function returns shape(s) {got}, "
                                   f"the model declares {want}")
        blob = exp.serialize()
        (workdir / ARTIFACT).write_bytes(blob)
        # Compile once here too: an XLA compile failure then happens in the isolated child.
        jax.jit(exp.call).lower(*specs).compile()
        ops = sorted({n.op_type for n in proto.graph.node})
        return {"file": ARTIFACT, "bytes": len(blob), "platforms": list(exp.platforms),
                "onnx_ops": ops, "compute_dtype": "bfloat16" if options.precision == "bf16" else "float32",
                "converted_from": model.meta.get("converted_from", "onnx"),
                "compiled_on": str(jax.devices()[0]), **batch_meta(model, options.batch_size)}

    def triton(self) -> TritonForm:
        from .export import XlaTriton

        return XlaTriton(ARTIFACT)

    def load(self, artifact: Artifact, options: CompileOptions) -> Executor:
        expected, why = predicted_platform()
        blob = artifact.file(ARTIFACT).read_bytes()
        ex = XlaExecutor(blob, artifact.batch_size, artifact.inputs, artifact.outputs)
        if expected == "tpu" and ex.platform != "tpu":
            # probe() promised a TPU (mode hardware): never label a CPU latency as TPU.
            raise UnavailableError(f"tpu.xla expected a TPU ({why}) but jax.devices()[0] is "
                                   f"{ex.device}: the TPU is lost or held by another process")
        return ex

