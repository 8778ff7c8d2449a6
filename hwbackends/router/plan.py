"""Routing decisions: for one strategy, every candidate variant, measured and judged.

The policy, in order: list every allowed target, and without building them reject those
no build could make eligible (an emulated target when emulated and modelled latencies are not
ranked; a slow build only ``*`` matched); compile on every other available target ×
precision (cached); reject variants whose fidelity misses the strategy's tolerance; never
rank an emulated variant by latency unless the config allows it; measure the rest
(the strategy's scenario: single-stream by default, or ``sliding``, a windowed model fed one
tick at a time, ranked by ``push_into``'s p99; profiles cached per artifact and machine); a
``hwb_choose`` plugin may pick;
otherwise choose the lowest p99 within the tier's budget, and when none meets it say so and
name the closest.

What a built variant is worth (build error, fidelity gate, modelled and emulated rules) is
one function, :func:`judge`, over its :class:`~hwbackends.variant.VariantRecord`: the live
planning here and the routing of a results file (:func:`decide_from_results`: ``hwb bench
--route``, ``hwb route --fleet-results``) both go through it.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bench import LatencyProfile, SingleStream, Sliding
from ..bench.harness import cached_measure, measure_interleaved
from ..bench.load import AtLoad, at_load, parse_load
from ..bench.profile import sliding_summary
from ..bench.scenarios import NMI_SWEEP
from ..compiler import compile as hwb_compile
from ..context import RunContext
from ..errors import HwbError
from ..fidelity import describe_kind, with_kind
from ..labels import label, push_of
from ..registry import (
    precisions_to_build,
    safe_probe,
    select_targets,
    slow_unless_named,
)
from ..samples import describe as describe_data
from ..specs import MODELLED, Availability, Mode
from ..units import fmt_us
from ..variant import VariantRecord, machine_key
from .modelled import modelled_estimate, modelled_profile
from .modelled import reason as modelled_reason

if TYPE_CHECKING:  # pragma: no cover
    from ..bench import BenchResults
    from ..compiled import CompiledModel
    from ..config import StrategiesFile, StrategyConfig
    from ..models import Model
    from ..registry import Registry

log = logging.getLogger("hwbackends.router")


@dataclass(frozen=True)
class Tier:
    """What ``hwb_choose`` receives as ``tier``."""

    name: str
    p99_us: float


@dataclass
class Candidate:
    """One variant considered for one strategy, with the verdict and the reasons for it.

    ``status``: ``chosen``, ``fallback`` (eligible, serves on failover), ``over-budget``
    (eligible, measured above the tier budget: a fallback of last resort), ``rejected``
    (fidelity, emulated), ``unavailable`` (the target cannot run here) or ``failed``
    (compile error)."""

    strategy: str
    target: str
    precision: str
    mode: str
    status: str = "candidate"
    reasons: list[str] = field(default_factory=list)
    cm: "CompiledModel | None" = field(default=None, repr=False)
    profile: LatencyProfile | None = None
    profile_cached: bool = False
    fidelity: dict[str, Any] | None = None
    #: Where its calibration and validation inputs came from (``CompiledModel.data``).
    data: dict[str, Any] | None = None
    #: The variant record it was judged from (:func:`judge`); ``None`` for a target never built.
    record: VariantRecord | None = field(default=None, repr=False)
    #: The target's family (``Target.family``: cpu, gpu, tpu, fpga, ref), what a
    #: ``hwb_choose`` plugin tests instead of the target's name; set by :func:`decide` from
    #: the run's registry ("" for a target not registered there).
    family: str = ""
    #: A strategy with a sliding load: what that load costs this variant (cores, knee, the
    #: p99 at it: :func:`hwbackends.bench.load.at_load`); its p99 is then the one ranked.
    load: AtLoad | None = None

    @property
    def variant(self) -> str:
        # with the record's push form (``cpu.native:fp32+push=int8``)
        return label(self.target, self.precision, self.record.push if self.record else None)

    @property
    def p99_us(self) -> float | None:
        """The p99 ranked: at the strategy's sliding load when it declares one, else the
        profile's."""
        if self.load is not None:
            return self.load.p99_us
        return self.profile.p99_us if self.profile else None

    def to_dict(self) -> dict[str, Any]:
        p = self.profile
        return {"variant": self.variant, "target": self.target, "precision": self.precision,
                "mode": self.mode, "status": self.status, "reasons": self.reasons,
                "p50_us": p.p50_us if p else None, "p99_us": p.p99_us if p else None,
                "p999_us": p.p999_us if p else None, "n": p.n if p else None,
                "profile_cached": self.profile_cached, "fidelity": self.fidelity,
                "data": self.data, "load": self.load.to_dict() if self.load else None}


