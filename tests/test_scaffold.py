"""``hwb plugin new`` writes a plugin that installs, registers and passes the conformance kit;
``hwb plugin check`` runs the kit."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hwbackends.errors import ConfigError
from hwbackends.scaffold import new_plugin

BIN = Path(sys.executable).parent
HWB = str(BIN / "hwb")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def test_new_writes_an_installable_package(tmp_path):
    d = new_plugin("mynpu", "tpu", tmp_path / "p")
    meta = tomllib.loads((d / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["hwbackends"] == {"mynpu": "hwb_mynpu"}
    assert meta["tool"]["setuptools"]["packages"] == ["hwb_mynpu"]
    src = (d / "hwb_mynpu" / "target.py").read_text()
    classes = {n.name for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef)}
    assert classes == {"MynpuTarget", "MynpuExecutor"}
    assert 'name = "tpu.mynpu"' in src and 'family = "tpu"' in src and "scaffold:" not in src
    assert "from .target import MynpuTarget" in (d / "hwb_mynpu" / "__init__.py").read_text()
    assert meta["tool"]["pytest"]["ini_options"]["hwb_target"] == ["tpu.mynpu"]
    # the generated tests are the kit's own: the same suite as `hwb plugin check`
    assert "from hwbackends.testing.test_contract import test_target, test_variant" in (
        d / "tests" / "test_conformance.py").read_text()
    readme = (d / "README.md").read_text()
    assert "Keras models made of `Dense` layers" in readme and "UnsupportedError" in readme
    for f in d.rglob("*.py"):
        ast.parse(f.read_text())


def test_new_refuses_bad_names_families_and_clobbering(tmp_path):
    with pytest.raises(ConfigError, match="lowercase identifier"):
        new_plugin("My-NPU", "cpu", tmp_path / "a")
    with pytest.raises(ConfigError, match="must be one of"):
        new_plugin("x", "quantum", tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        new_plugin("x", "cpu", tmp_path / "c")
    assert new_plugin("gpu.fast", "cpu", tmp_path / "d") == tmp_path / "d"  # FAMILY.NAME form
    assert 'name = "gpu.fast"' in (tmp_path / "d" / "hwb_fast" / "target.py").read_text()


def test_cli_errors_are_clear(tmp_path):
    r = _run([HWB, "plugin", "check", "no.such_target"])
    assert r.returncode == 1 and "unknown target 'no.such_target'" in r.stderr
    r = _run([HWB, "plugin", "new", "Bad Name", "--dir", str(tmp_path / "x")])
    assert r.returncode == 1 and "lowercase identifier" in r.stderr
    r = _run([HWB, "plugin"])
    assert r.returncode == 2 and "new" in r.stdout and "check" in r.stdout


@pytest.mark.slow
def test_scaffolded_plugin_installs_registers_and_passes_the_kit(tmp_path):
    """Installed with pip into a private target directory on PYTHONPATH, never into the shared
    venv: other test runs (and people) on the machine never see the throwaway target, there is
    nothing to uninstall, and an interrupted run leaves nothing registered behind."""
    name, target, dist = "scaffold_selftest", "cpu.scaffold_selftest", "hwb-scaffold-selftest"
    d = tmp_path / dist
    r = _run([HWB, "plugin", "new", name, "--family", "cpu", "--dir", str(d)])
    assert r.returncode == 0, r.stderr
    site = tmp_path / "site"  # where pip installs it: found through PYTHONPATH only
    r = _run([str(BIN / "pip"), "install", "-q", "--no-deps", "--no-build-isolation", "--no-compile",
              "--target", str(site), str(d)])
    assert r.returncode == 0, r.stderr[-2000:]
    env = dict(os.environ, HWB_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p))
    # the router considers it like any built-in target (here the only one allowed)
    cfg = tmp_path / "strategies.toml"
    cfg.write_text(textwrap.dedent('''\
        [tiers.relaxed]
        p99_us = 100000
        [router.bench]
        n = 200
        warmup = 20
        [strategies.demo]
        model = "zoo:mlp"
        tier = "relaxed"
        targets = ["cpu.scaffold_*"]
        fidelity = { corr_min = 0.9999 }
        '''))
    # The checks below read the installed plugin and nothing of each other's: two chains at
    # once, each a fresh interpreter importing TensorFlow (most of this test's time), so a
    # two-core machine runs them in about half the time it took one after the other. The
    # kit and the CLI's kit share one store (its concurrent use is safe: test_store_races).
    kit = [([HWB, "targets", "--json"], None),
           # the generated tests: the whole kit, probe_is_light included (an entry point now)
           ([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
             "--hwb-models", "mlp,lstm"], d)]
    # `hwb plugin check` finds the installed target's kit (-k and arguments after -- reach
    # pytest). Only the checks that need no compile: the whole kit ran just above, through the
    # scaffold's own tests (a second full run through the CLI cost ~15 s and tested no more).
    cli = [([HWB, "plugin", "check", target, "--models", "mlp", "-k", "probe or metadata",
             "--", "-q"], None),
           ([HWB, "route", str(cfg), "--json", "--cache-dir", str(tmp_path / "store")], None)]
    with ThreadPoolExecutor(2) as pool:
        chains = [pool.submit(lambda cmds: [_run(c, cwd=cwd, env=env) for c, cwd in cmds], cmds)
                  for cmds in (kit, cli)]
        (targets, direct), (check_k, route) = (c.result() for c in chains)
    data = json.loads(targets.stdout)
    row = next((t for t in data["targets"] if t["name"] == target), None)
    assert row is not None, [t["name"] for t in data["targets"]]
    assert row["plugin"] == name and row["availability"]["mode"] == "hardware"
    assert not [p for p in data["problems"] if p["plugin"] == name]
    out = direct.stdout + direct.stderr
    assert direct.returncode == 0, out[-4000:]
    assert "11 passed, 6 skipped" in out, out[-2000:]  # 5 target checks + 6 on the mlp (sliding too)
    assert "layer 'lstm' is a LSTM" in out           # the LSTM is refused, naming the layer
    assert check_k.returncode == 0, (check_k.stdout + check_k.stderr)[-3000:]
    assert "3 passed" in check_k.stdout
    assert route.returncode == 0, (route.stdout + route.stderr)[-3000:]
    demo = json.loads(route.stdout)["strategies"][0]
    assert demo["chosen"] == f"{target}:fp32" and demo["meets_budget"], demo
    # nothing reached the shared environment: a fresh registry of this process has no such target
    from hwbackends.registry import build_registry
    assert target not in build_registry().targets


def test_plugin_check_hands_arguments_after_double_dash_to_pytest():
    r = _run([HWB, "plugin", "check", "ref", "--models", "mlp", "-k", "metadata", "--", "-v",
              "--co"])
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert "test_target[ref-metadata]" in r.stdout  # -v --co: the collected test, by name
    assert "test_target[ref-probe" not in r.stdout  # and -k left the others out
    r = _run([HWB, "targets", "--", "-v"])
    assert r.returncode == 2 and "only taken by hwb plugin check" in r.stderr
