"""How the project writes a latency for people: one formatter, so a table, a report and a
routing decision show the same figure the same way."""
from __future__ import annotations

import math


def fmt_us(v: float | None) -> str:
    """A latency in µs for tables and reports: ``0.23 µs``, ``1,234.5 µs``, ``12.3 ms``; "—"
    for none measured (``None`` or NaN). Two decimals below 10 µs, where the fast variants
    differ."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if v < 10:
        return f"{v:.2f} µs"
    if v < 10_000:
        return f"{v:,.1f} µs"
    return f"{v / 1000:,.1f} ms"
