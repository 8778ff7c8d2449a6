"""``CompiledModel``: the one predict interface every target is served behind."""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import InputError
from .fidelity import Fidelity
from .specs import Availability, Mode, TensorSpec
from .target import Artifact, Executor, check_io


class CompiledModel:
    """A compiled, loaded variant of one model on one target.

    ``predict(x)`` validates and allocates: any batch size, one sample or many.
    ``predict_into(x, out)`` is the hot path: it *is* the executor's bound method (no wrapper
    frame), takes exactly ``(batch_size, *input.shape)`` float32 and writes into ``out``.
    """

    def __init__(self, executor: Executor, artifact: Artifact, availability: Availability,
                 model_name: str = "model", nan_policy: str = "reject",
                 static_batch: bool = True):
        if nan_policy not in ("reject", "pass"):
            raise ValueError("nan_policy must be 'reject' or 'pass'")
        self.executor = executor
        self.artifact = artifact
        self.availability = availability
        self.model_name = model_name
        self.nan_policy = nan_policy
        self.fidelity: Fidelity | None = None
        #: False when the executor takes any batch size (``predict`` then makes one call).
        self.static_batch = static_batch
        # The hot path: the executor's own bound method, so a call costs what the library costs.
        self.predict_into = executor.predict_into
        self._x = np.zeros(self.input.batched(self.batch_size), dtype=np.float32)
        self._y = np.zeros(self.output.batched(self.batch_size), dtype=np.float32)

    # -- metadata -------------------------------------------------------------------------------
    @property
    def target(self) -> str:
        return self.artifact.target

    @property
    def precision(self) -> str:
        return self.artifact.precision

    @property
    def mode(self) -> Mode:
        return self.availability.mode

    @property
    def fingerprint(self) -> str:
        return self.artifact.fingerprint

    @property
    def artifact_path(self) -> str:
        return str(self.artifact.path)

    @property
    def toolchain(self) -> dict[str, str]:
        return self.artifact.toolchain

    @property
    def batch_size(self) -> int:
        return self.artifact.batch_size

    @property
    def input(self) -> TensorSpec:
        return self.artifact.inputs[0]

    @property
    def output(self) -> TensorSpec:
        return self.artifact.outputs[0]

    @property
    def variant(self) -> str:
        return f"{self.target}:{self.precision}"

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.model_name, "target": self.target, "precision": self.precision,
            "variant": self.variant, "mode": self.mode.value, "device": self.availability.device,
            "mode_reason": self.availability.reason, "fingerprint": self.fingerprint,
            "batch_size": self.batch_size, "input": self.input.to_dict(),
            "output": self.output.to_dict(), "artifact_path": self.artifact_path,
            "artifact_bytes": self.artifact.size_bytes(), "toolchain": self.toolchain,
            "compile_seconds": self.artifact.compile_seconds, "cached": self.artifact.cached,
            "meta": self.artifact.meta,
            "fidelity": self.fidelity.to_dict() if self.fidelity else None,
        }

    def __repr__(self) -> str:
        return (f"<CompiledModel {self.model_name} on {self.variant} ({self.mode.value}), "
                f"batch {self.batch_size}>")

    # -- prediction -----------------------------------------------------------------------------
    def _validate(self, x: Any) -> tuple[np.ndarray, bool]:
        try:
            arr = np.asarray(x)
        except Exception as exc:
            raise InputError(f"input is not array-like ({type(x).__name__}): {exc}") from exc
        if arr.dtype.kind not in "fiub":
            raise InputError(f"input has dtype {arr.dtype}; expected a numeric array convertible "
                             f"to {self.input.dtype}")
        shape = self.input.shape
        single = tuple(arr.shape) == shape
        if single:
            arr = arr[None]
        elif tuple(arr.shape[1:]) != shape:
            raise InputError(f"input has shape {tuple(arr.shape)}; expected {shape} (one sample) "
                             f"or (n, {', '.join(map(str, shape))}) for a batch of n")
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if self.nan_policy == "reject" and not np.isfinite(arr).all():
            bad = int(np.size(arr) - np.isfinite(arr).sum())
            raise InputError(f"input contains {bad} NaN/Inf value(s); clean the features, or "
                             f"compile with nan_policy='pass' to let them through")
        return arr, single

    def predict(self, x: Any) -> np.ndarray:
        """Outputs for ``x`` of shape ``input.shape`` (one sample) or ``(n, *input.shape)``.
        Validates shape, dtype and (by default) NaN/Inf; returns a new array."""
        arr, single = self._validate(x)
        n, b = len(arr), self.batch_size
        out = np.empty((n, *self.output.shape), dtype=np.float32)
        if n == b or not self.static_batch:
            self.predict_into(arr, out)
        else:
            for i in range(0, n, b):
                chunk = arr[i:i + b]
                k = len(chunk)
                self._x[:k] = chunk
                if k < b:
                    self._x[k:] = 0.0  # pad the last partial batch
                self.predict_into(self._x, self._y)
                out[i:i + k] = self._y[:k]
        return out[0] if single else out

    def warmup(self, n: int = 20) -> None:
        """Run ``n`` calls so first-call costs (allocation, JIT, caches) are paid before traffic."""
        for _ in range(n):
            self.predict_into(self._x, self._y)

    def check(self, x: Any, out: Any) -> None:
        """Raise :class:`InputError` if ``x``/``out`` are not what ``predict_into`` takes."""
        check_io(x, out, self.input, self.output, self.batch_size)

    def close(self) -> None:
        close = getattr(self.executor, "close", None)
        if close:
            close()
