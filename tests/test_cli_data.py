"""The data a command checks against, what it builds, and its options:

* the user's calibration/validation data from the command line and strategies.toml, checked
   against the model, with its provenance in every output (synthetic N(0,1) said as such);
* nothing is built that the strategy's rules could not choose, slow builds stay out of the
   default sets, long builds report progress, cached profiles are said to be cached, and a
   batch sweep does not rebuild a batch-independent artifact;
* a bench with nothing measurable fails with the reason, ``hwb compile`` shows the FPGA
   estimate and a failed fidelity gate, ``synth=true`` without Vitis fails at once, no TF
   start-up noise, every option's help states its default, samples/s from the median.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hwbackends.cli import build_parser, main
from hwbackends.context import RunContext

ROOT = Path(__file__).resolve().parents[1]


def _save(path: Path, a: np.ndarray) -> Path:
    np.save(path, a)
    return path


@pytest.fixture
def mlp_data(tmp_path: Path) -> tuple[Path, Path]:
    """Calibration (200) and validation (100) samples of zoo:mlp's input (64 features)."""
    rng = np.random.default_rng(5)
    cal = _save(tmp_path / "calib.npy", rng.standard_normal((200, 64)).astype(np.float32))
    val = _save(tmp_path / "val.npy", rng.standard_normal((100, 64)).astype(np.float32))
    return cal, val


