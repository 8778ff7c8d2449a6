"""A variant's label, ``TARGET:PRECISION``: built by :func:`label` and read by
:func:`parse_label`, so no module spells the separator itself. A module of its own (not in
``variant.py``) because ``compiled.py`` names its variant with it, and ``variant.py`` reads
``CompiledModel``."""
from __future__ import annotations


def label(target: str, precision: str) -> str:
    """A variant's label, ``TARGET:PRECISION`` (``cpu.litert:int8``): how every row, pin,
    progress line and report names a variant. A target never built has no precision, and
    its label is the bare target name."""
    return f"{target}:{precision}" if precision else target


def parse_label(text: str) -> tuple[str, str]:
    """``(target, precision)`` of a label (the inverse of :func:`label`): ``cpu.litert:fp32``
    → ``("cpu.litert", "fp32")``; a bare target name has precision ``""``."""
    target, _, precision = text.partition(":")
    return target, precision
