"""How the project writes quantities for people, and reads them back from a command line:
one formatter per unit, so a table, a report and a routing decision show the same figure the
same way (a latency in µs, a size in bytes, an age in seconds)."""
from __future__ import annotations

import math
import re
from decimal import Decimal

from .errors import ConfigError

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


#: The largest size :func:`parse_size` takes (1024T: 1 PiB), the largest age :func:`parse_age`
#: takes (36500d: a century); the longest text either reads, and how much of it a message quotes.
MAX_SIZE_BYTES = 1 << 50
MAX_AGE_S = 36500 * 86400.0
_MAX_TEXT, _QUOTE = 400, 40
_SIZE_FORM = "0, 800M, 2G, 1.5GiB (K, M, G, T: powers of 1024), from 0 to 1024T"
_AGE_FORM = "45s, 90m, 12h, 30d, 2w, from 0s to 36500d"


def _quoted(text: object) -> str:
    t = str(text)
    return repr(t) if len(t) <= _QUOTE else repr(t[:_QUOTE]) + f"… ({len(t)} characters)"


def _number(text: object, pattern: str, what: str, form: str) -> tuple[Decimal, str]:
    """The number and the unit letter of ``text`` matched by ``pattern``, else
    :class:`ConfigError` naming the form expected."""
    t = str(text)
    m = re.fullmatch(pattern, t, re.I) if len(t) <= _MAX_TEXT else None
    if not m:
        raise ConfigError(f"{_quoted(text)} is not {what}; write a number with "
                          f"{'an optional unit' if what == 'a size' else 'a unit'}: {form}")
    return Decimal(m.group(1)), m.group(2).lower()


def parse_size(text: str) -> int:
    """``500M``, ``2G``, ``1.5GiB``, ``0`` → bytes (binary units, as :func:`fmt_bytes`
    writes them), at most :data:`MAX_SIZE_BYTES`. Raises :class:`ConfigError` (a
    ``ValueError``) saying what is accepted."""
    n, unit = _number(text, r"\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*", "a size", _SIZE_FORM)
    size = n * _SIZE_UNITS[unit]
    if size > MAX_SIZE_BYTES:
        raise ConfigError(f"{_quoted(text)} is too large a size (at most 1024T, 1 PiB); write "
                          f"one of {_SIZE_FORM}")
    return int(size)


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
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` → seconds, at most :data:`MAX_AGE_S`. Raises
    :class:`ConfigError` (a ``ValueError``) saying what is accepted."""
    n, unit = _number(text, r"\s*(\d+(?:\.\d*)?)\s*([smhdw])\s*", "an age", _AGE_FORM)
    age = n * _AGE_UNITS[unit]
    if age > Decimal(MAX_AGE_S):
        raise ConfigError(f"{_quoted(text)} is too long an age (at most 36500d, a century); "
                          f"write one of {_AGE_FORM}")
    return float(age)
