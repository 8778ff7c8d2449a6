"""``compile()``: model + target + precision → a loaded, fidelity-checked ``CompiledModel``.

Resolve the request (:mod:`.request`: the model, the target, the data (:mod:`.data`), a
converter chain to a format the target takes (:mod:`.converters`), the store key), look the
artifact up in the store, else build it in the isolated worker process (:mod:`.build`, with
:mod:`.heartbeat`), check it against its stored outputs (:mod:`.reload_check`), warm it up
and measure its fidelity against the reference. :mod:`.adopt` takes in an artifact another
fleet node built.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from .. import cost
from ..compiled import CompiledModel
from ..context import Progress, RunContext
from ..errors import ConfigError
from ..fidelity import check_kind
from ..models import Model
from ..registry import Registry
from ..store.artifacts import ArtifactStore
from .adopt import import_artifact
from .build import Run, build, load_cached, wrap
from .converters import conversion_path
from .gate import enforce_gate, fidelity_gate
from .heartbeat import heartbeat
from .reload_check import check_reload, make_reload_check
from .request import CORE_FORMAT, CompileRequest, fidelity_of, resolve

log = logging.getLogger("hwbackends")

__all__ = ["CORE_FORMAT", "CompileRequest", "check_reload", "compile", "conversion_path", "fidelity_gate",
           "heartbeat", "import_artifact", "make_reload_check"]


def compile(model: Any, target: str = "cpu.litert", precision: str | None = None, *,
            batch_size: int | None = None, threads: int | None = None,
            options: dict[str, Any] | None = None,
            calibration_data: Any = None,
            validation_data: np.ndarray | None = None,
            fidelity: bool = True, nan_policy: str = "reject",
            store: ArtifactStore | str | Path | None = None,
            isolate_compile: bool = True, timeout: float | None = None,
            rebuild: bool = False, progress: Progress | None = None,
            registry: Registry | None = None, limits: cost.Limits | None = None,
            output_kind: str | dict[str, str] | None = None, gate: bool = True,
            context: RunContext | None = None) -> CompiledModel:
    """Compile ``model`` for ``target`` at ``precision`` (default: the target's first) and
    return the loaded :class:`CompiledModel`, with ``.fidelity`` measured on validation data.

    ``model`` is anything :func:`load_model` takes. ``calibration_data`` (for the target's
    ``calibrated`` precisions) and ``validation_data`` (the fidelity check) are one array, or
    for a multi-input model a tuple/list in input order or a dict keyed by input name
    (calibrated multi-input precisions only on targets with ``multi_io_calibrated``), or
    :class:`~hwbackends.samples.Samples` (arrays with their source); both are checked
    (shape, dtype, NaN/Inf). Defaults: the model's own validation data, split into disjoint
    calibration and validation halves, else synthetic N(0,1). Where each came from is
    ``cm.data`` (and ``describe()["data"]``). The artifact is cached in the run's store
    (``context``, below): a second call with the same model, target, options and
    toolchain versions is a load. Every load, with or without ``fidelity``, re-runs a few
    inputs stored with the artifact and refuses (rebuilds) one whose outputs changed. The
    build runs in an isolated child process unless ``isolate_compile=False``; a crash or
    timeout raises :class:`CompileError`. A model loaded here is refused before any work when
    its declared cost is over ``limits`` (:mod:`hwbackends.cost`; default from the
    environment), and the worker runs under a memory limit (``HWB_WORKER_MEMORY``).
    ``output_kind`` says what the output is (``signed``, ``regression``, ``probabilities``,
    ``logits``; a dict by output name for several), which decides the metrics the fidelity
    gates on; without it the kind is inferred from the reference and ``cm.fidelity`` says so.
    A variant whose measured fidelity fails its precision's gate (:func:`.gate.fidelity_gate`,
    the check ``hwb compile`` exits 3 on) is not returned: :class:`FidelityGateError` is
    raised, carrying the figures and the variant (``err.variant``) for inspection. Pass
    ``gate=False`` to get ungated variants (a benchmark or a router that applies its own
    tolerance); ``fidelity=False`` measures nothing, so gates nothing.

    ``context`` (:class:`~hwbackends.RunContext`) is the run this compile belongs to: the
    target is looked up in its registry, the artifact kept in its store, progress sent to its
    callback. ``store`` (a store or its path), ``registry`` and ``progress`` are the same
    three, loose, for a one-off call; they build the context here, and giving both forms is
    a :class:`ConfigError`. Neither: ``HWB_CACHE_DIR``'s store, the installed plugins, the
    ``hwbackends`` log.
    """
    ctx = RunContext.given(context, "compile", store=store, registry=registry, progress=progress)
    say = ctx.progress
    req = resolve(CompileRequest(model, target, precision, batch_size, threads, options,
                                  calibration_data, validation_data, limits), ctx.registry)
    kinds = _output_kinds(req.m, output_kind)
    tgt = req.tgt
    run = Run(ctx.store, isolate_compile, timeout or tgt.compile_timeout, say)
    if rebuild:
        run.store.evict(req.key)
    loaded = None if rebuild else load_cached(req, run)
    if loaded is None:
        tgt.check_options(req.opts)  # a mistake in the options costs no build
        # One build per key at a time across processes sharing the store: the one that
        # waited loads what the other committed (an FPGA search is not repeated).
        with run.store.build_lock(req.key, req.what, say, run.timeout) as waited:
            if waited and not rebuild:
                loaded = load_cached(req, run)
            if loaded is None:
                loaded = build(req, run)
    executor, art = loaded
    cm = wrap(executor, art, req.avail, req.m.name, nan_policy, tgt)
    cm.data = req.data
    cm.upgraded = req.m.meta.get("upgraded")
    if fidelity:
        cm.fidelity = fidelity_of(req.m, cm, req.val, kinds)
        say(f"{cm.variant} fidelity: {cm.fidelity}")
        if gate:
            enforce_gate(cm)
    return cm


def _output_kinds(m: Model, output_kind: str | dict[str, str] | None) -> str | dict[str, str] | None:
    """``output_kind`` checked: one kind, or one per output name of ``m``."""
    if output_kind is None or isinstance(output_kind, str):
        return None if output_kind is None else check_kind(output_kind)
    if not isinstance(output_kind, dict):
        raise ConfigError(f"output_kind must be a kind or a dict of kinds by output name; got "
                          f"{type(output_kind).__name__}")
    names = [s.name for s in m.outputs]
    unknown = sorted(set(output_kind) - set(names))
    if unknown:
        raise ConfigError(f"output_kind names output(s) {', '.join(map(repr, unknown))[:200]}; "
                          f"{m.name!r} has {', '.join(names)}")
    return {k: check_kind(v, f"output_kind[{k!r}]") for k, v in output_kind.items()}
