"""Target-level checks that need no compile: the class attributes and ``probe()``."""
from __future__ import annotations

import re
import time

from ..models import FORMATS
from ..specs import FAMILIES, Availability, Mode
from ..target import CONTRACT_VERSION, Target
from .context import Conformance, ConformanceError

#: Seconds ``probe()`` may take (it runs on every ``hwb targets`` and every compile).
PROBE_BUDGET_S = 1.0


def check_metadata(ctx: Conformance) -> str:
    """Class attributes a target must set, and the methods it must implement."""
    t = ctx.target
    bad = []
    if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_-]+)*", t.name or ""):
        bad.append(f"name {t.name!r} must be lowercase dotted 'family.runtime' (e.g. cpu.litert)")
    elif "." in t.name and t.name.split(".")[0] != t.family:
        bad.append(f"name {t.name!r} must start with its family {t.family!r}")
    if t.family not in FAMILIES:
        bad.append(f"family {t.family!r} must be one of {', '.join(FAMILIES)}")
    if not t.precisions or not all(isinstance(p, str) and p for p in t.precisions):
        bad.append(f"precisions {t.precisions!r} must be a non-empty tuple of names (first = default)")
    if not t.formats or set(t.formats) - set(FORMATS):
        bad.append(f"formats {t.formats!r} must be a non-empty subset of {FORMATS}")
    if not (t.description or "").strip():
        bad.append("description must be one line for `hwb targets`")
    if not isinstance(t.option_docs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in t.option_docs.items()):
        bad.append("option_docs must map each option name to a one-line documentation string")
    calibrated = t.calibrated
    if set(calibrated) - set(t.precisions):
        bad.append(f"calibrated {calibrated!r} lists precisions the target does not offer")
    if t.multi_io_calibrated and not t.multi_io:
        bad.append("multi_io_calibrated is True but multi_io is False (it says the calibrated "
                   "precisions take multi-IO models, which the target does not take)")
    if t.contract_version != CONTRACT_VERSION:
        bad.append(f"contract_version {t.contract_version} != {CONTRACT_VERSION}")
    if not t.compile_timeout or t.compile_timeout <= 0:
        bad.append("compile_timeout must be a positive number of seconds")
    for meth in ("probe", "compile", "load"):
        if getattr(type(t), meth) is getattr(Target, meth):
            bad.append(f"{meth}() is not implemented")
    if bad:
        raise ConformanceError(f"{t.name}: " + "; ".join(bad))
    return f"{t.name} ({t.family}): precisions {', '.join(t.precisions)}; formats {', '.join(t.formats)}"


def check_probe(ctx: Conformance) -> str:
    """``probe()`` is fast, never raises, returns an ``Availability`` with an actionable reason
    when unavailable, a device when usable and says what stands in when emulated."""
    t = ctx.target
    t0 = time.perf_counter()
    av = ctx.availability(fresh=True)
    dt = time.perf_counter() - t0
    if not isinstance(av, Availability):
        raise ConformanceError(f"{t.name}.probe() returned {av!r}; return an Availability "
                               f"(Availability.hardware/emulated/unavailable)")
    if dt > PROBE_BUDGET_S:
        raise ConformanceError(f"{t.name}.probe() took {dt:.2f} s (budget {PROBE_BUDGET_S} s): it "
                               f"runs on every `hwb targets` and compile. Use find_spec/which, "
                               f"not imports or subprocesses")
    if not isinstance(av.mode, Mode):
        raise ConformanceError(f"Availability.mode is {av.mode!r}, not a hwbackends.Mode")
    if av.mode is Mode.UNAVAILABLE and not av.reason.strip():
        raise ConformanceError(f"{t.name} is unavailable without a reason; say what a person can "
                               f"do (e.g. 'tensorrt not importable (pip install tensorrt)')")
    if av.mode is Mode.EMULATED and not av.reason.strip():
        raise ConformanceError(f"{t.name} is emulated without saying what stands in for the hardware")
    if av.usable and not av.device.strip():
        raise ConformanceError(f"{t.name} is {av.mode.value} but names no device")
    again = t.probe()
    if again.mode is not av.mode:
        raise ConformanceError(f"{t.name}.probe() changed its answer between two calls "
                               f"({av.mode.value} → {again.mode.value})")
    return f"{av.mode.value} in {dt * 1000:.1f} ms: {av.reason or av.device}"
