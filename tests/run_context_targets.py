"""A target for tests/test_run_context.py, a module of its own because the compile worker
unpickles targets by module name.

``cpu.test_context`` is registered only in the test's own registry: a compile or an export
that finds it can only have looked in the registry it was given. Its build writes one file
naming the model; its own export format ``files`` copies the artifact's files out.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from build_cost_targets import ZeroExecutor

from hwbackends.specs import Availability
from hwbackends.target import Artifact, CompileOptions, Target

BUILT = "built.txt"


class ContextTarget(Target):
    name = "cpu.test_context"
    family = "cpu"
    formats = ("keras",)
    precisions = ("fp32",)
    exports = ("files",)
    description = "test target of tests/test_run_context.py"

    def probe(self) -> Availability:
        return Availability.hardware("CPU (test)")

    def toolchain(self) -> dict[str, str]:
        return {"test": "1"}

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        (workdir / BUILT).write_text(f"{model.name} at batch {options.batch_size}\n")
        return {}

    def load(self, artifact: Artifact, options: CompileOptions) -> Any:
        return ZeroExecutor(artifact)

    def export(self, artifact: Artifact, fmt: str, outdir: Path) -> list[Path]:
        if fmt not in self.exports:
            return super().export(artifact, fmt, outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        dst = outdir / BUILT
        shutil.copyfile(artifact.file(BUILT), dst)
        return [dst]
