"""``tpu.edgetpu``: full-integer int8 TFLite for the Coral Edge TPU.

Compile (child): Keras → full-int8 TFLite calibrated on representative data (the converter
of ``cpu.litert``, :func:`hwb_plugins._shared.tflite.to_tflite`), then ``edgetpu_compiler``
when it is on PATH; its log (which ops map to the Edge TPU, which stay on the CPU) is kept
in the artifact (``model_edgetpu.log``) and in ``artifact.meta["edgetpu_compiler_log"]``.

Run: with an Edge TPU present (PCIe ``/dev/apex_0`` or a Coral USB stick), the compiler and
``libedgetpu.so.1``, the compiled model runs through LiteRT with the ``libedgetpu`` delegate
(mode *hardware*). Otherwise the same int8 model runs on the CPU LiteRT interpreter (mode
*emulated*: the same integer arithmetic), with the missing piece as the reason.

Expect a floor of about 1 ms per call on the device (USB/PCIe round trip); dense layers and
LSTMs run slower than on a CPU. It is a target for CNN throughput, not microsecond tiers.
"""
from __future__ import annotations

import ctypes.util
import functools
import glob
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import MethodType
from typing import Any, Sequence

import numpy as np

from hwbackends.contract import (
    Artifact,
    Availability,
    CompileError,
    CompileOptions,
    Executor,
    Mode,
    Target,
    TensorSpec,
    UnavailableError,
    UnsupportedError,
)

from .._shared.litert import LiteRTExecutor
from .._shared.tflite import has_recurrent, op_names, to_tflite
from .._util import importable, version
from .delegate_probe import probe_delegate

COMPILER = "edgetpu_compiler"
DELEGATE = "libedgetpu.so.1"
#: USB ids of the Coral USB Accelerator before (1a6e:089a) and after (18d1:9302) firmware load.
USB_IDS = {("1a6e", "089a"), ("18d1", "9302")}

def find_device() -> str | None:
    """The Edge TPU device, if one is attached: '/dev/apex_0' (PCIe/M.2) or 'usb:BUS-PORT'."""
    apex = sorted(glob.glob("/dev/apex_*"))
    if apex:
        return apex[0]
    for d in glob.glob("/sys/bus/usb/devices/*"):
        try:
            ids = (Path(d, "idVendor").read_text().strip(), Path(d, "idProduct").read_text().strip())
        except OSError:
            continue
        if ids in USB_IDS:
            return "usb:" + os.path.basename(d)
    return None


def find_delegate() -> str | None:
    """Where libedgetpu.so.1 is, without loading it."""
    found = ctypes.util.find_library("edgetpu")
    if found:
        return found
    for d in ("/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/lib"):
        if os.path.exists(os.path.join(d, DELEGATE)):
            return os.path.join(d, DELEGATE)
    return None


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    """'Edge TPU Compiler version 16.0.384591198' or '' when not on PATH."""
    exe = shutil.which(COMPILER)
    if not exe:
        return ""
    try:
        r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
        return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr) else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_compiler(tflite: Path, outdir: Path, timeout: float = 300.0) -> tuple[Path, str]:
    """Run edgetpu_compiler on ``tflite``; return (compiled model, log text)."""
    exe = shutil.which(COMPILER)
    if not exe:
        raise UnavailableError(f"{COMPILER} not on PATH")
    r = subprocess.run([exe, "-s", "-o", str(outdir), str(tflite)], capture_output=True, text=True,
                       timeout=timeout)
    log_file = outdir / (tflite.stem + "_edgetpu.log")
    log = (r.stdout or "") + (r.stderr or "")
    if log_file.exists():
        log += "\n" + log_file.read_text(errors="replace")
    out = outdir / (tflite.stem + "_edgetpu.tflite")
    if r.returncode != 0 or not out.exists():
        raise CompileError(f"{COMPILER} failed (exit {r.returncode}) on {tflite.name}:\n{log[-3000:]}",
                           target="tpu.edgetpu", precision="int8", log=log)
    (outdir / (tflite.stem + "_edgetpu.log")).write_text(log)
    return out, log


def mapping_summary(log: str) -> dict[str, int]:
    """The op counts the compiler log reports ('Number of operations that will run on Edge
    TPU: 12' / '... will run on CPU: 2')."""
    out = {}
    for key, pat in (("on_edgetpu", r"will run on Edge TPU:\s*(\d+)"),
                     ("on_cpu", r"will run on CPU:\s*(\d+)")):
        m = re.search(pat, log)
        if m:
            out[key] = int(m.group(1))
    return out


class EdgeTpuExecutor(LiteRTExecutor):
    """The LiteRT zero-copy hot path, with the Edge TPU delegate on hardware. With int8 IO
    tensors each input is quantized into its tensor and each output dequantized out of its
    own, in place, with that tensor's scale and zero-point."""

    def __init__(self, path: Path, batch: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], delegate: bool, threads: int = 1):
        from ai_edge_litert.interpreter import load_delegate

        super().__init__(path, threads, batch, inputs, outputs,
                         [load_delegate(DELEGATE)] if delegate else None)
        self.int8_io = any(d["dtype"] == np.int8 for d in [*self.input_details, *self.output_details])
        # (1/scale, zero-point, float scratch) per input; (scale, zero-point) per output
        # (float IO tensors have scale 0: nothing to precompute).
        self._qin = [(np.float32(1.0 / d["quantization"][0]), np.float32(d["quantization"][1]),
                      np.zeros(buf.shape, np.float32))
                     for d, buf in zip(self.input_details, self._ins, strict=True)] if self.int8_io else []
        self._qout = [(np.float32(d["quantization"][0]), np.int32(d["quantization"][1]))
                      for d in self.output_details] if self.int8_io else []
        if self.int8_io and self.single:
            # The buffered float copy would cast into the int8 tensor: take the general
            # single-array call (same guard and error path), whose _run below quantizes.
            self.predict_into = MethodType(Executor._predict_one, self)  # type: ignore[method-assign]

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        if not self.int8_io:
            return super()._run(xs, outs)
        for x, buf, (inv, zp, f) in zip(xs, self._ins, self._qin, strict=True):
            np.multiply(x, inv, out=f)
            np.rint(f, out=f)
            np.add(f, zp, out=f)
            np.clip(f, -128, 127, out=f)
            buf[...] = f
        self._invoke()
        for o, buf, (scale, zp) in zip(outs, self._outs, self._qout, strict=True):
            np.subtract(buf, zp, out=o, casting="unsafe")
            np.multiply(o, scale, out=o)


