"""The sliding scenario's load profile: latency against offered tick rate, per number of
windows (STAC-ML's NMI), the rate one core sustains, the knee, and what a declared load
(``streams`` symbols at ``tick_rate_hz`` each, on ``cores`` cores) costs.

A profile's ``sliding["load"]`` (written by :func:`measure_load`, read back by
:func:`parse_load`, which refuses a malformed one with a :class:`ResultsError` naming the
field) is::

    {"form": "incremental", "budget_us": 50.0, "budget_from": "budget_us",
     "points": [{"streams": 24,
                 "closed": {"push": {brief}, "prepare": {brief}, "tick_p50_us": …,
                            "tick_p99_us": …, "sustainable_hz": …},
                 "open": [{"rate_hz": …, "offered_hz": …, "n": …, "p50_us": …, "p99_us": …,
                           "p999_us": …, "max_us": …, "service_p50_us": …,
                           "achieved_hz": …, "interrupted": false}, …],
                 "knee_hz": …, "knee_bound": "="}, …]}

Rates are aggregate ticks per second over all the windows of a point (``offered_hz = streams ×
rate_hz``), on the one core the loop runs on. ``sustainable_hz`` is ``1 / (median push +
median prepare)``: the work a core must fit between ticks. The **knee** is the offered rate at
which p99 leaves the budget, interpolated between the last point within it and the first past
it (``knee_bound`` ``"="``); ``">="`` when every point is within (the knee is past the sweep),
``"<="`` when none is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import ResultsError
from .profile import brief
from .scenarios import AUTO_LOAD, ProgressBar, Sliding, streams_loop, streams_open_loop

if TYPE_CHECKING:  # pragma: no cover
    from ..compiled import CompiledModel

#: Without ``budget_us`` (``hwb bench`` alone), the knee is taken where p99 passes this many
#: times the closed loop's tick p99 (push + prepare): where queueing, not the model, sets it.
SATURATION = 10.0


def measure_load(cm: "CompiledModel", sc: Sliding, steps: Sequence[np.ndarray],
                 bars: bool = False) -> dict[str, Any]:
    """The load sweep of ``sc`` on ``cm`` (see :class:`~.scenarios.Sliding`): per count of
    windows, the closed loop then each offered rate's open loop, within ``sc.max_s`` in all
    (split evenly over the loops). Stops at Ctrl-C keeping what was measured
    (``interrupted`` on the last point)."""
    nrates = (len(sc.rate_hz) or len(AUTO_LOAD)) + len(sc.offered_hz)
    share = sc.max_s / max(len(sc.streams) * (1 + nrates), 1)
    out = np.zeros(tuple(cm.output.shape), np.float32)
    rng = np.random.default_rng(sc.seed)
    points: list[dict[str, Any]] = []
    form = ""
    for n_win in sc.streams:
        w = cm.sliding(streams=n_win, auto_prepare=False)
        form = w.form
        bar = ProgressBar(f"{cm.variant} sliding NMI {n_win} closed loop", sc.ticks, bars)
        t = streams_loop(w.push_into, w.prepare, steps, out, n_win, sc.ticks, share,
                         min(sc.warmup, 4 * n_win + 16), bar)
        tick = t.latency_ns + t.prepare_ns
        med = float(np.median(tick)) if len(tick) else 0.0
        closed = {"push": brief(t.latency_ns), "prepare": brief(t.prepare_ns),
                  "tick_p50_us": med / 1e3,
                  "tick_p99_us": float(np.quantile(tick, 0.99)) / 1e3 if len(tick) else math.nan,
                  "sustainable_hz": 1e9 / med if med > 0 else 0.0}
        bar.done(f"push p50 {closed['push']['p50_us']:.2f} µs  prepare p50 "
                 f"{closed['prepare']['p50_us']:.2f} µs  → {closed['sustainable_hz']:,.0f} ticks/s "
                 f"per core")
        point: dict[str, Any] = {"streams": n_win, "closed": closed, "open": []}
        points.append(point)
        if t.interrupted:
            point["interrupted"] = True
            break
        rates = (list(sc.rate_hz) if sc.rate_hz else
                 [f * closed["sustainable_hz"] / n_win for f in AUTO_LOAD])
        rates = sorted(set(rates) | {a / n_win for a in sc.offered_hz})
        for r in rates:
            agg = r * n_win
            if not agg > 0:
                continue
            m = max(min(sc.ticks, int(agg * share) + 1), 2)
            arrivals = np.cumsum(rng.exponential(1.0 / agg, m))
            ids = rng.integers(0, n_win, m)
            w.reset()
            bar = ProgressBar(f"{cm.variant} sliding NMI {n_win} at {agg:,.0f}/s", m, bars)
            o = streams_open_loop(w.push_into, w.prepare, steps, out, arrivals, ids,
                                  share * 2, bar)
            got = brief(o.latency_ns)
            span = (arrivals[len(o.latency_ns) - 1] if len(o.latency_ns) else 0.0) \
                + (o.latency_ns[-1] / 1e9 if len(o.latency_ns) else 0.0)
            point["open"].append({
                "rate_hz": float(r), "offered_hz": float(agg), "n": got["n"],
                "p50_us": got["p50_us"], "p99_us": got["p99_us"], "p999_us": got["p999_us"],
                "max_us": got["max_us"],
                "service_p50_us": float(np.median(o.service_ns)) / 1e3
                if o.service_ns is not None and len(o.service_ns) else math.nan,
                "achieved_hz": len(o.latency_ns) / span if span > 0 else 0.0,
                "interrupted": o.interrupted})
            bar.done(f"p50 {got['p50_us']:.1f} µs  p99 {got['p99_us']:.1f} µs  n={got['n']}")
            if o.interrupted:
                break
        if point["open"] and point["open"][-1]["interrupted"]:
            break
    load = {"form": form, "points": points}
    return with_budget(load, sc.budget_us)


def with_budget(load: dict[str, Any], budget_us: float | None) -> dict[str, Any]:
    """``load`` with its budget and each point's knee (:func:`knee`) at ``budget_us``, or
    without one at :data:`SATURATION` × each point's closed-loop tick p99."""
    load = dict(load)
    load["budget_us"] = budget_us
    load["budget_from"] = "budget_us" if budget_us is not None else \
        f"none: the knee at {SATURATION:g}× the closed loop's tick p99"
    pts = []
    for p in load["points"]:
        b = budget_us if budget_us is not None else SATURATION * p["closed"]["tick_p99_us"]
        hz, bound = knee(p["open"], b)
        pts.append(dict(p, knee_hz=hz, knee_bound=bound))
    load["points"] = pts
    return load


