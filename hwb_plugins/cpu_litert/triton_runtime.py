"""The python backend's runner for ``cpu.litert`` variants exported to Triton: copied beside
the core's ``model.py`` as ``hwb_runtime.py`` (:attr:`hwbackends.target.TritonForm.runtime`).
It runs in Triton's python stub, which has no hwbackends: numpy and ``ai_edge_litert`` only."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np


def load(path: Path, threads: int, inputs: list[dict[str, Any]],
         outputs: list[dict[str, Any]]) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """The call of the ``.tflite`` file ``path``; tensors found by their position among the
    interpreter's input/output details (``index`` in ``inputs``/``outputs``)."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path), num_threads=threads)
    it.allocate_tensors()
    det_in, det_out = it.get_input_details(), it.get_output_details()
    ins = [det_in[int(t["index"])]["index"] for t in inputs]
    outs = [det_out[int(t["index"])]["index"] for t in outputs]

    def call(xs: list[np.ndarray]) -> list[np.ndarray]:
        for i, x in zip(ins, xs, strict=True):
            it.set_tensor(i, x)
        it.invoke()
        return [it.get_tensor(o) for o in outs]
    return call
