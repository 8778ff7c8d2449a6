"""Sizes and ages read from outside (``HWB_CACHE_MAX_SIZE``, ``hwb store prune --max-size`` /
``--older-than``) are bounded: a bad or huge value is a clear :class:`ConfigError` naming the
form and range (the CLI: a usage error, exit 2), never an ``OverflowError`` traceback; the
environment variable's bad value is logged and ignored, and the compile stands."""
from __future__ import annotations

import logging
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwbackends as hwb
from hwbackends.cli import main
from hwbackends.errors import ConfigError
from hwbackends.store.prune import MAX_SIZE_ENV
from hwbackends.units import MAX_AGE_S, MAX_SIZE_BYTES, parse_age, parse_size

HUGE = "9" * 309  # float() of it is inf: int(inf) was the OverflowError


@pytest.mark.parametrize("flag, value, said", [
    ("--max-size", HUGE, "is too large a size (at most 1024T"),
    ("--max-size", "1025T", "is too large a size (at most 1024T"),
    ("--max-size", "-1", "is not a size; expected a number"),
    ("--older-than", HUGE + "d", "is too long an age (at most 36500d"),
    ("--older-than", "1e9w", "is not an age; expected a number with a unit"),
])
def test_cli_bad_numbers_are_usage_errors(tmp_path, capsys, flag, value, said) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["store", "prune", flag, value, "--cache-dir", str(tmp_path / "store")])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert f"argument {flag}: " in err and said in err and "Traceback" not in err, err
    assert len(err) < 600, "the 309-digit value is quoted whole"
    assert not (tmp_path / "store").exists()  # refused before the store is touched


def test_a_huge_env_cap_is_logged_and_the_compile_stands(zoo_model, tmp_path, monkeypatch,
                                                         caplog) -> None:
    monkeypatch.setenv(MAX_SIZE_ENV, HUGE)
    with caplog.at_level(logging.WARNING, logger="hwbackends.store"):
        cm = hwb.compile(zoo_model("signal"), "ref", store=tmp_path / "store",
                         isolate_compile=False, fidelity=False)
    assert not cm.artifact.cached
    assert f"{MAX_SIZE_ENV}: '9999" in caplog.text and "too large a size" in caplog.text
    assert "the store is not pruned" in caplog.text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60) | st.from_regex(r"\s*[0-9]{1,400}(\.[0-9]{0,30})?\s*[kmgtKMGT]?(i?[bB])?\s*",
                                            fullmatch=True))
def test_parse_size_is_a_bounded_int_or_a_config_error(text: str) -> None:
    try:
        n = parse_size(text)
    except ConfigError as exc:
        assert "1024T" in str(exc) and len(str(exc)) < 400
        return
    assert isinstance(n, int) and 0 <= n <= MAX_SIZE_BYTES


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60) | st.from_regex(r"\s*[0-9]{1,400}(\.[0-9]{0,30})?\s*[smhdwSMHDW]\s*",
                                            fullmatch=True))
def test_parse_age_is_a_bounded_float_or_a_config_error(text: str) -> None:
    try:
        s = parse_age(text)
    except ConfigError as exc:
        assert "36500d" in str(exc) and len(str(exc)) < 400
        return
    assert isinstance(s, float) and 0 <= s <= MAX_AGE_S


@settings(max_examples=100, deadline=None)
@given(st.decimals(min_value=0, max_value=4096, places=3), st.sampled_from("kmgt"))
def test_parse_size_reads_what_it_is_given(n: Decimal, unit: str) -> None:
    want = n * {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[unit]
    text = f"{n}{unit.upper()}iB"
    if want > MAX_SIZE_BYTES:
        with pytest.raises(ConfigError, match="too large"):
            parse_size(text)
    else:
        assert parse_size(text) == int(want)