def knee(curve: Sequence[dict[str, Any]], budget_us: float) -> tuple[float | None, str]:
    """``(offered rate, bound)`` where ``curve``'s p99 leaves ``budget_us``: interpolated
    between the last point within and the first past it (``"="``); the highest rate measured
    when every point is within (``">="``); the lowest when none is (``"<="``); ``(None,
    "")`` for an empty curve."""
    pts = sorted((c for c in curve if c.get("n") and _finite(c.get("p99_us"))),
                 key=lambda c: c["offered_hz"])
    if not pts:
        return None, ""
    if pts[0]["p99_us"] > budget_us:
        return float(pts[0]["offered_hz"]), "<="
    for a, b in zip(pts, pts[1:], strict=False):
        if b["p99_us"] > budget_us >= a["p99_us"]:
            f = (budget_us - a["p99_us"]) / (b["p99_us"] - a["p99_us"])
            return float(a["offered_hz"] + f * (b["offered_hz"] - a["offered_hz"])), "="
    return float(pts[-1]["offered_hz"]), ">="


def p99_at(curve: Sequence[dict[str, Any]], offered_hz: float) -> tuple[float, str]:
    """The p99 (µs) at ``offered_hz``, linear between the two measured rates around it, and
    how it was found: ``"interpolated"``, ``"below the sweep"`` (the lowest rate's p99) or
    ``"past the sweep"`` (the highest rate's: a lower bound)."""
    pts = sorted((c for c in curve if c.get("n") and _finite(c.get("p99_us"))),
                 key=lambda c: c["offered_hz"])
    if not pts:
        return math.nan, "no open-loop point"
    if offered_hz <= pts[0]["offered_hz"]:
        return float(pts[0]["p99_us"]), "below the sweep"
    for a, b in zip(pts, pts[1:], strict=False):
        if a["offered_hz"] <= offered_hz <= b["offered_hz"]:
            span = b["offered_hz"] - a["offered_hz"]
            f = (offered_hz - a["offered_hz"]) / span if span > 0 else 0.0
            return float(a["p99_us"] + f * (b["p99_us"] - a["p99_us"])), "interpolated"
    return float(pts[-1]["p99_us"]), "past the sweep"


@dataclass
class AtLoad:
    """What a declared load costs a variant (:func:`at_load`): the curve read (``streams``:
    the count of windows measured nearest the declared one), the rate one core sustains,
    the cores that takes (``cores_needed``: aggregate ÷ sustainable, rounded up), the knee
    per core at the budget, the cores used (the fewest of those allowed whose knee holds the
    load), and the p99 at each used core's share of the load."""

    offered_hz: float
    streams: int
    sustainable_hz: float
    cores_needed: int
    knee_hz: float | None
    knee_bound: str
    cores_allowed: int
    cores_used: int
    per_core_hz: float
    p99_us: float
    p99_how: str
    holds: bool
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)

    def describe(self) -> str:
        """One line for ``hwb route --explain``."""
        k = "—" if self.knee_hz is None else f"{'≥ ' if self.knee_bound == '>=' else '≤ ' if self.knee_bound == '<=' else ''}{self.knee_hz:,.0f}"
        return (f"load {self.offered_hz:,.0f} ticks/s (curve at NMI {self.streams}): one core "
                f"sustains {self.sustainable_hz:,.0f}/s → {self.cores_needed} core(s) needed; "
                f"knee {k}/s per core at the budget; on {self.cores_used} of {self.cores_allowed} "
                f"core(s) allowed, {self.per_core_hz:,.0f}/s each, p99 {self.p99_us:.2f} µs "
                f"({self.p99_how})" + ("" if self.holds else f"; refused: {self.why}"))


