"""Targets that each break one rule of the contract, to prove the conformance kit catches it.

Built on the kit's NumPy sample target (hwbackends/testing/sample_target.py), which passes.
This module must be importable by the compile worker (the targets travel there by pickle),
hence a module of its own rather than classes inside a test function.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hwbackends.errors import UnsupportedError
from hwbackends.specs import Availability
from hwbackends.testing.sample_target import NumpyDenseExecutor, NumpyDenseTarget

_KEPT: list[float] = []


class Good(NumpyDenseTarget):
    name = "cpu.kit_good"


class _OtherExecutor(NumpyDenseTarget):
    """The sample target, loaded into a subclass of its executor that breaks one rule."""

    executor_class: type[NumpyDenseExecutor] = NumpyDenseExecutor

    def load(self, artifact: Any, options: Any) -> Any:
        ex = super().load(artifact, options)
        ex.__class__ = self.executor_class
        # _init_io bound the call of the class it ran in; bind the swapped class's own.
        ex._init_io(ex._in_specs, ex._out_specs, ex.batch_size)
        return ex


class _LeakyExecutor(NumpyDenseExecutor):
    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None:
        super().predict_into(x, out)
        _KEPT.append(float(out.flat[0]))  # keeps one float per call: a leak


class Leaky(_OtherExecutor):
    name = "cpu.kit_leaky"
    executor_class = _LeakyExecutor


class _GreedyExecutor(NumpyDenseExecutor):
    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        scratch = np.ones(1 << 18, np.float32)  # a 1 MB temporary per call, freed on return
        super()._run(xs, outs)
        outs[0][...] += scratch[0] - 1.0  # uses it (the result is unchanged)


class Greedy(_OtherExecutor):
    name = "cpu.kit_greedy"
    executor_class = _GreedyExecutor


class _LaxExecutor(NumpyDenseExecutor):
    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None:
        # the unguarded idiom: numpy casts float64 and broadcasts (1, 1) silently
        buf = np.zeros(self._xshape, np.float32)
        buf[...] = x
        NumpyDenseExecutor.predict_into(self, buf, out)


class Lax(_OtherExecutor):
    name = "cpu.kit_lax"
    executor_class = _LaxExecutor


class Sloppy(NumpyDenseTarget):
    """Claims fp32 but rounds the weights to 4 significant bits."""
    name = "cpu.kit_sloppy"

    def compile(self, model: Any, options: Any, workdir: Path) -> dict[str, Any]:
        meta = super().compile(model, options, workdir)
        with np.load(workdir / "weights.npz") as z:
            arrays = {k: (np.round(z[k] * 8) / 8).astype(np.float32) for k in z.files}
        np.savez(workdir / "weights.npz", **arrays)
        return meta


class Mute(NumpyDenseTarget):
    """Refuses every model without saying which part it cannot compile."""
    name = "cpu.kit_mute"

    def compile(self, model: Any, options: Any, workdir: Path) -> dict[str, Any]:
        raise UnsupportedError("cannot compile this model")


class Reasonless(NumpyDenseTarget):
    name = "cpu.kit_reasonless"

    def probe(self) -> Availability:
        return Availability.unavailable("")


class Slow(NumpyDenseTarget):
    name = "cpu.kit_slow"

    def probe(self) -> Availability:
        time.sleep(1.2)
        return super().probe()


class Bodiless(NumpyDenseTarget):
    """Keeps the weights in the artifact's metadata instead of files (nothing to verify)."""
    name = "cpu.kit_bodiless"

    def compile(self, model: Any, options: Any, workdir: Path) -> dict[str, Any]:
        meta = super().compile(model, options, workdir)
        with np.load(workdir / "weights.npz") as z:
            meta["weights"] = {k: z[k].tolist() for k in z.files}
        for p in list(workdir.iterdir()):
            p.unlink()
        return meta

    def load(self, artifact: Any, options: Any) -> Any:
        acts = artifact.meta["activations"]
        w = artifact.meta["weights"]
        weights = [(np.array(w[f"w{i}"], np.float32), np.array(w[f"b{i}"], np.float32))
                   for i in range(len(acts))]
        return NumpyDenseExecutor(weights, acts, artifact.batch_size, artifact.inputs[0],
                                  artifact.outputs[0])


class Unpicklable(NumpyDenseTarget):
    """Holds a handle that cannot travel to the compile worker."""
    name = "cpu.kit_unpicklable"

    def __init__(self) -> None:
        self.handle = lambda: None


class InCaller(NumpyDenseTarget):
    """Correct itself; the test compiles it with isolation off to prove the kit notices."""
    name = "cpu.kit_in_caller"


ALL = (Good, Leaky, Greedy, Lax, Sloppy, Mute, Reasonless, Slow, Bodiless, Unpicklable, InCaller)
