"""What the GPU targets need to know about the NVIDIA stack, found without importing torch,
TensorRT or CUDA (``probe()`` and ``toolchain()`` run in the parent and must stay light)."""
from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from ._util import importable


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str
    driver: str

    def as_dict(self) -> dict[str, str]:
        return {"gpu": self.name, "compute_capability": self.compute_capability,
                "driver": self.driver}


def device_nodes() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


@functools.lru_cache(maxsize=1)
def gpu_info() -> GpuInfo | None:
    """GPU 0 as nvidia-smi reports it (once per process), or None without a GPU/driver."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=name,compute_cap,driver_version",
                            "--format=csv,noheader", "-i", "0"],
                           capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = [p.strip() for p in r.stdout.strip().splitlines()[0].split(",")] if r.returncode == 0 and r.stdout.strip() else []
    if len(parts) < 3:
        return None
    return GpuInfo(parts[0], parts[1], parts[2])


def no_gpu_reason() -> str | None:
    """None when an NVIDIA GPU with a driver is visible, else why not."""
    if not device_nodes() and not os.path.exists("/dev/nvidiactl"):
        return "no NVIDIA GPU (/dev/nvidia0 absent)"
    if gpu_info() is None:
        return "NVIDIA device present but nvidia-smi cannot query it (driver not loaded?)"
    return None


def torch_cuda_build() -> str | None:
    """torch.version.cuda read from torch/version.py without importing torch ('' = CPU-only
    build, None = torch not installed)."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "version.py")
    try:
        text = open(path).read()
    except OSError:
        return ""
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else ""


def torch_cuda_reason() -> str | None:
    """None when torch can use a CUDA GPU here, else every reason a person can act on."""
    if not importable("torch"):
        return "torch not installed (pip install torch with CUDA)"
    reasons = []
    if not torch_cuda_build():
        from ._util import version
        reasons.append(f"torch {version('torch')} is a CPU-only build (torch.version.cuda is None)")
    gpu = no_gpu_reason()
    if gpu:
        reasons.append(gpu)
    return "; ".join(reasons) or None
