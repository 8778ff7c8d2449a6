"""Measure compiled variants: one variant in one scenario (:func:`measure`), or a model on
every allowed target × precision in every scenario (:func:`bench_model`)."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from .. import machine as machine_mod
from ..chunked import public
from ..compiler import compile as hwb_compile
from ..context import Progress, RunContext
from ..errors import HwbError, UnsupportedError
from ..labels import label
from ..registry import (
    precisions_to_build,
    safe_probe,
    select_targets,
    slow_unless_named,
    unaccepted_precisions,
)
from ..variant import VariantRecord
from .profile import LatencyProfile, brief, samples_per_s, summarize
from .profile_cache import ProfileCache, profile_key
from .results import BenchResults
from .scenarios import (
    Batch,
    Burst,
    ProgressBar,
    Scenario,
    Server,
    SingleStream,
    Sliding,
    Timing,
    closed_loop,
    noop,
    open_loop,
    sliding_loop,
    timeline,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..compiled import CompiledModel
    from ..models import Model

log = logging.getLogger("hwbackends.bench")


@contextlib.contextmanager
def pinned(cpus: Sequence[int] | None) -> Iterator[None]:
    """Pin the calling thread to ``cpus`` for the duration (no-op when ``None``)."""
    if not cpus:
        yield
        return
    if not hasattr(os, "sched_setaffinity"):
        raise UnsupportedError("CPU pinning needs os.sched_setaffinity (Linux); drop --pin")
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, set(cpus))
    except OSError as exc:
        raise UnsupportedError(f"cannot pin to CPUs {list(cpus)}: {exc}; usable CPUs are "
                               f"{sorted(before)}") from exc
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def input_set(data: Any, cm: "CompiledModel", batch: int, k: int = 32) -> list[Any]:
    """``k`` preallocated, C-contiguous inputs of shape ``(batch, *input)``, cycled through
    by the loops so the variant sees varying real data, not one cached array. A model with
    several inputs gets tuples (one array per input, ``data`` a tuple likewise), as its
    ``predict_into`` takes them."""
    multi = getattr(cm, "multi_io", False)
    per = data if multi and data is not None else (data,) * len(cm.inputs)
    cols = [_input_set(d, s.shape, batch, k) for d, s in zip(per, cm.inputs, strict=True)]
    return [public(tuple(c[j] for c in cols), multi) for j in range(k)]


def _input_set(data: np.ndarray | None, shape: tuple[int, ...], batch: int, k: int) -> list[np.ndarray]:
    if data is None or len(data) == 0:
        data = np.random.default_rng(0).standard_normal((256, *shape)).astype(np.float32)
    data = np.asarray(data, dtype=np.float32)
    xs = []
    for j in range(k):
        idx = (np.arange(batch) + j * batch) % len(data)
        xs.append(np.ascontiguousarray(data[idx]))
    return xs


def output_buffer(cm: "CompiledModel", batch: int) -> Any:
    """Where the loops write outputs: one ``(batch, *output)`` array, or a tuple of them."""
    return public(tuple(np.zeros(s.batched(batch), np.float32) for s in cm.outputs),
                  getattr(cm, "multi_io", False))


def measure(cm: "CompiledModel", scenario: Scenario, data: Any = None,
            batch_size: int | None = None, pin: Sequence[int] | None = None,
            bars: bool = False, predict_into: Callable[..., None] | None = None) -> LatencyProfile:
    """Measure ``cm`` in ``scenario`` and return its profile. ``batch_size`` only applies to
    variants without a static batch (others run at their compiled batch). ``bars``: a live
    progress bar on stderr. ``predict_into`` overrides the callable timed (the router's own
    dispatch, in its overhead benchmark)."""
    if isinstance(scenario, Sliding):
        return measure_sliding(cm, scenario, data, pin, bars)
    batch = cm.batch_size if (cm.static_batch or batch_size is None) else batch_size
    xs = input_set(data, cm, batch)
    out = output_buffer(cm, batch)
    fn = predict_into or cm.predict_into
    label = f"{cm.variant} b{batch} {scenario.name}"
    trace_info = None
    floor: Timing | None = None
    affinity: dict[str, Any] | None = None
    with pinned(pin):
        if isinstance(scenario, (SingleStream, Batch)):
            bar = ProgressBar(label, scenario.n, bars)
            t: Timing = closed_loop(fn, xs, out, scenario.n, scenario.max_s, scenario.warmup, bar)
        elif isinstance(scenario, (Server, Burst)):
            if isinstance(scenario, Server):
                arrivals, total = scenario.arrivals(), scenario.n
            else:
                trace = scenario.load()
                trace_info = trace.describe()
                arrivals, total = trace.timestamps, len(trace)
            bar = ProgressBar(label, total, bars)
            # The measured thread on a core of its own when there are two and no --pin says
            # otherwise; the same loop over a no-op, same arrivals, right after: the floor.
            with open_loop_cores(pin) as affinity:
                t = open_loop(fn, xs, out, arrivals, scenario.max_s, scenario.warmup, bar)
                if not t.interrupted:
                    floor = open_loop(noop, xs, out, arrivals, scenario.max_s, scenario.warmup)
        else:  # pragma: no cover - the type union is closed
            raise TypeError(f"unknown scenario {scenario!r}")
    stats = summarize(t.latency_ns)
    try:
        load = os.getloadavg()[0]  # how shared the machine was (reports flag a busy one)
    except OSError:
        load = None
    prof = LatencyProfile(
        variant=cm.variant, target=cm.target, precision=cm.precision, batch_size=batch,
        scenario=scenario.name, params=scenario.key() | ({"trace": trace_info} if trace_info else {})
        | {"loadavg_1m": load},
        mode=cm.mode.value,
        throughput=samples_per_s(t.service_ns if t.service_ns is not None else t.latency_ns, batch),
        duration_s=t.wall_s, machine=machine_mod.fingerprint(),
        fidelity=cm.fidelity.to_dict() if cm.fidelity else None,
        artifact_key=cm.artifact.key, interrupted=t.interrupted, **stats)
    if t.service_ns is not None and len(t.service_ns):
        prof.queue_mean_us = float((t.latency_ns - t.service_ns).mean() / 1e3)
    if isinstance(scenario, Burst) and t.arrivals_s is not None:
        prof.timeline = timeline(t.arrivals_s, t.latency_ns)
    if floor is not None:
        prof.noise_floor = brief(floor.latency_ns)
        prof.interrupted = prof.interrupted or floor.interrupted
    if affinity is not None:
        prof.params["affinity"] = affinity
    bar.done(f"p50 {prof.p50_us:.1f} µs  p99 {prof.p99_us:.1f} µs  n={prof.n}"
             + (f"  (no-op floor p99 {prof.noise_floor['p99_us']:.1f} µs"
                + (", at the floor)" if prof.at_noise_floor else ")") if prof.noise_floor else "")
             + ("  (interrupted)" if t.interrupted else ""))
    return prof


@contextlib.contextmanager
def open_loop_cores(pin: Sequence[int] | None) -> Iterator[dict[str, Any]]:
    """Where an open loop's threads run, yielded as the row's ``affinity``: with two usable
    cores or more (and no ``--pin``), the measuring thread goes to the last one and the
    process's other threads (a target's worker pool, the interpreter's helpers) keep the
    rest, so nothing started by the run competes for the measured core. The arrival schedule
    is precomputed, so no generator thread runs during the loop. One core, or no
    ``sched_setaffinity``: nothing changes, and the row says so."""
    if pin or not hasattr(os, "sched_setaffinity"):
        yield {"measured_cpus": sorted(pin) if pin else None, "pinned_by": "--pin" if pin else
               "nobody (no sched_setaffinity)", "generator": "precomputed schedule"}
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield {"measured_cpus": cpus, "pinned_by": "nobody (one usable core)",
               "generator": "precomputed schedule"}
        return
    mine = cpus[-1]
    with pinned([mine]):
        yield {"measured_cpus": [mine], "other_cpus": cpus[:-1], "pinned_by": "the harness",
               "generator": "precomputed schedule"}


def sliding_refusal(shape: Sequence[int], multi_io: bool, name: str) -> str:
    """Why model ``name`` cannot run the sliding scenario ("" when it can): it needs one input
    of rank ≥ 2, a time axis then each step's features."""
    if multi_io:
        return (f"{name} has several inputs or outputs; the sliding scenario slides one input's "
                f"first axis (keep the window yourself and measure single-stream)")
    if len(shape) < 2:
        return (f"{name} is not windowed: its input has shape {tuple(shape)}, and the sliding "
                f"scenario needs (T, *features), a time axis first; measure it with "
                f"-s single-stream")
    return ""


