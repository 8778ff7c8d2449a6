"""How Triton serves ``tpu.xla`` variants (``hwb export --format triton``): its python backend,
running the ``jax.export`` artifact per batch size through :mod:`.triton_runtime`."""
from __future__ import annotations

from pathlib import Path

from hwbackends.contract import TritonForm


class XlaTriton(TritonForm):
    """The python flavour only: Triton has no XLA backend. Arguments and results are in spec
    order (the default :meth:`positions`)."""

    runtime = Path(__file__).with_name("triton_runtime.py")
    runtime_name = "xla"

    def __init__(self, artifact_file: str) -> None:
        self.artifact_file = artifact_file  # type: ignore[misc]  # the target's file name
