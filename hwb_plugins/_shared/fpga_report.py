"""What the FPGA plugins' report sections share (``fpga.hls4ml``, ``fpga.da4ml``): picking a
target's rows out of the results, and the cell formatting. Each plugin parses only the
metadata keys its own ``compile`` wrote; this module knows none of them.

A results file's variant rows are dicts in older files and records
(:class:`hwbackends.variant.VariantRecord`, whose ``to_dict`` is the row) in newer ones;
:func:`rows_of` hands both out as dicts. The modelled ``hardware_estimate`` is a top-level key
of a row.
"""
from __future__ import annotations

import html
import math
from typing import Any


def esc(x: Any) -> str:
    return html.escape(str(x))


def num(v: Any, fmt: str = ",") -> str:
    """``v`` formatted, or an em dash for a missing (``None``/NaN) or non-numeric figure."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return format(v, fmt)


def rows_of(results: Any, target: str) -> list[dict[str, Any]]:
    """The built (no ``error``) variant rows of ``target`` in ``results``, as dicts."""
    out = []
    for v in getattr(results, "variants", None) or []:
        row = v.to_dict() if hasattr(v, "to_dict") else v
        if isinstance(row, dict) and row.get("target") == target and not row.get("error"):
            out.append(row)
    return out


def fpga_meta(row: dict[str, Any]) -> dict[str, Any]:
    """The row's FPGA metadata (the ``plugin_report`` the bench keeps of an FPGA variant)."""
    rep = row.get("plugin_report")
    return rep if isinstance(rep, dict) else {}


def estimate(row: dict[str, Any]) -> dict[str, Any]:
    """The row's modelled ``hardware_estimate`` ({} when it has none)."""
    est = row.get("hardware_estimate")
    return est if isinstance(est, dict) else {}


def fidelity_cell(row: dict[str, Any]) -> str:
    """``corr …, max abs …`` of the row's fidelity against the fp32 model, or a dash."""
    f = row.get("fidelity") or {}
    if not isinstance(f, dict) or not isinstance(f.get("corr"), (int, float)):
        return "—"
    return f"corr {f['corr']:.6f}, max abs {num(f.get('max_abs'), '.2g')}"


def table(head: list[str], rows: list[list[str]]) -> str:
    """An HTML table; ``head`` is escaped here, the cells are HTML already."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return ("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + body + "</tbody></table>")
