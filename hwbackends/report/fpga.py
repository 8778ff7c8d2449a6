"""The report's FPGA section: modelled cycles, ns and resources per model and precision
(``fpga.da4ml``), with the C-simulation fidelity of ``fpga.hls4ml`` beside them.

Every hardware figure here is *modelled* (RTL simulation + open synthesis, see
plugins/fpga_da4ml/estimate.py) and labelled so; fidelity figures are computed from the
bit-exact simulations against the fp32 model, like every other variant's.
"""
from __future__ import annotations

import html
import math
from typing import Any

from ..bench.results import BenchResults
from ..specs import MODELLED


def _e(x: Any) -> str:
    return html.escape(str(x))


def _num(v: Any, fmt: str = ",") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return format(v, fmt)


def _fid(v: dict[str, Any]) -> str:
    f = v.get("fidelity") or {}
    if "corr" not in f:
        return "—"
    return f"corr {f['corr']:.6f}, max abs {f.get('max_abs', math.nan):.2g}"


def _bits(v: dict[str, Any]) -> str:
    fp = v.get("fpga") or {}
    b, frac = fp.get("bits") or {}, fp.get("frac_bits")
    if "input_width" in b:  # fpga.da4ml
        return f"f={b.get('frac_bits')}, fw={b.get('weight_frac_bits')}, in {b['input_width']} b"
    if "total_bits" in b:  # fpga.hls4ml
        return f"f={frac}, {b['total_bits']:,} bits" if frac is not None else f"{b['total_bits']:,} bits"
    return "—"


def _row(v: dict[str, Any], twin: dict[str, Any]) -> list[str]:
    est = (v.get("fpga") or {}).get("hardware_estimate") or {}
    e2e = est.get("end_to_end") or {}
    exact = (v.get("fpga") or {}).get("bit_exact") or {}
    return [f"<b>{_e(v['variant'])}</b>", _bits(v),
            _num(est.get("latency_cycles")), _num(est.get("initiation_interval")),
            f"{_num(est.get('latency_ns'), ',.1f')} @ {_num(est.get('effective_mhz'), '.0f')} MHz",
            f"{_num(e2e.get('logic_ns'), ',.0f')} + {_num(e2e.get('io_assumption_ns'), ',.0f')} = "
            f"{_num(e2e.get('total_ns'), ',.0f')}",
            _num(est.get("luts")), _num(est.get("ffs")), _num(est.get("dsps")), _num(est.get("brams")),
            _fid(v) + (f"; bit-exact on {exact['samples']:,}" if exact.get("bit_exact") else ""),
            (_e(twin.get("variant", "")) + ": " + _fid(twin)) if twin else "—"]


def section(res: BenchResults) -> str:
    """The FPGA section, or "" when no FPGA variant was compiled."""
    fpga = [v for v in res.variants if str(v.get("target", "")).startswith("fpga.") and not v.get("error")]
    rtl = [v for v in fpga if ((v.get("fpga") or {}).get("hardware_estimate") or {}).get("label") == MODELLED]
    if not fpga:
        return ""
    # One model per report: the fpga.hls4ml variant(s) of the same model sit beside.
    hls = [v for v in fpga if v.get("target") == "fpga.hls4ml"]
    head = ["variant", "bits", "cycles", "II", "logic ns", "end-to-end ns (logic + I/O assumption)",
            "LUT", "FF", "DSP", "BRAM", "fidelity (RTL sim)", "fpga.hls4ml C-sim fidelity"]
    rows = [_row(v, hls[0] if hls else {}) for v in rtl]
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    table = ("<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"
             + body + "</tbody></table>") if rows else ""
    io = next((((v.get("fpga") or {}).get("hardware_estimate") or {}).get("end_to_end", {}).get("io_assumption")
               for v in rtl), "")
    src = next((((v.get("fpga") or {}).get("hardware_estimate") or {}).get("source") for v in rtl), {}) or {}
    missing = "" if rtl else (
        "<p>No <code>fpga.da4ml</code> variant in this run (its toolchain is missing, or it was not "
        "selected): only C-simulation fidelity is available, no cycles or resources.</p>")
    hls_rows = "".join(f"<li>{_e(v['variant'])}: {_fid(v)} ({_bits(v)})</li>" for v in hls)
    return ('<section><h2>FPGA: modelled latency and resources</h2>'
            '<div class="emu-banner"><b>Modelled, not measured on hardware.</b> Cycles and II are '
            'measured by driving the Verilated RTL with one vector per clock; resources come from '
            'open synthesis (yosys <code>synth_xilinx</code>); ns use min(target clock, the slowest '
            'stage\'s logic-only delay), without routing delay, so real post-route figures are '
            'slower. End-to-end adds a stated I/O assumption, not a measurement.</div>'
            + missing + table
            + (f'<p class="note">I/O assumption: {_e(io)}. Tools: {_e("; ".join(f"{k}: {v}" for k, v in src.items()))}.</p>'
               if rtl else "")
            + (f'<p class="note">fpga.hls4ml (C-simulation, bit-accurate; no cycles without Vitis HLS):</p><ul>{hls_rows}</ul>'
               if hls_rows else "")
            + "</section>")
