"""The conformance kit for target plugins.

Run the whole target contract against any registered target::

    pytest --hwb-target cpu.litert                         # from any directory
    pytest --pyargs hwbackends.testing --hwb-target NAME   # the same, explicit
    hwb plugin check NAME                                  # the same, through the CLI

Options: ``--hwb-models mlp,signal`` (default: every zoo model the target claims through its
``formats`` and the installed converters), ``--hwb-precisions all|default|fp32,int8``,
``--hwb-store PATH`` (default: a fresh temporary store).

The checks are plain functions (:mod:`hwbackends.testing.kit`) that a plugin's own test suite
can call; the pytest plugin (:mod:`hwbackends.testing.plugin`, registered under the
``pytest11`` entry point) only parametrizes them. Importing this package imports no ML
framework.
"""
from __future__ import annotations

from .kit import (
                  ALLOC_BOUND_BYTES,
                  ALLOC_CALLS,
                  IMPORT_BUDGET_MS,
                  LIGHT_PACKAGES,
                  PEAK_BOUND_BYTES,
                  PROBE_BUDGET_S,
                  TARGET_CHECKS,
                  TOLERANCES,
                  VARIANT_CHECKS,
                  WHEN_UNAVAILABLE,
                  Conformance,
                  ConformanceError,
                  NotApplicable,
                  Variant,
                  bad_input_cases,
                  names_layer,
                  precision_family,
                  run_target_check,
                  run_variant_check,
)

__all__ = [
    "ALLOC_BOUND_BYTES", "ALLOC_CALLS", "Conformance", "ConformanceError", "IMPORT_BUDGET_MS",
    "LIGHT_PACKAGES", "NotApplicable", "PEAK_BOUND_BYTES", "PROBE_BUDGET_S", "TARGET_CHECKS",
    "TOLERANCES", "VARIANT_CHECKS", "Variant", "WHEN_UNAVAILABLE", "bad_input_cases",
    "names_layer", "precision_family", "run_target_check", "run_variant_check",
]
