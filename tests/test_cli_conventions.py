"""The command line's conventions, each through ``hwb`` itself (``hwbackends.cli.main`` in this
process, or the installed ``hwb`` in a subprocess): ``--version``; ``-v`` before or after the
command; ``-o`` is ``--output`` everywhere (target options are ``-O``); a bad argument is a
usage error (exit 2) naming the expected form; precisions with commas pass through ``-p``;
the documented exit codes, a failed fidelity gate among them; strict JSON results with p95;
``--csv``; ``hwb compare`` for CI."""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hwbackends
from hwbackends.bench import BenchResults
from hwbackends.bench.profile import LatencyProfile, summarize
from hwbackends.cli import EXIT_CODES, build_parser, main, split_list
from hwbackends.specs import Availability
from hwbackends.target import Target

HWB = shutil.which("hwb", path=str(Path(sys.executable).parent)) or "hwb"
#: Runs on `pip install '.[cpu]'` alone (no TensorFlow: no zoo model): .ci/run's CPU venv.
CPU_INSTALL = pytest.mark.cpu_install


def _strict(text: str) -> object:
    """``json.loads`` that refuses the NaN / Infinity tokens, as JSON.parse and jq do."""
    def bad(tok: str) -> None:
        raise ValueError(f"non-standard JSON token {tok}")
    return json.loads(text, parse_constant=bad)