def at_load(load: dict[str, Any], streams: int, tick_rate_hz: float, cores: int,
            budget_us: float) -> AtLoad:
    """The declared load (``streams`` symbols at ``tick_rate_hz`` each, ``cores`` cores
    allowed) against a parsed load profile (:func:`parse_load`), the knee taken at
    ``budget_us`` (the tier's p99). The curve read is the one with the most windows not above
    ``streams`` (else the fewest). ``holds`` is false, with ``why``, when the knee on the cores
    allowed is below the load."""
    pts = [p for p in load["points"] if p["open"]] or load["points"]
    if not pts:
        raise ResultsError("this sliding profile has no load sweep; measure it with "
                           "hwb bench -s sliding:streams=1/2/4/8/24")
    under = [p for p in pts if p["streams"] <= streams]
    p = max(under, key=lambda q: q["streams"]) if under else min(pts, key=lambda q: q["streams"])
    agg = streams * tick_rate_hz
    sus = float(p["closed"]["sustainable_hz"])
    needed = math.ceil(agg / sus) if sus > 0 else 0
    hz, bound = knee(p["open"], budget_us)
    if hz is None:  # no open loop: the closed loop's rate stands for the knee
        hz, bound = sus, ">="
    used = max(1, min(cores, math.ceil(agg / hz))) if hz and hz > 0 else cores
    per = agg / used
    p99, how = p99_at(p["open"], per)
    holds, why = True, ""
    if bound == "<=":
        holds = False
        why = (f"p99 is past the {budget_us:g} µs budget at every rate measured (from "
               f"{hz or 0:,.0f} ticks/s per core): no number of cores holds it at this budget")
    elif not hz or hz * cores < agg:
        holds = False
        why = (f"knee {hz or 0:,.0f} ticks/s per core × {cores} core(s) allowed < "
               f"{agg:,.0f} ticks/s offered"
               + (f"; it needs {math.ceil(agg / hz)} core(s)" if hz else ""))
    elif sus <= 0 or needed > cores:
        holds, why = False, f"needs {needed} core(s) at {sus:,.0f} ticks/s each; {cores} allowed"
    return AtLoad(agg, int(p["streams"]), sus, needed, hz, bound, cores, used, per, p99, how,
                  holds, why)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_load(d: Any, where: str = "sliding profile") -> dict[str, Any]:
    """``d`` (a profile's ``sliding["load"]``, read from a results file another party may
    have written) checked field by field; a :class:`ResultsError` names the first field that
    is missing or of the wrong kind and says to re-run the bench."""
    def bad(what: str) -> ResultsError:
        return ResultsError(f"{where}: load {what}; re-run `hwb bench -s sliding` to "
                            f"regenerate it")

    if not isinstance(d, dict) or not isinstance(d.get("points"), list):
        raise bad("is not an object with a list of points")
    b = d.get("budget_us")
    if b is not None and not (_finite(b) and b > 0):
        raise bad(f"budget_us {b!r} is not a positive number")
    for j, p in enumerate(d["points"]):
        if not isinstance(p, dict):
            raise bad(f"point {j} is not an object")
        s = p.get("streams")
        if not isinstance(s, int) or isinstance(s, bool) or s < 1:
            raise bad(f"point {j}: streams {s!r} is not a count of windows ≥ 1")
        c = p.get("closed")
        if not isinstance(c, dict) or not _finite(c.get("sustainable_hz")) or c["sustainable_hz"] < 0 \
                or not _finite(c.get("tick_p99_us")):
            raise bad(f"point {j}: closed needs sustainable_hz ≥ 0 and tick_p99_us")
        if not isinstance(p.get("open"), list):
            raise bad(f"point {j}: open is not a list")
        for q in p["open"]:
            if not isinstance(q, dict) or not (_finite(q.get("offered_hz")) and q["offered_hz"] > 0):
                raise bad(f"point {j}: an open-loop row has no positive offered_hz")
            if not isinstance(q.get("n"), int) or (q["n"] and not _finite(q.get("p99_us"))):
                raise bad(f"point {j}: an open-loop row has no n or p99_us")
    return d