@dataclass
class Decision:
    """The routing of one strategy: the chosen variant and the failover order."""

    strategy: str
    tier: str
    budget_us: float
    candidates: list[Candidate]
    order: list[Candidate] = field(default_factory=list)  # serving order, chosen first
    meets_budget: bool = False
    chosen_by: str = "policy"
    note: str = ""
    #: The output kind the fidelity was judged as (declared or inferred, in words) and the
    #: strategy's fidelity gate with its defaults (``--explain``).
    output_kind: str = ""
    tolerance: str = ""
    #: The scenario whose p99 ranked the candidates (the strategy's ``scenario``).
    scenario: str = "single-stream"
    #: The strategy's sliding load (``{"streams", "tick_rate_hz", "cores"}``), or None.
    load: dict[str, Any] | None = None

    @property
    def chosen(self) -> Candidate | None:
        return self.order[0] if self.order else None

    def to_dict(self) -> dict[str, Any]:
        c = self.chosen
        return {"strategy": self.strategy, "tier": self.tier, "budget_us": self.budget_us,
                "chosen": c.variant if c else None, "chosen_mode": c.mode if c else None,
                "chosen_p99_us": c.p99_us if c else None, "meets_budget": self.meets_budget,
                "chosen_by": self.chosen_by, "note": self.note,
                "output_kind": self.output_kind, "tolerance": self.tolerance,
                "scenario": self.scenario, "load": self.load,
                "chosen_cores": c.load.cores_used if c and c.load else None,
                "failover": [x.variant for x in self.order[1:]],
                "candidates": [x.to_dict() for x in self.candidates]}


def explain(d: Decision) -> str:
    """The human explanation ``hwb route --explain`` prints for one strategy."""
    c = d.chosen
    head = (f"strategy {d.strategy}: tier {d.tier} (p99 ≤ {fmt_us(d.budget_us)}) → "
            + (f"{c.variant} ({c.mode}, p99 {fmt_us(c.p99_us)})" if c else "NO VARIANT"))
    lines = [head]
    if d.note:
        lines.append(f"  ! {one_line(d.note)}")
    data = next((x.data for x in d.candidates if x.data and x.data.get("calibration")), None) \
        or next((x.data for x in d.candidates if x.data), None)
    if data:
        lines.append(f"  fidelity {describe_data(data)}")
    if d.output_kind:
        lines.append(f"  output kind: {d.output_kind}")
    if d.tolerance:
        lines.append(f"  fidelity gate: {d.tolerance}")
    if d.load:
        ld = d.load
        lines.append(f"  ranked at its sliding load: {ld['streams']:,} streams × "
                     f"{ld['tick_rate_hz']:g} ticks/s = {ld['streams'] * ld['tick_rate_hz']:,.0f} "
                     f"ticks/s on at most {ld['cores']} core(s): fewest cores whose knee holds "
                     f"it, then the p99 at each core's share (interpolated from the sweep)")
    elif d.scenario == "sliding":
        lines.append("  ranked by the sliding scenario: p99 of push_into (one tick in, the "
                     "window's answer out); the prepare and the full window are measured apart")
    lines.append(f"  {'VARIANT':<30} {'MODE':<11} {'p99':>10} {'corr':>9} {'max abs':>9}  VERDICT")
    for x in d.candidates:
        f = x.fidelity or {}
        corr = f"{f['corr']:.6f}" if "corr" in f else "—"
        mx = f"{f['max_abs']:.2g}" if "max_abs" in f else "—"
        verdict = x.status + (": " + "; ".join(map(one_line, x.reasons)) if x.reasons else "")
        lines.append(f"  {x.variant:<30} {x.mode:<11} {fmt_us(x.p99_us):>10} {corr:>9} {mx:>9}  {verdict}")
    for x in d.candidates:
        if x.profile is not None and x.profile.sliding:
            lines.append(f"  {x.variant}: {sliding_summary(x.profile)}")
        if x.load is not None:
            lines.append(f"  {x.variant}: {x.load.describe()}")
    if len(d.order) > 1:
        lines.append("  failover order: " + " → ".join(x.variant for x in d.order))
    return "\n".join(lines)


