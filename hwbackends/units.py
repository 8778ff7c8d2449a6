"""How the project writes quantities for people, and reads them back from a command line:
one formatter per unit, so a table, a report and a routing decision show the same figure the
same way (a latency in µs, a size in bytes, an age in seconds)."""
from __future__ import annotations

import math
import re

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


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


def fmt_bytes(n: int) -> str:
    """A size for tables: ``512 B``, ``1.5 KiB``, ``12.3 MiB``, ``2.0 GiB`` (binary units)."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} TiB"


def parse_size(text: str) -> int:
    """``500M``, ``2G``, ``1.5GiB``, ``0`` → bytes (binary units, as :func:`fmt_bytes`
    writes them). Raises :class:`ValueError` saying what is accepted."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*", str(text), re.I)
    if not m:
        raise ValueError(f"{text!r} is not a size; write a number with an optional unit: "
                         f"0, 800M, 2G, 1.5GiB (K, M, G, T: powers of 1024)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def fmt_age(seconds: float) -> str:
    """How long ago, for tables: ``40 s``, ``12 min``, ``5 h``, ``3 d``."""
    s = max(0.0, seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.0f} d"


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` → seconds. Raises :class:`ValueError` saying
    what is accepted."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smhdw])\s*", str(text), re.I)
    if not m:
        raise ValueError(f"{text!r} is not an age; write a number and a unit: 45s, 90m, 12h, "
                         f"30d, 2w")
    return float(m.group(1)) * _AGE_UNITS[m.group(2).lower()]
