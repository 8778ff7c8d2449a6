"""``LatencyProfile``: one measured latency distribution, with everything needed to trust it.

Every number carries its scenario (and parameters), the variant's mode (hardware/emulated),
the machine it was measured on and the sample count: a profile without them cannot be
compared with another one honestly.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

#: Quantiles kept for the report's CDF plot (dense in the tail, where decisions are made).
CDF_QUANTILES = tuple(np.concatenate([np.linspace(0.0, 0.9, 46), np.linspace(0.9, 0.99, 19)[1:],
                                      np.linspace(0.99, 0.999, 10)[1:], [0.9995, 1.0]]).round(5))


#: A p99 within this factor of the no-op loop's p99 (same run) is "at the noise floor".
FLOOR_FACTOR = 1.5


@dataclass
class LatencyProfile:
    """A measured latency distribution of one variant in one scenario on one machine.

    Latencies are per call (one tick of ``batch_size`` samples), in microseconds. In open-loop
    scenarios (server, burst) they run from the *scheduled* arrival to completion, so time spent
    queued behind a slow call is counted (no coordinated omission). ``throughput`` is samples
    per second at the median call (:func:`samples_per_s`: batch size over the median service
    time), not calls over wall time, which one stall or the harness's own work would skew.
    """

    variant: str
    target: str
    precision: str
    batch_size: int
    scenario: str
    params: dict[str, Any]
    mode: str
    n: int
    p50_us: float
    p90_us: float
    p99_us: float
    p999_us: float
    max_us: float
    mean_us: float
    min_us: float
    throughput: float
    duration_s: float
    machine: dict[str, Any] = field(default_factory=dict)
    fidelity: dict[str, Any] | None = None
    artifact_key: str = ""
    interrupted: bool = False
    #: ``[[quantile, µs], ...]`` at :data:`CDF_QUANTILES` (for plots without the raw samples).
    cdf: list[list[float]] = field(default_factory=list)
    #: Burst replay: per time bin, arrivals and the p99/max latency of the calls in it.
    timeline: dict[str, list[float]] | None = None
    #: Server/burst: mean time a call waited for the one before it (µs), part of the latency.
    queue_mean_us: float | None = None
    created: float = field(default_factory=time.time)
    #: The 95th percentile (µs); ``None`` in a profile measured before it was kept.
    p95_us: float | None = None
    #: The ``sliding`` scenario (whose percentiles above are ``push_into``'s, tick → answer):
    #: ``{"form", "window", "prepare": {...}, "full": {...}}``, the prepare and the full window
    #: (``predict_into``) measured in the same interleaved run (:func:`brief` each), and
    #: ``"load"``: the load sweep over several windows and offered tick rates (its layout:
    #: hwbackends/bench/load.py); else None.
    sliding: dict[str, Any] | None = None
    #: Open-loop scenarios (server, burst): the same loop over a no-op in the same run
    #: (:func:`brief`), the harness's own floor; None in other scenarios and older files.
    noise_floor: dict[str, Any] | None = None

    @property
    def emulated(self) -> bool:
        return self.mode == "emulated"

    @property
    def at_noise_floor(self) -> bool:
        """Whether this open-loop p99 is within :data:`FLOOR_FACTOR` × the no-op loop's p99
        measured in the same run: the tail is then the harness's and the machine's, not the
        variant's (False without a floor)."""
        f = (self.noise_floor or {}).get("p99_us")
        return f is not None and f > 0 and self.p99_us <= FLOOR_FACTOR * f

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LatencyProfile":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    @property
    def offered_per_s(self) -> float | None:
        """Open-loop rows (server, burst): the samples per second offered — the server's
        Poisson rate, the burst trace's mean rate — times the batch size; None otherwise (or
        when a results file does not say)."""
        if self.scenario == "server":
            rate = self.params.get("rate_hz")
        elif self.scenario == "burst":
            trace = self.params.get("trace")
            rate = trace.get("mean_rate_hz") if isinstance(trace, dict) else None
        else:
            return None
        ok = isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate == rate
        return float(rate) * self.batch_size if ok else None

    @property
    def achieved_per_s(self) -> float | None:
        """Open-loop rows: the samples per second answered — ``n × batch`` over the loop's
        wall time (from the first scheduled arrival to the last answer); None otherwise. Beside
        :attr:`offered_per_s` it says whether the variant kept up; :attr:`throughput` is what
        one caller sustains at the median call, whatever was offered."""
        if self.scenario not in ("server", "burst") or not self.duration_s or self.duration_s <= 0:
            return None
        return self.n * self.batch_size / self.duration_s

    def row(self) -> str:
        """One line of the readable table (``*`` marks emulated figures)."""
        mark = "*" if self.emulated else " "
        p95 = f"{self.p95_us:>9.1f}" if self.p95_us is not None else f"{'—':>9}"
        offered, achieved = self.offered_per_s, self.achieved_per_s
        return (f"{self.variant:<26}{mark}{self.scenario:<14}{self.batch_size:>5} {self.n:>7} "
                f"{self.p50_us:>9.1f} {self.p90_us:>9.1f} {p95} {self.p99_us:>9.1f} "
                f"{self.p999_us:>9.1f} {self.max_us:>10.1f} {self.throughput:>12,.0f}"
                f" {_rate(offered):>10} {_rate(achieved):>10}")

    def csv_row(self) -> dict[str, Any]:
        """The table's row as :data:`CSV_FIELDS` values (``mode`` spelled out, not a ``*``)."""
        return {"variant": self.variant, "target": self.target, "precision": self.precision,
                "mode": self.mode, "scenario": self.scenario, "batch_size": self.batch_size,
                "n": self.n, "p50_us": self.p50_us, "p90_us": self.p90_us, "p95_us": self.p95_us,
                "p99_us": self.p99_us, "p999_us": self.p999_us, "max_us": self.max_us,
                "samples_per_s": self.throughput,
                "machine": str(self.machine.get("node_id") or self.machine.get("id") or "")} | self._csv_extra()

    def _csv_extra(self) -> dict[str, Any]:
        """The sliding and noise-floor columns (empty cells where the row has none)."""
        sl = self.sliding or {}
        pr, fu = sl.get("prepare") or {}, sl.get("full") or {}
        nf = self.noise_floor or {}
        return {"form": sl.get("form"), "prepare_p50_us": pr.get("p50_us"),
                "prepare_p99_us": pr.get("p99_us"), "full_p50_us": fu.get("p50_us"),
                "full_p99_us": fu.get("p99_us"), "floor_p99_us": nf.get("p99_us"),
                "at_noise_floor": int(self.at_noise_floor) if nf else None}