def one_line(reason: str) -> str:
    """A reason as one table cell: an error's first line (its traceback stays in --json)."""
    first, _, rest = reason.strip().partition("\n")
    return first + (f" (+{rest.count(chr(10)) + 1} lines: --json has the whole error)" if rest else "")


def allows_emulated(s: "StrategyConfig", cfg: "StrategiesFile") -> bool:
    """Whether strategy ``s`` ranks emulated latencies (its own setting, else the router's)."""
    return cfg.router.allow_emulated if s.allow_emulated is None else s.allow_emulated


def emulated_rejection(why: str) -> str:
    """The reason an emulated variant is not ranked; ``why`` is its availability's reason."""
    return (f"emulated ({why}): its latency is not this hardware's; set allow_emulated = "
            f"true to rank it")


def rejected_before_compile(s: "StrategyConfig", cfg: "StrategiesFile", av: Availability) -> str | None:
    """Why no variant of a target with availability ``av`` could be chosen for ``s``, known
    before compiling it (so it is not built), or ``None``: an emulated target when the
    strategy ranks neither emulated nor modelled latencies (and the target cannot find a
    board at load, ``details["board"]``, which would make it hardware). The fidelity gate
    needs the build."""
    if (av.mode is Mode.EMULATED and not allows_emulated(s, cfg) and not s.allow_modelled
            and not av.details.get("board")):
        return emulated_rejection(av.reason) + " (not built)"
    return None


def judge(rec: VariantRecord, name: str, s: "StrategyConfig", cfg: "StrategiesFile") -> Candidate:
    """The candidate policy, one place for every router: what variant record ``rec`` is worth
    to strategy ``name``, whether it was compiled just now (:func:`plan_strategy`) or read
    from a results file (:func:`candidates_from_results`: ``hwb bench --route``,
    ``hwb route --fleet-results``). In order: a build error fails it; **fidelity gates speed** (a
    variant outside the strategy's tolerance, or with none measured, is rejected); with
    ``allow_modelled`` a modelled hardware estimate is its latency (labelled so); an emulated
    variant is rejected unless the strategy ranks emulated latencies. What survives has
    status ``to-measure``: the caller gives it its profile."""
    c = Candidate(name, rec.target, rec.precision, rec.mode, record=rec)
    fid = rec.fidelity
    if fid is not None and s.output_kind and (fid.kind, fid.kind_source) != (s.output_kind, "declared"):
        fid = with_kind(fid, s.output_kind)  # measured before the strategy declared it
    c.fidelity = fid.to_dict() if fid else None
    c.data = rec.data
    if rec.error:
        c.status, c.reasons = "failed", [rec.error]  # whole: --json and the report's fold
        return c
    bad = s.fidelity.tolerance(s.output_kind).violations(fid) if fid else ["no fidelity measured"]
    if bad:
        c.status, c.reasons = "rejected", ["fidelity: " + ", ".join(bad)]
        return c
    est = modelled_estimate(rec) if s.allow_modelled else None
    if est is not None:  # ranked by its modelled latency, labelled (router/modelled.py)
        c.profile, c.mode = modelled_profile(rec, est), MODELLED
        c.status, c.reasons = "candidate", [modelled_reason(est)]
        return c
    if c.mode == Mode.EMULATED.value and not allows_emulated(s, cfg):
        c.status, c.reasons = "rejected", [emulated_rejection(rec.mode_reason or "a stand-in")]
        return c
    c.status = "to-measure"
    return c


