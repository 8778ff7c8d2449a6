"""The suite's own guard (tests/conftest.py ``_no_fork_after_jax``): a test that forks the
test process in Python once JAX runs errs (at its teardown), naming where; the fork-free form
passes. Run in a pytest of its own on a two-test file, with this suite's conftest as its
plugin."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

CASES = '''
import subprocess, sys
import jax.numpy as jnp

def test_forks_after_jax():
    jnp.zeros(1).block_until_ready()  # JAX's backends and threads start here
    subprocess.run([sys.executable, "-c", "pass"], preexec_fn=lambda: None, check=True)

def test_spawns_after_jax():
    jnp.zeros(1).block_until_ready()
    subprocess.run([sys.executable, "-c", "pass"], check=True, start_new_session=True)
'''


def test_a_fork_after_jax_fails_the_test_and_a_plain_subprocess_does_not(tmp_path):
    pytest.importorskip("jax")
    (tmp_path / "test_cases.py").write_text(textwrap.dedent(CASES))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        [str(HERE), *(p for p in sys.path if p)]))
    env.pop("PYTEST_XDIST_WORKER", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                        "conftest", "-rfE", "test_cases.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "2 passed, 1 warning, 1 error" in out, out  # JAX's warning; the test errs at teardown
    assert "ERROR test_cases.py::test_forks_after_jax" in out, out
    assert "forked in Python after JAX started its threads" in out, out
    assert "test_cases.py" in out.split("Forked at:")[1], out  # where it forked


FLEET_AFTER_JAX = '''
import os, sys
import jax.numpy as jnp
jnp.zeros(1).block_until_ready()
os.register_at_fork(before=lambda: sys.stdout.write("FORKED\\n"))
from hwbackends.errors import HwbError
from hwbackends.fleet import run_fleet
try:
    run_fleet("zoo:signal", "local", targets=["cpu.onnxruntime"], allow_external=True)
except HwbError as exc:
    print("REFUSED", type(exc).__name__, exc)
'''


def test_the_embedded_fleet_refuses_to_fork_a_process_jax_runs_in(tmp_path):
    """Starting the embedded local Ray forks the driver (Ray's own preexec_fn): after JAX has
    started its threads, run_fleet says so and what to do instead, and nothing forks."""
    pytest.importorskip("jax")
    pytest.importorskip("ray")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", FLEET_AFTER_JAX], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "REFUSED FleetError JAX has started its threads" in r.stdout, r.stdout + r.stderr
    assert "hwb node --head" in r.stdout and "FORKED" not in r.stdout, r.stdout