TABLE_HEADER = (f"{'VARIANT':<27}{'SCENARIO':<14}{'BATCH':>5} {'N':>7} {'p50 µs':>9} {'p90 µs':>9} "
                f"{'p95 µs':>9} {'p99 µs':>9} {'p99.9 µs':>9} {'max µs':>10} {'samples/s':>12} "
                f"{'offered/s':>10} {'achieved/s':>10}")
#: What the last three columns mean (printed under the table).
RATE_NOTE = ("samples/s: what one caller sustains at the median call (batch ÷ median service "
             "time); offered/s and achieved/s (open-loop rows): the arrival rate and the rate "
             "answered over the run's wall time")
#: The columns of :func:`table_csv` (``hwb bench --csv``, ``hwb report --csv``).
CSV_FIELDS = ("variant", "target", "precision", "mode", "scenario", "batch_size", "n", "p50_us",
              "p90_us", "p95_us", "p99_us", "p999_us", "max_us", "samples_per_s", "machine",
              # sliding rows: the form, the prepare and the full window; open-loop rows: the floor
              "form", "prepare_p50_us", "prepare_p99_us", "full_p50_us", "full_p99_us",
              "floor_p99_us", "at_noise_floor")


def table(profiles: list[LatencyProfile]) -> str:
    lines = [TABLE_HEADER] + [p.row() for p in profiles]
    lines += extra_lines(profiles)
    if any(p.offered_per_s is not None or p.achieved_per_s is not None for p in profiles):
        lines.append(RATE_NOTE)
    if any(p.emulated for p in profiles):
        lines.append("* emulated: measured on a stand-in (C-simulation, CPU instead of the "
                     "accelerator), not the hardware's latency")
    if any(p.interrupted for p in profiles):
        lines.append("(interrupted: the last profile holds what was measured before Ctrl-C)")
    return "\n".join(lines)


def extra_lines(profiles: list[LatencyProfile]) -> list[str]:
    """The table's notes on sliding rows (the prepare and the full window beside the push) and
    on open-loop rows (their no-op noise floor, and whether the p99 is at it)."""
    out = []
    for p in profiles:
        if p.sliding:
            out.append(f"  {p.variant} {sliding_summary(p)}")
            out += [f"  {p.variant} {line}" for line in load_lines(p)]
        nf = p.noise_floor
        if nf:
            out.append(f"  {p.variant} {p.scenario}: no-op floor p50 {_f(nf.get('p50_us'))} / p99 "
                       f"{_f(nf.get('p99_us'))} µs"
                       + ("  (p99 at the noise floor)" if p.at_noise_floor else ""))
    return out


