"""The python backend's runner for ``cpu.onnxruntime`` variants exported to Triton: copied
beside the core's ``model.py`` as ``hwb_runtime.py`` (:attr:`hwbackends.target.TritonForm.runtime`).
It runs in Triton's python stub, which has no hwbackends: numpy and ``onnxruntime`` only."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np


def load(path: Path, threads: int, inputs: list[dict[str, Any]],
         outputs: list[dict[str, Any]]) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """The call of the ONNX graph ``path`` on the CPU provider, ``threads`` intra-op threads;
    tensors found by their position among the session's inputs/outputs (``index``)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    gin, gout = [i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()]
    ins = [gin[int(t["index"])] for t in inputs]
    outs = [gout[int(t["index"])] for t in outputs]
    return lambda xs: sess.run(outs, dict(zip(ins, xs, strict=True)))
