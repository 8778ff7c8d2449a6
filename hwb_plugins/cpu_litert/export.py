"""How Triton serves ``cpu.litert`` variants (``hwb export --format triton``): its python
backend, running the ``.tflite`` artifact per batch size through :mod:`.triton_runtime`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hwbackends.contract import TritonForm


class LiteRTTriton(TritonForm):
    """The python flavour only: Triton has no LiteRT backend."""

    artifact_file = "model.tflite"
    runtime = Path(__file__).with_name("triton_runtime.py")
    runtime_name = "litert"

    def positions(self, compiled: Any, path: Path) -> tuple[list[int], list[int]]:
        """Each tensor's position among the interpreter's input/output details, as the
        loaded executor bound them (the converter's order need not be the model's)."""
        ex = compiled.executor
        det_in, det_out = ex.input_details, ex.output_details
        det_in = det_in if isinstance(det_in, list) else [det_in]
        det_out = det_out if isinstance(det_out, list) else [det_out]
        all_in = [d["index"] for d in ex.interpreter.get_input_details()]
        all_out = [d["index"] for d in ex.interpreter.get_output_details()]
        return ([all_in.index(d["index"]) for d in det_in],
                [all_out.index(d["index"]) for d in det_out])


TRITON = LiteRTTriton()
