from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hwbackends.specs import Availability, TensorSpec
from hwbackends.target import Artifact, CompileOptions, Target, check_io

from .._util import cpu_name, importable, version

_F32 = np.dtype(np.float32)


class LiteRTExecutor:
    """Zero-copy hot path: numpy views of the interpreter's own input/output buffers and the
    C++ ``Invoke`` called directly. This beats ``set_tensor``/``invoke``/``get_tensor`` (which
    copy, allocate and check reference counts on every call): see docs/performance.md."""

    def __init__(self, path: Path, threads: int, batch: int, inp: TensorSpec, out: TensorSpec):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=threads)
        self.interpreter.allocate_tensors()
        self.batch_size = batch
        self._in_spec, self._out_spec = inp, out
        self._xs, self._os = inp.batched(batch), out.batched(batch)
        i = self.interpreter.get_input_details()[0]["index"]
        o = self.interpreter.get_output_details()[0]["index"]
        # Views stay valid because allocate_tensors() is never called again.
        self._in = self.interpreter.tensor(i)()
        self._out = self.interpreter.tensor(o)()
        self._invoke = self.interpreter._interpreter.Invoke

    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None:
        # numpy would silently broadcast a wrong shape or cast a wrong dtype into the buffer;
        # the contract refuses both (conformance kit, bad_inputs); cost: docs/performance.md.
        try:
            ok = (x.shape == self._xs and out.shape == self._os and x.dtype is _F32
                  and out.dtype is _F32 and x.flags.c_contiguous and out.flags.c_contiguous)
        except AttributeError:
            ok = False
        if not ok:  # raises InputError; returns only for an equal, non-canonical dtype object
            check_io(x, out, self._in_spec, self._out_spec, self.batch_size)
        try:
            self._in[...] = x
            self._invoke()
            out[...] = self._out
        except Exception:
            check_io(x, out, self._in_spec, self._out_spec, self.batch_size)
            raise


class LiteRTTarget(Target):
    name = "cpu.litert"
    family = "cpu"
    precisions = ("fp32", "fp16", "int8-dynamic", "int8")
    calibrated = ("int8",)
    formats = ("keras",)
    description = "LiteRT (TFLite) + XNNPACK on the CPU"
    option_docs = {
        "recurrent": "'unroll' (default: fastest, int8-safe) or 'loop' (a TFLite WHILE loop) "
                     "for LSTM/GRU/SimpleRNN layers",
    }

    def probe(self) -> Availability:
        if not importable("ai_edge_litert"):
            return Availability.unavailable("ai-edge-litert not installed (pip install ai-edge-litert)")
        if not importable("tensorflow"):
            return Availability.unavailable("tensorflow not installed: the TFLite converter needs "
                                            "it (pip install tensorflow-cpu)")
        return Availability.hardware(f"CPU ({cpu_name()})", "LiteRT interpreter with XNNPACK")

    def toolchain(self) -> dict[str, str]:
        return {"tensorflow": version("tensorflow-cpu") or version("tensorflow"),
                "keras": version("keras"), "ai-edge-litert": version("ai-edge-litert")}

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        from .convert import has_recurrent, op_names, to_tflite

        recurrent = options.extra.get("recurrent", "unroll")
        if recurrent not in ("unroll", "loop"):
            from hwbackends.errors import UnsupportedError
            raise UnsupportedError(f"cpu.litert option recurrent must be 'unroll' or 'loop', got {recurrent!r}")
        blob = to_tflite(model.obj, options.precision, options.batch_size, options.calibration,
                         recurrent=recurrent)
        (workdir / "model.tflite").write_bytes(blob)
        return {"file": "model.tflite", "bytes": len(blob), "ops": op_names(blob),
                "recurrent": recurrent if has_recurrent(model.obj) else None}

    def load(self, artifact: Artifact, options: CompileOptions) -> LiteRTExecutor:
        return LiteRTExecutor(artifact.file("model.tflite"), options.threads or 1,
                              artifact.batch_size, artifact.inputs[0], artifact.outputs[0])
