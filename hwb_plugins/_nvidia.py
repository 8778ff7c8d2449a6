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


# -- the CUDA stack of gpu.tensorrt: versions from package metadata, never by importing ----------
#: Oldest Linux driver of each CUDA major (NVIDIA's CUDA toolkit release notes, table 3):
#: a wheel built for CUDA 13 cannot start on a 12.x driver, whatever the GPU.
MIN_DRIVER = {12: (525, 60, 13), 13: (580, 65, 6)}
#: Distributions that name their CUDA major, newest naming first.
_TRT_DISTS = {12: ("tensorrt-cu12-libs", "tensorrt-cu12", "tensorrt_cu12_libs"),
              13: ("tensorrt-cu13-libs", "tensorrt-cu13", "tensorrt_cu13_libs")}
_CUDART_DISTS = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime")


@dataclass(frozen=True)
class CudaStack:
    """What is installed for gpu.tensorrt ('' = absent)."""

    tensorrt: str = ""
    tensorrt_cuda: int | None = None  # the CUDA major the TensorRT wheel was built for
    cuda_python: str = ""  # cuda-bindings (or cuda-python) version
    cuda_runtime: str = ""  # the nvidia-cuda-runtime wheel, when pip installed one
    driver: str = ""  # nvidia-smi's driver version
    driver_cuda: str = ""  # the newest CUDA the driver supports (nvidia-smi's header)

    def summary(self) -> str:
        """What is installed, in words ('' when nothing is): 'TensorRT 11.4.0.106 (CUDA 12),
        cuda-python 12.9.10, CUDA runtime 12.9.79, driver 570.124.06 (CUDA 12.8)'."""
        parts = []
        if self.tensorrt:
            parts.append(f"TensorRT {self.tensorrt}"
                         + (f" (CUDA {self.tensorrt_cuda})" if self.tensorrt_cuda else ""))
        if self.cuda_python:
            parts.append(f"cuda-python {self.cuda_python}")
        if self.cuda_runtime:
            parts.append(f"CUDA runtime {self.cuda_runtime}")
        if self.driver:
            parts.append(f"driver {self.driver}"
                         + (f" (CUDA {self.driver_cuda})" if self.driver_cuda else ""))
        return ", ".join(parts)

    def as_dict(self) -> dict[str, str]:
        return {"tensorrt": self.tensorrt,
                "tensorrt_cuda": str(self.tensorrt_cuda or ""),
                "cuda_python": self.cuda_python, "cuda_runtime": self.cuda_runtime,
                "driver": self.driver, "driver_cuda": self.driver_cuda}


def _major(v: str) -> int | None:
    m = re.match(r"(\d+)", v or "")
    return int(m.group(1)) if m else None


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v or "")[:3])


@functools.lru_cache(maxsize=1)
def driver_cuda_version() -> str:
    """'12.4' from nvidia-smi's header ("CUDA Version: 12.4"), '' without one."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ""
    try:
        r = subprocess.run([exe], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"CUDA Version:\s*([\d.]+)", r.stdout or "")
    return m.group(1) if m else ""


def cuda_stack() -> CudaStack:
    """The installed TensorRT / cuda-python / CUDA runtime / driver, from package metadata and
    nvidia-smi (no CUDA context, no heavy import)."""
    from ._util import version

    trt, trt_cuda = version("tensorrt"), None
    for major, dists in _TRT_DISTS.items():
        found = next((version(d) for d in dists if version(d)), "")
        if found:
            trt, trt_cuda = trt or found, major
            break
    cudart = next((version(d) for d in _CUDART_DISTS if version(d)), "")
    info = gpu_info()
    return CudaStack(tensorrt=trt, tensorrt_cuda=trt_cuda,
                     cuda_python=version("cuda-bindings") or version("cuda-python"),
                     cuda_runtime=cudart, driver=info.driver if info else "",
                     driver_cuda=driver_cuda_version() if info else "")


def stack_mismatch(s: CudaStack) -> str | None:
    """Why this TensorRT / cuda-python / driver combination cannot work, or None. Each reason
    says what to install."""
    reasons = []
    if s.tensorrt and (_major(s.tensorrt) or 0) < 10:
        reasons.append(f"TensorRT {s.tensorrt} is older than 10 (pip install 'hwbackends[gpu]')")
    cp = _major(s.cuda_python)
    if s.tensorrt_cuda and cp and cp != s.tensorrt_cuda:
        reasons.append(f"TensorRT {s.tensorrt} is built for CUDA {s.tensorrt_cuda} but cuda-python "
                       f"{s.cuda_python} is for CUDA {cp}: install one CUDA major "
                       f"('hwbackends[gpu]' = CUDA 12, 'hwbackends[gpu-cu13]' = CUDA 13)")
    need = s.tensorrt_cuda or cp
    if need and s.driver:
        dc = _vtuple(s.driver_cuda)
        too_old = (dc[:1] < (need,)) if dc else (_vtuple(s.driver) < MIN_DRIVER.get(need, (0,)))
        if too_old:
            floor = ".".join(map(str, MIN_DRIVER.get(need, ())))
            alt = " or install 'hwbackends[gpu]' (CUDA 12)" if need > 12 else ""
            reasons.append(f"driver {s.driver} (CUDA {s.driver_cuda or '?'}) is too old for CUDA "
                           f"{need} wheels (needs ≥ {floor}): update the driver{alt}")
    return "; ".join(reasons) or None
