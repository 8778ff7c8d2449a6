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


#: CPU features that decide whether natively compiled code runs (and how fast) on a host.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
             "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "asimd", "asimddp", "sve",
             "sve2", "i8mm", "bf16")


@functools.lru_cache(maxsize=1)
def isa() -> str:
    """``"<arch>:<flag>,…"``: the instruction-set features of this host among :data:`ISA_FLAGS`
    (from /proc/cpuinfo; no import). A target whose artifact is native code built for the host
    (``-march=native``) puts this into ``Target.toolchain()``: the store and fleet nodes then
    never hand an AVX-512 build to an AVX2 machine, where it would die with SIGILL."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return f"{platform.machine()}:{','.join(x for x in ISA_FLAGS if x in flags)}"


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
