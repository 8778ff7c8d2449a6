"""The python backend's runner for ``tpu.xla`` variants exported to Triton: copied beside the
core's ``model.py`` as ``hwb_runtime.py`` (:attr:`hwbackends.target.TritonForm.runtime`). It
runs in Triton's python stub, which has no hwbackends: numpy and ``jax`` only."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np


def load(path: Path, threads: int, inputs: list[dict[str, Any]],
         outputs: list[dict[str, Any]]) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """The call of the serialized ``jax.export`` artifact ``path``: arguments and results in
    spec order (``threads`` does not apply to XLA)."""
    import jax

    exp = jax.export.deserialize(bytearray(path.read_bytes()))
    fn = jax.jit(exp.call)

    def call(xs: list[np.ndarray]) -> list[np.ndarray]:
        ys = fn(*xs)
        return [np.asarray(y) for y in (ys if isinstance(ys, (list, tuple)) else [ys])]
    return call
