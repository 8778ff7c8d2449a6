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
        raise ConfigError(f"{_quoted(text)} is not {what}; expected a number with "
                          f"{'an optional unit' if what == 'a size' else 'a unit'}: {form}")
    return Decimal(m.group(1)), m.group(2).lower()


def parse_size(text: str) -> int:
    """``500M``, ``2G``, ``1.5GiB``, ``0`` → bytes (binary units, as :func:`fmt_bytes`
    writes them), at most :data:`MAX_SIZE_BYTES`. Raises :class:`ConfigError` (a
    ``ValueError``) saying what is accepted."""
    n, unit = _number(text, r"\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*", "a size", _SIZE_FORM)
    size = n * _SIZE_UNITS[unit]
    if size > MAX_SIZE_BYTES:
        raise ConfigError(f"{_quoted(text)} is too large a size (at most 1024T, 1 PiB); "
                          f"expected one of {_SIZE_FORM}")
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
                          f"expected one of {_AGE_FORM}")
    return float(age)


# -- numbers on a command line and in settings: one parser per kind ---------------------------
#: A decimal number as a person writes it (no ``nan``, ``inf``, ``0x``, ``1_000``).
_DECIMAL = r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*"
_WHOLE = r"\s*([+-]?\d+)\s*"


def _read(text: object, pattern: str, what: str, form: str) -> Decimal:
    t = str(text)
    m = re.fullmatch(pattern, t, re.I) if len(t) <= _MAX_TEXT else None
    if not m:
        raise ConfigError(f"{_quoted(text)} is not {what}; expected {form}")
    return Decimal(m.group(1))


def _bounded(v: Decimal, text: object, what: str, form: str, lo: float, hi: float,
             lo_open: bool) -> None:
    if v < Decimal(repr(lo)) or (lo_open and v == Decimal(repr(lo))) or v > Decimal(repr(hi)):
        raise ConfigError(f"{_quoted(text)} is out of range for {what}; expected {form}")


def _g(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def parse_count(text: str, lo: int = 1, hi: int = 10_000_000, what: str = "a count",
                example: int | None = None, per_item: str = "") -> int:
    """A whole number ``lo..hi`` (a sample count, a batch size, threads, slots). ``per_item``
    says what each one costs where the value sizes work (``8 B of timing each``), so the
    message says why the cap is where it is."""
    form = (f"a whole number ≥ {_g(lo)} and ≤ {_g(hi)}"
            + (f", e.g. {example}" if example is not None else "")
            + (f" ({per_item})" if per_item else ""))
    v = _read(text, _WHOLE, what, form)
    _bounded(v, text, what, form, lo, hi, False)
    return int(v)


def parse_port(text: str, allow_any: bool = True) -> int:
    """A TCP port: ``1..65535``, or ``0`` (any free one) when ``allow_any``."""
    lo = 0 if allow_any else 1
    form = "a port number from 1 to 65535" + (" (0: any free port)" if allow_any else "")
    v = _read(text, _WHOLE, "a port", form)
    _bounded(v, text, "a port", form, lo, 65535, False)
    return int(v)


def parse_real(text: str, lo: float, hi: float, what: str, unit: str = "",
               lo_open: bool = False, example: str = "") -> float:
    """A finite decimal number in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``); the kinds
    below name their unit and bounds."""
    form = (f"a number {'>' if lo_open else '≥'} {_g(lo)} and ≤ {_g(hi)}{' ' + unit if unit else ''}"
            + (f", e.g. {example}" if example else ""))
    v = _read(text, _DECIMAL, what, form)
    _bounded(v, text, what, form, lo, hi, lo_open)
    return float(v)


#: The largest batch size any option, setting or file takes.
MAX_BATCH = 1 << 16
#: Bounds of the kinds: a duration a command waits or measures (a week), a latency budget
#: (an hour in µs), a rate of requests (10 MHz: 100 ns apart, past any core).
MAX_SECONDS = 7 * 86400.0
MAX_US = 3600e6
MAX_RATE_HZ = 1e7


def parse_seconds(text: str, lo: float = 0.0, hi: float = MAX_SECONDS, lo_open: bool = True) -> float:
    """A duration in seconds, ``> 0`` (or ``≥ lo``) and at most a week."""
    return parse_real(text, lo, hi, "a duration", "seconds", lo_open, "30")


def parse_us(text: str, lo: float = 0.0, hi: float = MAX_US, lo_open: bool = True) -> float:
    """A time in microseconds (a deadline, a spin budget), ``> 0`` and at most an hour."""
    return parse_real(text, lo, hi, "a time in µs", "µs", lo_open, "500")


def parse_rate(text: str, hi: float = MAX_RATE_HZ) -> float:
    """A rate in Hz, ``> 0`` and at most :data:`MAX_RATE_HZ`."""
    return parse_real(text, 0.0, hi, "a rate", "Hz", True, "2000")


def parse_fraction(text: str) -> float:
    """A fraction in ``[0, 1]``."""
    return parse_real(text, 0.0, 1.0, "a fraction", "", False, "0.01")