def sliding_summary(p: LatencyProfile) -> str:
    """One sliding row in words (the table's notes, ``hwb route --explain``): the push, the
    prepare apart, the full window of the same run."""
    sl = p.sliding or {}
    pr, fu = sl.get("prepare") or {}, sl.get("full") or {}
    return (f"sliding ({sl.get('form')}, window {sl.get('window')}): push p50 {_f(p.p50_us)} / "
            f"p99 {_f(p.p99_us)} µs; prepare p50 {_f(pr.get('p50_us'))} / p99 "
            f"{_f(pr.get('p99_us'))} µs (apart); full window p50 {_f(fu.get('p50_us'))} / p99 "
            f"{_f(fu.get('p99_us'))} µs")


def _rate(v: float | None) -> str:
    return f"{v:,.0f}" if v is not None else "—"


def load_lines(p: LatencyProfile) -> list[str]:
    """The sliding load sweep in words, one line per count of windows: the rate one core
    sustains, the knee at the budget, the p99 at the highest rate within it."""
    load = (p.sliding or {}).get("load") or {}
    out = []
    for pt in load.get("points", []):
        c = pt.get("closed") or {}
        k, bound = pt.get("knee_hz"), pt.get("knee_bound", "")
        knee = "—" if k is None else f"{'≥ ' if bound == '>=' else '≤ ' if bound == '<=' else ''}{k:,.0f}"
        b = load.get("budget_us")
        out.append(f"NMI {pt.get('streams')}: tick (push + prepare) p50 {_f(c.get('tick_p50_us'))} / "
                   f"p99 {_f(c.get('tick_p99_us'))} µs → one core sustains "
                   f"{c.get('sustainable_hz', 0):,.0f} ticks/s; knee {knee} ticks/s "
                   + (f"(p99 ≤ {b:g} µs)" if b else f"(budget {load.get('budget_from', '?')})")
                   + f" over {len(pt.get('open') or [])} offered rate(s)")
    return out


def _f(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) and v == v else "—"


def brief(latency_ns: np.ndarray) -> dict[str, Any]:
    """:func:`summarize` without the CDF: what a results row keeps of a secondary loop (the
    sliding scenario's prepare and full window, an open loop's no-op floor)."""
    d = summarize(latency_ns)
    d.pop("cdf")
    return d


def table_csv(profiles: list[LatencyProfile]) -> str:
    """The profiles as CSV (one header line, one row per profile), for a spreadsheet or a CI
    script."""
    return csv_text(CSV_FIELDS, [p.csv_row() for p in profiles])


def csv_text(fields: Sequence[str], rows: list[dict[str, Any]]) -> str:
    """``rows`` as CSV with the header ``fields``: floats to 6 significant digits, an empty
    cell where a figure is unknown (``None``, NaN)."""
    import csv
    import io
    import math

    def cell(v: Any) -> Any:
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return ""
        return float(f"{v:.6g}") if isinstance(v, float) else v

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: cell(v) for k, v in r.items()})
    return buf.getvalue()


def samples_per_s(service_ns: np.ndarray | None, batch: int) -> float:
    """Samples per second one caller sustains at the median call: ``batch / median(service
    time)``. Robust where ``n × batch / wall time`` is not: a few stalls (a page fault, the
    machine's other work) move the median little, and the time the harness spends between
    calls (the open loops' waits for the next arrival) is not the variant's. 0 without samples."""
    if service_ns is None or len(service_ns) == 0:
        return 0.0
    med = float(np.median(np.asarray(service_ns, dtype=np.float64)))
    return batch * 1e9 / med if med > 0 else 0.0


def summarize(latency_ns: np.ndarray) -> dict[str, Any]:
    """Percentiles (µs) of a latency sample; ``n == 0`` gives NaNs, not an exception."""
    us = np.asarray(latency_ns, dtype=np.float64) / 1e3
    if us.size == 0:
        nan = float("nan")
        return {"n": 0, "p50_us": nan, "p90_us": nan, "p95_us": nan, "p99_us": nan, "p999_us": nan,
                "max_us": nan, "mean_us": nan, "min_us": nan, "cdf": []}
    q = np.quantile(us, [0.5, 0.9, 0.95, 0.99, 0.999])
    cdf = np.quantile(us, CDF_QUANTILES)
    return {"n": int(us.size), "p50_us": float(q[0]), "p90_us": float(q[1]), "p95_us": float(q[2]),
            "p99_us": float(q[3]), "p999_us": float(q[4]), "max_us": float(us.max()), "mean_us": float(us.mean()),
            "min_us": float(us.min()),
            "cdf": [[float(a), float(b)] for a, b in zip(CDF_QUANTILES, cdf, strict=True)]}
