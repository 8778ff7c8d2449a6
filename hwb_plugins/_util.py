"""Small helpers the built-in plugins share (a third-party plugin would copy what it needs)."""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util

from hwbackends.contract import machine


@functools.lru_cache(maxsize=None)
def version(dist: str) -> str:
    """Installed version of a distribution without importing it ('' when absent), read once
    per process: a module already imported keeps its version whatever pip does meanwhile,
    and a store key hashes it on every compile."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cpu_name() -> str:
    """The CPU's model name, for ``Availability.device`` (reads /proc/cpuinfo; no import)."""
    return machine.cpu_model()
