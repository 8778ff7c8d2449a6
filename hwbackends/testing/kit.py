"""The conformance checks: the whole target contract, run against the real toolchain.

Each ``check_*`` function takes a :class:`~.context.Conformance` (one target, one artifact
store) and, for per-variant checks, a :class:`~.context.Variant` (zoo model × precision). A
check returns a short summary on success, raises :class:`~.context.ConformanceError` (an
``AssertionError``) naming the rule that was broken and how to fix it, or
:class:`~.context.NotApplicable` with the reason it cannot run here (target unavailable,
model not supported by the target).

The checks are plain functions so they run anywhere: under the pytest plugin
(``pytest --hwb-target NAME``), from ``hwb plugin check NAME``, or from a plugin's own tests.
This module is their index; each lives in a module of its own:

===================  ==============================================================
``check_target``     metadata (class attributes), probe (fast, never raises)
``light``            probe_is_light (measured import cost of the plugin and probe())
``check_store``      store_roundtrip (files, cache, corruption), compile_isolated
``check_variant``    compile, predict, fidelity (:data:`hwbackends.fidelity.TOLERANCES`)
``alloc``            no_allocation (per-call peak and net, tracemalloc)
``bad_inputs``       bad_inputs (every wrong array → InputError)
``check_sliding``    sliding (``cm.sliding()`` equals ``predict_into`` on each window)
===================  ==============================================================
"""
from __future__ import annotations

from typing import Callable

from ..fidelity import TOLERANCES, precision_family
from .alloc import ALLOC_BOUND_BYTES, ALLOC_CALLS, PEAK_BOUND_BYTES, check_no_allocation
from .bad_inputs import STRIDED, bad_input_cases, check_bad_inputs
from .check_sliding import check_sliding
from .check_store import check_compile_isolated, check_store_roundtrip
from .check_target import PROBE_BUDGET_S, check_metadata, check_probe
from .check_variant import check_compile, check_fidelity, check_predict
from .context import Conformance, ConformanceError, NotApplicable, Variant, zoo_format
from .layers import layer_names, names_layer
from .light import IMPORT_BUDGET_MS, LIGHT_PACKAGES, check_probe_is_light

#: Checks run once per target / once per (model, precision), in this order.
TARGET_CHECKS: dict[str, Callable[[Conformance], str]] = {
    "metadata": check_metadata, "probe": check_probe, "probe_is_light": check_probe_is_light,
    "store_roundtrip": check_store_roundtrip, "compile_isolated": check_compile_isolated,
}
VARIANT_CHECKS: dict[str, Callable[[Conformance, Variant], str]] = {
    "compile": check_compile, "predict": check_predict, "no_allocation": check_no_allocation,
    "fidelity": check_fidelity, "bad_inputs": check_bad_inputs, "sliding": check_sliding,
}
#: Target checks that still run (and must pass) when the target is unavailable here.
WHEN_UNAVAILABLE = ("metadata", "probe", "probe_is_light")


def run_target_check(ctx: Conformance, name: str) -> str:
    if name not in WHEN_UNAVAILABLE:
        ctx.require_usable()
    return TARGET_CHECKS[name](ctx)


def run_variant_check(ctx: Conformance, v: Variant, name: str) -> str:
    ctx.require_usable()
    return VARIANT_CHECKS[name](ctx, v)


__all__ = [
    "ALLOC_BOUND_BYTES", "ALLOC_CALLS", "IMPORT_BUDGET_MS", "LIGHT_PACKAGES", "PEAK_BOUND_BYTES",
    "PROBE_BUDGET_S", "STRIDED", "TARGET_CHECKS", "TOLERANCES", "VARIANT_CHECKS",
    "WHEN_UNAVAILABLE", "Conformance", "ConformanceError", "NotApplicable", "Variant",
    "bad_input_cases", "layer_names", "names_layer", "precision_family", "run_target_check",
    "run_variant_check", "zoo_format",
]
