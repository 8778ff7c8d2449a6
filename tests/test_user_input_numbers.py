"""Every number a user types: generated from ``hwb``'s own argparse tree and scenario table.

Each numeric option of every subcommand (found by its ``type``: the number parsers of
hwbackends/units.py carry ``number_kind``; a bare ``int``/``float`` type is itself a failure)
and each numeric setting of every ``-s`` scenario gets the bad values — negative, zero where
zero means nothing, NaN, ±inf, 1e308, 400 digits, text — and must exit 2 with one error line
naming the expected form, no traceback, within 10 s. All of it runs through ``hwb``'s
``main()`` in this process; a sample also runs through the real ``hwb`` executable."""
from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path

import pytest

from hwbackends.bench.scenarios import SCENARIOS
from hwbackends.cli import build_parser, main

BAD = ["-1", "0", "nan", "inf", "-inf", "1e308", "9" * 400, "text", "1_000", "0x10"]
#: Options where 0 is a meaningful value (what it means), so "0" is not a bad value there.
ZERO_MEANS = {
    "--grpc-port": "any free port", "--metrics-port": "any free port", "--http": "any free port",
    "--cache-entries": "no inference cache", "--limit": "list every store entry",
    "--num-cpus": "a head node that runs no tasks", "--shm-spin-us": "never spin",
    "--max-p50": "no rise allowed", "--max-p99": "no rise allowed",
    "--max-corr-drop": "no drop allowed", "--pin": "CPU 0", "--shm-pin": "CPU 0",
    "--max-size": "an empty store",
}
#: Scenario settings where 0 is meaningful.
ZERO_SETTINGS = {"warmup": "no warm-up", "seed": "seed 0"}
#: Settings that are not numbers.
TEXT_SETTINGS = {"trace", "unit"}


def numeric_options() -> tuple[list[tuple[tuple[str, ...], str]], list[str]]:
    """(command path, option) of every numeric option in the tree, and the options whose type
    is a bare int/float (not one of the number parsers)."""
    found, bare = [], []
    todo: list[tuple[tuple[str, ...], argparse.ArgumentParser]] = [((), build_parser())]
    while todo:
        path, parser = todo.pop()
        for act in parser._actions:
            if isinstance(act, argparse._SubParsersAction):
                todo += [(path + (name,), sub) for name, sub in act.choices.items()]
            elif act.option_strings and act.nargs != 0:
                opt = max(act.option_strings, key=len)
                if act.type in (int, float):
                    bare.append(" ".join(path + (opt,)))
                elif getattr(act.type, "number_kind", None):
                    found.append((path, opt))
    return sorted(set(found)), bare


def hwb(*argv: str) -> tuple[int, str, float]:
    """``hwb ARGV`` in this process: (exit code, stderr, seconds)."""
    err = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:
            rc = int(exc.code or 0)
    return rc, err.getvalue(), time.monotonic() - t0


def assert_usage_error(argv: tuple[str, ...], rc: int, err: str, took: float) -> None:
    assert "Traceback" not in err, (argv, err)
    assert rc == 2, f"hwb {' '.join(a[:30] for a in argv)} exited {rc}, not 2: {err[-300:]}"
    errors = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(errors) == 1, (argv, err)
    assert "expected" in errors[0], (argv, errors[0])  # it names the form
    assert len(errors[0]) < 400, errors[0]  # the 400-digit value is quoted short
    assert took < 10, (argv, took)


def test_every_numeric_option_uses_a_number_parser():
    found, bare = numeric_options()
    assert not bare, f"numeric options with a bare int/float type (use hwbackends.cli.number): {bare}"
    opts = {" ".join(p + (o,)) for p, o in found}
    for must in ("serve --metrics-port", "serve --deadline-us", "serve --shm-slots",
                 "serve --duration", "serve --cache-entries", "store --limit", "bench --n",
                 "compile --batch-size", "compile --threads", "compile --limit",
                 "fleet --task-timeout", "export --instances", "compare --max-p99"):
        assert must in opts, must


