"""Broken, slow, duplicate and out-of-date plugins are reported and skipped; `hwb targets`
keeps working and lists every problem.

The plugins here are real entry points: each is a module plus a ``*.dist-info`` with an
``entry_points.txt`` in a temporary directory put on ``PYTHONPATH`` of a ``hwb`` subprocess,
which is exactly how ``importlib.metadata`` finds installed plugins (nothing is installed
into the project's environment)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from hwbackends import CONTRACT_VERSION, hookimpl
from hwbackends.errors import UnknownTargetError
from hwbackends.registry import build_registry
from hwbackends.specs import Availability
from hwbackends.target import Target

HWB = str(Path(sys.executable).parent / "hwb")

_TARGET = textwrap.dedent('''\
    from hwbackends import hookimpl
    from hwbackends.specs import Availability
    from hwbackends.target import Target

    class T(Target):
        name = {name!r}
        family = "cpu"
        formats = ("keras",)
        description = "robustness fixture"
        contract_version = {version}

        def probe(self):
            {probe}
    ''')

PLUGINS = {
    # module name: source
    "hwbt_broken_import": "import not_a_real_module_hwbt\n",
    "hwbt_exits": "raise SystemExit('licence server unreachable')\n",
    "hwbt_raises_in_hook": textwrap.dedent('''\
        from hwbackends import hookimpl

        @hookimpl
        def hwb_targets():
            raise RuntimeError("device table corrupt")
        '''),
    "hwbt_slow": "import time\ntime.sleep(1.0)\n" + _TARGET.format(
        name="cpu.hwbt_slow", version=CONTRACT_VERSION,
        probe="return Availability.hardware('CPU')") + "\n@hookimpl\ndef hwb_targets():\n    return [T()]\n",
    "hwbt_dup": _TARGET.format(name="cpu.litert", version=CONTRACT_VERSION,
                               probe="return Availability.hardware('CPU')")
    + "\n@hookimpl\ndef hwb_targets():\n    return [T()]\n",
    "hwbt_old": _TARGET.format(name="cpu.hwbt_old", version=CONTRACT_VERSION + 41,
                               probe="return Availability.hardware('CPU')")
    + "\n@hookimpl\ndef hwb_targets():\n    return [T()]\n",
    "hwbt_bad_probe": _TARGET.format(name="cpu.hwbt_bad_probe", version=CONTRACT_VERSION,
                                     probe="raise OSError('driver gone')")
    + "\n@hookimpl\ndef hwb_targets():\n    return [T()]\n",
    "hwbt_bad_signature": textwrap.dedent('''\
        from hwbackends import hookimpl

        @hookimpl
        def hwb_choose(candidates, tier, budget):   # not the hook's signature
            return None
        '''),
}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("plugins")
    for mod, src in PLUGINS.items():
        (root / f"{mod}.py").write_text(src)
        info = root / f"{mod}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {mod}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[hwbackends]\n{mod} = {mod}\n")
    return root


def _hwb(plugin_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([HWB, "targets", *args], capture_output=True, text=True, timeout=120, env=env)


def test_hwb_targets_survives_every_broken_plugin_and_names_the_problem(plugin_path):
    r = _hwb(plugin_path, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    problems = {p["plugin"]: p for p in data["problems"]}
    names = {t["name"]: t for t in data["targets"]}
    # the built-ins and the good plugins still load
    assert {"ref", "cpu.litert", "cpu.onnxruntime", "cpu.hwbt_slow", "cpu.hwbt_bad_probe"} <= set(names)
    p = problems["hwbt_broken_import"]
    assert p["stage"] == "import" and "not_a_real_module_hwbt" in p["error"]
    p = problems["hwbt_exits"]
    assert p["stage"] == "import" and "licence server unreachable" in p["error"]
    p = problems["hwbt_raises_in_hook"]
    assert p["stage"] == "hwb_targets" and "device table corrupt" in p["error"]
    assert "hwbt_raises_in_hook.py" in p["error"]  # where it raised
    p = problems["hwbt_dup"]  # refused, naming both plugins
    assert p["stage"] == "contract" and "'cpu.litert'" in p["error"]
    assert "'cpu_litert'" in p["error"] and "'hwbt_dup'" in p["error"]
    assert names["cpu.litert"]["plugin"] == "cpu_litert"  # the first provider keeps the name
    p = problems["hwbt_old"]  # refused, with both versions
    assert p["stage"] == "contract" and "cpu.hwbt_old" not in names
    assert f"contract version {CONTRACT_VERSION + 41}" in p["error"]
    assert f"implements version {CONTRACT_VERSION}" in p["error"]
    p = problems["hwbt_bad_signature"]
    assert p["stage"] == "register" and "budget" in p["error"]
    # a probe that raises is shown as unavailable with the reason, not a crash
    a = names["cpu.hwbt_bad_probe"]["availability"]
    assert a["mode"] == "unavailable" and "driver gone" in a["reason"]
    # import times are recorded for every plugin, the slow one measured as slow
    assert data["plugin_import_seconds"]["hwbt_slow"] >= 0.9
    assert data["plugin_import_seconds"]["hwbt_slow"] > max(
        v for k, v in data["plugin_import_seconds"].items() if k != "hwbt_slow")


def test_hwb_targets_human_output_lists_problems_and_import_times(plugin_path):
    r = _hwb(plugin_path, "--verbose")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "plugins that could not be used:" in out
    for mod in ("hwbt_broken_import", "hwbt_exits", "hwbt_raises_in_hook", "hwbt_dup", "hwbt_old",
                "hwbt_bad_signature"):
        assert f"  {mod} (" in out
    times = out.split("plugin import times:")[1].strip().splitlines()
    assert times[0].split()[0] == "hwbt_slow"  # sorted slowest first
    assert float(times[0].split()[1]) >= 900  # ms


# -- the same rules through a registry built in-process ------------------------------------
class _T(Target):
    family = "cpu"
    formats = ("keras",)
    description = "fixture"

    def probe(self) -> Availability:
        return Availability.hardware("CPU")


def _plugin(name: str, *targets: Target, converters=None) -> types.ModuleType:
    m = types.ModuleType(name)
    m.hwb_targets = hookimpl(lambda: list(targets))
    if converters is not None:
        def hwb_converters():
            raise converters
        m.hwb_converters = hookimpl(hwb_converters)
    return m


def test_registry_rules_in_process():
    a = type("A", (_T,), {"name": "cpu.same"})()
    b = type("B", (_T,), {"name": "cpu.same"})()
    old = type("Old", (_T,), {"name": "cpu.old", "contract_version": 0})()
    reg = build_registry(entry_points=False)
    reg.register(_plugin("first", a), "first")
    reg.register(_plugin("second", b), "second")
    reg.register(_plugin("old", old), "old")
    reg.register(_plugin("conv", converters=ValueError("no onnx")), "conv")
    reg.register(types.SimpleNamespace(hwb_targets=hookimpl(lambda: ["not a target"])), "junk")
    assert reg.targets["cpu.same"] is a
    msgs = {p.plugin: p.error for p in reg.problems}
    assert "'first'" in msgs["second"] and "'second'" in msgs["second"]
    assert "version 0" in msgs["old"] and f"version {CONTRACT_VERSION}" in msgs["old"]
    assert "no onnx" in msgs["conv"]
    assert "not a named Target" in msgs["junk"]
    with pytest.raises(UnknownTargetError, match="plugins that failed to load: .*second"):
        reg.target("cpu.old")


def test_hwb_plugins_env_registers_modules_in_every_registry(tmp_path, monkeypatch):
    """``HWB_PLUGINS`` (as pytest's PYTEST_PLUGINS): modules named there register after the
    entry points, in any process that builds a registry; a bad name is a reported problem
    naming the variable, an entry point named again is not registered twice."""
    (tmp_path / "hwbt_env_plugin.py").write_text(_TARGET.format(
        name="cpu.hwbt_env", version=CONTRACT_VERSION, probe="return Availability.hardware('CPU')")
        + "\nclass P:\n    @hookimpl\n    def hwb_targets(self):\n        return [T()]\n\nplugin = P()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HWB_PLUGINS", " hwbt_env_plugin:plugin, hwbt_not_there ,hwb_plugins.cpu_litert")
    reg = build_registry()
    assert reg.target_plugin["cpu.hwbt_env"] == "hwbt_env_plugin:plugin"
    (p,) = [p for p in reg.problems if p.plugin == "hwbt_not_there"]
    assert p.stage == "import" and "HWB_PLUGINS" in p.error and "hwbt_not_there" in p.error
    assert reg.target_plugin["cpu.litert"] == "cpu_litert"  # the entry point, once
    assert not [p for p in reg.problems if "cpu_litert" in p.plugin]
    monkeypatch.delenv("HWB_PLUGINS")
    assert "cpu.hwbt_env" not in build_registry().targets