def plan_strategy(name: str, s: "StrategyConfig", cfg: "StrategiesFile", model: "Model",
                  ctx: RunContext, *, reuse_profiles: bool = True,
                  calibration_data: Any = None) -> Decision:
    """Compile, check (:func:`judge`), measure and rank every candidate for strategy
    ``name``, in the run's context ``ctx`` (store, registry, profile cache, progress);
    ``reuse_profiles``: a cached profile stands for a measurement. Targets the strategy's rules reject whatever they build
    (:func:`rejected_before_compile`) and slow builds only ``*`` matched
    (:func:`~hwbackends.registry.slow_unless_named`) are listed with the reason, not
    compiled. ``precisions = [...]`` builds exactly those a target accepts, listed or not
    (:func:`~hwbackends.registry.precisions_to_build`)."""
    say, reg = ctx.progress, ctx.registry
    tier = cfg.tiers[s.tier]
    bench = SingleStream(n=cfg.router.bench.n, warmup=cfg.router.bench.warmup,
                         max_s=cfg.router.bench.max_s)
    names = select_targets(reg, s.targets, where=f"strategy {name!r} targets")
    slow = slow_unless_named(reg, names, s.targets)
    cands: list[Candidate] = []
    for tname in names:
        tgt = reg.targets[tname]
        av = safe_probe(tgt)
        if not av.usable:
            cands.append(Candidate(name, tname, "", "unavailable", "unavailable", [av.reason]))
            continue
        early = rejected_before_compile(s, cfg, av) or slow.get(tname)
        if early:
            say(f"{name}: {tname} rejected without building it: {early}")
        for prec in precisions_to_build(tgt, s.precisions):
            if early:
                cands.append(Candidate(name, tname, prec, av.mode.value, "rejected", [early]))
                continue
            cm = None
            try:
                cm = hwb_compile(model, tname, prec, batch_size=s.batch_size, context=ctx,
                                 isolate_compile=cfg.router.isolate_compile,
                                 calibration_data=calibration_data,
                                 output_kind=s.output_kind, gate=False)  # judged below
                rec = VariantRecord.from_compiled(cm, reg)
            except HwbError as exc:
                rec = VariantRecord.failed(tname, prec, av.mode.value, f"{type(exc).__name__}: {exc}")
            c = judge(rec, name, s, cfg)
            c.cm = cm
            cands.append(c)
    todo = [c for c in cands if c.status == "to-measure"]
    if todo and s.scenario == "sliding":
        measure_sliding_candidates(todo, cfg, model, ctx, reuse_profiles, name)
        todo = []
    # Measure the survivors together, interleaved, so they are compared under the same noise.
    if todo:
        profs = measure_interleaved([c.cm for c in todo], bench, cfg.router.bench.rounds,  # type: ignore[misc]
                                    ctx.profiles, reuse_profiles, progress=say, what=name)
        for c, (prof, hit) in zip(todo, profs, strict=True):
            c.profile, c.profile_cached, c.status = prof, hit, "candidate"
    return decide(name, s, tier.p99_us, cands, reg)


def no_sliding(why: str) -> str:
    """The reason a candidate of a sliding strategy is not eligible."""
    return f"no sliding measurement ({why}): a sliding strategy ranks only variants measured sliding"


