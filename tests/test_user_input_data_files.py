"""Data files a user names — ``hwb predict --input``, ``--calibration-data``,
``--validation-data``, a burst scenario's ``trace=FILE``, a strategies file — when they are not
regular files: a FIFO (nothing ever writes it: the reader must not block), a link to
/dev/zero, a directory, a file over the size cap. Each command answers within 10 s with one
line (exit 1, or 2 for the scenario setting, which is checked as the argument is parsed),
never a traceback and never a hang."""
from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hwbackends.cli import main

KINDS = ["fifo", "dev-zero-link", "directory", "huge"]


def plant(kind: str, p: Path) -> Path:
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dev-zero-link":
        p.symlink_to("/dev/zero")
    elif kind == "directory":
        p.mkdir()
    else:
        with open(p, "wb") as f:  # sparse: past every cap without writing it
            f.truncate((2 << 30) + 1)
    return p


def run_bounded(*argv: str) -> tuple[int, str]:
    """``hwb ARGV`` in this process on a thread, failing the test past 10 s."""
    box: dict[str, Any] = {}

    def go() -> None:
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                box["rc"] = main(list(argv))
            except SystemExit as exc:
                box["rc"] = int(exc.code or 0)
        box["err"] = err.getvalue()

    t = threading.Thread(target=go, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(10)
    assert not t.is_alive(), f"hwb {' '.join(argv)} still running after 10 s"
    assert time.monotonic() - t0 < 10
    return box["rc"], box["err"]


def assert_one_line(rc: int, err: str, codes: tuple[int, ...], argv: tuple[str, ...]) -> None:
    assert rc in codes and "Traceback" not in err, (argv, rc, err)
    lines = [ln for ln in err.splitlines() if ln.startswith("hwb ")]
    assert len(lines) == 1, (argv, err)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("option", ["--input", "--calibration-data", "--validation-data"])
def test_a_data_file_that_is_not_a_file_is_one_line(kind, option, tmp_path: Path, store_dir: Path):
    bad = plant(kind, tmp_path / "x.npy")
    if option == "--input":
        argv = ("predict", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "--input", str(bad),
                "--cache-dir", str(store_dir))
    else:
        argv = ("compile", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", option, str(bad),
                "--cache-dir", str(store_dir))
    rc, err = run_bounded(*argv)
    assert_one_line(rc, err, (1,), argv)
    assert "regular file" in err or "bytes" in err, err


@pytest.mark.parametrize("kind", KINDS)
def test_a_trace_that_is_not_a_file_is_a_usage_error(kind, tmp_path: Path):
    bad = plant(kind, tmp_path / "ticks.txt")
    argv = ("bench", "zoo:mlp", "-s", f"burst:trace={bad}")
    rc, err = run_bounded(*argv)
    assert_one_line(rc, err, (2,), argv)


@pytest.mark.parametrize("kind", KINDS)
def test_a_strategies_file_that_is_not_a_file_is_one_line(kind, tmp_path: Path):
    bad = plant(kind, tmp_path / "s.toml")
    argv = ("route", str(bad), "--check")
    rc, err = run_bounded(*argv)
    assert_one_line(rc, err, (1,), argv)