# -- item 7: data from the CLI, checked, with its provenance ---------------------------------
def test_compile_takes_calibration_and_validation_files(store_dir, mlp_data, capsys) -> None:
    cal, val = mlp_data
    rc = main(["compile", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "int8", "--calibration-data",
               str(cal), "--validation-data", str(val), "--cache-dir", str(store_dir), "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    c, v = d["data"]["calibration"], d["data"]["validation"]
    assert c["kind"] == "file" and c["path"] == str(cal.resolve()) and c["n"] == 200
    assert v["kind"] == "file" and v["path"] == str(val.resolve()) and v["n"] == 100
    assert not c["synthetic"] and not v["synthetic"] and c["sha256"] != v["sha256"]
    assert d["fidelity"]["n"] == 100  # every validation sample, none used to calibrate


def test_without_data_every_output_says_synthetic(store_dir, capsys) -> None:
    assert main(["compile", "zoo:mlp", "-t", "ref", "--cache-dir", str(store_dir)]) == 0
    assert "validated on synthetic N(0,1) inputs" in capsys.readouterr().out
    assert main(["compile", "zoo:mlp", "-t", "ref", "--cache-dir", str(store_dir), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["data"]["validation"]["synthetic"] and d["data"]["validation"]["kind"] == "synthetic"
    assert d["data"]["calibration"] is None  # fp32: nothing calibrated


def test_a_wide_input_gets_fewer_synthetic_samples_not_gigabytes(tmp_path, capsys) -> None:
    """A 3×128×128 input without data: validation noise stays within SYNTHETIC_BYTES (170
    samples of 512, said so in the output), and an fp32 build generates no calibration."""
    import onnx
    from onnx import TensorProto, helper

    from hwbackends import samples

    shape = ["N", 3, 128, 128]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    path = tmp_path / "wide.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["compile", str(path), "-t", "ref", "--cache-dir", str(tmp_path / "s"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    n = samples.SYNTHETIC_BYTES // (4 * 3 * 128 * 128)
    assert d["data"]["validation"]["n"] == n == 170 and f"{n} samples" in d["data"]["validation"]["label"]
    assert d["data"]["calibration"] is None


def test_validation_data_alone_is_split_into_disjoint_halves(store_dir, mlp_data, capsys) -> None:
    _, val = mlp_data
    assert main(["compile", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "int8", "--validation-data",
                 str(val), "--cache-dir", str(store_dir), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["data"]
    assert d["calibration"]["label"].startswith("samples 0–49 of val.npy")
    assert d["validation"]["label"].startswith("samples 50–99 (held out from calibration) of val.npy")


@pytest.mark.parametrize("make, flag, want", [
    (lambda d: _save(d / "x.npy", np.zeros((10, 5), np.float32)), "--validation-data",
     r"x.npy is an array of shape \(10, 5\); the model takes samples of shape \(64,\): give \(n, 64\)"),
    (lambda d: _save(d / "x.npy", np.full((4, 64), np.nan, np.float32)), "--calibration-data",
     "contains 256 NaN and 0 Inf value"),
    (lambda d: _save(d / "x.npy", np.array(["a"] * 64).reshape(1, 64)), "--validation-data",
     "has dtype <U1; expected numbers"),
    (lambda d: _save(d / "x.npy", np.zeros((2, 64), np.complex64)), "--validation-data",
     "has dtype complex64"),
    (lambda d: (d / "x.npy").write_bytes(np.lib.format.magic(1, 0) + b"garbage") and d / "x.npy",
     "--validation-data", "cannot be read as .npy"),
    (lambda d: d / "missing.npy", "--validation-data", "missing.npy: no such file; give a .npy"),
    (lambda d: (d / "x.csv").write_text("1,2") and d / "x.csv", "--calibration-data",
     "a .csv file; give a .npy array"),
    (lambda d: np.savez(d / "x.npz", a=np.zeros((3, 64)), b=np.zeros((3, 64))) or d / "x.npz",
     "--validation-data", "holds arrays a, b; the model takes one input"),
    (lambda d: _save(d / "x.npy", np.array([{"a": 1}], dtype=object)), "--validation-data",
     "Python objects.*never loaded"),
])
def test_bad_data_files_are_clear_errors(store_dir, tmp_path, capsys, make, flag, want) -> None:
    import re

    path = make(tmp_path)
    rc = main(["compile", "zoo:mlp", "-t", "ref", flag, str(path), "--cache-dir", str(store_dir)])
    err = capsys.readouterr().err
    assert rc == 1 and "InputError" in err and flag in err
    assert re.search(want, err), err


def test_bench_results_and_report_carry_the_provenance(store_dir, mlp_data, tmp_path) -> None:
    _, val = mlp_data
    out, rep = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["bench", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "60", "-q",
                 "--validation-data", str(val), "--cache-dir", str(store_dir), "-o", str(out),
                 "--report", str(rep)]) == 0
    d = json.loads(out.read_text())
    assert "val.npy" in d["data"]["validation"]["label"] and not d["data"]["validation"]["synthetic"]
    assert d["variants"][0]["data"]["validation"]["path"] == str(val.resolve())
    html = rep.read_text()
    assert "of val.npy" in html and "held-out validation samples" not in html
    assert "Synthetic inputs" not in html
    # and without data, the report says the figures are on synthetic inputs
    assert main(["bench", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "60", "-q",
                 "--cache-dir", str(store_dir), "-o", str(out), "--report", str(rep)]) == 0
    assert json.loads(out.read_text())["data"]["validation"]["synthetic"]
    assert "Synthetic inputs" in rep.read_text()


#: One unbounded tier and a short router bench: the strategies of the tests below.
TIER_AND_BENCH = """\
[tiers.any]
p99_us = 1000000

[router.bench]
n = 50
warmup = 5
rounds = 1
"""

STRATEGIES = TIER_AND_BENCH + """\

[strategies.s]
model = "zoo:mlp"
tier = "any"
targets = ["cpu.onnxruntime"]
precisions = ["fp32"]
validation_data = "val.npy"
"""


def test_strategies_file_data_and_the_route_flag_that_replaces_it(store_dir, mlp_data, tmp_path,
                                                                  capsys) -> None:
    _, val = mlp_data
    cfg = tmp_path / "s.toml"
    cfg.write_text(STRATEGIES)
    assert main(["route", str(cfg), "--json", "--cache-dir", str(store_dir)]) == 0
    cand = json.loads(capsys.readouterr().out)["strategies"][0]["candidates"][0]
    assert cand["data"]["validation"]["path"] == str(val.resolve())
    other = _save(tmp_path / "other.npy", np.ones((40, 64), np.float32) * 0.5)
    assert main(["route", str(cfg), "--json", "--cache-dir", str(store_dir),
                 "--validation-data", str(other)]) == 0
    cand = json.loads(capsys.readouterr().out)["strategies"][0]["candidates"][0]
    assert cand["data"]["validation"]["path"] == str(other.resolve())
    assert main(["route", str(cfg), "--explain", "--cache-dir", str(store_dir)]) == 0
    assert "fidelity validated on samples 50–99" in capsys.readouterr().out


def test_strategy_data_of_the_wrong_shape_names_the_strategy(store_dir, tmp_path) -> None:
    from hwbackends.errors import InputError
    from hwbackends.router import Router

    _save(tmp_path / "val.npy", np.zeros((10, 3), np.float32))
    cfg = tmp_path / "s.toml"
    cfg.write_text(STRATEGIES)
    with pytest.raises(InputError, match=r"strategy 's' validation_data val.npy is an array of shape"):
        Router.from_config(cfg, context=RunContext.at(store_dir))


# -- item 9: build only what can be chosen ----------------------------------------------------
def _cost_registry(report: Path):
    from build_cost_targets import BatchFreeTarget, EmulatedTarget, SlowTarget, plugin

    from hwbackends.registry import build_registry

    reg = build_registry(entry_points=False)
    reg.register(plugin(EmulatedTarget(str(report)), SlowTarget(str(report)),
                        BatchFreeTarget(str(report))), "cost")
    return reg


def _built(report: Path) -> list[str]:
    return report.read_text().split("\n")[:-1] if report.exists() else []


ROUTE_ALL = TIER_AND_BENCH + """\

[strategies.everything]
model = "zoo:mlp"
tier = "any"
targets = ["*"]
fidelity = { corr_min = -1.0 }   # the test targets output zeros
"""


def test_route_builds_nothing_its_rules_reject(store_dir, tmp_path) -> None:
    """`hwb route` built fpga.da4ml for 344 s and then rejected it as emulated."""
    from hwbackends.bench import ProfileCache
    from hwbackends.router import Router

    report = tmp_path / "built"
    reg = _cost_registry(report)
    cfg = tmp_path / "s.toml"
    cfg.write_text(ROUTE_ALL)
    said: list[str] = []
    r = Router.from_config(cfg,
                           context=RunContext.at(tmp_path / "store", progress=said.append,
                                                 profiles=ProfileCache(tmp_path / "profiles"), registry=reg))
    c = {x.target: x for x in r.decisions["everything"].candidates}
    assert _built(report) == ["fpga.test_batchfree batch 1"]  # neither emulated nor slow built
    assert c["tpu.test_emulated"].status == "rejected" and c["tpu.test_emulated"].cm is None
    assert "emulated" in c["tpu.test_emulated"].reasons[0] and "not built" in c["tpu.test_emulated"].reasons[0]
    assert c["fpga.test_slow"].status == "rejected" and "not built by default" in c["fpga.test_slow"].reasons[0]
    assert r.decisions["everything"].chosen.target == "fpga.test_batchfree"
    assert any("measuring 1 candidate(s)" in m for m in said)
    # the same again: the profile comes from the cache, and says so
    said.clear()
    Router.from_config(cfg,
                       context=RunContext.at(tmp_path / "store", progress=said.append,
                                             profiles=ProfileCache(tmp_path / "profiles"), registry=reg))
    assert any("profiles from cache" in m for m in said) and not any("measuring" in m for m in said)
    # a strategy that names them, or ranks emulated latencies, gets them built
    cfg.write_text(ROUTE_ALL.replace('targets = ["*"]', 'targets = ["*", "fpga.*"]\nallow_emulated = true'))
    Router.from_config(cfg,
                       context=RunContext.at(tmp_path / "store",
                                             profiles=ProfileCache(tmp_path / "profiles"), registry=reg))
    assert {"fpga.test_slow batch 1", "tpu.test_emulated batch 1"} <= set(_built(report))


def test_bench_leaves_slow_builds_out_of_the_default_set(store_dir, tmp_path) -> None:
    from hwbackends.bench import SingleStream, bench_model

    report = tmp_path / "built"
    reg = _cost_registry(report)
    res = bench_model("zoo:mlp", ["*"], None, [SingleStream(n=20, warmup=2)],
                      context=RunContext.at(tmp_path / "store", registry=reg), bars=False)
    assert "fpga.test_slow batch 1" not in _built(report)
    row = next(a for a in res.availability if a["target"] == "fpga.test_slow")
    assert "not built by default" in row["skipped"] and "--targets fpga.test_slow" in row["skipped"]
    assert "fpga.test_slow:fp32" not in {v.variant for v in res.variants}
    bench_model("zoo:mlp", ["fpga.*"], None, [SingleStream(n=20, warmup=2)],
                context=RunContext.at(tmp_path / "store", registry=reg), bars=False)
    assert "fpga.test_slow batch 1" in _built(report)


def test_batch_sweep_builds_a_batch_independent_artifact_once(tmp_path) -> None:
    """`-s batch:sizes=…` re-ran fpga.hls4ml's auto-precision search for every size."""
    from hwbackends.bench import Batch, bench_model

    report = tmp_path / "built"
    reg = _cost_registry(report)
    res = bench_model("zoo:mlp", ["fpga.test_batchfree"], None, [Batch(sizes=(1, 4, 8), n=20)],
                      context=RunContext.at(tmp_path / "store", registry=reg), bars=False)
    assert sorted(p.batch_size for p in res.profiles) == [1, 4, 8]
    assert _built(report) == ["fpga.test_batchfree batch 1"]


def test_long_builds_report_elapsed_time() -> None:
    from hwbackends.compiler import heartbeat

    said: list[str] = []
    with heartbeat(said.append, "fpga.x:auto still building", first=0.05, every=0.05):
        time.sleep(0.3)
    assert said and all(m.startswith("fpga.x:auto still building: ") and m.endswith(" elapsed")
                        for m in said)
    n = len(said)
    time.sleep(0.15)
    assert len(said) == n  # stops with the build


# -- item 12 ----------------------------------------------------------------------------------
def test_bench_with_nothing_measurable_fails_with_the_reason(store_dir, tmp_path, capsys) -> None:
    from hwbackends.registry import get_registry, safe_probe

    reg = get_registry()
    if any(safe_probe(t).usable for n, t in reg.targets.items() if n.startswith("gpu.")):
        pytest.skip("a gpu.* target is available here")
    rc = main(["bench", "zoo:mlp", "-t", "gpu.*", "-q", "-o", str(tmp_path / "r.json"),
               "--cache-dir", str(store_dir)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "nothing was measured" in err and "gpu.torch unavailable" in err


def test_compile_flags_a_failed_fidelity_gate(store_dir, tmp_path, capsys) -> None:
    rng = np.random.default_rng(1)
    tiny = _save(tmp_path / "tiny.npy", (rng.standard_normal((64, 64)) * 1e-3).astype(np.float32))
    val = _save(tmp_path / "val.npy", (rng.standard_normal((128, 64)) * 3).astype(np.float32))
    assert main(["compile", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "int8", "--calibration-data",
                 str(tiny), "--validation-data", str(val), "--cache-dir", str(store_dir)]) == 3
    out = capsys.readouterr().out  # built, but the gate failed: exit 3 (hwb --help, exit codes)
    assert "! FIDELITY GATE FAILED (quantized precision): corr" in out


def test_compile_prints_the_fpga_hardware_estimate() -> None:
    # The lines come from each plugin's Target.summary_lines (the core reads none of their
    # meta keys); the text is pinned here as `hwb compile` printed it before the hook.
    from hwb_plugins.fpga_da4ml.estimate import hardware_estimate
    from hwbackends.cli.compile import summary_lines

    est = hardware_estimate(cycles=6, ii=1, depth=6, synth={"luts": 19700, "ffs": 900, "dsps": 0,
                                                            "stage_bound_ns": 2.0},
                            part="xcvu13p", clock_mhz=200, io_ns=850, io_source="PCIe", tools={})
    lines = summary_lines({"target": "fpga.da4ml", "hardware_estimate": est,
                           "meta": {"bits": {"frac_bits": 6, "per_layer": [1]},
                                    "hardware_estimate": est}})
    assert len(lines) == 3
    assert lines[0].startswith("  hardware  MODELLED, not measured: 6 cycles (II 1) = 30.0 ns "
                               "@ 200 MHz; end to end 880 ns (logic + 850 ns I/O assumption)")
    assert lines[1].startswith("            resources 19,700 LUT, 900 FF, 0 DSP on xcvu13p; ")
    assert lines[2] == "  bits      frac_bits 6"
    syn = {"requested": False, "available": False, "reason": "vitis_hls not on PATH"}
    assert summary_lines({"target": "fpga.hls4ml", "meta": {"synthesis": syn}}) == [
        "  synthesis not requested (vitis_hls not on PATH): C-simulation only, no cycles or resources"]
    syn = {"tool": "vitis_hls", "report": {"LatencyBest": 12, "BRAM_18K": 0, "Loops": []}}
    assert summary_lines({"target": "fpga.hls4ml", "meta": {"synthesis": syn, "bits": {"total": 8}}}) \
        == ["  synthesis vitis_hls: LatencyBest 12, BRAM_18K 0", "  bits      total 8"]
    assert summary_lines({"target": "cpu.litert", "meta": {"bits": {"total": 8}}}) == []
    assert summary_lines({"target": "fpga.not-installed-here", "meta": {}}) == []


def test_a_raising_summary_hook_is_named_not_fatal(monkeypatch) -> None:
    """The build succeeded: a plugin whose summary_lines raises or returns the wrong type is
    named in one line; `hwb compile` still prints the rest."""
    from hwbackends.cli.compile import summary_lines
    from hwbackends.registry import get_registry

    cls = type(get_registry().target("fpga.hls4ml"))

    def boom(self, meta):
        raise KeyError("synthesis")

    monkeypatch.setattr(cls, "summary_lines", boom)
    assert summary_lines({"target": "fpga.hls4ml", "meta": {}}) == [
        "  (fpga.hls4ml.summary_lines raised KeyError: 'synthesis'; a plugin bug)"]
    monkeypatch.setattr(cls, "summary_lines", lambda self, meta: "bits 8")
    assert summary_lines({"target": "fpga.hls4ml", "meta": {}}) == [
        "  (fpga.hls4ml.summary_lines returned str, not a list of str; a plugin bug)"]


def test_synth_without_vitis_fails_before_building(store_dir, capsys) -> None:
    from hwbackends.registry import get_registry, safe_probe

    t = get_registry().targets.get("fpga.hls4ml")
    if t is None or not safe_probe(t).usable or shutil.which("vitis_hls"):
        pytest.skip("needs fpga.hls4ml available and no vitis_hls on PATH")
    t0 = time.monotonic()
    rc = main(["compile", "zoo:mlp", "-t", "fpga.hls4ml", "-O", "synth=true", "--rebuild",
               "--cache-dir", str(store_dir)])
    err = capsys.readouterr().err
    assert rc == 1 and "synth=true runs C-synthesis with vitis_hls, which is not on PATH" in err
    assert time.monotonic() - t0 < 30  # no C-simulation build (a minute or more) first


def test_no_tensorflow_startup_noise(store_dir) -> None:
    env = dict(os.environ, HWB_CACHE_DIR=str(store_dir))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    p = subprocess.run([sys.executable, "-m", "hwbackends", "compile", "zoo:mlp", "-t", "ref",
                        "--cache-dir", str(store_dir)], capture_output=True, text=True, env=env,
                       timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    for noise in ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard", "I0000"):
        assert noise not in p.stderr, p.stderr


def test_every_option_states_its_default() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, sp in sub.choices.items():
        fmt = sp._get_formatter()
        chosen = {a for g in sp._mutually_exclusive_groups if g.required for a in g._group_actions}
        for a in sp._actions:
            if isinstance(a, argparse._HelpAction) or not a.option_strings or a.required or a in chosen:
                continue
            shown = fmt._get_help_string(a) if a.help else ""
            if not a.help or (a.nargs != 0 and "default" not in shown.lower()):
                missing.append(f"hwb {name} {a.option_strings[0]}")
    assert not missing, "options without help or a stated default: " + ", ".join(missing)
    text = " ".join(sub.choices["serve"].format_help().split())
    assert "sleeps on a futex (default: 50.0)" in text  # appended by the formatter
    assert "client slots of the shm endpoint: clients attached at once (default 8)" in text  # stated


def test_samples_per_s_is_median_based(compiled) -> None:
    """One stall in 25 calls made calls/wall-time understate what a variant sustains."""
    from hwbackends.bench import SingleStream, measure

    cm = compiled("mlp", "cpu.onnxruntime", "fp32")
    calls = [0]

    def stalling(x, out):
        calls[0] += 1
        if calls[0] % 25 == 0:
            time.sleep(0.02)
        cm.predict_into(x, out)
    prof = measure(cm, SingleStream(n=200, warmup=0), predict_into=stalling)
    assert prof.throughput == pytest.approx(cm.batch_size * 1e6 / prof.p50_us, rel=1e-6)
    assert prof.throughput > 3 * prof.n * cm.batch_size / prof.duration_s  # n/wall would say less


def test_fleet_ships_the_checked_data_with_its_source(store_dir, mlp_data) -> None:
    """hwb fleet reads and checks the files on the driver; each node gets the arrays and the
    driver's provenance (file name, sha256), not a path it may not have."""
    from hwbackends.cli.fleet import data_payload
    from hwbackends.fleet.node import data_from_payload

    cal, val = mlp_data
    args = build_parser().parse_args(["fleet", "zoo:mlp", "--fleet", "local", "--calibration-data",
                                      str(cal), "--validation-data", str(val)])
    kw = data_from_payload(data_payload(args))
    assert set(kw) == {"calibration_data", "validation_data"}
    assert kw["validation_data"].source.path == str(val.resolve())
    assert kw["calibration_data"].arrays.shape == (200, 64)
    assert data_from_payload(None) == {}
