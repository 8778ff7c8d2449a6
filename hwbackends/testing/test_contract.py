"""The conformance kit's tests: collected by ``pytest --hwb-target NAME`` (or
``pytest --pyargs hwbackends.testing --hwb-target NAME``). Each test is one rule of the
contract; see :mod:`hwbackends.testing.kit` for what each checks."""
from __future__ import annotations

import pytest

from hwbackends.testing.kit import TARGET_CHECKS, VARIANT_CHECKS, run_target_check, run_variant_check
from hwbackends.testing.plugin import run_check

pytestmark = pytest.mark.hwb_conformance


@pytest.mark.parametrize("check", list(TARGET_CHECKS))
def test_target(hwb_target_ctx, check):
    print(run_check(run_target_check, hwb_target_ctx, check))


@pytest.mark.parametrize("check", list(VARIANT_CHECKS))
def test_variant(hwb_variant, check):
    ctx, variant = hwb_variant
    print(run_check(run_variant_check, ctx, variant, check))
