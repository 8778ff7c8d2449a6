"""The report's ``fpga.hls4ml`` section: each design's C-simulation fidelity and its bits
(hook ``hwb_report_sections``).

The C-simulation is bit-accurate but untimed: without Vitis HLS there are no cycles or
resources, and the section says so rather than showing a latency. The keys read are the ones
this plugin's ``compile`` writes: the design's ``bits`` and the ``auto`` search's chosen
``frac_bits`` (kept by the bench in the row's ``fpga`` dict).
"""
from __future__ import annotations

from typing import Any

from .._shared.fpga_report import esc, fidelity_cell, fpga_meta, num, rows_of
from .target import Hls4mlTarget


def _bits(row: dict[str, Any]) -> str:
    meta = fpga_meta(row)
    b, frac = meta.get("bits") or {}, meta.get("frac_bits")
    if "total_bits" not in b:
        return "—"
    return (f"f={esc(frac)}, " if frac is not None else "") + f"{num(b['total_bits'])} bits"


def sections(results: Any) -> list[str]:
    """The section, or nothing when no fpga.hls4ml variant was built."""
    rows = rows_of(results, Hls4mlTarget.name)
    if not rows:
        return []
    items = "".join(f"<li><b>{esc(r['variant'])}</b>: {fidelity_cell(r)} ({_bits(r)})</li>" for r in rows)
    return ['<section><h2>FPGA (fpga.hls4ml): C-simulation fidelity</h2>'
            '<div class="emu-banner"><b>C-simulation, not hardware.</b> hls4ml\'s bit-accurate '
            'C-simulation gives each design\'s exact fixed-point answers (the fidelity below) but '
            'no cycles or resources: those need Vitis HLS synthesis (or <code>fpga.da4ml</code>, '
            'which models them from RTL).</div>'
            f'<ul>{items}</ul></section>']
