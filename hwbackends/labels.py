"""A variant's label, ``TARGET:PRECISION[+push=FORM]``: built by :func:`label` and read by
:func:`parse_label`, so no module spells the separators itself. A module of its own (not in
``variant.py``) because ``compiled.py`` names its variant with it, and ``variant.py`` reads
``CompiledModel``.

The ``+push=FORM`` part names a sliding window's push form when it is not the variant's own
precision: cpu.native's ``push_weights=int8`` keeps an fp32 variant whose push reads int8
weights (``cpu.native:fp32+push=int8``), a different variant from the plain fp32 one in every
row, report, comparison and pin."""
from __future__ import annotations

import re
from typing import Any, NamedTuple

#: The push forms a label may name (``+push=FORM``); fp32 is the plain form and is not named.
PUSH_FORMS = ("bf16", "f16", "fp16", "int8")
_PUSH = "+push="


class Label(NamedTuple):
    """A parsed label: its target, precision and push form (``None``: the variant's own)."""

    target: str
    precision: str
    push: str | None = None


def label(target: str, precision: str, push: str | None = None) -> str:
    """A variant's label, ``TARGET:PRECISION`` (``cpu.litert:int8``): how every row, pin,
    progress line and report names a variant. A target never built has no precision, and
    its label is the bare target name. ``push``: a reduced push form (one of
    :data:`PUSH_FORMS`), appended as ``+push=FORM``; ``None`` or ``"fp32"`` adds nothing."""
    base = f"{target}:{precision}" if precision else target
    return base + (f"{_PUSH}{push}" if push and push != "fp32" else "")


def parse_label(text: str) -> Label:
    """The :class:`Label` of ``text`` (the inverse of :func:`label`): ``cpu.litert:fp32`` →
    ``("cpu.litert", "fp32", None)``, ``cpu.native:fp32+push=int8`` → ``("cpu.native", "fp32",
    "int8")``; a bare target name has precision ``""``. A ``+push=`` naming no known form is
    kept in the precision (the target's precision check then refuses it, saying why)."""
    target, _, precision = text.partition(":")
    m = re.fullmatch(r"(.*)\+push=(" + "|".join(PUSH_FORMS) + r")", precision)
    if m:
        return Label(target, m.group(1), m.group(2))
    return Label(target, precision)


def push_form(meta: Any) -> str | None:
    """The reduced push form an artifact's metadata declares (``meta["sliding"]
    ["push_weights"]``, where a target keeps the weights its sliding push reads), or ``None``
    for the variant's own (fp32, or no sliding form)."""
    sl = meta.get("sliding") if isinstance(meta, dict) else None
    form = sl.get("push_weights") if isinstance(sl, dict) else None
    return form if isinstance(form, str) and form in PUSH_FORMS else None


def push_of(variant: str) -> str | None:
    """The push form a row's variant label names (:func:`parse_label`'s ``push``), reading
    past a fleet row's `` @ NODE``."""
    return parse_label(variant.partition(" @ ")[0]).push
