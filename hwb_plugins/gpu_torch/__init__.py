"""``gpu.torch``: PyTorch models on an NVIDIA GPU — torch.export artifact, torch.compile at
load, CUDA-graph capture over fixed device buffers, pinned host buffers. Unavailable without
a CUDA build of torch and a GPU (the reason says which)."""
from __future__ import annotations

from hwbackends.contract import hookimpl

from .target import TorchCudaTarget


@hookimpl
def hwb_targets():
    return [TorchCudaTarget()]
