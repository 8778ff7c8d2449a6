"""Two results files side by side (``hwb compare BASE.json NEW.json``): per variant and
scenario, how p50 and p99 moved, and how fidelity (correlation with the reference, relative
error) moved; which moves break the thresholds a CI job sets.

Rows are matched by variant, scenario (with its offered rate for ``server``), batch size and
machine, so a demo's several server rates and a fleet file's machines each compare with their
own. A sliding profile with a load sweep adds a row per count of windows (``sliding NMI N``):
the closed loop's tick (push + prepare) p50/p99, judged like any row, beside the rate one core
sustains and the knee. A variant that compiled in BASE and failed in NEW always breaks the comparison; one
absent from NEW is listed, and breaks it with ``fail_missing``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..variant import machine_key
from .profile import LatencyProfile, csv_text
from .results import BenchResults


@dataclass(frozen=True)
class Thresholds:
    """What a CI job allows: the largest p50 / p99 increase in percent of BASE's, the
    largest drop of fidelity correlation (absolute); ``None``: not checked."""

    p50_pct: float | None = None
    p99_pct: float | None = None
    corr_drop: float | None = None
    fail_missing: bool = False


@dataclass
class Delta:
    """One row: a (variant, scenario, batch, machine) in both files, or in one of them."""

    variant: str
    scenario: str
    batch_size: int
    machine: str
    mode: str
    base_p50_us: float | None = None
    new_p50_us: float | None = None
    base_p99_us: float | None = None
    new_p99_us: float | None = None
    base_corr: float | None = None
    new_corr: float | None = None
    base_rel_err: float | None = None
    new_rel_err: float | None = None
    status: str = "ok"  # ok | regression | only in base | only in new | failed in new
    why: list[str] = field(default_factory=list)
    #: Sliding load rows (``sliding NMI N``): the rate one core sustains and the knee
    #: (ticks/s); their p50/p99 are the closed loop's tick (push + prepare).
    base_sustainable_hz: float | None = None
    new_sustainable_hz: float | None = None
    base_knee_hz: float | None = None
    new_knee_hz: float | None = None

    @staticmethod
    def pct(base: float | None, new: float | None) -> float | None:
        if base is None or new is None or not (math.isfinite(base) and math.isfinite(new)) or base <= 0:
            return None
        return 100.0 * (new - base) / base

    @property
    def p50_pct(self) -> float | None:
        return self.pct(self.base_p50_us, self.new_p50_us)

    @property
    def p99_pct(self) -> float | None:
        return self.pct(self.base_p99_us, self.new_p99_us)

    @property
    def corr_change(self) -> float | None:
        if self.base_corr is None or self.new_corr is None:
            return None
        return self.new_corr - self.base_corr

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"p50_pct": self.p50_pct, "p99_pct": self.p99_pct,
                               "corr_change": self.corr_change}


@dataclass
class Comparison:
    rows: list[Delta]
    notes: list[str]

    @property
    def failed(self) -> list[Delta]:
        return [r for r in self.rows if r.status in ("regression", "failed in new")
                or (r.status == "only in base" and r.why)]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows], "notes": self.notes,
                "failed": len(self.failed)}


def _key(p: LatencyProfile) -> tuple[str, str, int, str]:
    scen = p.scenario
    rate = (p.params or {}).get("rate_hz")
    if p.scenario == "server" and rate is not None:
        scen = f"server@{rate:g}Hz"
    other = (p.params or {}).get("model")  # a profile of another model than the file's (the demo's sliding)
    if isinstance(other, str):
        scen += f" ({other})"
    return p.variant, scen, p.batch_size, machine_key(p)


@dataclass(frozen=True)
class _LoadRow:
    """A sliding profile's load point as a comparison row's figures."""

    mode: str
    p50_us: float
    p99_us: float
    sustainable_hz: float
    knee_hz: float | None


def _load_rows(res: BenchResults) -> dict[tuple[str, str, int, str], _LoadRow]:
    """Per sliding profile with a load sweep, one row per count of windows: ``(variant,
    "sliding NMI N", batch, machine)``."""
    from .load import parse_load

    out: dict[tuple[str, str, int, str], _LoadRow] = {}
    for p in res.profiles:
        raw = (p.sliding or {}).get("load")
        if not raw:
            continue
        for pt in parse_load(raw, f"profile {p.variant}")["points"]:
            c = pt["closed"]
            other = (p.params or {}).get("model")
            scen = f"sliding NMI {pt['streams']}" + (f" ({other})" if isinstance(other, str) else "")
            out[(p.variant, scen, p.batch_size, machine_key(p))] = _LoadRow(
                p.mode, float(c.get("tick_p50_us", math.nan)), float(c["tick_p99_us"]),
                float(c["sustainable_hz"]), pt.get("knee_hz"))
    return out


def _fidelity(res: BenchResults) -> dict[tuple[str, int, str], tuple[float, float] | None]:
    """Per (variant, batch, machine): (corr, rel_err) of a compiled variant, None if it failed."""
    out: dict[tuple[str, int, str], tuple[float, float] | None] = {}
    for v in res.variants:
        k = (v.variant, v.batch_size, machine_key(v))
        if v.error:
            out.setdefault(k, None)
        elif v.fidelity is not None:
            out[k] = (v.fidelity.corr, v.fidelity.rel_err)
    return out


def _judge(d: Delta, t: Thresholds) -> None:
    for name, pct, limit in (("p50", d.p50_pct, t.p50_pct), ("p99", d.p99_pct, t.p99_pct)):
        if limit is not None and pct is not None and pct > limit:
            d.why.append(f"{name} +{pct:.1f}% > {limit:g}%")
    drop = d.corr_change
    if t.corr_drop is not None and drop is not None and -drop > t.corr_drop:
        d.why.append(f"fidelity corr {drop:+.4g} (drop > {t.corr_drop:g})")
    if d.why:
        d.status = "regression"


def _fill(d: Delta, base_f: Any, new_f: Any) -> None:
    if base_f:
        d.base_corr, d.base_rel_err = base_f
    if new_f:
        d.new_corr, d.new_rel_err = new_f


def compare(base: BenchResults, new: BenchResults, thresholds: Thresholds = Thresholds()) -> Comparison:
    """The rows of both files matched, each judged against ``thresholds``."""
    bp: dict[tuple[str, str, int, str], Any] = {_key(p): p for p in base.profiles}
    np_: dict[tuple[str, str, int, str], Any] = {_key(p): p for p in new.profiles}
    bp.update(_load_rows(base))
    np_.update(_load_rows(new))
    bf, nf = _fidelity(base), _fidelity(new)
    rows: list[Delta] = []
    for key in list(bp) + [k for k in np_ if k not in bp]:
        variant, scen, batch, machine = key
        b, n = bp.get(key), np_.get(key)
        d = Delta(variant, scen, batch, machine, (n or b).mode)  # type: ignore[union-attr]
        fk = (variant, batch, machine)
        if fk not in bf and fk not in nf:  # a one-machine file's variant rows name no machine
            fk = (variant, batch, "?")
        _fill(d, bf.get(fk), nf.get(fk))
        if b is not None:
            d.base_p50_us, d.base_p99_us = b.p50_us, b.p99_us
            if isinstance(b, _LoadRow):
                d.base_sustainable_hz, d.base_knee_hz = b.sustainable_hz, b.knee_hz
        if n is not None:
            d.new_p50_us, d.new_p99_us = n.p50_us, n.p99_us
            if isinstance(n, _LoadRow):
                d.new_sustainable_hz, d.new_knee_hz = n.sustainable_hz, n.knee_hz
        if b is not None and n is None:
            if fk in nf and nf[fk] is None:
                d.status, d.why = "failed in new", ["the variant failed to compile in NEW"]
            else:
                d.status = "only in base"
                if thresholds.fail_missing:
                    d.why.append("not measured in NEW (--fail-missing)")
        elif b is None:
            d.status = "only in new"
        else:
            _judge(d, thresholds)
        rows.append(d)
    notes = []
    if {machine_key(p) for p in base.profiles} != {machine_key(p) for p in new.profiles}:
        notes.append("BASE and NEW were measured on different machines: latency deltas compare "
                     "machines as well as builds")
    if any(r.mode == "emulated" for r in rows):
        notes.append("emulated rows (mode emulated) time a stand-in, not the device: their "
                     "deltas say nothing about the hardware's latency")
    return Comparison(rows, notes)


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, fmt)


HEADER = (f"{'VARIANT':<27}{'SCENARIO':<20}{'BATCH':>5} {'p50 µs':>19} {'Δp50':>8} "
          f"{'p99 µs':>19} {'Δp99':>8} {'corr':>19} STATUS")


def render(c: Comparison) -> str:
    lines = [HEADER]
    for r in c.rows:
        mark = "*" if r.mode == "emulated" else " "
        lines.append(
            f"{r.variant:<26}{mark}{r.scenario:<20}{r.batch_size:>5} "
            f"{_num(r.base_p50_us, '.4g'):>9}→{_num(r.new_p50_us, '.4g'):<9} {_num(r.p50_pct, '+.1f'):>7}% "
            f"{_num(r.base_p99_us, '.4g'):>9}→{_num(r.new_p99_us, '.4g'):<9} {_num(r.p99_pct, '+.1f'):>7}% "
            f"{_num(r.base_corr, '.4f'):>9}→{_num(r.new_corr, '.4f'):<9} {r.status}"
            + (f": {'; '.join(r.why)}" if r.why else ""))
        if r.scenario.startswith("sliding NMI"):
            lines.append(f"{'':<27}one core sustains {_num(r.base_sustainable_hz, ',.0f')}→"
                         f"{_num(r.new_sustainable_hz, ',.0f')} ticks/s; knee "
                         f"{_num(r.base_knee_hz, ',.0f')}→{_num(r.new_knee_hz, ',.0f')} ticks/s "
                         f"(p50/p99 above: the closed loop's push + prepare)")
    lines += [f"note: {n}" for n in c.notes]
    bad = c.failed
    lines.append(f"{len(bad)} of {len(c.rows)} row(s) past the thresholds" if bad
                 else f"all {len(c.rows)} row(s) within the thresholds")
    return "\n".join(lines)


CSV_FIELDS = ("variant", "scenario", "batch_size", "machine", "mode", "base_p50_us", "new_p50_us",
              "p50_pct", "base_p99_us", "new_p99_us", "p99_pct", "base_corr", "new_corr",
              "corr_change", "base_rel_err", "new_rel_err", "status", "why",
              "base_sustainable_hz", "new_sustainable_hz", "base_knee_hz", "new_knee_hz")


def render_csv(c: Comparison) -> str:
    return csv_text(CSV_FIELDS, [r.to_dict() | {"why": "; ".join(r.why)} for r in c.rows])
