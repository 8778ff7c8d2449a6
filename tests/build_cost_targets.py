"""Targets for tests/test_cli_data.py's build-cost checks. A module of its
own because the compile worker unpickles targets by module name.

- ``fpga.test_slow``: a target that declares ``slow_compile`` (as ``fpga.da4ml`` does); its
  build is instant, so a test sees whether it was *selected*, not how long it took.
- ``fpga.test_batchfree``: a static-batch target whose artifact does not depend on the batch
  (``batch_independent``, as the FPGA targets); each build appends a line to ``report``.
- ``tpu.test_emulated``: an emulated target (as ``tpu.xla`` here) that records its builds.
"""
from __future__ import annotations

import types
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hwbackends import hookimpl
from hwbackends.specs import Availability
from hwbackends.target import Artifact, CompileOptions, Executor, Target


class ZeroExecutor(Executor):
    """Outputs zeros (the core's checks compare with the outputs stored at build time)."""

    def __init__(self, artifact: Artifact):
        self._init_io(artifact.inputs[0], artifact.outputs[0], artifact.batch_size)

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        outs[0][...] = 0.0


class _Recording(Target):
    family = "fpga"
    formats = ("keras",)
    precisions = ("fp32",)
    description = "test target"

    def __init__(self, report: str = "") -> None:
        self.report = report  # pickled into the worker with the target

    def probe(self) -> Availability:
        return Availability.hardware("CPU (test)")

    def toolchain(self) -> dict[str, str]:
        return {"test": "1"}

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        if self.report:
            with open(self.report, "a") as f:
                f.write(f"{self.name} batch {options.batch_size}\n")
        return {}

    def load(self, artifact: Artifact, options: CompileOptions) -> Any:
        return ZeroExecutor(artifact)


class SlowTarget(_Recording):
    name = "fpga.test_slow"
    slow_compile = "test: pretends its build takes minutes"


class BatchFreeTarget(_Recording):
    name = "fpga.test_batchfree"
    batch_independent = True


class EmulatedTarget(_Recording):
    name = "tpu.test_emulated"
    family = "tpu"

    def probe(self) -> Availability:
        return Availability.emulated("CPU (test)", "a stand-in for the accelerator")


def plugin(*targets: Target) -> types.ModuleType:
    mod = types.ModuleType("build_cost_targets_plugin")
    mod.hwb_targets = hookimpl(lambda: list(targets))
    return mod
