from __future__ import annotations

from pathlib import Path
from typing import Any

from hwbackends.contract import (
    Artifact,
    Availability,
    CompileOptions,
    Executor,
    Target,
    TritonForm,
    UnsupportedError,
)

from .._shared.litert import LiteRTExecutor
from .._shared.tflite import has_recurrent, op_names, to_tflite
from .._util import cpu_name, importable, version


class LiteRTTarget(Target):
    name = "cpu.litert"
    family = "cpu"
    precisions = ("fp32", "fp16", "int8-dynamic", "int8")
    calibrated = ("int8",)
    formats = ("keras",)
    install = "hwbackends[keras]"
    description = "LiteRT (TFLite) + XNNPACK on the CPU"
    multi_io = True
    #: int8 calibrates every input (one array per input, fed in the converter's input order).
    multi_io_calibrated = True
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
        recurrent = options.extra.get("recurrent", "unroll")
        if recurrent not in ("unroll", "loop"):
            raise UnsupportedError(f"cpu.litert option recurrent must be 'unroll' or 'loop', got {recurrent!r}")
        blob = to_tflite(model.obj, options.precision, options.batch_size, model.inputs,
                         model.outputs, options.calibration, recurrent=recurrent, target=self.name)
        (workdir / "model.tflite").write_bytes(blob)
        return {"file": "model.tflite", "bytes": len(blob), "ops": op_names(blob),
                "recurrent": recurrent if has_recurrent(model.obj) else None}

    def triton(self) -> TritonForm:
        from .export import TRITON

        return TRITON

    def load(self, artifact: Artifact, options: CompileOptions) -> Executor:
        return LiteRTExecutor(artifact.file("model.tflite"), options.runtime_threads(),
                              artifact.batch_size, artifact.inputs, artifact.outputs)
