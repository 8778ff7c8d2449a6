"""One compiled variant's record: what a bench run, a fleet node and the router know about a
variant (target × precision) *besides* its latency profiles — its mode, fidelity, build cost,
where its data came from, its modelled hardware estimate, or the error that stopped it.

It is the ``variants`` rows of a results file (``BenchResults.variants``), written by
``hwb bench`` / ``hwb fleet`` and read by the report, ``hwb route --fleet-results`` and
``hwb bench --route``; and it is what the router's candidate policy
(:func:`hwbackends.router.plan.judge`) judges, whether the variant was compiled just now or
read back from a file. :meth:`VariantRecord.to_dict` / :meth:`VariantRecord.from_dict`
round-trip (``from_dict(r.to_dict()) == r``); keys a newer writer added are kept, not lost.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .errors import HwbError
from .fidelity import Fidelity
from .labels import PUSH_FORMS, label, push_form

if TYPE_CHECKING:  # pragma: no cover
    from .compiled import CompiledModel
    from .registry import Registry

log = logging.getLogger(__name__)


class RecordError(HwbError):
    """A variant row of a results file that is not one (missing target/precision, wrong type)."""


@dataclass
class VariantRecord:
    """One variant row. ``error`` set means it was not built (or its node was lost) and
    nothing else but the identity and ``mode`` is meaningful. ``hardware_estimate`` is the
    artifact metadata's modelled figure (``Target.compile``'s ``hardware_estimate``, e.g.
    ``fpga.da4ml``'s cycles and ns), ``None`` when the target measures instead. ``machine``,
    ``artifact_from`` and ``artifact_from_node`` are set by fleet runs."""

    variant: str
    target: str
    precision: str
    mode: str
    error: str | None = None
    fidelity: Fidelity | None = None
    device: str = ""
    mode_reason: str = ""
    compile_seconds: float = 0.0
    cached: bool = False
    artifact_bytes: int | None = None
    artifact_key: str = ""
    batch_size: int = 1
    toolchain: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] | None = None
    hardware_estimate: dict[str, Any] | None = None
    #: What the target's plugin keeps for its report sections (``Target.report_meta``: for
    #: the FPGA targets bits, bit-exactness, chosen fraction); ``None`` for most targets.
    plugin_report: dict[str, Any] | None = None
    machine: dict[str, Any] | None = None
    #: The sliding push form when it is not the variant's own precision (a label's
    #: ``+push=FORM``: cpu.native's ``push_weights=int8``); ``None`` for the plain form.
    push: str | None = None
    artifact_from: str | None = None
    artifact_from_node: str | None = None
    #: Keys of the row this version does not know (a newer writer's), written back unchanged.
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_compiled(cls, cm: "CompiledModel", registry: "Registry") -> "VariantRecord":
        """The record of a variant just compiled (or loaded from the store); ``registry`` is
        the run's, which holds its target."""
        d = cm.describe()
        est = d.get("hardware_estimate")
        return cls(variant=cm.variant, target=cm.target, precision=cm.precision,
                   mode=cm.mode.value, fidelity=cm.fidelity, device=d.get("device") or "",
                   mode_reason=d.get("mode_reason") or "",
                   compile_seconds=float(d.get("compile_seconds") or 0.0),
                   cached=bool(d.get("cached")), artifact_bytes=d.get("artifact_bytes"),
                   artifact_key=cm.artifact.key, batch_size=cm.batch_size,
                   toolchain=dict(d.get("toolchain") or {}), data=cm.data or None,
                   hardware_estimate=est, plugin_report=report_meta(cm.target, d.get("meta") or {}, registry),
                   push=push_form(d.get("meta")))

    @classmethod
    def failed(cls, target: str, precision: str, mode: str, error: str,
               batch_size: int | None = None, **kw: Any) -> "VariantRecord":
        """The record of a variant that was not built (compile error, lost node, ...)."""
        kw.setdefault("variant", label(target, precision))
        return cls(target=target, precision=precision, mode=mode, error=error,
                   batch_size=batch_size or 1, **kw)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.extra)
        for f in fields(self):
            if f.name != "extra":
                d[f.name] = getattr(self, f.name)
        d["fidelity"] = self.fidelity.to_dict() if self.fidelity else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VariantRecord":
        """The inverse of :meth:`to_dict` (a row of a results file of this format version:
        ``BenchResults.load`` refuses other versions before reading a row)."""
        if not isinstance(d, dict):
            raise RecordError(f"a variant row must be a JSON object, got {type(d).__name__}; "
                              f"re-run `hwb bench` to regenerate the results file")
        missing = [k for k in ("target", "precision") if not isinstance(d.get(k), str)]
        if missing:
            raise RecordError(f"variant row {d.get('variant', '?')!r} has no {', '.join(missing)}; "
                              f"re-run `hwb bench` to regenerate the results file")
        known = {f.name for f in fields(cls)} - {"extra"}
        kw = {k: v for k, v in d.items() if k in known and v is not None}
        if "push" in kw and kw["push"] not in PUSH_FORMS:
            raise RecordError(f"variant row {d.get('variant', '?')!r}: push {kw['push']!r} is not "
                              f"one of {', '.join(PUSH_FORMS)}; re-run `hwb bench` to regenerate "
                              f"the results file")
        kw.setdefault("variant", label(d["target"], d["precision"], kw.get("push")))
        kw.setdefault("mode", "unknown")
        kw["error"] = d.get("error") or None
        if isinstance(d.get("fidelity"), dict):
            kw["fidelity"] = Fidelity.from_dict(d["fidelity"])
        return cls(**kw, extra={k: v for k, v in d.items() if k not in known})


def report_meta(target: str, meta: dict[str, Any], registry: "Registry") -> dict[str, Any] | None:
    """What the results row keeps (as ``plugin_report``) of a variant's artifact metadata for its
    plugin's report sections: ``Target.report_meta``, so the core reads none of a plugin's
    keys. ``None`` for a target the run's ``registry`` does not hold, or a hook that raises or
    returns something other than a dict (logged: a plugin bug must not lose the benchmark)."""
    tgt = registry.targets.get(target)
    if tgt is None:
        return None
    try:
        out = tgt.report_meta(meta)
    except Exception as exc:
        log.warning("%s.report_meta raised %s: %s; the row keeps no report metadata (a plugin bug)",
                    target, type(exc).__name__, exc)
        return None
    if out is not None and not isinstance(out, dict):
        log.warning("%s.report_meta returned %s, not a dict; the row keeps no report metadata",
                    target, type(out).__name__)
        return None
    return out


def machine_key(row: Any) -> str:
    """The machine a results row (availability dict, :class:`VariantRecord`, or
    ``LatencyProfile``) was measured on: its Ray node id in a fleet file, else the machine
    fingerprint's id; ``"?"`` for a row with neither (a variant of a one-machine file)."""
    m = (row.get("machine") if isinstance(row, dict) else getattr(row, "machine", None)) or {}
    return str(m.get("node_id") or m.get("id") or "?")
