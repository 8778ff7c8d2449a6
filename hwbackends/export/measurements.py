"""What a results file measured about one variant, and the server settings that follow.

:func:`read_measurements` is the one place ``hwb export`` reads a results file (through
:meth:`hwbackends.bench.results.BenchResults.load`): a change of the results format touches
that function only. Everything else here works on :class:`Measured` and is pure arithmetic,
so the mapping from measurements to settings is tested without a server.

The mapping (docs/export.md has the table):

- ``max_batch_size``: the largest measured batch size (no setting beyond what was measured),
  lowered to the largest size whose p99 fits the deadline when a strategy gives one, and never
  above the engine's own maximum (a TensorRT profile);
- ``preferred_batch_size``: the measured sizes > 1 (≤ ``max_batch_size``) whose cost per row
  (median call / batch) is lower than at every smaller measured size: batching to them pays;
- ``max_queue_delay``: half of (deadline − p99 at ``max_batch_size``): a request that waited
  that long, then behind one running batch, then in the largest batch still meets its
  deadline, with room for the server's own overhead; without a deadline, the p99 of one
  batch-1 call (wait at most one call's tail for company);
- queue timeout = the deadline, requests past it rejected;
- instances × threads per instance ≤ the measured machine's usable cores.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError, UnsupportedError

#: Scenarios whose profiles are per-call costs at a known batch size with no queueing in them.
CLOSED_LOOP = ("batch", "single-stream")


@dataclass(frozen=True)
class SizeCost:
    """One measured batch size: median and p99 per call (µs), and the sample count."""

    batch: int
    p50_us: float
    p99_us: float
    n: int
    scenario: str

    @property
    def per_row_us(self) -> float:
        return self.p50_us / self.batch


@dataclass(frozen=True)
class Measured:
    """Every closed-loop figure of one variant on one machine, by batch size."""

    variant: str
    machine: str
    cores: int
    mode: str
    sizes: tuple[SizeCost, ...]
    command: str
    source: str
    model: str = ""
    fingerprint: str = ""

    def at(self, batch: int) -> SizeCost:
        for s in self.sizes:
            if s.batch == batch:
                return s
        raise InputError(f"{self.variant} was not measured at batch {batch} on {self.machine}; "
                         f"measured: {', '.join(str(s.batch) for s in self.sizes)}")

    def provenance(self) -> list[str]:
        """Lines for the comment at the top of every config written from these figures."""
        figs = ", ".join(f"b{s.batch} p50 {s.p50_us:.1f} µs p99 {s.p99_us:.1f} µs (n={s.n})"
                         for s in self.sizes)
        return [f"measured: {self.variant} ({self.mode}) on {self.machine}, {self.cores} cores",
                f"per batch size: {figs}",
                f"from {self.source}: {self.command or '(no command recorded)'}"]


def read_measurements(path: str | Path, variant: str, model: Any = None,
                      machine: str | None = None) -> dict[str, Measured]:
    """The closed-loop profiles of ``variant`` in results file ``path``, one
    :class:`Measured` per machine (a fleet file has several; a ``hwb bench`` file one), keyed by
    a short machine name usable in a file name. ``model``: the loaded model, checked against the
    file's (a results file of another model is refused). ``machine``: keep only that one."""
    from ..bench.results import BenchResults

    res = BenchResults.load(path)
    if model is not None and res.model.get("fingerprint") not in (None, model.fingerprint):
        raise InputError(f"{path} measured model {res.model.get('name')!r} (fingerprint "
                         f"{res.model.get('fingerprint')}), not {model.name!r} "
                         f"({model.fingerprint}); export with the results of this model "
                         f"(`hwb bench {model.name} -s batch -o R.json`)")
    by_machine: dict[str, dict[int, SizeCost]] = {}
    info: dict[str, tuple[int, str]] = {}
    for p in res.profiles:
        if p.variant != variant or p.scenario not in CLOSED_LOOP or not p.n or p.interrupted:
            continue
        m = p.machine or res.machine or {}
        name = _machine_name(m)
        if machine is not None and name != machine:
            continue
        row = SizeCost(p.batch_size, float(p.p50_us), float(p.p99_us), int(p.n), p.scenario)
        sizes = by_machine.setdefault(name, {})
        # a batch sweep beats a single-stream figure at the same size (same loop, more sizes)
        if p.batch_size not in sizes or p.scenario == "batch":
            sizes[p.batch_size] = row
        info[name] = (int(m.get("usable_cores") or m.get("cores") or 1), p.mode)
    if not by_machine:
        have = sorted({p.variant for p in res.profiles})
        where = f" on machine {machine!r}" if machine else ""
        raise InputError(f"{path} holds no closed-loop (batch or single-stream) profile of "
                         f"{variant}{where}; it has {', '.join(have) or 'no profiles'}. "
                         f"Measure it: `hwb bench MODEL -t {variant.split(':')[0]} "
                         f"-p {variant.split(':')[-1]} -s batch:sizes=1/8/32 -o {Path(path).name}`")
    return {name: Measured(variant, name, info[name][0], info[name][1],
                           tuple(sizes[b] for b in sorted(sizes)), res.command, str(path),
                           str(res.model.get("name", "")), str(res.model.get("fingerprint", "")))
            for name, sizes in by_machine.items()}


def _machine_name(m: dict[str, Any]) -> str:
    """A file-name-safe label for a machine row: the fleet label/hostname, else its id."""
    raw = str(m.get("label") or m.get("hostname") or m.get("id") or "local")
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in raw)[:64]