class EdgeTpuTarget(Target):
    name = "tpu.edgetpu"
    family = "tpu"
    precisions = ("int8",)
    calibrated = ("int8",)
    formats = ("keras",)
    install = "hwbackends[keras]"
    description = "Coral Edge TPU (full-int8 TFLite + edgetpu_compiler); int8 CPU emulation without one"
    #: Several inputs/outputs through the multi-IO TFLite conversion, calibrated on every input.
    multi_io = True
    multi_io_calibrated = True
    option_docs = {
        "int8_io": "true: int8 input/output tensors (the executor quantizes float32 in and out); "
                   "default false: float32 IO with QUANTIZE/DEQUANTIZE ops at the ends",
        "recurrent": "'unroll' (default, int8-safe) or 'loop' for LSTM/GRU/SimpleRNN layers",
    }

    def probe(self) -> Availability:
        if not importable("ai_edge_litert"):
            return Availability.unavailable("ai-edge-litert not installed (pip install ai-edge-litert)")
        if not importable("tensorflow"):
            return Availability.unavailable("tensorflow not installed: the full-int8 TFLite "
                                            "converter needs it (pip install tensorflow-cpu)")
        missing = []
        if not shutil.which(COMPILER):
            missing.append(f"{COMPILER} not on PATH")
        dev = find_device()
        if dev is None:
            missing.append("no Edge TPU device (/dev/apex_0 absent)")
        delegate = find_delegate() if not missing else None
        if not missing and delegate is None:
            missing.append(f"{DELEGATE} not found (install libedgetpu1-std)")
        if not missing:
            # Load + one invoke in a child first: a delegate built for another TFLite ABI
            # segfaults whoever loads it, and that must not be the caller.
            crashed = probe_delegate(delegate)
            if crashed:
                return Availability.unavailable(crashed)
            return Availability.hardware(f"Edge TPU ({dev})", "LiteRT with the libedgetpu delegate")
        return Availability.emulated("CPU LiteRT interpreter (int8)", "; ".join(missing))

    def toolchain(self) -> dict[str, str]:
        # The compiler's version is part of the key: installing it rebuilds with the compiler.
        return {"tensorflow": version("tensorflow-cpu") or version("tensorflow"),
                "keras": version("keras"), "ai-edge-litert": version("ai-edge-litert"),
                "edgetpu_compiler": compiler_version() or "absent"}

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        recurrent = options.extra.get("recurrent", "unroll")
        if recurrent not in ("unroll", "loop"):
            raise UnsupportedError(f"{self.name} option recurrent must be 'unroll' or 'loop', "
                                   f"got {recurrent!r}")
        int8_io = options.extra.get("int8_io", False)
        if not isinstance(int8_io, bool):
            raise UnsupportedError(f"{self.name} option int8_io must be true or false, got {int8_io!r}")
        blob = to_tflite(model.obj, "int8", options.batch_size, model.inputs, model.outputs,
                         options.calibration, recurrent=recurrent, target=self.name, int8_io=int8_io)
        path = workdir / "model.tflite"
        path.write_bytes(blob)
        ops = op_names(blob)
        float_ops = [o for o in ops if o not in ("QUANTIZE", "DEQUANTIZE")]
        meta: dict[str, Any] = {"file": "model.tflite", "bytes": len(blob), "ops": ops,
                                "int8_io": int8_io,
                                "recurrent": recurrent if has_recurrent(model.obj) else None}
        if shutil.which(COMPILER):
            compiled, log = run_compiler(path, workdir)
            meta.update(edgetpu_file=compiled.name, edgetpu_compiler_log=log,
                        edgetpu_mapping=mapping_summary(log), edgetpu_compiler=compiler_version())
        else:
            meta.update(edgetpu_file=None, edgetpu_compiler=f"{COMPILER} not on PATH: the artifact "
                        f"holds the int8 model only (runs emulated on the CPU interpreter)",
                        edgetpu_compiler_log="")
        meta["tflite_ops"] = float_ops
        return meta

    def load(self, artifact: Artifact, options: CompileOptions) -> Executor:
        avail = self.probe()
        compiled = artifact.meta.get("edgetpu_file")
        if avail.mode is Mode.HARDWARE:
            if not compiled:
                raise UnavailableError(f"{self.name}: an Edge TPU is present but this artifact was "
                                       f"built without {COMPILER}; rebuild it (hwb compile --rebuild)")
            if find_device() is None:
                raise UnavailableError(f"{self.name}: the Edge TPU was removed since probing")
            return self._executor(artifact, artifact.file(compiled), True, 1)
        return self._executor(artifact, artifact.file("model.tflite"), False,
                              options.runtime_threads())

    @staticmethod
    def _executor(artifact: Artifact, path: Path, delegate: bool, threads: int) -> Executor:
        return EdgeTpuExecutor(path, artifact.batch_size, artifact.inputs, artifact.outputs,
                               delegate=delegate, threads=threads)
