"""``tpu.xla``: models compiled ahead of time by XLA through JAX (ONNX → JAX → jax.export).

Runs on ``jax.devices()[0]``: a TPU (mode hardware), else the GPU or CPU XLA backend (mode
emulated, device named). Precisions ``fp32`` and ``bf16``. Imports no TensorFlow."""
from __future__ import annotations

from hwbackends.contract import hookimpl

from .target import XlaTarget


@hookimpl
def hwb_targets():
    return [XlaTarget()]