@dataclass(frozen=True)
class Settings:
    """Server settings for one variant on one machine, each from a measured figure."""

    max_batch_size: int
    preferred: tuple[int, ...]
    queue_delay_us: int
    timeout_us: int | None
    instances: int
    threads: int
    warmup_sizes: tuple[int, ...]
    deadline_us: float | None
    why: list[str] = field(default_factory=list)


def plan(m: Measured, *, deadline_us: float | None = None, max_batch: int | None = None,
         engine_max: int | None = None, threads: int = 1, instances: int | None = None) -> Settings:
    """The settings :mod:`this module's docstring <hwbackends.export.measurements>` derives
    from ``m``. ``max_batch``: the user's cap; ``engine_max``: the artifact's own limit (a
    TensorRT profile); ``threads``: intra-op threads per instance; ``instances``: the user's
    count (default: as many as the cores allow). Impossible requests raise, saying why."""
    measured = [s.batch for s in m.sizes]
    why: list[str] = []
    if engine_max is not None and max_batch is not None and max_batch > engine_max:
        raise UnsupportedError(f"--max-batch-size {max_batch} is beyond the engine's optimization "
                               f"profile (max batch {engine_max}); the server would refuse "
                               f"larger batches: ask for ≤ {engine_max} or rebuild the engine "
                               f"with --batch-size {max_batch}")
    if max_batch is not None and max_batch < 1:
        raise ConfigError(f"--max-batch-size must be ≥ 1, got {max_batch}")
    if max_batch is not None and max_batch > measured[-1]:
        raise InputError(f"--max-batch-size {max_batch} is beyond the largest measured batch "
                         f"size {measured[-1]} of {m.variant} on {m.machine}: no setting comes "
                         f"from a guess. Measure it: `hwb bench … -s batch:sizes="
                         f"{'/'.join(map(str, measured + [max_batch]))}`")
    cap = min(x for x in (max_batch, engine_max, measured[-1]) if x is not None)
    usable = [s for s in m.sizes if s.batch <= cap]
    if not usable:
        raise InputError(f"{m.variant} on {m.machine} was measured only at batch sizes "
                         f"{measured}, all above the limit {cap}; measure smaller sizes")
    if deadline_us is not None:
        fits = [s for s in usable if s.p99_us < deadline_us]
        if not fits:
            raise UnsupportedError(
                f"{m.variant} on {m.machine}: p99 {usable[0].p99_us:.1f} µs at batch "
                f"{usable[0].batch} already exceeds the strategy's deadline {deadline_us:.0f} µs; "
                f"no batching setting can meet it: choose a faster variant or a slower tier")
        if fits[-1].batch < usable[-1].batch:
            why.append(f"max_batch_size {fits[-1].batch}, not {usable[-1].batch}: p99 at "
                       f"{usable[-1].batch} is {usable[-1].p99_us:.1f} µs, over the deadline "
                       f"{deadline_us:.0f} µs")
        usable = fits
    top = usable[-1]
    preferred: list[int] = []
    best = usable[0].per_row_us
    for s in usable[1:]:
        if s.per_row_us < best:
            preferred.append(s.batch)
            best = s.per_row_us
    why.append("preferred_batch_size: " + (", ".join(
        f"{b} ({m.at(b).per_row_us:.2f} µs/row)" for b in preferred) or "none (no measured size "
        "costs less per row than batch 1)") + f"; batch 1 costs {usable[0].per_row_us:.2f} µs/row")
    if deadline_us is not None:
        # Half the slack waits for company; the other half is headroom for waiting behind a
        # batch already running and for the server's own overhead, which an in-process
        # measurement does not contain. At the full slack a request that waited it out would
        # meet the queue timeout (= the deadline) within scheduling jitter and be rejected.
        delay = int((deadline_us - top.p99_us) / 2)
        why.append(f"max_queue_delay {delay} µs = (deadline {deadline_us:.0f} − p99 "
                   f"{top.p99_us:.1f} at batch {top.batch}) / 2: the other half is headroom")
    else:
        delay = int(round(usable[0].p99_us))
        why.append(f"max_queue_delay {delay} µs = p99 of one batch-{usable[0].batch} call (no "
                   f"strategy deadline given)")
    if threads < 1:
        raise ConfigError(f"--threads must be ≥ 1, got {threads}")
    most = max(1, m.cores // threads)
    if instances is None:
        instances = most
    elif instances < 1 or instances * threads > m.cores:
        raise ConfigError(f"{instances} instances × {threads} threads = {instances * threads} "
                          f"threads on {m.machine}'s {m.cores} cores: oversubscribed cores add "
                          f"to the tail; use at most {most} instances at {threads} threads")
    why.append(f"instance_group count {instances} × {threads} threads ≤ {m.cores} cores")
    return Settings(top.batch, tuple(preferred), max(0, delay),
                    int(deadline_us) if deadline_us is not None else None, instances, threads,
                    tuple(s.batch for s in usable), deadline_us, why)


def strategy_deadline(config: str | Path, strategy: str) -> float:
    """A strategy's deadline (µs): its ``timeout_us`` when set, else its tier's p99 budget."""
    from ..config import load_config

    cfg = load_config(config, check_targets=False)
    if strategy not in cfg.strategies:
        raise ConfigError(f"{config} has no strategy {strategy!r}; it has "
                          f"{', '.join(cfg.strategies)}")
    s = cfg.strategies[strategy]
    return float(s.timeout_us) if s.timeout_us else float(cfg.tiers[s.tier].p99_us)
