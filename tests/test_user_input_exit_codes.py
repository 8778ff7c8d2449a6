"""The README's exit-code table, one test per row, each through the ``hwb`` command (in this
process through ``main()``; ``hwb serve``'s Ctrl-C through a real process and a real SIGINT).
The table itself must list exactly the codes ``hwb --help`` lists (``EXIT_CODES``)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hwbackends.cli import EXIT_CODES, main

ROOT = Path(__file__).resolve().parent.parent


def hwb(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:
            rc = int(exc.code or 0)
    return rc, out.getvalue(), err.getvalue()


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("hwb ")]


def test_the_readme_table_lists_every_exit_code():
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", text, re.M)
    assert [int(c) for c, _ in rows] == [c for c, _ in EXIT_CODES]


@pytest.fixture(scope="module")
def measured(tmp_path_factory, store_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("exit") / "r.json"
    rc, _, err = hwb("bench", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "100", "-q",
                     "-o", str(out), "--cache-dir", str(store_dir))
    assert rc == 0, err
    return out


def test_0_success(measured: Path):
    rc, out, _ = hwb("compare", str(measured), str(measured), "--max-p99", "10")
    assert rc == 0 and "within the thresholds" in out


def test_1_an_error_hwb_reports(tmp_path: Path):
    rc, _, err = hwb("report", str(tmp_path / "none.json"), "--csv")
    assert rc == 1 and len(error_lines(err)) == 1 and "does not exist" in err


@pytest.mark.parametrize("argv", [
    ("compile", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "int4"),
    ("export", "zoo:mlp", "-t", "cpu.onnxruntime:int4", "--format", "triton", "-o", "x"),
    ("bench", "zoo:mlp", "--n", "-1"),
    ("serve", "zoo:mlp", "--shm", "s", "--metrics-port", "70000"),
])
def test_2_a_usage_error(argv, store_dir: Path):
    rc, _, err = hwb(*argv)
    assert rc == 2, err
    (line,) = [ln for ln in err.splitlines() if ": error: " in ln]
    assert "expected" in line and "Traceback" not in err


def test_3_built_but_the_fidelity_gate_failed(monkeypatch, tmp_path: Path):
    """fpga.hwbt_so (tests/hwbt_targets.py) builds and loads, and answers zeros."""
    sys.path.insert(0, str(Path(__file__).parent))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
    from hwbt_targets import SoTarget, plugin

    from hwbackends import registry
    reg = registry.build_registry()
    reg.register(plugin(SoTarget()), "hwbt")
    monkeypatch.setattr(registry, "_REGISTRY", reg)
    rc, out, err = hwb("compile", "zoo:mlp", "-t", "fpga.hwbt_so", "--cache-dir", str(tmp_path))
    assert rc == 3 and "FIDELITY GATE FAILED" in out, out + err


def _edited(src: Path, dst: Path, **figures: float) -> Path:
    d = json.loads(src.read_text())
    for p in d["profiles"]:
        p.update(figures)
    dst.write_text(json.dumps(d, allow_nan=True))
    return dst


def test_4_compare_found_a_move_past_a_threshold(measured: Path, tmp_path: Path):
    p99 = json.loads(measured.read_text())["profiles"][0]["p99_us"]
    slow = _edited(measured, tmp_path / "slow.json", p99_us=p99 * 2, max_us=p99 * 3)
    rc, out, _ = hwb("compare", str(measured), str(slow), "--max-p99", "10")
    assert rc == 4 and "regression" in out


def test_5_compare_found_a_broken_figure(measured: Path, tmp_path: Path):
    broken = _edited(measured, tmp_path / "nan.json", p99_us=float("nan"))
    rc, out, _ = hwb("compare", str(measured), str(broken), "--max-p99", "10")
    assert rc == 5 and "broken" in out and "within the thresholds" not in out


def test_130_serve_stopped_by_ctrl_c(store_dir: Path, tmp_path: Path):
    name = f"hwbt-exit-{os.getpid()}"
    env = {**os.environ, "HWB_CACHE_DIR": str(store_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "hwbackends", "serve", "zoo:mlp", "-t",
                             "cpu.onnxruntime", "-p", "fp32", "--shm", name, "--pin", "none"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # the endpoints, once serving
        assert line.startswith("{"), proc.stderr.read() if proc.poll() is not None else line
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert rc == 130, err
    assert "interrupted" in err and "Traceback" not in err