def step_set(data: Any, cm: "CompiledModel", k: int = 4096) -> list[np.ndarray]:
    """Up to ``k`` distinct steps (shape ``input.shape[1:]``, C-contiguous float32) from the
    model's sample windows, in order: the sliding scenario pushes a new one each tick."""
    shape = tuple(cm.input.shape)
    if data is None or len(data) == 0:
        data = np.random.default_rng(0).standard_normal((256, *shape)).astype(np.float32)
    flat = np.ascontiguousarray(np.asarray(data, dtype=np.float32).reshape(-1, *shape[1:])[:k])
    return [flat[j] for j in range(len(flat))]


def measure_sliding(cm: "CompiledModel", scenario: Sliding, data: Any = None,
                    pin: Sequence[int] | None = None, bars: bool = False) -> LatencyProfile:
    """The sliding scenario of ``cm`` (:func:`~.scenarios.sliding_loop`): the profile's
    percentiles are ``push_into``'s; ``sliding`` holds the form, the prepare's and the full
    window's figures from the same run, and (``scenario.streams``) the load sweep over that
    many windows (``sliding["load"]``, :func:`~.load.measure_load`). A model without a window
    is refused (UnsupportedError, saying what it needs)."""
    why = sliding_refusal(tuple(cm.input.shape), getattr(cm, "multi_io", False), cm.model_name)
    if why:
        raise UnsupportedError(why)
    window = cm.sliding(auto_prepare=False)
    steps = step_set(data, cm)
    out_step = np.zeros(tuple(cm.output.shape), np.float32)
    xs = input_set(data, cm, cm.batch_size)
    out = output_buffer(cm, cm.batch_size)
    bar = ProgressBar(f"{cm.variant} sliding ({window.form})", scenario.n, bars)
    with pinned(pin):
        t = sliding_loop(window.push_into, window.prepare, cm.predict_into, steps, out_step,
                         xs, out, scenario.n, scenario.max_s, scenario.warmup, scenario.rounds,
                         bar)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    stats = summarize(t.push_ns)
    full = brief(t.full_ns)
    prof = LatencyProfile(
        variant=cm.variant, target=cm.target, precision=cm.precision, batch_size=cm.batch_size,
        scenario=scenario.name, params=scenario.key() | {"loadavg_1m": load}, mode=cm.mode.value,
        throughput=samples_per_s(t.push_ns, 1), duration_s=t.wall_s,
        machine=machine_mod.fingerprint(),
        fidelity=cm.fidelity.to_dict() if cm.fidelity else None,
        artifact_key=cm.artifact.key, interrupted=t.interrupted, **stats)
    prof.sliding = {"form": window.form, "window": window.window,
                    "prepare": brief(t.prepare_ns), "full": full,
                    "push_over_full_p50": (prof.p50_us / full["p50_us"]
                                           if full["n"] and full["p50_us"] > 0 else None)}
    bar.done(f"push p50 {prof.p50_us:.2f} µs  p99 {prof.p99_us:.2f} µs  full window p50 "
             f"{full['p50_us']:.1f} µs  n={prof.n}" + ("  (interrupted)" if t.interrupted else ""))
    if scenario.streams and not t.interrupted:
        from .load import measure_load
        with pinned(pin):
            load = measure_load(cm, scenario, steps, bars)
        prof.sliding["load"] = load
        last = load["points"][-1] if load["points"] else {}
        prof.interrupted = bool(last.get("interrupted")
                                or any(o["interrupted"] for o in last.get("open", [])))
    return prof


