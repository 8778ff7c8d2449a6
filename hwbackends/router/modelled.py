"""Modelled latencies for the router (strategy option ``allow_modelled = true``).

A variant whose compile produced a ``hardware_estimate`` (``fpga.da4ml``: cycles from an RTL
testbench, clock from open synthesis) has no measurable latency here: its executor is a
simulation. With ``allow_modelled`` the router ranks it by the *modelled end-to-end* latency
(logic + the stated I/O assumption) beside the measured p99 of real variants. The profile it
gets is marked ``mode = "modelled"`` and every explanation says so: it is never a
measurement, and serving it here runs the simulation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..bench.profile import LatencyProfile
from ..specs import MODELLED

if TYPE_CHECKING:  # pragma: no cover
    from ..variant import VariantRecord


def modelled_estimate(rec: "VariantRecord") -> dict[str, Any] | None:
    """The variant's modelled hardware estimate (``Target.compile``'s ``hardware_estimate``
    metadata, documented in hwbackends/target.py), when it has one with a latency."""
    est = rec.hardware_estimate
    if not est or est.get("label") != MODELLED or not est.get("end_to_end"):
        return None
    return est


def modelled_profile(rec: "VariantRecord", est: dict[str, Any]) -> LatencyProfile:
    """A one-point "distribution" at the modelled end-to-end latency (µs)."""
    us = float(est["end_to_end"]["total_ns"]) / 1000.0
    return LatencyProfile(
        variant=rec.variant, target=rec.target, precision=rec.precision, batch_size=rec.batch_size,
        scenario="modelled", params={"basis": est.get("basis", ""),
                                     "io_assumption": est["end_to_end"].get("io_assumption", "")},
        mode=MODELLED, n=0, p50_us=us, p90_us=us, p95_us=us, p99_us=us, p999_us=us, max_us=us, mean_us=us,
        min_us=us, throughput=0.0, duration_s=0.0, artifact_key=rec.artifact_key)


def reason(est: dict[str, Any]) -> str:
    e2e = est["end_to_end"]
    return (f"modelled, not measured: {est['latency_cycles']} cycles = {e2e['logic_ns']:.0f} ns logic "
            f"+ {e2e['io_assumption_ns']:.0f} ns I/O assumption")
