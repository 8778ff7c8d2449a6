"""How Triton serves ``gpu.tensorrt`` variants (``hwb export --format triton``): its
``tensorrt_plan`` platform running the engine as ``model.plan``. An engine holds one batch size
(its optimization profile) and its bindings keep the graph's tensor names, so the config
binds those; a plan runs only on the TensorRT version and compute capability it was built
for unless built VERSION_COMPATIBLE, which the config's comment records."""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from hwbackends.contract import Artifact, TensorSpec, TritonFile, TritonForm, UnsupportedError


def version_compatible(artifact: Artifact) -> bool:
    """Whether the artifact's engine was built with VERSION_COMPATIBLE."""
    flags = (artifact.meta.get("build_plan") or {}).get("builder_flags") or ()
    return "VERSION_COMPATIBLE" in flags


def bindings(artifact: Artifact) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The artifact's specs under the engine's tensor names (the graph's, in spec order:
    ``meta["io"]``); the specs' own names where the artifact does not record them."""
    io = artifact.meta.get("io") or {}

    def named(specs: list[TensorSpec], names: Any) -> list[TensorSpec]:
        if not isinstance(names, list) or len(names) != len(specs):
            return list(specs)
        return [replace(s, name=str(n)) for s, n in zip(specs, names, strict=True)]
    return named(artifact.inputs, io.get("inputs")), named(artifact.outputs, io.get("outputs"))


class TensorRTTriton(TritonForm):
    """The native flavour only: one engine, one batch size."""

    native_backend = True
    one_batch = True

    def __init__(self, artifact_file: str) -> None:
        self.artifact_file = artifact_file  # type: ignore[misc]  # the target's engine file

    def check(self, artifact: Artifact, portable: bool) -> None:
        """``portable`` (``--trt-version-compatible``) needs an engine built VERSION_COMPATIBLE."""
        if portable and not version_compatible(artifact):
            raise UnsupportedError("--trt-version-compatible: this engine was not built with "
                                   "VERSION_COMPATIBLE, so it runs only on the TensorRT version "
                                   "it was built with; rebuild it version-compatible first")

    def native(self, version_dir: Path, compiled: dict[int, Any], inputs: list[TensorSpec],
               outputs: list[TensorSpec], threads: int) -> TritonFile:
        """``model.plan``, a copy of the engine, bound under the engine's tensor names at its
        compiled batch."""
        (cm,) = compiled.values()
        art = cm.artifact
        version_dir.mkdir(parents=True, exist_ok=True)
        out = version_dir / "model.plan"
        shutil.copyfile(art.file(self.artifact_file), out)
        bound = art.meta.get("bound_to") or {}
        notes = [f"TensorRT plan: TensorRT {bound.get('tensorrt', '?')}, compute capability "
                 f"{bound.get('compute_capability', '?')} ({bound.get('gpu', '?')}); "
                 + ("built VERSION_COMPATIBLE" if version_compatible(art) else
                    "runs only there (not built VERSION_COMPATIBLE)"),
                 f"engine optimization profile: batch {art.batch_size} (static)"]
        return TritonFile([out], {"platform": "tensorrt_plan"}, gpu=True, bound=bindings(art),
                          static_batch=art.batch_size, notes=notes)

