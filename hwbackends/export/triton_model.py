"""Triton python-backend model for variants Triton runs through its python backend.

``hwb export --format triton`` copies this file to ``NAME/1/model.py`` beside
``hwb_model.json`` (served tensor names and each tensor's position in the runtime, one
compiled artifact per measured batch size) and the target's runner module ``hwb_runtime.py``
(:attr:`TritonForm.runtime <hwbackends.target.TritonForm.runtime>`), which loads one artifact
in the variant's runtime. The file is the same for every model and every target: no text
from a model is ever written into it, and it runs no framework itself.
It runs inside Triton's python-backend stub, whose interpreter does not have hwbackends:
it imports only numpy and the runner beside it (by its fixed file name), and
``triton_python_backend_utils`` (the stub's module) only in the Triton class.

Requests Triton hands over together (dynamic batching) are concatenated and run as one
batch: the smallest compiled artifact that holds them, padded with zeros (each artifact was
measured at exactly that size, so the batches Triton forms are the measured ones).
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "hwb_model.json"
RUNTIME = "hwb_runtime.py"


def load_runtime(root: Path) -> Any:
    """The runner module ``root/hwb_runtime.py``, imported by path (the version directory is
    not on the stub's ``sys.path``)."""
    spec = importlib.util.spec_from_file_location("hwb_runtime", root / RUNTIME)
    if spec is None or spec.loader is None:
        raise ImportError(f"no runner module {RUNTIME} in {root}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Runner:
    """The compiled artifacts of one variant, one per batch size, run from numpy arrays."""

    def __init__(self, root: str | Path) -> None:
        root = Path(root)
        self.spec = json.loads((root / MANIFEST).read_text())
        self.inputs: list[dict[str, Any]] = self.spec["inputs"]
        self.outputs: list[dict[str, Any]] = self.spec["outputs"]
        self.threads = int(self.spec.get("threads", 1))
        runtime = load_runtime(root)
        self.sizes = sorted(int(b) for b in self.spec["batches"])
        self.calls = {b: runtime.load(root / self.spec["batches"][str(b)], self.threads,
                                      self.inputs, self.outputs) for b in self.sizes}

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
