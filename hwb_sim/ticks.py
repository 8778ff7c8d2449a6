"""Tick-arrival traces: when market-data updates reach the model.

Real feeds are not a constant rate: quiet periods of tens of ticks per second alternate with
bursts of hundreds to thousands per second (the open, news, a large order sweeping the book).
A latency measured at a constant rate hides what bursts do to the queue, so the burst
scenario replays a trace like this one. ``generate`` is a seeded, piecewise Poisson process
(the same seed gives the same trace everywhere); ``load`` reads recorded timestamps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class Segment:
    """One stretch of constant arrival rate: ``kind`` is ``quiet`` or ``burst``."""

    start: float
    end: float
    kind: str
    rate_hz: float


@dataclass
class TickTrace:
    """Arrival times in seconds from the start of the trace (sorted, first at ≥ 0)."""

    timestamps: np.ndarray
    segments: list[Segment] = field(default_factory=list)
    source: str = "generated"
    params: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def duration(self) -> float:
        return float(self.timestamps[-1]) if len(self.timestamps) else 0.0

    def peak_rate(self, window_s: float = 0.01) -> float:
        """Highest arrival rate (Hz) over any ``window_s`` bin."""
        if len(self.timestamps) == 0:
            return 0.0
        bins = np.arange(0.0, self.duration + window_s, window_s)
        counts, _ = np.histogram(self.timestamps, bins)
        return float(counts.max() / window_s)

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "ticks": len(self), "duration_s": self.duration,
                "mean_rate_hz": len(self) / self.duration if self.duration else 0.0,
                "peak_rate_hz_10ms": self.peak_rate(), "params": self.params,
                "bursts": sum(1 for s in self.segments if s.kind == "burst")}

    def save(self, path: str | Path) -> None:
        """One timestamp (seconds) per line: what :func:`load` reads back."""
        np.savetxt(path, self.timestamps, fmt="%.9f")


def generate(duration_s: float = 2.0, seed: int = 0, quiet_rate_hz: float = 50.0,
             burst_rate_hz: tuple[float, float] = (500.0, 3000.0), mean_quiet_s: float = 0.4,
             mean_burst_s: float = 0.08, open_burst: bool = True) -> TickTrace:
    """A seeded trace of quiet periods and bursts.

    Quiet stretches last ``Exp(mean_quiet_s)`` at ``quiet_rate_hz``; bursts last
    ``Exp(mean_burst_s)`` at a rate drawn uniformly from ``burst_rate_hz``. With
    ``open_burst`` the trace starts with a burst, as the market open does.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    lo, hi = burst_rate_hz
    if not (0 < quiet_rate_hz and 0 < lo <= hi):
        raise ValueError("rates must be positive and burst_rate_hz = (low, high) with low ≤ high")
    rng = np.random.default_rng(seed)
    t, kind = 0.0, "burst" if open_burst else "quiet"
    segments: list[Segment] = []
    chunks: list[np.ndarray] = []
    while t < duration_s:
        if kind == "burst":
            length, rate = rng.exponential(mean_burst_s), float(rng.uniform(lo, hi))
        else:
            length, rate = rng.exponential(mean_quiet_s), quiet_rate_hz
        end = min(t + max(length, 1e-3), duration_s)
        # Poisson process on [t, end): a Poisson count, then uniform sorted times.
        k = rng.poisson(rate * (end - t))
        chunks.append(np.sort(rng.uniform(t, end, k)))
        segments.append(Segment(t, end, kind, rate))
        t, kind = end, ("quiet" if kind == "burst" else "burst")
    ts = np.concatenate(chunks) if chunks else np.zeros(0)
    params = {"duration_s": duration_s, "seed": seed, "quiet_rate_hz": quiet_rate_hz,
              "burst_rate_hz": [lo, hi], "mean_quiet_s": mean_quiet_s,
              "mean_burst_s": mean_burst_s, "open_burst": open_burst}
    return TickTrace(ts, segments, "generated", params)


def load(path: str | Path, unit: str = "s") -> TickTrace:
    """Timestamps from a file: ``.npy`` or text with one number per line (``#`` comments
    allowed) in ``unit`` (s, ms, us, ns). They are sorted and shifted to start at 0."""
    from hwbackends.errors import InputError

    p = Path(path)
    if unit not in _UNITS:
        raise InputError(f"unknown time unit {unit!r}; use one of {', '.join(_UNITS)}")
    if not p.exists():
        raise InputError(f"trace file {p} does not exist; give a file of arrival timestamps "
                         f"(one per line, or .npy), or generate one with hwb_sim.generate()")
    try:
        raw = np.load(p) if p.suffix == ".npy" else np.loadtxt(p, comments="#", ndmin=1)
    except ValueError as exc:
        raise InputError(f"trace file {p}: expected one number (a timestamp in {unit}) per line: "
                         f"{exc}") from exc
    ts = np.asarray(raw, dtype=np.float64).ravel()
    if ts.size == 0:
        raise InputError(f"trace file {p} holds no timestamps")
    if not np.isfinite(ts).all():
        raise InputError(f"trace file {p} holds non-finite timestamps")
    ts = np.sort(ts) * _UNITS[unit]
    return TickTrace(ts - ts[0], [], str(p), {"unit": unit})