def cached_measure(cm: "CompiledModel", scenario: Scenario, cache: ProfileCache | None,
                   data: Any = None, pin: Sequence[int] | None = None,
                   bars: bool = False, reuse: bool = True,
                   batch_size: int | None = None) -> tuple[LatencyProfile, bool]:
    """:func:`measure` through the profile cache: ``(profile, was_cached)``. ``reuse``: a
    cached profile of the same artifact, machine, scenario, batch and pinning stands for the
    measurement; otherwise it is measured, and the fresh profile (unless interrupted) is
    kept for the next run either way."""
    batch = cm.batch_size if (cm.static_batch or batch_size is None) else batch_size
    key = profile_key(cm.artifact.key, machine_mod.fingerprint()["id"], scenario.key(), batch,
                      list(pin) if pin else None)
    if cache is not None and reuse:
        hit = cache.get(key)
        if hit is not None:
            hit.fidelity = cm.fidelity.to_dict() if cm.fidelity else hit.fidelity
            return hit, True
    prof = measure(cm, scenario, data, batch_size, pin, bars)
    if cache is not None and not prof.interrupted:
        cache.put(key, prof)
    return prof, False


def measure_interleaved(cms: list["CompiledModel"], scenario: SingleStream, rounds: int = 5,
                        cache: ProfileCache | None = None, reuse: bool = True,
                        data: Any = None, progress: Progress | None = None,
                        what: str = "") -> list[tuple[LatencyProfile, bool]]:
    """Single-stream profiles of several variants measured *interleaved*: ``rounds`` rounds,
    each running every variant for ``n / rounds`` calls, samples pooled per variant. Machine
    noise (another process, a frequency change) then falls on all candidates alike instead of
    on whichever was measured at the wrong moment, which is what a ranking needs. Variants
    with a cached profile are not re-measured (unless ``reuse`` is false). ``progress``
    hears which: ``"WHAT: profiles from cache (3)"`` or ``"WHAT: measuring 2 candidate(s)
    interleaved …"``."""
    fp = machine_mod.fingerprint()
    keys = [profile_key(cm.artifact.key, fp["id"], scenario.key() | {"rounds": rounds},
                        cm.batch_size) for cm in cms]
    out: list[tuple[LatencyProfile, bool] | None] = [None] * len(cms)
    todo = []
    for i, (cm, key) in enumerate(zip(cms, keys, strict=True)):
        hit = cache.get(key) if (cache is not None and reuse) else None
        if hit is not None:
            hit.fidelity = cm.fidelity.to_dict() if cm.fidelity else hit.fidelity
            out[i] = (hit, True)
        else:
            todo.append(i)
    if progress is not None:
        hits = len(cms) - len(todo)
        pre = f"{what}: " if what else ""
        if not todo:
            progress(f"{pre}profiles from cache ({hits} candidate(s), this machine, same artifacts)")
        else:
            progress(f"{pre}measuring {len(todo)} candidate(s) interleaved ({scenario.n} calls "
                     f"each in {rounds} rounds)" + (f"; {hits} profile(s) from cache" if hits else ""))
    if todo:
        per = max(scenario.n // rounds, 1)
        bufs = {i: (input_set(data, cms[i], cms[i].batch_size),
                    output_buffer(cms[i], cms[i].batch_size)) for i in todo}
        pools: dict[int, list[np.ndarray]] = {i: [] for i in todo}
        walls = {i: 0.0 for i in todo}
        for r in range(rounds):
            for i in todo:
                xs, o = bufs[i]
                t = closed_loop(cms[i].predict_into, xs, o, per, scenario.max_s / rounds,
                                scenario.warmup if r == 0 else min(scenario.warmup, 20))
                pools[i].append(t.latency_ns)
                walls[i] += t.wall_s
                if t.interrupted:
                    raise KeyboardInterrupt
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = None
        for i in todo:
            cm = cms[i]
            pooled = np.concatenate(pools[i])
            stats = summarize(pooled)
            prof = LatencyProfile(
                variant=cm.variant, target=cm.target, precision=cm.precision,
                batch_size=cm.batch_size, scenario=scenario.name,
                params=scenario.key() | {"rounds": rounds, "loadavg_1m": load}, mode=cm.mode.value,
                throughput=samples_per_s(pooled, cm.batch_size),
                duration_s=walls[i], machine=fp,
                fidelity=cm.fidelity.to_dict() if cm.fidelity else None,
                artifact_key=cm.artifact.key, **stats)
            if cache is not None:
                cache.put(keys[i], prof)
            out[i] = (prof, False)
    return [o for o in out if o is not None]


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """What every variant of one :func:`bench_model` call is built and measured with: the
    run's context, the loaded model, its sample inputs and the call's own choices (pinning,
    progress bars, profile reuse, the data every compile gets)."""

    ctx: RunContext
    model: "Model"
    data: Any
    pin: Sequence[int] | None = None
    bars: bool = True
    reuse_profiles: bool = False
    calibration_data: Any = None
    validation_data: Any = None
    #: Target-specific compile options for every variant (``hwb bench -O``).
    options: dict[str, Any] | None = None

    def compile(self, target: str, precision: str, batch_size: int | None = None) -> "CompiledModel":
        """The variant, compiled (or loaded from the store) in this run's context, ungated: a
        benchmark measures and reports a variant whatever its fidelity (the report flags it)."""
        return hwb_compile(self.model, target, precision, batch_size=batch_size,
                           context=self.ctx, calibration_data=self.calibration_data,
                           validation_data=self.validation_data, options=self.options, gate=False)

    def measure(self, cm: "CompiledModel", sc: Scenario,
                batch_size: int | None = None) -> tuple[LatencyProfile, bool]:
        """``cm`` in ``sc`` through the run's profile cache (:func:`cached_measure`)."""
        return cached_measure(cm, sc, self.ctx.profiles, self.data, self.pin, self.bars,
                              self.reuse_profiles, batch_size)


def bench_model(model: Any, targets: Sequence[str] = ("*",), precisions: Sequence[str] | None = None,
                scenarios: Sequence[Scenario] = (SingleStream(),), *,
                context: RunContext | None = None, pin: Sequence[int] | None = None,
                bars: bool = True, reuse_profiles: bool = False,
                max_ref_s: float | None = 3.0, results: BenchResults | None = None,
                calibration_data: Any = None, validation_data: Any = None,
                options: dict[str, Any] | None = None) -> BenchResults:
    """Compile ``model`` on every matching, available target × precision and measure each
    variant in each scenario. Failures (compile errors, unavailable targets) are recorded with
    their reason, never raised. Ctrl-C stops the run and returns what was measured
    (``results.interrupted``). ``context`` gives the store, registry, profile cache and
    progress callback (default :class:`~hwbackends.context.RunContext`: no profile cache);
    with a profile cache, every fresh profile is kept in it, and ``reuse_profiles`` lets a
    cached one stand for a new measurement. ``bars``: live progress bars on stderr.
    ``max_ref_s`` caps each scenario's time on the slow ``ref`` target (the source framework;
    a baseline, not a contender). A slow-to-build target (``Target.slow_compile``) matched
    only by ``*`` is listed, not built (:func:`~hwbackends.registry.slow_unless_named`).
    ``calibration_data`` and ``validation_data`` go to every compile (see
    :func:`hwbackends.compile`); where the data came from is each variant row's ``data`` and
    ``results.data``. ``options``: target-specific compile options for every variant (a target
    that refuses them gives a failed row, saying why)."""
    from ..models import load_model

    ctx = context or RunContext()
    say, reg = ctx.progress, ctx.registry
    names = select_targets(reg, targets)
    skipped = slow_unless_named(reg, names, targets)
    if precisions:  # Target.accepts: `-p 'ap_fixed<16,6>'` builds on fpga.hls4ml, listed or not
        why = unaccepted_precisions([reg.targets[n] for n in names], precisions)
        if why:  # refused before the model is loaded
            raise UnsupportedError(why + "; choose one of those with -p")
    m = load_model(model)
    no_window = sliding_refusal(tuple(m.inputs[0].shape), m.multi_io, m.name)
    if no_window and any(isinstance(sc, Sliding) for sc in scenarios):
        if all(isinstance(sc, Sliding) for sc in scenarios):
            raise UnsupportedError(no_window)  # refused before anything is compiled
        say(f"sliding: skipped: {no_window}")
        scenarios = [sc for sc in scenarios if not isinstance(sc, Sliding)]
    res = results or BenchResults(model={}, machine={})
    # A caller's (empty) results object is filled in place, so it holds whatever was measured
    # however this function ends: ``hwb bench`` writes it on every exit path.
    res.model, res.machine = res.model or m.describe(), res.machine or machine_mod.fingerprint()
    if any(isinstance(sc, (Server, Burst)) for sc in scenarios) and "open_loop" not in res.machine:
        with open_loop_cores(pin) as where:  # what each open-loop row's ``affinity`` will say
            res.machine = {**res.machine, "open_loop": where}
    run = BenchRun(ctx, m, m.representative(256, seed=2), pin, bars, reuse_profiles,
                   calibration_data, validation_data, options)
    try:
        for name in names:
            tgt = reg.targets[name]
            avail = safe_probe(tgt).to_dict()
            res.availability.append({"target": name, "family": tgt.family,
                                     "precisions": list(tgt.precisions), **avail}
                                    | ({"skipped": skipped[name]} if name in skipped else {}))
            if name in skipped and avail["mode"] != "unavailable":
                say(f"{name}: {skipped[name]}")
                continue
            if avail["mode"] == "unavailable":
                say(f"{name}: unavailable ({avail['reason']})")
                continue
            for prec in precisions_to_build(tgt, precisions):
                try:
                    cm = run.compile(name, prec)
                except HwbError as exc:
                    say(f"{label(name, prec)}: {type(exc).__name__}: {exc}")
                    res.variants.append(VariantRecord.failed(name, prec, avail["mode"],
                                                             f"{type(exc).__name__}: {exc}"))
                    continue
                res.variants.append(VariantRecord.from_compiled(cm, reg))
                note_data(res, cm.data)
                for sc in scenarios:
                    if name == "ref" and max_ref_s is not None:
                        sc = dataclasses.replace(sc, max_s=min(sc.max_s, max_ref_s))
                    if isinstance(sc, Batch):
                        _sweep(res, run, cm, sc)
                    else:
                        _one(res, run, cm, sc)
    except KeyboardInterrupt:
        res.interrupted = True
        say("interrupted: keeping what was measured")
    return res


def _one(res: BenchResults, run: BenchRun, cm: "CompiledModel", sc: Scenario) -> None:
    """One variant in one (non-batch) scenario."""
    prof, hit = run.measure(cm, sc)
    if hit:
        run.ctx.progress(f"{cm.variant} {sc.name}: profile from cache (this machine, same artifact)")
    res.profiles.append(prof)
    if prof.interrupted:
        raise KeyboardInterrupt


def note_data(res: BenchResults, data: dict[str, Any]) -> None:
    """``res.data``: the run's validation source and (from the first calibrated variant) its
    calibration source."""
    if not data:
        return
    cur = res.data or {}
    res.data = {"validation": cur.get("validation") or data.get("validation"),
                "calibration": cur.get("calibration") or data.get("calibration")}


def _sweep(res: BenchResults, run: BenchRun, base_cm: "CompiledModel", sc: Batch) -> None:
    """The batch scenario: one profile per batch size (static-batch targets compile a variant
    per size, cached artifacts like any other; a ``batch_independent`` target's one build
    serves every size, so its precision search is not run again)."""
    for size in sc.sizes:
        if not base_cm.static_batch or size == base_cm.batch_size:
            cm = base_cm
        else:
            try:
                cm = run.compile(base_cm.target, base_cm.precision, batch_size=size)
            except HwbError as exc:
                run.ctx.progress(f"{base_cm.variant} batch {size}: {type(exc).__name__}: {exc}")
                res.variants.append(VariantRecord.failed(base_cm.target, base_cm.precision,
                                                         base_cm.mode.value,
                                                         f"{type(exc).__name__}: {exc}", size))
                continue
        prof, _ = run.measure(cm, sc, batch_size=size)
        res.profiles.append(prof)
        if prof.interrupted:
            raise KeyboardInterrupt