def measure_sliding_candidates(todo: list[Candidate], cfg: "StrategiesFile", model: "Model",
                               ctx: RunContext, reuse_profiles: bool, name: str) -> None:
    """A sliding strategy's candidates: each one's sliding profile (push, prepare apart, full
    window, interleaved within its own run; cached per artifact and machine), on the model's
    sample windows. One that cannot slide is rejected, saying why."""
    b = cfg.router.bench
    s = cfg.strategies[name]
    sc = Sliding(n=b.n, warmup=b.warmup, max_s=b.max_s, rounds=b.rounds, streams=(),
                 ticks=b.n, budget_us=cfg.tiers[s.tier].p99_us)
    if s.sliding is not None:  # the STAC-ML sweep up to the declared number of windows
        want = s.sliding.streams
        agg = want * s.sliding.tick_rate_hz
        sc = dataclasses.replace(sc, streams=tuple(
            sorted({x for x in NMI_SWEEP if x <= want} | ({want} if want < NMI_SWEEP[-1] else set()))),
            offered_hz=tuple(sorted({agg / s.sliding.cores, agg})))  # the load, per core and on one
    data = model.representative(256, seed=2)
    ctx.progress(f"{name}: measuring {len(todo)} candidate(s) sliding ({sc.n} ticks each, the full "
        f"window interleaved" + (f"; then under load over {'/'.join(map(str, sc.streams))} "
                                 f"windows" if sc.streams else "") + ")")
    for c in todo:
        try:
            c.profile, c.profile_cached = cached_measure(c.cm, sc, ctx.profiles, data,  # type: ignore[arg-type]
                                                         reuse=reuse_profiles)
            c.status = "candidate"
        except HwbError as exc:
            c.status, c.reasons = "rejected", [no_sliding(f"{type(exc).__name__}: {exc}")]
        else:
            judge_load(c, s, cfg.tiers[s.tier].p99_us)


def judge_load(c: Candidate, s: "StrategyConfig", budget: float) -> None:
    """For a strategy with a sliding load: what the load costs candidate ``c`` (its
    profile's load sweep, :func:`~hwbackends.bench.load.at_load` at the tier's budget) as
    ``c.load``; ``c`` is rejected, saying why, when its profile has no sweep or its knee on the
    cores allowed is below the load. No load declared: nothing changes."""
    if s.sliding is None or c.profile is None:
        return
    raw = (c.profile.sliding or {}).get("load")
    if not raw:
        c.status, c.reasons = "rejected", [no_sliding(
            "its sliding profile has no load sweep; measure it with hwb bench -s "
            "sliding:streams=stac")]
        return
    try:
        c.load = at_load(parse_load(raw, f"{c.variant}'s sliding profile"), s.sliding.streams,
                         s.sliding.tick_rate_hz, s.sliding.cores, budget)
    except HwbError as exc:
        c.status, c.reasons = "rejected", [f"{type(exc).__name__}: {exc}"]
        return
    if not c.load.holds:
        c.status, c.reasons = "rejected", [f"load: {c.load.why}"]


def unmeasured_model(s: "StrategyConfig", res: "BenchResults") -> str:
    """Why a results file cannot route strategy ``s`` (its ``model``, a path or ``zoo:NAME``,
    is not the model the file measured), or "" when it can."""
    name = str(res.model.get("name", ""))
    if s.model in (name, f"zoo:{name}") or Path(s.model).stem == name:
        return ""
    return f"strategy model {s.model} was not measured in this run (it measured {name or '?'})"


