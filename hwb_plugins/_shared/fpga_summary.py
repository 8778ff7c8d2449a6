"""What the FPGA plugins (``fpga.hls4ml``, ``fpga.da4ml``) both say about a build from the
metadata keys both write (``bits``, ``bit_exact``, ``search``, from the shared fixed-point
search): the ``hwb compile`` line about bits (``Target.summary_lines``) and what the results
file keeps for their report sections (``Target.report_meta``). Standard library only: the
targets import it at probe time."""
from __future__ import annotations

from typing import Any


def bits_lines(meta: dict[str, Any]) -> list[str]:
    """``  bits      k v, …`` (scalar entries of ``meta["bits"]``), or none without bits."""
    bits = meta.get("bits") or {}
    if not isinstance(bits, dict) or not bits:
        return []
    return ["  bits      " + ", ".join(f"{k} {v}" for k, v in bits.items()
                                       if not isinstance(v, (dict, list)))[:200]]


def report_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Bits, bit-exactness and the chosen fraction: what the report sections show."""
    search = meta.get("search")
    return {"bits": meta.get("bits"), "bit_exact": meta.get("bit_exact"),
            "frac_bits": search.get("frac_bits") if isinstance(search, dict) else None}
