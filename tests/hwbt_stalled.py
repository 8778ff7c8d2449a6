"""``cpu.stalled``: a target whose variant never finishes on its own, for Ctrl-C tests.

Its compile is cpu.litert's (in the compile worker, as any build); its ``load()`` -- in the
process that measures, a Ray worker under ``hwb fleet`` -- touches ``$HWBT_STALLED_STARTED`` and
then waits for ``$HWBT_STALLED_RELEASE`` to exist (at most ten minutes). A test interrupts while
the job is provably running instead of racing the measurement's length. Loaded in every
process through ``HWB_PLUGINS=hwbt_stalled`` with this directory on ``PYTHONPATH``.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hwbackends import hookimpl
from hwbackends.specs import Availability
from hwbackends.target import Target

HOLD_LIMIT_S = 600.0


class StalledTarget(Target):
    name = "cpu.stalled"  # sorts after cpu.onnxruntime: a fleet node queues it second
    family = "cpu"
    precisions = ("fp32",)
    formats = ("keras",)
    description = "test double: cpu.litert whose load() waits for a release file"

    def probe(self) -> Availability:
        return Availability.hardware("CPU", "test double")

    def compile(self, model: Any, options: Any, workdir: Path) -> dict[str, Any]:
        from hwb_plugins.cpu_litert.target import LiteRTTarget
        return LiteRTTarget().compile(model, options, workdir)

    def load(self, artifact: Any, options: Any) -> Any:
        started, release = os.environ.get("HWBT_STALLED_STARTED"), os.environ.get("HWBT_STALLED_RELEASE")
        if started:
            Path(started).touch()
        end = time.monotonic() + HOLD_LIMIT_S
        while release and not Path(release).exists() and time.monotonic() < end:
            time.sleep(0.05)
        from hwb_plugins.cpu_litert.target import LiteRTTarget
        return LiteRTTarget().load(artifact, options)


@hookimpl
def hwb_targets() -> list[Target]:
    return [StalledTarget()]