def candidates_from_results(res: "BenchResults", name: str, s: "StrategyConfig",
                            cfg: "StrategiesFile", node: str | None = None) -> list[Candidate]:
    """The router's candidates for strategy ``name`` from a results file's rows (one
    machine's, ``node``, in a fleet file; every row when ``None``), measuring nothing: each
    variant record goes through :func:`judge`, and a survivor's profile is the newest
    uninterrupted profile of the strategy's scenario (single-stream, or sliding) of the same
    variant at the strategy's batch size in that file (none in a sliding strategy: not
    eligible, saying so); unavailable and skipped targets keep their reason."""
    def wanted(target: str) -> bool:
        return any(fnmatch.fnmatchcase(target, p) for p in s.targets)

    def here(row: Any) -> bool:
        return node is None or machine_key(row) == node

    cands: list[Candidate] = []
    for a in res.availability:
        if here(a) and wanted(a["target"]) and (a["mode"] == "unavailable" or a.get("skipped")):
            status = "unavailable" if a["mode"] == "unavailable" else "rejected"
            cands.append(Candidate(name, a["target"], "", a["mode"], status,
                                   [a.get("reason", "") if status == "unavailable" else a["skipped"]]))
    for rec in res.variants:
        if not (here(rec) and wanted(rec.target)) or (s.precisions and rec.precision not in s.precisions):
            continue
        c = judge(rec, name, s, cfg)
        cands.append(c)
        if c.status != "to-measure":
            continue
        prof = [p for p in res.profiles if here(p) and p.target == c.target
                and p.precision == c.precision and push_of(p.variant) == rec.push
                and p.scenario == s.scenario and p.batch_size == s.batch_size
                and not p.interrupted and (p.params or {}).get("model") in (None, s.model)]
        if not prof and s.scenario == "sliding":
            c.status, c.reasons = "rejected", [no_sliding(
                "none in the results" + (" of this machine" if node else "")
                + "; measure it with hwb bench -s sliding")]
            continue
        if not prof:
            c.status, c.reasons = "failed", [f"no single-stream profile at batch {s.batch_size} "
                                             f"in the results" + (" of this machine" if node else "")]
            continue
        c.profile = max(prof, key=lambda p: p.created)  # the newest
        c.status = "candidate"
        judge_load(c, s, cfg.tiers[s.tier].p99_us)
    return cands


def decide_from_results(res: "BenchResults", name: str, s: "StrategyConfig",
                        cfg: "StrategiesFile", reg: "Registry", node: str | None = None) -> Decision:
    """:func:`decide` on :func:`candidates_from_results`: the routing a results file implies,
    from its own profiles (``hwb bench --route``; per machine, ``hwb route --fleet-results``)."""
    budget = cfg.tiers[s.tier].p99_us
    unmeasured = unmeasured_model(s, res)
    if unmeasured:
        return Decision(name, s.tier, budget, [], note=unmeasured)
    cands = candidates_from_results(res, name, s, cfg, node)
    d = decide(name, s, budget, cands, reg)
    if not cands:
        d.note = (f"no variant of {', '.join(s.targets)} in these results; measure them "
                  f"(hwb bench -t ...) or route live (hwb route)")
    own = [k for k in ("calibration_data", "validation_data") if getattr(s, k, None)]
    if own:  # the file's fidelity was measured on the run's data, not on these
        d.note = "; ".join(x for x in (d.note, f"fidelity from the results' own data, not this "
                                                f"strategy's {' / '.join(own)}") if x)
    return d


def _others(eligible: list[Candidate], chosen: Candidate, budget: float) -> None:
    """Why each eligible candidate but the chosen one is not chosen."""
    for c in eligible:
        if c is not chosen and c.status == "fallback" and c.load is not None \
                and chosen.load is not None and c.load.cores_used > chosen.load.cores_used:
            c.reasons = [f"needs {c.load.cores_used} cores to hold the load; chosen needs "
                         f"{chosen.load.cores_used}"]
        elif c is not chosen and c.status == "fallback":
            c.reasons = [f"p99 {fmt_us(c.p99_us)} ≥ chosen {fmt_us(chosen.p99_us)}"]
        elif c.status == "over-budget":
            c.reasons = [f"p99 {fmt_us(c.p99_us)} > budget {fmt_us(budget)}"]


