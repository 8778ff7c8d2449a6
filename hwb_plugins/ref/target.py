from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hwbackends.contract import Artifact, Availability, CompileOptions, Executor, Model, Target, load_saved

from .._shared.onnx_batch import batch_meta
from .._util import cpu_name, version


class RefExecutor(Executor):
    """The source framework itself, any batch size. Not a hot path: the reference allocates."""

    def __init__(self, model: Model, batch_size: int):
        self.model = model
        self._init_io(model.inputs, model.outputs, None)
        self.batch_size = batch_size

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        for o, y in zip(outs, self.model.reference(xs), strict=True):
            o[...] = y


class RefTarget(Target):
    name = "ref"
    family = "ref"
    precisions = ("fp32",)
    formats = ("keras", "torch", "onnx")
    description = "the source framework in fp32: the golden outputs (Keras, PyTorch, ONNX)"
    static_batch = False
    multi_io = True

    def probe(self) -> Availability:
        return Availability.hardware(f"CPU ({cpu_name()})", "runs the source framework on the CPU")

    def toolchain(self) -> dict[str, str]:
        return {d: version(d) for d in ("keras", "tensorflow-cpu", "torch", "onnxruntime")}

    def compile(self, model: Model, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        model.save(workdir)
        return {"format": model.format, **batch_meta(model, options.batch_size)}

    def load(self, artifact: Artifact, options: CompileOptions) -> Executor:
        model = load_saved(artifact.path)
        return RefExecutor(model, artifact.batch_size)