def _usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    assert e.value.code == 2, f"hwb {' '.join(argv)} exited {e.value.code}, not 2 (usage)"
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# -- --version, -v, --help -----------------------------------------------------------------------
@CPU_INSTALL
def test_version_is_the_package_version():
    r = subprocess.run([HWB, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"hwb (hwbackends) {hwbackends.__version__}"


@CPU_INSTALL
def test_verbose_is_taken_before_and_after_the_command(hwb_cli):
    rc, plain, _ = hwb_cli("targets")
    assert rc == 0 and "option " not in plain
    for argv in (("targets", "-v"), ("-v", "targets"), ("targets", "--verbose")):
        rc, out, _ = hwb_cli(*argv)
        assert rc == 0, argv
        assert "option isa:" in out and "plugin import times" in out, argv


@CPU_INSTALL
def test_every_subcommand_takes_verbose():
    """Every parser under ``hwb`` (sub-subcommands too) knows ``-v``."""
    todo = [build_parser()]
    while todo:
        p = todo.pop()
        assert "-v" in p._option_string_actions, p.prog
        for act in p._actions:
            if isinstance(act, argparse._SubParsersAction):
                todo += act.choices.values()


@CPU_INSTALL
def test_help_lists_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "exit codes:" in out
    for code, what in EXIT_CODES:
        assert f"  {code:<4} {what.split()[0]}" in out
    assert "fidelity gate" in out and "hwb compare" in out


# -- -o is --output ---------------------------------------------------------------------------
@CPU_INSTALL
def test_o_means_output_in_every_command():
    todo = [build_parser()]
    seen = 0
    while todo:
        p = todo.pop()
        act = p._option_string_actions.get("-o")
        if act is not None:
            seen += 1
            assert any(s.startswith("--output") for s in act.option_strings), (p.prog, act.option_strings)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += a.choices.values()
    assert seen >= 6  # bench fleet report predict export demo
    args = build_parser().parse_args(["compile", "zoo:mlp", "-O", "isa=x86-64-v2", "-O", "n=3"])
    assert args.option == [("isa", "x86-64-v2"), ("n", 3)]


def test_predict_o_writes_the_outputs(hwb_cli, tmp_path: Path, store_dir: Path):
    x = np.zeros((2, 64), np.float32)
    np.save(tmp_path / "x.npy", x)
    rc, out, err = hwb_cli("predict", "zoo:mlp", "-t", "cpu.onnxruntime", "-i", str(tmp_path / "x.npy"),
                           "-o", str(tmp_path / "y.npy"), "--cache-dir", str(store_dir))
    assert rc == 0, err
    assert np.load(tmp_path / "y.npy").shape[0] == 2


# -- bad arguments are usage errors ------------------------------------------------------------
@CPU_INSTALL
@pytest.mark.parametrize("argv, expected", [
    (["serve", "zoo:mlp", "--shm", "s", "--pin", "1-0"], "expected CPU numbers like 0 or 0,1 or 2-3"),
    (["serve", "zoo:mlp", "--shm", "s", "--pin", "a"], "expected CPU numbers"),
    (["serve", "zoo:mlp", "--shm", "s", "--batch-sizes", "1,x"], "expected batch sizes ≥ 1 separated by commas"),
    (["serve", "zoo:mlp", "--shm", "s", "--batch-sizes", "0"], "e.g. 1,2,4"),
    (["bench", "zoo:mlp", "-s", "server:rate_hz=0"], "rate_hz='0' is not valid: '0' is out of range for a rate; expected a number > 0"),
    (["bench", "zoo:mlp", "-s", "server:n=0"], "n='0' is not valid: '0' is out of range for a count; expected a whole number ≥ 1"),
    (["bench", "zoo:mlp", "-s", "warp"], "unknown scenario 'warp'"),
    (["bench", "zoo:mlp", "--pin", "0-"], "expected CPU numbers"),
    (["bench", "zoo:mlp", "--n", "0"], "expected a whole number ≥ 1"),
    (["compile", "zoo:mlp", "-O", "synth"], "expected KEY=VALUE, e.g. -O synth=true"),
    (["compile", "zoo:mlp", "--batch-size", "-1"], "expected a whole number ≥ 1"),
    (["compile", "net.pt", "--input-shape", "0,x"], "expected positive integers separated by commas"),
    (["compare", "a.json", "b.json", "--max-p99", "-5"], "expected a number ≥ 0"),
])
def test_a_bad_argument_is_a_usage_error_naming_the_expected_form(capsys, argv, expected):
    err = _usage_error(capsys, *argv)
    assert expected in err, err
    assert "usage: hwb " + argv[0] in err


@CPU_INSTALL
def test_serve_pin_takes_a_range():
    args = build_parser().parse_args(["serve", "zoo:mlp", "--shm", "s", "--pin", "0-1",
                                      "--batch-sizes", "4,1,2"])
    assert args.pin == [0, 1] and args.batch_sizes == [1, 2, 4]


@CPU_INSTALL
def test_route_fleet_results_is_not_a_ray_address():
    """``--fleet`` is a Ray address (hwb fleet); the placement advice reads ``--fleet-results``."""
    route = build_parser().parse_args(["route", "s.toml", "--fleet-results", "r.json"])
    assert route.fleet_results == "r.json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["route", "s.toml", "--fleet", "r.json"])


# -- precisions with commas -------------------------------------------------------------------
@CPU_INSTALL
def test_split_list_keeps_commas_inside_angle_brackets():
    assert split_list(["ap_fixed<16,6>,fp32", "int8", "fixed<8,3,AP_RND,AP_SAT>"]) == [
        "ap_fixed<16,6>", "fp32", "int8", "fixed<8,3,AP_RND,AP_SAT>"]
    assert split_list(["cpu.*, tpu.xla", ""]) == ["cpu.*", "tpu.xla"]


def test_bench_takes_a_fixed_point_precision_through_hwb(tmp_path: Path, store_dir: Path):
    """The installed ``hwb``: ``-p 'ap_fixed<16,6>'`` is one precision, not two."""
    out = tmp_path / "r.json"
    env = os.environ | {"HWB_CACHE_DIR": str(store_dir)}
    r = subprocess.run([HWB, "bench", "zoo:mlp", "-t", "cpu.native", "-p", "ap_fixed<16,6>",
                        "-s", "single-stream:n=50,warmup=5", "-o", str(out), "-q"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    res = BenchResults.load(out)
    assert [v.variant for v in res.variants] == ["cpu.native:ap_fixed<16,6>"]
    assert [p.precision for p in res.profiles] == ["ap_fixed<16,6>"]


# -- a failed fidelity gate is exit 3 ----------------------------------------------------------
def test_compile_exits_3_when_the_fidelity_gate_fails(hwb_cli, monkeypatch, tmp_path: Path):
    """fpga.hwbt_so answers zeros: built and loaded fine, its outputs are far from the
    reference, so ``hwb compile`` says FIDELITY GATE FAILED and exits 3, not 0."""
    sys.path.insert(0, str(Path(__file__).parent))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
    from hwbt_targets import SoTarget, plugin

    from hwbackends import registry
    reg = registry.build_registry()
    reg.register(plugin(SoTarget()), "hwbt")
    monkeypatch.setattr(registry, "_REGISTRY", reg)
    rc, out, err = hwb_cli("compile", "zoo:mlp", "-t", "fpga.hwbt_so", "--cache-dir", str(tmp_path))
    assert "FIDELITY GATE FAILED" in out, out + err
    assert rc == 3
    rc, out, _ = hwb_cli("compile", "zoo:mlp", "-t", "fpga.hwbt_so", "--cache-dir", str(tmp_path), "--json")
    assert rc == 3 and json.loads(out)["fidelity_gate"]["passed"] is False


# -- strict JSON, p95, CSV, compare ------------------------------------------------------------
def _profile(variant: str, p50: float, p99: float, **kw) -> LatencyProfile:
    target, _, precision = variant.partition(":")
    stats = summarize(np.array([p50 * 1e3] * 98 + [p99 * 1e3] * 2))
    d = dict(variant=variant, target=target, precision=precision, batch_size=1,
             scenario="single-stream", params={}, mode="hardware", throughput=1e6 / p50,
             duration_s=0.1, machine={"id": "m1"}, **stats)
    return LatencyProfile(**(d | kw))


@CPU_INSTALL
def test_results_file_is_strict_json_with_null_reasons(tmp_path: Path):
    res = BenchResults(model={"name": "m"}, machine={"id": "m1"})
    res.profiles = [_profile("cpu.a:fp32", 2.0, 5.0),
                    LatencyProfile(**(_profile("cpu.b:fp32", 1, 1).__dict__ | summarize(np.array([]))))]
    path = res.save(tmp_path / "r.json")
    d = _strict(path.read_text())
    empty = d["profiles"][1]
    assert empty["p50_us"] is None and empty["null_reasons"]["p50_us"] == "NaN: no samples"
    assert d["profiles"][0]["p95_us"] == pytest.approx(2.0)
    back = BenchResults.load(path)
    assert math.isnan(back.profiles[1].p99_us) and back.profiles[0].p99_us == pytest.approx(5.0)


@pytest.fixture(scope="module")
def measured(tmp_path_factory, store_dir: Path) -> Path:
    """One real ``hwb bench`` results file (cpu.onnxruntime fp32, 300 calls)."""
    out = tmp_path_factory.mktemp("bench") / "base.json"
    rc = main(["bench", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "300", "-q",
               "-o", str(out), "--cache-dir", str(store_dir)])
    assert rc == 0
    return out


def test_bench_results_and_json_are_strict_with_p95(measured: Path):
    d = _strict(measured.read_text())
    (p,) = d["profiles"]
    assert p["p50_us"] <= p["p90_us"] <= p["p95_us"] <= p["p99_us"] <= p["p999_us"]


def test_bench_and_report_csv(hwb_cli, measured: Path, store_dir: Path, tmp_path: Path):
    rc, out, err = hwb_cli("report", str(measured), "--csv")
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["variant"] for r in rows] == ["cpu.onnxruntime:fp32"]
    assert float(rows[0]["p50_us"]) <= float(rows[0]["p95_us"]) <= float(rows[0]["p99_us"])
    assert rows[0]["mode"] == "hardware"
    rc, out, err = hwb_cli("bench", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "50",
                           "--csv", "-o", str(tmp_path / "r.json"), "--cache-dir", str(store_dir))
    assert rc == 0, err
    (row,) = csv.DictReader(io.StringIO(out))
    assert row["variant"] == "cpu.onnxruntime:fp32" and int(row["n"]) == 50
    assert f"results: {tmp_path / 'r.json'}" in err  # the notes go to stderr, the CSV stays clean


def _slower(src: Path, dst: Path, factor: float, corr: float | None = None) -> Path:
    d = json.loads(src.read_text())
    for p in d["profiles"]:
        p["p50_us"] *= factor
        p["p99_us"] *= factor
    if corr is not None:
        for v in d["variants"]:
            v["fidelity"]["corr"] = corr
    dst.write_text(json.dumps(d))
    return dst


def test_compare_exits_4_past_a_threshold(hwb_cli, measured: Path, tmp_path: Path):
    same = _slower(measured, tmp_path / "same.json", 1.0)
    rc, out, _ = hwb_cli("compare", str(measured), str(same), "--max-p50", "5", "--max-p99", "5")
    assert rc == 0, out
    assert "all 1 row(s) within the thresholds" in out
    slow = _slower(measured, tmp_path / "slow.json", 1.3)
    rc, out, _ = hwb_cli("compare", str(measured), str(slow), "--max-p99", "10")
    assert rc == 4, out
    assert "regression: p99 +30.0% > 10%" in out
    rc, out, _ = hwb_cli("compare", str(measured), str(slow), "--max-p99", "50")
    assert rc == 0, out
    drift = _slower(measured, tmp_path / "drift.json", 1.0, corr=0.9)
    rc, out, _ = hwb_cli("compare", str(measured), str(drift), "--max-corr-drop", "0.01", "--json")
    d = json.loads(out)
    assert rc == 4 and d["failed"] == 1
    assert d["rows"][0]["new_corr"] == 0.9 and d["rows"][0]["corr_change"] < -0.09
    rc, out, _ = hwb_cli("compare", str(measured), str(slow), "--csv")
    (row,) = csv.DictReader(io.StringIO(out))
    assert rc == 0 and float(row["p50_pct"]) == pytest.approx(30.0)


def test_compare_fails_on_a_variant_that_failed_in_new(hwb_cli, measured: Path, tmp_path: Path):
    d = json.loads(measured.read_text())
    d["profiles"] = []
    d["variants"][0] |= {"error": "CompileError: boom", "fidelity": None}
    (tmp_path / "broken.json").write_text(json.dumps(d))
    rc, out, _ = hwb_cli("compare", str(measured), str(tmp_path / "broken.json"))
    assert rc == 4 and "failed in new" in out


def test_compare_of_a_missing_file_is_an_error(hwb_cli, measured: Path, tmp_path: Path):
    rc, _, err = hwb_cli("compare", str(measured), str(tmp_path / "nope.json"))
    assert rc == 1 and "does not exist" in err


# -- route --explain prints no traceback ----------------------------------------------------------
class _BoomTarget(Target):
    """Compiles nothing: raises with a traceback-like multi-line message, as a converter's
    crash inside the compile worker reads."""

    name = "cpu.hwbt_boom"
    family = "cpu"
    formats = ("keras",)
    description = "test target whose compile fails with a multi-line error"

    def probe(self) -> Availability:
        return Availability.hardware("CPU (test)")

    def toolchain(self) -> dict[str, str]:
        return {"hwbt": "1"}

    def compile(self, model, options, workdir):
        raise RuntimeError("the converter crashed\nTraceback (most recent call last):\n"
                           "  File \"conv.py\", line 7, in convert\nValueError: deep inside")

    def load(self, artifact, options):  # pragma: no cover - never built
        raise AssertionError


def test_route_explain_prints_an_error_on_one_line(hwb_cli, monkeypatch, tmp_path: Path, store_dir: Path):
    from hwbackends import hookimpl, registry

    reg = registry.build_registry()
    plug = type(sys)("hwbt_boom_plugin")
    plug.hwb_targets = hookimpl(lambda: [_BoomTarget()])
    reg.register(plug, "hwbt_boom")
    monkeypatch.setattr(registry, "_REGISTRY", reg)
    cfg = tmp_path / "s.toml"
    cfg.write_text('[tiers.fast]\np99_us = 1000\n[router]\nisolate_compile = false\n'
                   '[strategies.a]\nmodel = "zoo:mlp"\ntier = "fast"\ntargets = ["cpu.hwbt_boom"]\n')
    rc, out, err = hwb_cli("route", str(cfg), "--explain", "--cache-dir", str(store_dir))
    rc2, plain, _ = hwb_cli("route", str(cfg), "--cache-dir", str(store_dir))
    assert rc2 == 1 and "Traceback" not in plain and "the converter crashed" in plain
    assert rc == 1  # no variant for the strategy
    row = next(line for line in out.splitlines() if line.strip().startswith("cpu.hwbt_boom"))
    assert "failed" in row and "the converter crashed" in row and "--json has the whole error" in row
    assert "Traceback" not in out and "deep inside" not in out, out
    rc, out, _ = hwb_cli("route", str(cfg), "--json", "--cache-dir", str(store_dir))
    (strategy,) = json.loads(out)["strategies"]
    (cand,) = strategy["candidates"]
    assert "ValueError: deep inside" in cand["reasons"][0]  # the whole error, not cut


# -- hwb targets names the extra ----------------------------------------------------------------
@CPU_INSTALL
def test_targets_name_the_extra_that_installs_each_target(hwb_cli):
    rc, out, _ = hwb_cli("targets", "--json")
    rows = {r["name"]: r for r in json.loads(out)["targets"]}
    assert rc == 0
    assert rows["cpu.litert"]["install"] == rows["tpu.edgetpu"]["install"] == "hwbackends[keras]"
    assert rows["cpu.onnxruntime"]["install"] == "hwbackends[cpu]"
    assert rows["tpu.xla"]["install"] == "hwbackends[tpu]"
    assert rows["fpga.hls4ml"]["install"] == rows["fpga.da4ml"]["install"] == "hwbackends[fpga]"
    assert rows["gpu.torch"]["install"] == "hwbackends[torch]"
    rc, out, _ = hwb_cli("targets")
    lines = out.splitlines()
    from hwbackends.cli.targets import extra_installed

    for name, r in rows.items():
        if r["availability"]["mode"] == "unavailable" and r["install"]:
            i = next(k for k, line in enumerate(lines) if line.startswith(name + " "))
            # the extra is named only when installing it would change something: a CPU-only
            # torch build has gpu.torch's extra installed, and the reason says what is wrong
            shown = f"packages: pip install '{r['install']}'" in "\n".join(lines[i:i + 3])
            assert shown == (not extra_installed(r["install"])), name


def test_an_installed_extra_is_not_named_again():
    """extra_installed reads the distribution's own requirements: the core extra is installed
    wherever hwbackends is, an unknown distribution or extra is not."""
    from hwbackends.cli.targets import extra_installed

    assert extra_installed("hwbackends") and extra_installed("hwbackends[]")
    assert not extra_installed("hwbackends-no-such-dist[x]")
    assert not extra_installed("hwbackends[board]")  # pynq: never on a CPU machine
    assert not extra_installed("not a requirement")


# -- hwb predict without -p runs the variant compiled last ------------------------------------
def test_predict_without_precision_runs_the_variant_compiled_last(hwb_cli, tmp_path: Path):
    """`hwb compile -p int8` then `hwb predict` (no -p) runs that int8 variant, and says so,
    instead of silently building the target's first precision (fp32)."""
    store = str(tmp_path / "store")
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    rc, _, err = hwb_cli("compile", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "int8-dynamic",
                         "--cache-dir", store)
    assert rc in (0, 3), err
    rc, out, err = hwb_cli("predict", "zoo:mlp", "-t", "cpu.onnxruntime", "-i", str(tmp_path / "x.npy"),
                           "--cache-dir", store, "--json")
    assert rc == 0, err
    assert json.loads(out)["variant"] == "cpu.onnxruntime:int8-dynamic"
    assert "no -p given: cpu.onnxruntime:int8-dynamic, the variant of mlp the store holds" in err
    assert "compiling" not in err  # loaded, not built
    rc, out, err = hwb_cli("predict", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "-i",
                           str(tmp_path / "x.npy"), "--cache-dir", store, "--json")
    assert rc == 0 and json.loads(out)["variant"] == "cpu.onnxruntime:fp32"
    assert "no -p given" not in err
    # two stored now: which one to run is not guessed from their history
    rc, out, err = hwb_cli("predict", "zoo:mlp", "-t", "cpu.onnxruntime", "-i", str(tmp_path / "x.npy"),
                           "--cache-dir", store, "--json")
    assert rc == 0 and json.loads(out)["variant"] == "cpu.onnxruntime:fp32"
    assert "the store holds 2 variants of mlp for cpu.onnxruntime (fp32, int8-dynamic)" in err


@CPU_INSTALL
def test_store_prune_without_a_limit_is_a_usage_error(tmp_path: Path):
    """``hwb store prune`` with neither limit: exit 2 (not 1), the expected form named, and
    nothing removed (the installed ``hwb``, as a script calls it)."""
    store = tmp_path / "store"
    r = subprocess.run([HWB, "store", "--cache-dir", str(store), "prune"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "usage: hwb store prune" in r.stderr and "Traceback" not in r.stderr
    assert "give --max-size SIZE" in r.stderr and "--older-than AGE" in r.stderr, r.stderr
    r = subprocess.run([HWB, "store", "--cache-dir", str(store), "prune", "--older-than", "30d"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("removed 0 artifact(s)"), r.stdout + r.stderr
