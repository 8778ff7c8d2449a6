"""What a results file measured about one variant, and the server settings that follow.

:func:`read_measurements` is the one place ``hwb export`` reads a results file (through
:meth:`hwbackends.bench.results.BenchResults.load`): a change of the results format touches
that function only. Everything else here works on :class:`Measured` and is pure arithmetic,
so the mapping from measurements to settings is tested without a server.

The mapping (docs/export.md has the table):

- ``max_batch_size``: the largest measured batch size (no setting beyond what was measured),
  lowered to the largest size whose p99 fits the deadline when a strategy gives one, and never
  above the model file's own maximum (an engine built for one batch size);
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

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..bench.results import FORMAT, VERSION
from ..config import MAX_BATCH
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
    #: The results file's own text (its command, the model's name): for callers, never
    #: written into a generated file (:meth:`provenance` leaves them out).
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
        """Lines for the comment at the top of every config written from these figures: our
        own words, validated figures and names made safe (the variant is a registered
        target's, the machine label is sanitized), never text from the model or the file."""
        figs = ", ".join(f"b{s.batch} p50 {s.p50_us:.1f} µs p99 {s.p99_us:.1f} µs (n={s.n})"
                         for s in self.sizes)
        return [f"measured: {self.variant} ({self.mode}) on {self.machine}, {self.cores} cores",
                f"per batch size: {figs}",
                f"model fingerprint {self.fingerprint or '(none)'}"]


#: What export reads of a results file, at most (a results file with CDFs and timelines of a
#: large sweep is a few MB; this bounds what a hostile one makes the parser hold).
MAX_RESULTS_BYTES = 64 << 20
#: What each field of a profile row must be, as the error message says it.
EXPECTED = {
    "batch_size": f"an integer 1..{MAX_BATCH}",
    "n": "an integer ≥ 0 (the sample count)",
    "p50_us": "a finite number of µs > 0, or null when not measured",
    "p99_us": "a finite number of µs > 0 and ≥ p50_us, or null when not measured",
    "variant": "a string (TARGET:PRECISION)", "scenario": "a string", "mode": "a string",
    "interrupted": "true or false", "usable_cores": "an integer 1..65536",
    "cores": "an integer 1..65536", "fingerprint": "the model's fingerprint (hex digits)",
    "format": f"\"{FORMAT}\"", "version": f"{VERSION} (this hwbackends' results format)",
}
_Us = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_Cores = Annotated[int, Field(ge=1, le=65536)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Machine(_Strict):
    label: str | None = None
    hostname: str | None = None
    id: str | None = None
    usable_cores: _Cores | None = None
    cores: _Cores | None = None


class _Row(_Strict):
    """One profile row of the variant being exported, as export needs it."""

    variant: str
    scenario: str
    batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH)]
    n: Annotated[int, Field(ge=0)]
    p50_us: _Us | None
    p99_us: _Us | None
    mode: str
    interrupted: bool = False
    machine: _Machine | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_figures_without_samples(cls, d: Any) -> Any:
        if isinstance(d, dict) and d.get("n") == 0:  # nothing measured: figures are absent
            return {**d, "p50_us": None, "p99_us": None}
        return d

    @model_validator(mode="after")
    def _p99_not_below_p50(self) -> "_Row":
        if self.p50_us is not None and self.p99_us is not None and self.p99_us < self.p50_us:
            raise ValueError(f"p99_us {self.p99_us} is below p50_us {self.p50_us}: a tail "
                             f"cannot be faster than the median")
        return self


class _ModelInfo(_Strict):
    name: str = ""
    fingerprint: Annotated[str, Field(pattern=r"^[0-9a-f]{8,128}$")]


class _File(_Strict):
    """The file's head; rows are checked one by one (only the exported variant's)."""

    format: Literal[FORMAT]  # type: ignore[valid-type]
    version: Literal[VERSION]  # type: ignore[valid-type]
    command: str = ""
    model: _ModelInfo
    machine: _Machine | None = None
    profiles: list[dict[str, Any]]


def _problem(path: str | Path, where: str, exc: ValidationError) -> InputError:
    """The first problem of ``exc`` as ``FILE: field: what was found; expected …``."""
    e = exc.errors()[0]
    loc = [str(x) for x in e["loc"]]
    field = loc[-1] if loc else ""
    dotted = ".".join([where, *loc] if where else loc) or "(top level)"
    got = "missing" if e["type"] == "missing" else f"got {e.get('input')!r:.60}"
    expect = EXPECTED.get(field)
    msg = e["msg"] if e["type"] not in ("missing",) else "required key missing"
    more = f" ({len(exc.errors()) - 1} more problem(s))" if len(exc.errors()) > 1 else ""
    return InputError(f"results file {path}: {dotted}: {msg}, {got}"
                      + (f"; expected {expect}" if expect else "") + more
                      + ". Export from a results file `hwb bench` or `hwb fleet` wrote")


def _load(path: str | Path) -> _File:
    from ..config import read_text_file

    text = read_text_file(path, "results file", MAX_RESULTS_BYTES)
    try:
        raw = json.loads(text)
    except RecursionError:
        raise InputError(f"results file {path}: values nested too deeply to parse") from None
    except ValueError as exc:
        raise InputError(f"results file {path} is not JSON: {exc}") from None
    try:
        return _File.model_validate(raw)
    except ValidationError as exc:
        raise _problem(path, "", exc) from None


def _row(path: str | Path, i: int, d: dict[str, Any]) -> _Row:
    try:
        return _Row.model_validate(d)
    except ValidationError as exc:
        raise _problem(path, f"profiles[{i}]", exc) from None


