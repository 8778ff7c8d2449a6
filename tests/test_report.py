"""The hardware-evaluation report and the demo that produces it."""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess

import pytest

from hwbackends.bench import Batch, BenchResults, Burst, Server, SingleStream, bench_model
from hwbackends.context import RunContext
from hwbackends.registry import get_registry
from hwbackends.report import write_report
from hwbackends.units import fmt_us

#: The installed plugins, whose report sections the report adds.
REG = get_registry()

CONFIG = """
[tiers.fast]
p99_us = 1000
[tiers.impossible]
p99_us = 0.01
[router]
isolate_compile = false
[router.bench]
n = 300
warmup = 20
[strategies.a]
model = "zoo:signal"
tier = "fast"
targets = ["cpu.onnxruntime", "ref"]
precisions = ["fp32"]
[strategies.b]
model = "zoo:signal"
tier = "impossible"
targets = ["cpu.onnxruntime"]
precisions = ["fp32"]
"""


@pytest.fixture(scope="module")
def results(store_dir, tmp_path_factory) -> BenchResults:
    from hwbackends.router import Router

    res = bench_model("zoo:signal", ["cpu.onnxruntime", "ref"], ["fp32"],
                      [SingleStream(n=300, warmup=20), Server(rate_hz=1000, n=200, warmup=20),
                       Burst(duration_s=0.4, seed=2, warmup=20), Batch(sizes=(1, 4), n=200, warmup=10)],
                      max_ref_s=0.3, context=RunContext.at(store_dir), bars=False)
    cfg = tmp_path_factory.mktemp("cfg") / "s.toml"
    cfg.write_text(CONFIG)
    router = Router.from_config(cfg, strict=False, context=RunContext.at(store_dir))
    res.routing = [d.to_dict() for d in router.decisions.values()]
    return res


def test_report_is_self_contained_and_complete(results, tmp_path) -> None:
    out = write_report(results, tmp_path / "r.html", registry=REG)
    html = out.read_text()
    for heading in ("Summary", "Routing decision per tier", "Availability on this machine",
                    "Latency distribution", "Server scenario", "Burst replay", "Batching",
                    "Fidelity against the fp32 source model", "How this was measured"):
        assert heading in html, heading
    assert html.count("<svg") >= 4  # CDF, server CDF, burst timeline, batch
    # self-contained: no external stylesheet, script or image
    assert not re.search(r'<(link|script)\b', html)
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "cpu.onnxruntime:fp32" in html and "HARDWARE" in html
    assert "over budget" in html and "closest: cpu.onnxruntime:fp32" in html  # tier "impossible"
    assert "EMULATED" not in html  # nothing emulated was measured here


def test_emulated_profiles_are_labelled(results, tmp_path) -> None:
    # Rendering check: a profile whose variant ran on a stand-in must be marked as such in
    # tables, plots and the banner (the figures are this run's, relabelled as emulated).
    res = copy.deepcopy(results)
    for p in res.profiles:
        if p.target == "ref":
            p.mode = "emulated"
    html = write_report(res, tmp_path / "e.html", registry=REG).read_text()
    assert "EMULATED" in html and "Emulated figures" in html
    assert "not</b> how fast the hardware would be" in html
    # The summary names the emulated variants and gives no latency figure for them: a
    # stand-in's time would read as the device's ("fastest emulated 2.34 µs (Edge TPU)").
    summary = html[html.index("<h2>Summary</h2>"):html.index("Routing decision per tier")]
    assert "emulated variants (no device latency)" in summary and "ref:fp32" in summary
    assert "fastest emulated" not in html
    emu_p99 = next(p.p99_us for p in res.profiles if p.emulated and p.scenario == "single-stream")
    assert fmt_us(emu_p99) not in summary


def test_report_folds_long_text_counts_failures_and_other_models(results, tmp_path, capsys) -> None:
    """Through `hwb report`: a long error and routing reasons are whole (the first part opens
    a fold holding all of it, no silent cut at 200/240 characters), failed variants are
    counted in the summary, and a strategy of a model this run did not measure is shown as
    such instead of counting as one of this run's strategies over budget; p95 in the tables."""
    from hwbackends.cli import main
    from hwbackends.variant import VariantRecord

    res = copy.deepcopy(results)
    tail = "the last line of a long traceback: " + "x" * 20
    error = "CompileError: compiling failed\n" + "  File 'conv.py', line 1\n" * 30 + tail
    res.variants.append(VariantRecord.failed("cpu.onnxruntime", "int8", "hardware", error))
    reason = "rejected: " + "because " * 60 + "END-OF-REASON"
    res.routing[0]["candidates"][0]["reasons"] = [reason]
    other = copy.deepcopy(res.routing[1]) | {"strategy": "lstm_desk", "model": "zoo:lstm",
                                             "model_in_run": False, "chosen": None,
                                             "meets_budget": False, "candidates": []}
    res.routing.append(other)
    path = res.save(tmp_path / "r.json")
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 0
    capsys.readouterr()
    html = (tmp_path / "r.html").read_text()
    assert tail in html and "END-OF-REASON" in html
    assert html.count('<details class="long">') >= 2
    assert "1 failed" in html
    summary = html[html.index("<h2>Summary</h2>"):html.index("Routing decision per tier")]
    assert "1 / 2" in summary and "1 of other models, not in this run" in summary
    assert "other model (zoo:lstm): not in this run" in html
    assert "<th class=\"num\">p95</th>" in html


