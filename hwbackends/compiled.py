"""``CompiledModel``: the one predict interface every target is served behind."""
from __future__ import annotations

from typing import Any

import numpy as np

from .chunked import as_returned, predict_in_batches, tuple_call
from .exclusive import lock_for
from .fidelity import Fidelity
from .inputs import NAN_POLICIES, as_batches, is_single
from .labels import label, push_form
from .sliding import Window, Windows, open_window, open_windows
from .specs import Availability, Mode, TensorSpec
from .target import Artifact, Executor, check_io, close_executor


class CompiledModel:
    """A compiled, loaded variant of one model on one target.

    ``predict(x)`` validates and allocates: any batch size, one sample or many.
    ``predict_into(x, out)`` is the hot path: it *is* the executor's bound method (no wrapper
    frame), takes exactly ``(batch_size, *input.shape)`` float32 and writes into ``out``.

    **Several inputs or outputs** (:attr:`multi_io`): ``predict`` takes a tuple (one array
    per input, ``inputs`` order), a dict keyed by input name, and returns one array when the
    model has one output, else a tuple in ``outputs`` order; ``predict_into(xs, outs)`` takes
    tuples, one buffer per tensor (see :class:`hwbackends.target.Executor`).
    """

    def __init__(self, executor: Executor, artifact: Artifact, availability: Availability,
                 model_name: str = "model", nan_policy: str = "reject",
                 static_batch: bool = True):
        if nan_policy not in NAN_POLICIES:
            raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
        self.executor = executor
        self.artifact = artifact
        self.availability = availability
        self.model_name = model_name
        self.nan_policy = nan_policy
        self.fidelity: Fidelity | None = None
        #: Where the calibration and validation inputs came from (``compile`` sets it:
        #: ``{"calibration": DataSource dict or None, "validation": …}``, hwbackends/samples.py).
        self.data: dict[str, Any] = {}
        #: how the source model was converted before any target saw it (an old ONNX opset
        #: upgraded: ``Model.meta["upgraded"]``), None when it was taken as written
        self.upgraded: dict[str, Any] | None = None
        #: False when the executor takes any batch size (``predict`` then makes one call).
        self.static_batch = static_batch
        # The hot path: the executor's own bound method, so a call costs what the library costs.
        self.predict_into = executor.predict_into
        #: Whether the model has several inputs or outputs (tuples in ``predict_into``).
        self.multi_io = artifact.multi_io
        # The allocating paths run on tuples; the hot path above keeps its own shape.
        self._call = tuple_call(self.predict_into, not self.multi_io)
        self._xs = tuple(np.zeros(s.batched(self.batch_size), np.float32) for s in self.inputs)
        self._ys = tuple(np.zeros(s.batched(self.batch_size), np.float32) for s in self.outputs)

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
    def inputs(self) -> list[TensorSpec]:
        """Every input, in the order ``predict``/``predict_into`` take them."""
        return self.artifact.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        """Every output, in the order ``predict``/``predict_into`` give them."""
        return self.artifact.outputs

    @property
    def input(self) -> TensorSpec:
        """The first (for most models the only) input."""
        return self.artifact.inputs[0]

    @property
    def output(self) -> TensorSpec:
        return self.artifact.outputs[0]

    @property
    def variant(self) -> str:
        return label(self.target, self.precision, push_form(self.artifact.meta))

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.model_name, "target": self.target, "precision": self.precision,
            "variant": self.variant, "mode": self.mode.value, "device": self.availability.device,
            "mode_reason": self.availability.reason, "fingerprint": self.fingerprint,
            "batch_size": self.batch_size, "input": self.input.to_dict(),
            "output": self.output.to_dict(),
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs], "artifact_path": self.artifact_path,
            "artifact_bytes": self.artifact.size_bytes(), "toolchain": self.toolchain,
            "compile_seconds": self.artifact.compile_seconds, "cached": self.artifact.cached,
            "meta": self.artifact.meta,
            # Modelled FPGA figures (fpga.da4ml): labelled "modelled", never hardware.
            "hardware_estimate": self.artifact.meta.get("hardware_estimate"),
            "fidelity": self.fidelity.to_dict() if self.fidelity else None,
            "data": self.data,
            "upgraded": self.upgraded,
        }

    def __repr__(self) -> str:
        return (f"<CompiledModel {self.model_name} on {self.variant} ({self.mode.value}), "
                f"batch {self.batch_size}>")

    # -- prediction -----------------------------------------------------------------------------
    def validate(self, x: Any) -> tuple[tuple[np.ndarray, ...], bool]:
        """``x`` as float32 batches for this variant (a tuple, one per input, see
        :func:`hwbackends.inputs.as_batches`) and whether it was one sample; raises
        :class:`InputError` (shape, dtype, NaN/Inf per ``nan_policy``)."""
        return as_batches(x, self.inputs, self.nan_policy), is_single(x, self.inputs)

    def predict(self, x: Any) -> Any:
        """Outputs for ``x`` of shape ``input.shape`` (one sample) or ``(n, *input.shape)``
        (several inputs: a tuple or a dict of those). Validates shape, dtype and (by default)
        NaN/Inf; returns a new array (a tuple of arrays for several outputs).

        It holds the executor's lock (:mod:`hwbackends.exclusive`), so calling it on a model
        an :class:`~hwbackends.serve.Engine` (or another thread) is serving is safe: the
        executor and this object's staging buffers run one call at a time. The hot path,
        :meth:`predict_into`, takes no lock: one caller at a time."""
        xs, single = self.validate(x)
        with lock_for(self):
            ys = predict_in_batches(self._call, xs, self.batch_size, self.inputs, self.outputs,
                                    static_batch=self.static_batch, xbufs=self._xs, ybufs=self._ys)
        return as_returned(ys, single)

    def warmup(self, n: int = 20) -> None:
        """Run ``n`` calls so first-call costs (allocation, JIT, caches) are paid before traffic."""
        for _ in range(n):
            self._call(self._xs, self._ys)

    def check(self, x: Any, out: Any) -> None:
        """Raise :class:`InputError` if ``x``/``out`` are not what ``predict_into`` takes."""
        if not self.multi_io:
            x, out = (x,), (out,)
        check_io(x, out, self.inputs, self.outputs, self.batch_size,
                 contiguous=getattr(self.executor, "contiguous", False))

    # -- the sliding window and the stream (hwbackends/sliding.py) ------------------------------
    def sliding(self, *, streams: int | None = None, auto_prepare: bool = True) -> Window | Windows:
        """A :class:`~hwbackends.sliding.Window` over the input's first axis: ``push_into(x_t,
        out)`` takes one step (``input.shape[1:]``) and writes what ``predict_into`` returns for
        the window ending at ``x_t`` (zero state at the window's start; zero-filled before
        ``input.shape[0]`` steps were pushed). The target's incremental form where it offers
        one (``window.form == "incremental"``), else the window recomputed each tick.
        ``auto_prepare=False``: ``push_into`` only answers; call ``window.prepare()`` before
        the next tick (off the critical path), or the next push runs it first.
        ``streams=N``: :class:`~hwbackends.sliding.Windows`, ``N`` independent windows over
        these weights (one per symbol): ``push_into(i, x_t, out)``, ``push_many(ids, xs,
        outs)``, ``prepare()``, ``reset(i)``."""
        if streams is not None:
            return open_windows(self, streams, stateful=False, auto_prepare=auto_prepare)
        return open_window(self, stateful=False, auto_prepare=auto_prepare)

    def streaming(self, *, streams: int | None = None, auto_prepare: bool = True) -> Window | Windows:
        """A stream for a model trained stateful: each ``push_into(x_t, out)`` advances the
        state by one step (never reset between ticks) and answers; ``reset()`` zeroes it.
        Only where the target has an incremental form for the model (cpu.native: recurrent
        models); else :class:`~hwbackends.errors.UnsupportedError`. ``streams=N``: ``N``
        independent streams (:class:`~hwbackends.sliding.Windows`)."""
        if streams is not None:
            return open_windows(self, streams, stateful=True, auto_prepare=auto_prepare)
        return open_window(self, stateful=True, auto_prepare=auto_prepare)

    def close(self) -> None:
        """Release what the executor holds (device handles, native libraries)."""
        close_executor(self.executor)
