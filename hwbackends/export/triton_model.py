"""Triton python-backend model for variants with no native Triton backend (LiteRT, XLA).

``hwb export --format triton`` copies this file to ``NAME/1/model.py`` beside
``hwb_model.json`` (runtime, served tensor names and each tensor's position in the runtime,
one compiled artifact per measured batch size). The file is the same for every model: no
text from a model is ever written into it.
It runs inside Triton's python-backend stub, whose interpreter does not have hwbackends:
it imports only numpy and the variant's own runtime (``ai_edge_litert``, ``onnxruntime`` or
``jax``), and ``triton_python_backend_utils`` (the stub's module) only in the Triton class.

Requests Triton hands over together (dynamic batching) are concatenated and run as one
batch: the smallest compiled artifact that holds them, padded with zeros (each artifact was
measured at exactly that size, so the batches Triton forms are the measured ones).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "hwb_model.json"


class Runner:
    """The compiled artifacts of one variant, one per batch size, run from numpy arrays."""

    def __init__(self, root: str | Path) -> None:
        root = Path(root)
        self.spec = json.loads((root / MANIFEST).read_text())
        self.inputs: list[dict[str, Any]] = self.spec["inputs"]
        self.outputs: list[dict[str, Any]] = self.spec["outputs"]
        self.threads = int(self.spec.get("threads", 1))
        runtime = self.spec["runtime"]
        make = {"litert": self._litert, "onnxruntime": self._onnxruntime, "xla": self._xla}[runtime]
        self.sizes = sorted(int(b) for b in self.spec["batches"])
        self.calls = {b: make(root / self.spec["batches"][str(b)], b) for b in self.sizes}

    def _litert(self, path: Path, batch: int) -> Any:
        from ai_edge_litert.interpreter import Interpreter

        it = Interpreter(model_path=str(path), num_threads=self.threads)
        it.allocate_tensors()
        det_in, det_out = it.get_input_details(), it.get_output_details()
        ins = [det_in[int(t["index"])]["index"] for t in self.inputs]
        outs = [det_out[int(t["index"])]["index"] for t in self.outputs]

        def call(xs: list[np.ndarray]) -> list[np.ndarray]:
            for i, x in zip(ins, xs, strict=True):
                it.set_tensor(i, x)
            it.invoke()
            return [it.get_tensor(o) for o in outs]
        return call

    def _onnxruntime(self, path: Path, batch: int) -> Any:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        gin, gout = [i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()]
        ins = [gin[int(t["index"])] for t in self.inputs]
        outs = [gout[int(t["index"])] for t in self.outputs]
        return lambda xs: sess.run(outs, dict(zip(ins, xs, strict=True)))

    def _xla(self, path: Path, batch: int) -> Any:
        import jax

        exp = jax.export.deserialize(bytearray(path.read_bytes()))
        fn = jax.jit(exp.call)

        def call(xs: list[np.ndarray]) -> list[np.ndarray]:
            ys = fn(*xs)
            return [np.asarray(y) for y in (ys if isinstance(ys, (list, tuple)) else [ys])]
        return call

    def run(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        """Outputs for one batch of ``n`` rows (any ``n`` up to the largest compiled size)."""
        n = int(xs[0].shape[0])
        fit = [b for b in self.sizes if b >= n]
        if not fit:
            raise ValueError(f"batch of {n} rows exceeds the largest compiled size "
                             f"{self.sizes[-1]} (config max_batch_size)")
        b = fit[0]
        padded = []
        for x, t in zip(xs, self.inputs, strict=True):
            buf = np.zeros((b, *t["shape"]), dtype=t["dtype"])
            buf[:n] = x
            padded.append(buf)
        return [np.ascontiguousarray(y[:n]) for y in self.calls[b](padded)]


class TritonPythonModel:
    """Triton's python-backend entry points."""

    def initialize(self, args: dict[str, Any]) -> None:
        self.runner = Runner(Path(__file__).resolve().parent)

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        names = [t["name"] for t in self.runner.inputs]
        parts = [[pb_utils.get_input_tensor_by_name(r, nm).as_numpy() for nm in names]
                 for r in requests]
        rows = [int(p[0].shape[0]) for p in parts]
        cols = [np.concatenate([p[i] for p in parts]) for i in range(len(names))]
        outs = self.runner.run(cols)
        responses, start = [], 0
        for n in rows:
            tensors = [pb_utils.Tensor(t["name"], y[start:start + n])
                       for t, y in zip(self.runner.outputs, outs, strict=True)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += n
        return responses

    def finalize(self) -> None:
        self.runner = None