def test_cli_report_and_version_error(results, tmp_path, capsys) -> None:
    from hwbackends.cli import main

    path = results.save(tmp_path / "res.json")
    assert main(["report", str(path), "-o", str(tmp_path / "out.html")]) == 0
    assert "report: " in capsys.readouterr().out and (tmp_path / "out.html").exists()
    d = json.loads(path.read_text())
    d["version"] = 0
    path.write_text(json.dumps(d))
    assert main(["report", str(path), "-o", str(tmp_path / "x.html")]) == 1
    assert "results-format version 0" in capsys.readouterr().err


def _chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                       "google-chrome")) if p), None)


def test_report_renders_in_headless_chromium(results, tmp_path) -> None:
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium on PATH (apt-get install -y chromium) to render the report")
    html = write_report(results, tmp_path / "r.html", registry=REG)
    shot = tmp_path / "r.png"
    base = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(base + ["--dump-dom", html.as_uri()], capture_output=True, text=True,
                         timeout=90)
    assert "Routing decision per tier" in dom.stdout and "<svg" in dom.stdout
    subprocess.run(base + ["--window-size=1280,3000", f"--screenshot={shot}", html.as_uri()],
                   capture_output=True, timeout=90)
    assert shot.exists() and shot.stat().st_size > 50_000  # a rendered page, not a blank one


