"""The Open Inference Protocol (KServe v2, Triton's HTTP/REST and gRPC API), model side:
what the HTTP endpoint (:mod:`.oip_http`) and the gRPC service (:mod:`.oip_grpc`) share.

:class:`OipModels` holds the served names: each engine under every name it is given (a
router strategy's name, whose router picks the variant per call, and the model's name), and
each :class:`~hwbackends.serve.sequences.Sequences` under its own name (``NAME.window`` for
sliding windows, ``NAME.stream`` for streams). It answers health, server and model metadata,
Triton's model configuration and statistics, and ``infer``: the tensors of one request
checked against the model (names, ``FP32``, shape ``[n, *sample]`` with ``1 ≤ n ≤``
:data:`MAX_BATCH`, element count), run as ``n`` engine requests (micro-batched there), and
the outputs returned per tensor. A sequence model takes exactly one tick per request
(``[1, *step]``) with the ``sequence_id`` / ``sequence_start`` / ``sequence_end``
parameters.

Every refusal is an :class:`OipError` whose ``kind`` each transport maps to its status
(:data:`HTTP_STATUS`, :data:`GRPC_CODE`); its message says what was expected. A request that
the engine answers "unavailable" (deadline, breaker open, backend error) is an
``unavailable`` error carrying the engine's reason: the protocol has no "no signal" answer.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import HwbError, InputError
from ..version import __version__
from .engine import Engine
from .request import Unavailable, check_deadline_us
from .sequences import SequenceError, Sequences

#: Rows (samples) one infer request may carry; each is one engine request.
MAX_BATCH = 256
#: The protocol's name for the only datatype served (float32, little-endian).
FP32 = "FP32"
#: What ``GET /v2`` and ServerMetadata say the server supports.
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics", "sequence",
              "model_repository")

#: OipError kind → HTTP status and gRPC status-code name.
HTTP_STATUS = {"bad": 400, "unauthenticated": 401, "not_found": 404, "too_large": 413,
               "full": 429, "unavailable": 503, "unsupported": 501}
GRPC_CODE = {"bad": "INVALID_ARGUMENT", "unauthenticated": "UNAUTHENTICATED",
             "not_found": "NOT_FOUND", "too_large": "RESOURCE_EXHAUSTED",
             "full": "RESOURCE_EXHAUSTED", "unavailable": "UNAVAILABLE",
             "unsupported": "UNIMPLEMENTED"}


class OipError(HwbError):
    """A request the protocol refuses; ``kind`` is a key of :data:`HTTP_STATUS`."""

    def __init__(self, message: str, kind: str = "bad"):
        super().__init__(message)
        self.kind = kind


@dataclass
class InTensor:
    """One request input as a transport decoded it: ``data`` is a flat float32 array."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass
class OutTensor:
    name: str
    shape: tuple[int, ...]
    data: np.ndarray  # float32, C order


@dataclass
class _Stats:
    """Triton's statistics of one served name (durations in ns)."""

    success: list[int] = field(default_factory=lambda: [0, 0])
    fail: list[int] = field(default_factory=lambda: [0, 0])
    infer: list[int] = field(default_factory=lambda: [0, 0])
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, list[int]] = field(default_factory=dict)


def run_rows(eng: Engine, xs: np.ndarray, deadline_us: float | None) -> np.ndarray | Unavailable:
    """Submit each row of ``xs`` to ``eng`` (micro-batched there) and wait for all: the
    outputs ``(n, *eng.output_shape)``, or the first :class:`Unavailable` (the rest are
    abandoned unrun). Raises InputError for a bad row."""
    handles = [eng.submit(x, deadline_us) for x in xs]
    out = np.empty((len(xs), *eng.output_shape), np.float32)
    for i, h in enumerate(handles):
        res = eng.wait(h, out[i])
        if isinstance(res, Unavailable):
            for rest in handles[i + 1:]:
                eng.abandon(rest)
            return res
    return out


class _Served:
    """One served name: an engine (whole samples) or a sequences object (one tick each)."""

    def __init__(self, name: str, engine: Engine, seq: Sequences | None, specs: Any):
        self.name = name
        self.engine = engine
        self.seq = seq
        ins, outs = specs
        #: [(tensor name, per-request shape without the batch axis)]
        if seq is None:
            self.inputs, self.outputs = ins, outs
        else:
            self.inputs = [(ins[0][0], seq.step_shape)]
            self.outputs = [(outs[0][0], seq.output_shape)]
        self.version = "1" if seq is not None else None  # an engine's is its active version
        self.stats = _Stats()
        self.lock = threading.Lock()

    @property
    def versions(self) -> list[str]:
        return [self.version or str(self.engine.version)]

    @property
    def max_batch(self) -> int:
        return 1 if self.seq is not None else MAX_BATCH