def test_every_numeric_option_refuses_every_bad_value_with_exit_2():
    found, _ = numeric_options()
    t0 = time.monotonic()
    for path, opt in found:
        for value in BAD:
            if value == "0" and opt in ZERO_MEANS:
                continue
            # a model's --limit takes NAME=VALUE (weights=0 turns it off: skipped with "0")
            model_limit = opt == "--limit" and path[0] != "store"
            argv = (*path, f"{opt}=weights={value}" if model_limit else f"{opt}={value}")
            assert_usage_error(argv, *hwb(*argv))
    assert time.monotonic() - t0 < 60


def test_every_numeric_scenario_setting_refuses_every_bad_value_with_exit_2():
    for name, cls in SCENARIOS.items():
        for f in fields(cls):
            if f.name == "name" or f.name in TEXT_SETTINGS:
                continue
            for value in BAD:
                if value == "0" and f.name in ZERO_SETTINGS:
                    continue
                argv = ("bench", "zoo:mlp", "-s", f"{name}:{f.name}={value}")
                assert_usage_error(argv, *hwb(*argv))


@pytest.mark.parametrize("argv", [
    ("bench", "zoo:mlp", "-s", "server:rate=1e300"), ("bench", "zoo:mlp", "--n", "10" * 30),
    ("compile", "zoo:mlp", "--batch-size", "99999999"), ("compile", "zoo:mlp", "--threads", "1000000"),
    ("serve", "zoo:mlp", "--shm", "s", "--batch-sizes", "1,2," + "9" * 40),
    ("bench", "zoo:mlp", "--pin", "0-99999999999"),
    ("compile", "m.pt", "--input-shape", "99999999999,2"),
])
def test_values_that_would_size_huge_work_are_refused_before_any(argv):
    assert_usage_error(argv, *hwb(*argv))


def test_good_values_still_parse():
    p = build_parser()
    a = p.parse_args(["serve", "zoo:mlp", "--shm", "s", "--metrics-port", "0", "--deadline-us",
                      "250.5", "--duration", "1.5", "--shm-slots", "4", "--cache-entries", "0",
                      "--batch-sizes", "4,1,2"])
    assert (a.metrics_port, a.deadline_us, a.duration, a.shm_slots, a.cache_entries,
            a.batch_sizes) == (0, 250.5, 1.5, 4, 0, [1, 2, 4])
    assert p.parse_args(["store", "--limit", "0"]).limit == 0
    a = p.parse_args(["bench", "m", "--n", "1000", "--pin", "0-1", "-s", "server:rate=2000"])
    assert (a.n, a.pin) == (1000, [0, 1])


HWB = shutil.which("hwb", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(HWB is None, reason="no hwb executable beside this Python")
def test_a_sample_through_the_real_command():
    """The issue's own cases, each as a user runs it: a fresh ``hwb`` process."""
    cases = [("serve", "zoo:mlp", "--shm", "s", "--metrics-port", "70000"),
             ("serve", "zoo:mlp", "--shm", "s", "--metrics-port", "-1"),
             ("serve", "zoo:mlp", "--shm", "s", "--metrics-port", "9" * 30),
             ("compile", "zoo:mlp", "--limit", "weights=-1"),
             ("serve", "zoo:mlp", "--shm", "s", "--deadline-us", "nan"),
             ("serve", "zoo:mlp", "--shm", "s", "--shm-slots", "0"),
             ("serve", "zoo:mlp", "--shm", "s", "--duration", "-1"),
             ("store", "--limit", "-1")]

    def one(argv):
        t0 = time.monotonic()
        r = subprocess.run([HWB, *argv], capture_output=True, text=True, timeout=30)
        return argv, r.returncode, r.stderr, time.monotonic() - t0

    with ThreadPoolExecutor(4) as pool:
        for argv, rc, err, took in pool.map(one, cases):
            assert_usage_error(argv, rc, err, took)
