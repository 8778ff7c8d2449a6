"""``hardware_estimate``: the *modelled* figures of one design, and how they relate.

Every figure comes from a tool run on this design (the testbench for cycles and II, yosys for
resources and the logic-delay bound), never from a board: the dict says so in ``label`` and
``basis``. The relations a reader (and tests/test_fpga_da4ml.py) can check:

* ``effective_mhz = min(clock_mhz, 1000 / stage_bound_ns)``: the target clock, unless the
  slowest pipeline stage's logic alone cannot meet it;
* ``latency_ns = latency_cycles * 1000 / effective_mhz``;
* ``end_to_end_ns = latency_ns + io_assumption_ns`` (split as ``logic`` and ``I/O assumption``).
"""
from __future__ import annotations

from typing import Any

#: Default I/O assumption: one PCIe round trip between host memory and an FPGA endpoint.
#: ~850 ns measured full round trip, Xilinx Virtex-7 PCIe Gen3 x8 endpoint ↔ Intel i7-4771
#: (http://hackingnasdaq.blogspot.com/2014/05/pcie-latency.html, 2014); see
#: docs/targets-fpga.md for context (Neugebauer et al., SIGCOMM 2018, pcie-bench).
PCIE_RTT_NS = 850.0
PCIE_SOURCE = ("PCIe round trip ~850 ns measured FPGA endpoint (Virtex-7 Gen3 x8) ↔ host "
               "(i7-4771): hackingnasdaq.blogspot.com/2014/05/pcie-latency.html")
LABEL = "modelled"


def effective_mhz(clock_mhz: float, stage_bound_ns: float) -> float:
    if stage_bound_ns <= 0:
        return float(clock_mhz)
    return min(float(clock_mhz), 1000.0 / stage_bound_ns)


def hardware_estimate(*, cycles: int, ii: int, depth: int, synth: dict[str, Any], part: str,
                      clock_mhz: float, io_ns: float, io_source: str, tools: dict[str, str],
                      pnr: dict[str, Any] | None = None) -> dict[str, Any]:
    bound = float(synth.get("stage_bound_ns", 0.0))
    eff = effective_mhz(clock_mhz, bound)
    latency_ns = cycles * 1000.0 / eff
    est: dict[str, Any] = {
        "label": LABEL,
        "basis": "RTL simulation (Verilator testbench, one vector per clock)"
                 + (" + open synthesis (yosys synth_xilinx, logic-only per-stage delay)"
                    if synth.get("luts") is not None else " (synthesis not run: no resources, no delay bound)")
                 + "; no board, no place-and-route",
        "latency_cycles": int(cycles), "initiation_interval": int(ii), "pipeline_depth": int(depth),
        "luts": synth.get("luts"), "ffs": synth.get("ffs"), "dsps": synth.get("dsps"),
        "brams": synth.get("brams"), "carry": synth.get("carry"),
        "part": part, "clock_mhz": float(clock_mhz),
        "stage_delay_bound_ns": round(bound, 3),
        "stage_bound_mhz": round(1000.0 / bound, 1) if bound > 0 else None,
        "effective_mhz": round(eff, 3),
        "latency_ns": round(latency_ns, 3),
        "end_to_end": {"logic_ns": round(latency_ns, 3), "io_assumption_ns": float(io_ns),
                       "total_ns": round(latency_ns + io_ns, 3), "io_assumption": io_source,
                       "label": LABEL},
        "source": tools,
    }
    if pnr:
        est["post_route"] = pnr
    return est


def estimate_lines(est: dict[str, Any] | None) -> list[str]:
    """What ``hwb compile`` prints of an estimate (``Target.summary_lines``): the modelled
    latency with its clock and I/O assumption, then the resources; none without one."""
    if not isinstance(est, dict) or not est:
        return []
    e2e = est.get("end_to_end") or {}
    res = ", ".join(f"{est[k]:,} {k[:-1].upper()}" for k in ("luts", "ffs", "dsps", "brams")
                    if est.get(k) is not None)
    return [f"  hardware  {est.get('label', LABEL).upper()}, not measured: "
            f"{est['latency_cycles']} cycles (II {est.get('initiation_interval')}) = "
            f"{est['latency_ns']:,.1f} ns @ {est['effective_mhz']:.0f} MHz; end to end "
            f"{e2e.get('total_ns', 0):,.0f} ns (logic + {e2e.get('io_assumption_ns', 0):,.0f} "
            f"ns I/O assumption)",
            f"            resources {res or 'not synthesized'} on {est.get('part')}; "
            f"{est.get('basis', '')}"]