def _specs(eng: Engine) -> tuple[list[tuple[str, tuple[int, ...]]], list[tuple[str, tuple[int, ...]]]]:
    lay = eng.layout
    if lay is not None:
        return ([(f.name, tuple(f.shape)) for f in lay[0].fields],
                [(f.name, tuple(f.shape)) for f in lay[1].fields])
    plan = eng.versions.active.plan
    return [(plan.input.name, tuple(plan.input.shape))], [(plan.output.name, tuple(plan.output.shape))]


class OipModels:
    """The names the protocol serves (see the module docstring). ``engines``: name → engine
    (one engine may appear under several names); ``sequences``: name → (the engine of the
    model the windows belong to, its :class:`Sequences`)."""

    def __init__(self, engines: Mapping[str, Engine],
                 sequences: Mapping[str, tuple[Engine, Sequences]] | None = None, *,
                 server_name: str = "hwbackends"):
        self.server_name = server_name
        self.server_version = __version__
        self._served: dict[str, _Served] = {}
        for name, eng in engines.items():
            self._add(name, eng, None)
        for name, (eng, seq) in (sequences or {}).items():
            self._add(name, eng, seq)
        if not self._served:
            raise InputError("OipModels needs at least one engine to serve")

    def _add(self, name: str, eng: Engine, seq: Sequences | None) -> None:
        if not name or len(name) > 256 or any(c in name for c in "/?#% \t\r\n"):
            raise InputError(f"model name {name!r}: expected 1 to 256 characters, none of / ? # % "
                             f"or whitespace (it is a URL path segment)")
        if name in self._served:
            raise InputError(f"model name {name!r} is given twice")
        self._served[name] = _Served(name, eng, seq, _specs(eng))

    @property
    def names(self) -> list[str]:
        return list(self._served)

    # -- health and metadata ---------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return all(s.engine.running for s in self._served.values())

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_name, "version": self.server_version,
                "extensions": list(EXTENSIONS)}

    def model(self, name: str, version: str = "") -> _Served:
        s = self._served.get(name)
        if s is None:
            raise OipError(f"unknown model {name!r:.300}; served: {', '.join(self._served)}",
                           "not_found")
        if version and version not in s.versions:
            raise OipError(f"model {name!r} has no version {version!r:.40}; served: "
                           f"{', '.join(s.versions)} (or omit the version)", "not_found")
        return s

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            return self.model(name, version).engine.running
        except OipError:
            return False

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        s = self.model(name, version)

        def tensors(side: list[tuple[str, tuple[int, ...]]]) -> list[dict[str, Any]]:
            return [{"name": n, "datatype": FP32, "shape": [-1, *shape]} for n, shape in side]
        return {"name": s.name, "versions": s.versions, "platform": "hwbackends",
                "inputs": tensors(s.inputs), "outputs": tensors(s.outputs)}

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """Triton's model configuration (its JSON form; the gRPC service parses it into
        ``inference.ModelConfig``)."""
        s = self.model(name, version)
        eng = s.engine
        cfg: dict[str, Any] = {
            "name": s.name, "platform": "hwbackends", "backend": "hwbackends",
            "max_batch_size": s.max_batch,
            "input": [{"name": n, "data_type": "TYPE_FP32", "dims": list(shape)} for n, shape in s.inputs],
            "output": [{"name": n, "data_type": "TYPE_FP32", "dims": list(shape)} for n, shape in s.outputs],
            "instance_group": [{"name": s.name, "kind": "KIND_CPU", "count": 1}],
            "parameters": {"variant": {"string_value": eng.variant},
                           "strategy": {"string_value": eng.strategy}}}
        if s.seq is not None:
            cfg["sequence_batching"] = {"max_sequence_idle_microseconds": int(s.seq.idle_s * 1e6),
                                        "direct": {}}
            cfg["parameters"]["windows"] = {"string_value": str(s.seq.capacity)}
            cfg["parameters"]["form"] = {"string_value": s.seq.windows.form}
        else:
            pol = eng.config.policy
            cfg["dynamic_batching"] = {
                "preferred_batch_size": [int(b) for b in (pol.allowed_batch_sizes or (1,))],
                "max_queue_delay_microseconds": int(pol.batch_timeout_us)}
        return cfg

    def model_stats(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics (JSON form) of one name, or of every name when ``name`` is empty."""
        chosen = [self.model(name, version)] if name else list(self._served.values())
        rows = []
        for s in chosen:
            st = s.stats
            with s.lock:
                dur = {k: {"count": v[0], "ns": v[1]} for k, v in
                       (("success", st.success), ("fail", st.fail), ("queue", [st.success[0], 0]),
                        ("compute_input", [st.success[0], 0]), ("compute_infer", st.infer),
                        ("compute_output", [st.success[0], 0]), ("cache_hit", [0, 0]),
                        ("cache_miss", [0, 0]))}
                batches = [{"batch_size": b, "compute_input": {"count": c, "ns": 0},
                            "compute_infer": {"count": c, "ns": ns},
                            "compute_output": {"count": c, "ns": 0}}
                           for b, (c, ns) in sorted(st.batches.items())]
                rows.append({"name": s.name, "version": s.versions[0],
                             "last_inference": st.last_inference_ms,
                             "inference_count": st.inference_count,
                             "execution_count": st.execution_count,
                             "inference_stats": dur, "batch_stats": batches})
        return {"model_stats": rows}

    def repository_index(self) -> list[dict[str, Any]]:
        return [{"name": s.name, "version": s.versions[0],
                 "state": "READY" if s.engine.running else "UNAVAILABLE", "reason": ""}
                for s in self._served.values()]

    # -- inference -------------------------------------------------------------------------
    def infer(self, name: str, version: str, inputs: Sequence[InTensor],
              requested: Sequence[str] | None, params: Mapping[str, Any],
              deadline_us: float | None = None) -> tuple[_Served, list[OutTensor]]:
        """Run one request: ``(served model, outputs)`` (only the ``requested`` names when
        given, else all), or :class:`OipError`. ``params`` are the request's parameters
        (``sequence_id``, ``sequence_start``, ``sequence_end``, ``timeout`` in µs);
        ``deadline_us`` the transport's own budget (the smaller one wins)."""
        s = self.model(name, version)
        t0 = time.perf_counter_ns()
        try:
            outs = self._infer(s, inputs, requested, params, deadline_us)
        except OipError:
            self._count(s, t0, None)
            raise
        self._count(s, t0, outs[0].shape[0] if outs else 0)
        return s, outs

    def _count(self, s: _Served, t0: int, n: int | None) -> None:
        dt = time.perf_counter_ns() - t0
        st = s.stats
        with s.lock:
            if n is None:
                st.fail[0] += 1
                st.fail[1] += dt
                return
            st.success[0] += 1
            st.success[1] += dt
            st.infer[0] += 1
            st.infer[1] += dt
            st.inference_count += n
            st.execution_count += 1
            st.last_inference_ms = int(time.time() * 1000)
            b = st.batches.setdefault(n, [0, 0])
            b[0] += 1
            b[1] += dt

    def _rows(self, s: _Served, inputs: Sequence[InTensor]) -> tuple[int, list[np.ndarray]]:
        """The request's tensors in the model's input order as ``(n, *sample)`` arrays."""
        by: dict[str, InTensor] = {}
        for t in inputs:
            if t.name in by:
                raise OipError(f"input {t.name!r:.100} is given twice")
            by[t.name] = t
        want = [n for n, _ in s.inputs]
        extra = sorted(set(by) - set(want))
        missing = [n for n in want if n not in by]
        if extra or missing:
            raise OipError(f"model {s.name!r} takes inputs {want}; the request "
                           + (f"lacks {missing}" if missing else "")
                           + (" and " if missing and extra else "")
                           + (f"has unknown {[e[:100] for e in extra[:8]]}" if extra else ""))
        n_rows = None
        arrays = []
        for tname, shape in s.inputs:
            t = by[tname]
            if t.datatype != FP32:
                raise OipError(f"input {tname!r} has datatype {t.datatype!r:.20}; model {s.name!r} "
                               f"takes {FP32} (float32) only")
            if len(t.shape) != len(shape) + 1 or tuple(t.shape[1:]) != shape or not 1 <= t.shape[0] <= s.max_batch:
                rows = "[1" if s.max_batch == 1 else f"[n (1 to {s.max_batch})"
                raise OipError(f"input {tname!r} has shape {list(t.shape)[:10]}; model {s.name!r} takes "
                               f"{rows}, {', '.join(map(str, shape))}]"
                               + (" (one tick per request)" if s.seq is not None else ""))
            if n_rows is not None and t.shape[0] != n_rows:
                raise OipError(f"inputs have different batch sizes ({n_rows} and {t.shape[0]})")
            n_rows = t.shape[0]
            if t.data.size != math.prod(t.shape):
                raise OipError(f"input {tname!r} carries {t.data.size} values; its shape "
                               f"{list(t.shape)} needs {math.prod(t.shape)}")
            arrays.append(t.data.reshape(t.shape))
        return int(n_rows or 0), arrays

    def _infer(self, s: _Served, inputs: Sequence[InTensor], requested: Sequence[str] | None,
               params: Mapping[str, Any], deadline_us: float | None) -> list[OutTensor]:
        out_names = [n for n, _ in s.outputs]
        if requested is not None:
            unknown = [r for r in requested if r not in out_names]
            if unknown:
                raise OipError(f"model {s.name!r} has outputs {out_names}; unknown requested "
                               f"output(s) {[u[:100] for u in unknown[:8]]}")
        n, arrays = self._rows(s, inputs)
        seq_id = params.get("sequence_id", 0)
        if s.seq is not None:
            y = self._tick(s, arrays[0][0], seq_id, params)[None]
            ys = [y]
        else:
            if seq_id not in (0, "", None):
                raise OipError(f"model {s.name!r} takes whole samples, not sequences; send "
                               f"ticks with sequence_id to its sequence model (hwb serve "
                               f"--sequences N serves NAME.window)")
            ys = self._run(s, n, arrays, params, deadline_us)
        outs = [OutTensor(name, (n, *shape), y) for (name, shape), y in zip(s.outputs, ys, strict=True)]
        return outs if requested is None else [o for o in outs if o.name in requested]

    def _run(self, s: _Served, n: int, arrays: list[np.ndarray], params: Mapping[str, Any],
             deadline_us: float | None) -> list[np.ndarray]:
        eng = s.engine
        timeout = params.get("timeout")
        budget = [deadline_us] if deadline_us is not None else []
        if timeout not in (None, 0):
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise OipError(f"parameter timeout {timeout!r:.40}: expected microseconds (a number)")
            try:
                budget.append(check_deadline_us(float(timeout), "timeout (µs)"))
            except InputError as exc:
                raise OipError(str(exc)) from None
        xs = arrays[0] if len(arrays) == 1 else np.concatenate([a.reshape(n, -1) for a in arrays], axis=1)
        xs = np.ascontiguousarray(xs, dtype=np.float32)
        try:
            res = run_rows(eng, xs, min(budget) if budget else None)
        except InputError as exc:
            raise OipError(str(exc)) from None
        if isinstance(res, Unavailable):
            raise OipError(f"model {s.name!r}: no answer ({res.reason}; status "
                           f"{res.status.name}): skip this tick or retry", "unavailable")
        lay = eng.layout
        if lay is None:
            return [res]
        return [res[:, f.offset:f.offset + f.size].reshape(n, *f.shape) for f in lay[1].fields]

    def _tick(self, s: _Served, x: np.ndarray, seq_id: Any, params: Mapping[str, Any]) -> np.ndarray:
        seq = s.seq
        assert seq is not None
        if seq_id in (0, "", None):
            raise OipError(f"model {s.name!r} serves sequences: give the request a sequence_id "
                           f"(correlation id), with sequence_start=true on its first tick")
        flags = []
        for key in ("sequence_start", "sequence_end"):
            v = params.get(key, False)
            if not isinstance(v, bool):
                raise OipError(f"parameter {key} is {v!r:.40}; expected true or false")
            flags.append(v)
        if not np.isfinite(x).all():
            raise OipError(f"the tick for sequence {seq_id!r:.80} holds NaN or Inf; send finite "
                           f"float32 features")
        out = np.empty(seq.output_shape, np.float32)
        try:
            seq.tick(seq_id, np.ascontiguousarray(x, dtype=np.float32), out,
                     start=flags[0], end=flags[1])
        except SequenceError as exc:
            raise OipError(str(exc), "full" if exc.kind == "full" else "bad") from None
        except InputError as exc:
            raise OipError(str(exc)) from None
        return out
