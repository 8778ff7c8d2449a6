"""The fidelity gate a built variant must pass before :func:`hwbackends.compile` hands it out.

One check for every caller that asks "did this variant fail its precision's gate": the
precision family's tolerance (:func:`hwbackends.fidelity.gate_violations`, what the
conformance kit and a fleet import hold a variant to) and, for an FPGA ``auto`` precision,
whether its search met its own target. ``compile()`` raises :class:`FidelityGateError` on a
failure (unless called with ``gate=False``); ``hwb compile`` prints it and exits 3.
"""
from __future__ import annotations

from typing import Any

from ..errors import FidelityGateError


def fidelity_gate(cm: Any) -> dict[str, Any] | None:
    """``{"passed", "family", "violations"}`` for ``cm`` (None when no fidelity was measured)."""
    if cm.fidelity is None:
        return None
    from ..fidelity import gate_violations, precision_family

    bad = gate_violations(cm.precision, cm.fidelity)
    if (cm.artifact.meta or {}).get("meets_target") is False:
        bad.append("the target's own fidelity target (its option fidelity, met by the auto "
                   "precision search or checked at the precision given) was not met on the "
                   "calibration data")
    return {"passed": not bad, "family": precision_family(cm.precision), "violations": bad}


def enforce_gate(cm: Any) -> None:
    """Raise :class:`FidelityGateError` (carrying ``cm``) when ``cm`` fails its gate."""
    gate = fidelity_gate(cm)
    if gate is None or gate["passed"]:
        return
    raise FidelityGateError(
        f"{cm.variant} was built but fails the {gate['family']} precision's fidelity gate: "
        f"{'; '.join(gate['violations'])} (fidelity: {cm.fidelity}). It is not handed out: "
        f"check the model compiles as written on this target (a layer or argument it may "
        f"not read), give representative calibration_data for a quantized precision, or pick "
        f"another precision; to inspect it, the variant is this error's .variant, or call "
        f"compile(..., gate=False) to get ungated variants",
        variant=cm, violations=gate["violations"], family=gate["family"])
