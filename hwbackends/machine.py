"""The machine fingerprint every profile carries: a latency means nothing without it.

Cheap to compute (no framework import): CPU model from /proc/cpuinfo, core counts, the
affinity mask, kernel, Python and the installed versions of the libraries that shape latency.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
from typing import Any

#: Distributions whose version changes a measured latency.
LIBRARIES = ("numpy", "ai-edge-litert", "tensorflow-cpu", "tensorflow", "onnxruntime", "torch",
             "jax", "jaxlib", "hls4ml", "tensorrt")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), without importing anything heavy."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


@functools.lru_cache(maxsize=1)
def fingerprint() -> dict[str, Any]:
    """``{"id": short hash, "cpu": ..., "cores": ..., "libraries": {...}, ...}``.

    ``id`` hashes what changes latency (CPU model, cores, kernel, Python, library versions),
    so the profile cache never serves a profile measured under different conditions."""
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = list(range(os.cpu_count() or 1))
    libs = {d: v for d in LIBRARIES if (v := _version(d))}
    d: dict[str, Any] = {
        "cpu": cpu_model(), "arch": platform.machine(), "cores": os.cpu_count() or 1,
        "usable_cores": len(affinity), "kernel": platform.release(),
        "os": platform.system(), "python": platform.python_version(), "libraries": libs,
    }
    d["id"] = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    return d


def describe(fp: dict[str, Any] | None = None) -> str:
    fp = fp or fingerprint()
    libs = ", ".join(f"{k} {v}" for k, v in fp.get("libraries", {}).items())
    return (f"{fp.get('cpu', '?')}, {fp.get('usable_cores', '?')}/{fp.get('cores', '?')} cores, "
            f"{fp.get('os', '')} {fp.get('kernel', '')}, Python {fp.get('python', '')}; {libs}")