def rank(c: Candidate) -> tuple[float, ...]:
    """The built-in policy's order: with a sliding load, the fewest cores that hold it (a
    target whose throughput holds it where one core cannot comes first), then the p99 at it;
    else the p99, then the p50."""
    if c.load is not None:
        return (c.load.cores_used, c.load.p99_us, c.profile.p50_us if c.profile else 0.0)
    return (c.profile.p99_us, c.profile.p50_us)  # type: ignore[union-attr]


def decide(name: str, s: "StrategyConfig", budget: float, cands: list[Candidate],
           reg: "Registry") -> Decision:
    """Rank the measured candidates and choose (pin, then plugins, then the built-in policy)."""
    d = Decision(name, s.tier, budget, cands, scenario=s.scenario,
                 load=s.sliding.model_dump() if getattr(s, "sliding", None) is not None else None)
    for c in cands:
        c.family = reg.family(c.target)
    measured = next((c.record.fidelity for c in cands if c.record and c.record.fidelity), None)
    d.output_kind = describe_kind(measured, s.output_kind)
    d.tolerance = s.fidelity.describe()
    eligible = sorted((c for c in cands if c.profile is not None and c.status != "rejected"),
                      key=rank)
    for c in eligible:
        c.status = "fallback" if c.p99_us <= budget else "over-budget"
    if not eligible:
        d.note = ("no target can serve this strategy: "
                  + "; ".join(f"{c.variant}: {c.status} ({'; '.join(c.reasons)})" for c in cands)
                  if cands else "no registered target matches " + ", ".join(s.targets))
        return d
    chosen: Candidate | None = None
    if s.pin:
        chosen = next((c for c in cands if c.variant == s.pin), None)
        if chosen is None or chosen.profile is None:
            why = f"{chosen.status}: {'; '.join(chosen.reasons)}" if chosen else "not a candidate here"
            d.note = f"pinned {s.pin} cannot serve ({why})"
            d.order = []
            return d
        d.chosen_by = "pin"
    if chosen is None:
        answer = reg.call_first("hwb_choose", candidates=list(eligible), tier=Tier(s.tier, budget))
        if answer is not None:
            picked = answer[1]
            if picked in eligible:
                chosen, d.chosen_by = picked, "plugin (hwb_choose)"
            else:
                log.warning("an hwb_choose plugin returned %r, not one of the candidates; ignored",
                            picked)
    if chosen is None:
        within = [c for c in eligible if c.p99_us <= budget]
        chosen = within[0] if within else eligible[0]
    d.meets_budget = chosen.p99_us <= budget
    chosen.status = "chosen"
    why = {"pin": "pinned in the config", "policy": "lowest measured p99"
           + (" within budget" if d.meets_budget else "")}.get(d.chosen_by, f"chosen by {d.chosen_by}")
    if chosen.load is not None and d.chosen_by == "policy":
        why = (f"holds the load on the fewest cores ({chosen.load.cores_used}), then lowest p99 "
               f"at it" + (" within budget" if d.meets_budget else ""))
    # A modelled latency (allow_modelled) keeps its label next to the verdict.
    chosen.reasons = [why] + [r for r in chosen.reasons if chosen.mode == MODELLED and r.startswith(MODELLED)]
    _others(eligible, chosen, budget)
    if not d.meets_budget:
        d.note = (f"no variant meets tier {s.tier} (p99 ≤ {fmt_us(budget)}); "
                  + (f"closest: {chosen.variant} at p99 {fmt_us(chosen.p99_us)}"
                     if d.chosen_by == "policy" else
                     f"{d.chosen_by} chose {chosen.variant} at p99 {fmt_us(chosen.p99_us)}"))
    d.order = [chosen] + [c for c in eligible if c is not chosen]
    return d