def _of(row_variant: Any, variant: str) -> bool:
    """Whether a row measured ``variant`` (a fleet row is ``VARIANT @ NODE``)."""
    return isinstance(row_variant, str) and (row_variant == variant
                                             or row_variant.startswith(f"{variant} @ "))


def read_measurements(path: str | Path, variant: str, model: Any = None,
                      machine: str | None = None) -> dict[str, Measured]:
    """The closed-loop profiles of ``variant`` in results file ``path``, one
    :class:`Measured` per machine (a fleet file has several; a ``hwb bench`` file one), keyed by
    a short machine name usable in a file name. ``machine``: keep only that one.

    The file is untrusted input: its head and every row of ``variant`` are validated
    (:class:`_Row`: batch sizes integers 1..``MAX_BATCH``, p50/p99 finite and > 0 or null when
    absent, p99 ≥ p50, sample counts, types) and the first problem is an :class:`InputError`
    naming the field and what it must be. The file must carry a model fingerprint, and with
    ``model`` given it must be that model's."""
    res = _load(path)
    if model is not None and res.model.fingerprint != model.fingerprint:
        raise InputError(f"{path} measured model {res.model.name!r:.80} (fingerprint "
                         f"{res.model.fingerprint}), not {model.name!r:.80} "
                         f"({model.fingerprint}); export with the results of this model "
                         f"(`hwb bench MODEL -s batch -o R.json`)")
    by_machine: dict[str, dict[int, SizeCost]] = {}
    info: dict[str, tuple[int, str]] = {}
    for i, d in enumerate(res.profiles):
        if not _of(d.get("variant"), variant) or d.get("scenario") not in CLOSED_LOOP:
            continue
        p = _row(path, i, d)
        if not p.n or p.interrupted or p.p50_us is None or p.p99_us is None:
            continue
        m = p.machine or res.machine or _Machine()
        name = _machine_name(m)
        if machine is not None and name != machine:
            continue
        row = SizeCost(p.batch_size, p.p50_us, p.p99_us, p.n, p.scenario)
        sizes = by_machine.setdefault(name, {})
        # a batch sweep beats a single-stream figure at the same size (same loop, more sizes)
        if p.batch_size not in sizes or p.scenario == "batch":
            sizes[p.batch_size] = row
        info[name] = (m.usable_cores or m.cores or 1, "emulated" if p.mode == "emulated"
                      else "hardware")
    if not by_machine:
        where = f" on machine {machine!r}" if machine else ""
        raise InputError(f"{path} holds no closed-loop (batch or single-stream) profile of "
                         f"{variant}{where} with figures. Measure it: `hwb bench MODEL -t "
                         f"{variant.split(':')[0]} -p {variant.split(':')[-1]} "
                         f"-s batch:sizes=1/8/32 -o {Path(path).name}`")
    return {name: Measured(variant, name, info[name][0], info[name][1],
                           tuple(sizes[b] for b in sorted(sizes)), res.command, str(path),
                           res.model.name, res.model.fingerprint)
            for name, sizes in by_machine.items()}


def _machine_name(m: _Machine) -> str:
    """A file-name-safe label for a machine row: the fleet label/hostname, else its id."""
    raw = str(m.label or m.hostname or m.id or "local")
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in raw)[:64]


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
         engine_max: int | None = None, threads: int = 1, instances: int | None = None,
         memory: tuple[int, int] | None = None) -> Settings:
    """The settings :mod:`this module's docstring <hwbackends.export.measurements>` derives
    from ``m``. ``max_batch``: the user's cap; ``engine_max``: the artifact's own limit (a
    file that holds one batch size, :attr:`TritonForm.one_batch <hwbackends.target.TritonForm.one_batch>`); ``threads``: intra-op threads per instance; ``instances``: the user's
    count (default: as many as the cores allow); ``memory``: (bytes one row needs, limit):
    no batch size whose rows need more than the limit is compiled or configured, whatever the
    results file says was measured. Impossible requests raise, saying why."""
    measured = [s.batch for s in m.sizes]
    why: list[str] = []
    memory_max = _memory_cap(measured[-1], memory, why)
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
    cap = min(x for x in (max_batch, engine_max, measured[-1], memory_max) if x is not None)
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


def _memory_cap(top: int, memory: tuple[int, int] | None, why: list[str]) -> int | None:
    """The largest batch whose rows fit ``memory`` = (bytes per row, limit); a why-line when
    that leaves out measured sizes (up to ``top``)."""
    if memory is None:
        return None
    per_row, limit = memory
    cap = max(1, limit // max(1, per_row))
    if cap < top:
        why.append(f"batch sizes above {cap} left out: at {top} rows the model's tensors need "
                   f"≈ {top * per_row / 2**30:.1f} GiB, over the limit {limit / 2**30:.1f} GiB "
                   f"(a quarter of this machine's memory)")
    return cap


def strategy_deadline(config: str | Path, strategy: str) -> float:
    """A strategy's deadline (µs): its ``timeout_us`` when set, else its tier's p99 budget."""
    from ..config import load_config

    cfg = load_config(config, check_targets=False)
    if strategy not in cfg.strategies:
        raise ConfigError(f"{config} has no strategy {strategy!r}; it has "
                          f"{', '.join(cfg.strategies)}")
    s = cfg.strategies[strategy]
    return float(s.timeout_us) if s.timeout_us else float(cfg.tiers[s.tier].p99_us)