def test_demo_quick_end_to_end(store_dir, tmp_path, capsys) -> None:
    from hwbackends.cli import main

    cfg = tmp_path / "s.toml"
    cfg.write_text(CONFIG)
    rc = main(["demo", "--quick", "--targets", "cpu.onnxruntime,ref", "--config", str(cfg),
               "-o", str(tmp_path / "demo"), "--cache-dir", str(store_dir)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "routing (examples: s.toml)" in out and "report:" in out
    res = BenchResults.load(tmp_path / "demo" / "results.json")
    assert {p.scenario for p in res.profiles} == {"single-stream", "server", "burst", "sliding"}
    # the sliding figure is in the results (and so the report), named by its own model
    sl = next(p for p in res.profiles if p.scenario == "sliding")
    assert sl.params["model"] == "zoo:lstm" and sl.variant == "cpu.native:fp32"
    assert [pt["streams"] for pt in sl.sliding["load"]["points"]] == [1]  # --quick: one window
    assert "Sliding windows under load" in (tmp_path / "demo" / "report.html").read_text()
    assert "  NMI 1: tick (push + prepare)" in out
    assert [r["strategy"] for r in res.routing] == ["a", "b"]
    assert all(r["model"] == "zoo:signal" and r["model_in_run"] for r in res.routing)
    assert (tmp_path / "demo" / "report.html").stat().st_size > 20_000
    # the sliding figure of the zoo LSTM, measured in the demo (cpu.native's own form)
    line = next(x for x in out.splitlines() if x.startswith("sliding window, zoo:lstm on cpu.native"))
    m = re.search(r"push p50 ([\d.]+) µs / p99 ([\d.]+) µs vs full window ([\d.]+) µs "
                  r"\(incremental; prepare p50 [\d.]+ µs apart, n=\d+\)", line)
    assert m, line
    push50, push99, full50 = map(float, m.groups())
    assert 0 < push50 <= push99 and push50 < full50  # one step costs less than the window


# -- plugin sections (hook hwb_report_sections) -----------------------------------------------

def _fpga_results() -> BenchResults:
    """A results file with one fpga.da4ml and one fpga.hls4ml row, as the bench writes them:
    the estimate from da4ml's own estimate(), the bits each plugin's compile records."""
    from hwb_plugins.fpga_da4ml.estimate import hardware_estimate
    from hwbackends.variant import VariantRecord

    est = hardware_estimate(cycles=6, ii=1, depth=6, synth={"luts": 19700, "ffs": 900, "dsps": 0,
                                                            "stage_bound_ns": 2.0},
                            part="xcvu13p", clock_mhz=200, io_ns=850, io_source="PCIe <x4>",
                            tools={"yosys": "0.50"})
    res = BenchResults(model={"name": "m"}, machine={})
    res.variants = [
        VariantRecord(variant="fpga.da4ml:auto", target="fpga.da4ml", precision="auto",
                      mode="emulated", hardware_estimate=est,
                      plugin_report={"bits": {"input_width": 8, "frac_bits": 6, "weight_frac_bits": 5},
                            "bit_exact": {"samples": 4096, "bit_exact": True}}),
        VariantRecord(variant="fpga.hls4ml:auto", target="fpga.hls4ml", precision="auto",
                      mode="emulated", plugin_report={"bits": {"total_bits": 1234}, "frac_bits": 9}),
        VariantRecord.failed("fpga.hls4ml", "ap_fixed<8,3>", "emulated", "CompileError: no g++"),
    ]
    return res


def test_fpga_sections_come_from_the_fpga_plugins() -> None:
    from hwbackends.report.html import render

    html = render(_fpga_results(), REG)
    da = html[html.index("FPGA (fpga.da4ml)"):]
    da = da[:da.index("</section>")]
    assert "Modelled, not measured on hardware" in da and "<td>6</td>" in da
    assert "30 + 850 = 880" in da and "19,700" in da and "bit-exact on 4,096" in da
    assert "f=6, fw=5, in 8 b" in da and "PCIe &lt;x4&gt;" in da  # escaped
    hls = html[html.index("FPGA (fpga.hls4ml)"):]
    hls = hls[:hls.index("</section>")]
    assert "C-simulation, not hardware" in hls and "f=9, 1,234 bits" in hls
    assert "ap_fixed&lt;8,3&gt;" not in hls  # the failed build is the fidelity table's, not here
    # sections come after the core's fidelity section, before the method
    assert html.index("Fidelity against") < html.index("FPGA (fpga.da4ml)") < html.index(
        "FPGA (fpga.hls4ml)") < html.index("How this was measured")


def test_no_fpga_section_without_fpga_variants() -> None:
    from hwbackends.report.html import render
    from hwbackends.variant import VariantRecord

    res = BenchResults(model={"name": "m"}, machine={})
    res.variants = [VariantRecord(variant="cpu.litert:fp32", target="cpu.litert", precision="fp32",
                                  mode="hardware")]
    assert "FPGA" not in render(res, REG)


class _Section:
    @staticmethod
    def hwb_report_sections(results):
        return [f"<section><h2>Plugin X</h2>{len(results.variants)} rows</section>"]


class _BrokenSection:
    @staticmethod
    def hwb_report_sections(results):
        raise KeyError("a meta key the plugin expected")


class _WrongType:
    @staticmethod
    def hwb_report_sections(results):
        return [{"not": "html"}]


def test_a_raising_report_plugin_is_noted_and_the_report_is_written(tmp_path) -> None:
    import hwbackends as hwb
    from hwbackends.registry import build_registry

    reg = build_registry()  # the installed plugins (the FPGA sections) and three of the test's
    for cls, name in ((_Section, "section-ok"), (_BrokenSection, "section-broken"),
                      (_WrongType, "section-wrong")):
        plugin = type(name, (), {"hwb_report_sections": hwb.hookimpl(cls.hwb_report_sections)})
        reg.register(plugin, name)
    html = write_report(_fpga_results(), tmp_path / "r.html", registry=reg).read_text()
    assert "<h2>Plugin X</h2>3 rows" in html and "FPGA (fpga.da4ml)" in html
    left = html[html.index("Plugin sections left out"):]
    assert "section-broken: KeyError" in left and "a meta key the plugin expected" in left
    assert "section-wrong: hwb_report_sections returned dict, not HTML strings" in left
    assert "How this was measured" in html


def test_the_bench_keeps_what_each_target_reports() -> None:
    """Target.report_meta decides what a row keeps of the artifact metadata, not the core."""
    from hwbackends.variant import report_meta

    meta = {"bits": {"total_bits": 8}, "search": {"frac_bits": 5}, "bit_exact": None}
    assert report_meta("fpga.hls4ml", meta, REG) == {"bits": {"total_bits": 8}, "bit_exact": None,
                                                "frac_bits": 5}
    assert report_meta("fpga.da4ml", meta, REG) == report_meta("fpga.hls4ml", meta, REG)
    assert report_meta("cpu.litert", meta, REG) is None  # the default keeps nothing
    assert report_meta("fpga.not-installed-here", meta, REG) is None  # no Target, nothing kept
