"""The report's ``fpga.da4ml`` section: modelled cycles, II, ns and resources per precision
(hook ``hwb_report_sections``).

Every hardware figure here is *modelled* (RTL simulation + open synthesis, see
:mod:`.estimate`) and labelled so; fidelity figures are computed from the bit-exact RTL
simulation against the fp32 model, like every other variant's. The keys read are the ones
this plugin's ``compile`` writes: ``hardware_estimate`` and the design's ``bits`` and
``bit_exact`` (kept by the bench in the row's ``fpga`` dict).
"""
from __future__ import annotations

from typing import Any

from hwbackends.contract import MODELLED

from .._shared.fpga_report import esc, estimate, fidelity_cell, fpga_meta, num, rows_of, table
from .target import Da4mlTarget

HEAD = ["variant", "bits", "cycles", "II", "logic ns", "end-to-end ns (logic + I/O assumption)",
        "LUT", "FF", "DSP", "BRAM", "fidelity (RTL sim)"]


def _bits(row: dict[str, Any]) -> str:
    b = fpga_meta(row).get("bits") or {}
    if "input_width" not in b:
        return "—"
    return f"f={esc(b.get('frac_bits'))}, fw={esc(b.get('weight_frac_bits'))}, in {num(b['input_width'])} b"


def _row(row: dict[str, Any]) -> list[str]:
    est = estimate(row)
    e2e = est.get("end_to_end") or {}
    exact = fpga_meta(row).get("bit_exact") or {}
    return [f"<b>{esc(row['variant'])}</b>", _bits(row),
            num(est.get("latency_cycles")), num(est.get("initiation_interval")),
            f"{num(est.get('latency_ns'), ',.1f')} @ {num(est.get('effective_mhz'), '.0f')} MHz",
            f"{num(e2e.get('logic_ns'), ',.0f')} + {num(e2e.get('io_assumption_ns'), ',.0f')} = "
            f"{num(e2e.get('total_ns'), ',.0f')}",
            num(est.get("luts")), num(est.get("ffs")), num(est.get("dsps")), num(est.get("brams")),
            fidelity_cell(row) + (f"; bit-exact on {num(exact.get('samples'))}" if exact.get("bit_exact") else "")]


def sections(results: Any) -> list[str]:
    """The section, or nothing when no fpga.da4ml variant with a modelled estimate was built."""
    rtl = [r for r in rows_of(results, Da4mlTarget.name) if estimate(r).get("label") == MODELLED]
    if not rtl:
        return []
    est = estimate(rtl[0])
    io = (est.get("end_to_end") or {}).get("io_assumption", "")
    src = est.get("source") or {}
    tools = "; ".join(f"{k}: {v}" for k, v in src.items()) if isinstance(src, dict) else str(src)
    return ['<section><h2>FPGA (fpga.da4ml): modelled latency and resources</h2>'
            '<div class="emu-banner"><b>Modelled, not measured on hardware.</b> Cycles and II are '
            'measured by driving the Verilated RTL with one vector per clock; resources come from '
            'open synthesis (yosys <code>synth_xilinx</code>); ns use min(target clock, the slowest '
            'stage\'s logic-only delay), without routing delay, so real post-route figures are '
            'slower. End-to-end adds a stated I/O assumption, not a measurement.</div>'
            + table(HEAD, [_row(r) for r in rtl])
            + f'<p class="note">I/O assumption: {esc(io)}. Tools: {esc(tools)}.</p></section>']
