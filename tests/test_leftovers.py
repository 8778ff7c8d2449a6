"""The session-level leftover check of tests/conftest.py: a run whose tests
leave a temporary path they made fails, naming the path and the test; a clean run passes and
removes its private temp directory."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

LEAKY = '''
import tempfile

def test_leaves_a_bench_store():
    tempfile.mkdtemp(prefix="hwb-bench-")

def test_cleans_up(tmp_path):
    (tmp_path / "f").write_text("x")
'''

CLEAN = '''
import shutil, tempfile

def test_cleans_up():
    d = tempfile.mkdtemp(prefix="hwb-load-")
    shutil.rmtree(d)
'''


def _run(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text(body)
    # The inner run's temp dirs go under this test's TMPDIR (where the checks below look), not
    # beside the outer run's: drop the root the outer conftest exported for its xdist workers,
    # and the outer run's HWB_TEST_KEEP_TMP (the inner runs must clean up to be checked).
    env = {k: v for k, v in os.environ.items() if k not in ("HWB_TEST_TMP_ROOT", "HWB_TEST_KEEP_TMP")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", *args, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)


@pytest.mark.parametrize("args", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_test_that_leaves_a_temp_path_fails_the_run(tmp_path, args):
    """Also under pytest-xdist, where the leftover is found in a worker, whose own output
    never reaches the terminal: the controller reports it and fails the run."""
    r = _run(tmp_path, LEAKY, *args)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "2 passed" in r.stdout  # the tests pass; the run fails for what they left
    assert "LEFTOVERS" in r.stdout and "hwb-bench-" in r.stdout
    assert "first seen after test_x.py::test_leaves_a_bench_store" in r.stdout


def test_a_clean_run_passes_and_removes_its_temp_dir(tmp_path):
    import tempfile

    before = {p.name for p in Path(tempfile.gettempdir()).glob("hwbt-*")}
    r = _run(tmp_path, CLEAN)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LEFTOVERS" not in r.stdout
    assert {p.name for p in Path(tempfile.gettempdir()).glob("hwbt-*")} == before
