"""The sliding scenario under load (STAC-ML's NMI × offered tick rate) and strategies routed
by a declared load: ``hwb bench -s sliding:streams=…`` on zoo:lstm with cpu.native and
cpu.onnxruntime (tiny tick counts), results.json, the report's curve, ``hwb compare``'s rows,
``hwb route`` with ``sliding = {streams, tick_rate_hz, cores}``; the router's pick and core
count on constructed profiles; labels that carry the push form."""
from __future__ import annotations

import copy
import io
import json
import math
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwbackends as hwb
from hwbackends.bench import BenchResults, LatencyProfile, parse
from hwbackends.bench.load import at_load, knee, p99_at, parse_load, with_budget
from hwbackends.bench.results import ResultsError
from hwbackends.bench.scenarios import NMI_SWEEP, Sliding
from hwbackends.cli import main
from hwbackends.config import load_config, parse_config
from hwbackends.errors import ConfigError
from hwbackends.fidelity import compare as fidelity_compare
from hwbackends.labels import label, parse_label, push_form
from hwbackends.registry import get_registry
from hwbackends.router.plan import decide_from_results, explain
from hwbackends.variant import VariantRecord

TARGETS = "cpu.native,cpu.onnxruntime"
SCENARIO = "sliding:n=200,rounds=2,warmup=20,streams=1/3,ticks=120,max_s=2,budget_us=200000"


def _run(argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(argv)
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def load_run(tmp_path_factory, store_dir) -> tuple[Path, str]:
    """One ``hwb bench -s sliding:streams=1/3,…`` on zoo:lstm, shared by the tests."""
    out = tmp_path_factory.mktemp("load") / "res.json"
    rc, text = _run(["bench", "zoo:lstm", "-t", TARGETS, "-p", "fp32", "-s", SCENARIO,
                     "-o", str(out), "--cache-dir", str(store_dir)])
    assert rc == 0, text
    return out, text


# -- the scenario's settings ------------------------------------------------------------------

def test_scenario_settings_parse_and_bad_ones_are_config_errors() -> None:
    sc = parse("sliding:streams=1/2/4,rate=100/250.5,budget_us=50,ticks=300,offered=9000")
    assert isinstance(sc, Sliding)
    assert (sc.streams, sc.rate_hz, sc.budget_us, sc.ticks, sc.offered_hz) == \
        ((1, 2, 4), (100.0, 250.5), 50.0, 300, (9000.0,))
    assert parse("sliding:streams=stac").streams == NMI_SWEEP == (1, 2, 4, 8, 24)
    assert parse("sliding:streams=none").streams == ()
    assert parse("sliding").streams == (1,)  # one window's curve by default
    for bad, word in (("streams=0", "≥ 1"), ("streams=2/x", "streams"), ("rate=-5", "> 0"),
                      ("rate=inf", "> 0"), ("ticks=0", "ticks='0' is not valid"),
                      ("budget_us=0", "> 0"), ("nmi=4", "bad parameter")):
        with pytest.raises(ConfigError, match=word):
            parse(f"sliding:{bad}")


# -- hwb bench: the profile in results.json ---------------------------------------------------

def test_bench_writes_the_load_sweep_per_variant_and_nmi(load_run) -> None:
    out, text = load_run
    raw = json.loads(out.read_text())
    rows = [p for p in raw["profiles"] if p["scenario"] == "sliding"]
    assert {p["variant"] for p in rows} == {"cpu.native:fp32", "cpu.onnxruntime:fp32"}
    for p in rows:
        load = parse_load(p["sliding"]["load"])
        assert load["budget_us"] == 200000 and load["budget_from"] == "budget_us"
        assert [pt["streams"] for pt in load["points"]] == [1, 3]
        for pt in load["points"]:
            c = pt["closed"]
            assert c["push"]["n"] > 0 and c["prepare"]["n"] == c["push"]["n"]
            # the rate one core sustains is 1 / (median push + median prepare), measured
            assert c["sustainable_hz"] == pytest.approx(1e6 / c["tick_p50_us"], rel=1e-9)
            assert c["tick_p50_us"] >= c["push"]["p50_us"]
            assert len(pt["open"]) == 6  # the automatic offered rates
            for q in pt["open"]:
                assert q["n"] >= 2 and q["offered_hz"] == pytest.approx(q["rate_hz"] * pt["streams"])
                # latency from the scheduled arrival: never below the push's own service time
                assert q["p99_us"] >= q["p50_us"] >= q["service_p50_us"]
            assert pt["knee_bound"] in ("=", ">=", "<=") and pt["knee_hz"] > 0
            assert (pt["knee_hz"], pt["knee_bound"]) == knee(pt["open"], 200000)
    assert "NMI 3: tick (push + prepare)" in text and "one core sustains" in text


def test_results_round_trip_keeps_the_load_profile(load_run, tmp_path) -> None:
    out, _ = load_run
    res = BenchResults.load(out)
    p = next(p for p in res.profiles if p.scenario == "sliding")
    again = BenchResults.load(res.save(tmp_path / "again.json"))
    q = next(x for x in again.profiles if x.variant == p.variant and x.scenario == "sliding")
    assert q.sliding["load"] == p.sliding["load"]
    assert parse_load(q.sliding["load"]) is not None


def test_a_malformed_load_is_a_results_error_naming_the_field(load_run) -> None:
    out, _ = load_run
    good = json.loads(out.read_text())["profiles"][0]["sliding"]["load"]
    for mutate, word in ((lambda d: d.update(points="x"), "list of points"),
                         (lambda d: d["points"][0].update(streams=True), "streams"),
                         (lambda d: d["points"][0]["closed"].update(sustainable_hz="fast"), "sustainable_hz"),
                         (lambda d: d["points"][0]["open"][0].update(offered_hz=-1), "offered_hz"),
                         (lambda d: d.update(budget_us=float("nan")), "budget_us")):
        bad = copy.deepcopy(good)
        mutate(bad)
        with pytest.raises(ResultsError, match=word):
            parse_load(bad, "row 0")
    # and reading a results file refuses one, naming the file and the profile
    raw = json.loads(out.read_text())
    raw["profiles"][0]["sliding"]["load"]["points"][0]["streams"] = -3
    bad_file = out.with_name("bad-load.json")
    bad_file.write_text(json.dumps(raw))
    with pytest.raises(ResultsError, match=r"bad-load.json: profile 0 .*streams -3"):
        BenchResults.load(bad_file)


def test_report_draws_latency_against_offered_rate(load_run, tmp_path) -> None:
    out, _ = load_run
    html_path = tmp_path / "r.html"
    rc, _ = _run(["report", str(out), "-o", str(html_path)])
    assert rc == 0
    html = html_path.read_text()
    i = html.index("Sliding windows under load: latency against offered tick rate")
    section = html[i:html.index("</section>", i)]
    assert "<svg" in section  # the curve, one per variant and count of windows
    assert section.count("<b>cpu.native:fp32</b>") == 2 and section.count("<b>cpu.onnxruntime:fp32</b>") == 2
    assert "one core sustains" in section and "knee" in section


def test_compare_has_a_row_per_sliding_nmi_and_judges_it(load_run, tmp_path) -> None:
    out, _ = load_run
    rc, text = _run(["compare", str(out), str(out), "--json"])
    assert rc == 0
    rows = json.loads(text)["rows"]
    nmi = [r for r in rows if r["scenario"].startswith("sliding NMI")]
    assert {(r["variant"], r["scenario"]) for r in nmi} == {
        (v, f"sliding NMI {n}") for v in ("cpu.native:fp32", "cpu.onnxruntime:fp32") for n in (1, 3)}
    assert all(r["base_knee_hz"] == r["new_knee_hz"] and r["new_sustainable_hz"] > 0 for r in nmi)
    # a slower tick in NEW breaks --max-p99 on that row, and only there
    raw = json.loads(out.read_text())
    prof = next(p for p in raw["profiles"] if p["variant"] == "cpu.native:fp32")
    prof["sliding"]["load"]["points"][1]["closed"]["tick_p99_us"] *= 3
    slower = tmp_path / "slower.json"
    slower.write_text(json.dumps(raw))
    rc, text = _run(["compare", str(out), str(slower), "--max-p99", "50"])
    assert rc != 0
    bad = [ln for ln in text.splitlines() if "regression" in ln]
    assert len(bad) == 1 and "cpu.native:fp32" in bad[0] and "sliding NMI 3" in bad[0]


# -- routing by load --------------------------------------------------------------------------

def _curve(sus: float, p99_at_frac: dict[float, float], streams: int = 24) -> dict:
    """A load point measured at ``streams`` windows: one core sustains ``sus`` ticks/s; the
    open loop's p99 at each fraction of it."""
    return {"streams": streams,
            "closed": {"push": {"n": 100, "p50_us": 1.0, "p99_us": 2.0},
                       "prepare": {"n": 100, "p50_us": 1.0, "p99_us": 2.0},
                       "tick_p50_us": 1e6 / sus, "tick_p99_us": 2e6 / sus, "sustainable_hz": sus},
            "open": [{"rate_hz": f * sus / streams, "offered_hz": f * sus, "n": 500, "p50_us": v / 2,
                      "p99_us": v, "p999_us": v * 1.5, "max_us": v * 2, "service_p50_us": 1.0,
                      "achieved_hz": f * sus, "interrupted": False} for f, v in p99_at_frac.items()]}


def _profile(target: str, points: list[dict]) -> LatencyProfile:
    return LatencyProfile(
        variant=label(target, "fp32"), target=target, precision="fp32", batch_size=1,
        scenario="sliding", params={}, mode="hardware", n=100, p50_us=1.0, p90_us=1.5,
        p99_us=2.0, p999_us=3.0, max_us=4.0, mean_us=1.1, min_us=0.9, throughput=1e6,
        duration_s=1.0, sliding={"form": "incremental", "window": 16,
                                 "load": with_budget({"form": "incremental", "points": points}, None)})


def _results(*profiles: LatencyProfile) -> BenchResults:
    y = np.linspace(-1, 1, 64, dtype=np.float32)[:, None]
    fid = fidelity_compare(y, y)
    res = BenchResults(model={"name": "lstm"}, machine={"id": "m"})
    for p in profiles:
        res.variants.append(VariantRecord(variant=p.variant, target=p.target, precision="fp32",
                                          mode="hardware", fidelity=fid))
        res.profiles.append(p)
    return res


def _cfg(tmp_path: Path, load: str, p99_us: float = 100) -> tuple:
    f = tmp_path / "s.toml"
    f.write_text(f"""
[tiers.fast]
p99_us = {p99_us}
[strategies.desk]
model = "zoo:lstm"
tier = "fast"
targets = ["cpu.native", "cpu.onnxruntime"]
sliding = {load}
""")
    cfg = load_config(f, get_registry())
    return cfg, cfg.strategies["desk"]


# A CPU-like variant: one core sustains 2,000 ticks/s, p99 within 100 µs up to 90% of it; an
# accelerator-like one: 250,000 ticks/s per instance, p99 higher at low load than the CPU's.
SLOW = _curve(2_000, {0.25: 20.0, 0.5: 25.0, 0.75: 40.0, 0.9: 90.0, 1.0: 400.0, 1.2: 5000.0})
FAST = _curve(250_000, {0.25: 50.0, 0.5: 55.0, 0.75: 60.0, 0.9: 80.0, 1.0: 300.0, 1.2: 900.0})


def test_router_prefers_the_target_whose_throughput_holds_the_load(tmp_path) -> None:
    res = _results(_profile("cpu.native", [SLOW]), _profile("cpu.onnxruntime", [FAST]))
    cfg, s = _cfg(tmp_path, "{ streams = 500, tick_rate_hz = 200 }")  # 100,000 ticks/s, 1 core
    assert s.scenario == "sliding"  # a load makes the strategy sliding
    d = decide_from_results(res, "desk", s, cfg, get_registry())
    assert d.chosen is not None and d.chosen.variant == "cpu.onnxruntime:fp32"
    cpu = next(c for c in d.candidates if c.target == "cpu.native")
    assert cpu.status == "rejected" and cpu.load.cores_needed == 50  # 100,000 / 2,000
    assert "knee" in cpu.reasons[0] and "1 core(s) allowed" in cpu.reasons[0]
    acc = d.chosen.load
    assert (acc.cores_needed, acc.cores_used, acc.streams) == (1, 1, 24)
    # 100,000 of 250,000 ticks/s = 0.4 of it: between the 0.25 (50 µs) and 0.5 (55 µs) points
    assert acc.p99_us == pytest.approx(50 + (100_000 - 62_500) / (125_000 - 62_500) * 5)
    assert d.chosen.p99_us == acc.p99_us and d.meets_budget
    text = explain(d)
    assert "500 streams × 200 ticks/s = 100,000 ticks/s on at most 1 core(s)" in text
    assert "50 core(s) needed" in text and "refused" in text
    assert d.to_dict()["chosen_cores"] == 1


def test_router_counts_cores_and_ranks_fewest_cores_first(tmp_path) -> None:
    steady = _curve(2_000, {0.25: 10.0, 0.5: 12.0, 0.9: 20.0, 0.95: 30.0, 1.0: 400.0})
    res = _results(_profile("cpu.native", [steady]), _profile("cpu.onnxruntime", [FAST]))
    cfg, s = _cfg(tmp_path, "{ streams = 500, tick_rate_hz = 200, cores = 64 }")
    d = decide_from_results(res, "desk", s, cfg, get_registry())
    cpu = next(c for c in d.candidates if c.target == "cpu.native")
    # the knee at 100 µs: between 0.95 (30 µs) and 1.0 (400 µs) of 2,000/s
    k = 1900 + (100 - 30) / (400 - 30) * 100
    used = math.ceil(100_000 / k)
    assert cpu.load.knee_hz == pytest.approx(k) and cpu.load.knee_bound == "="
    assert cpu.load.cores_needed == 50 and cpu.load.cores_used == used == 53
    assert cpu.load.holds and cpu.status == "fallback"
    share = 100_000 / used  # per core, between the 0.9 (20 µs) and 0.95 (30 µs) points
    assert cpu.load.p99_us == pytest.approx(20 + (share - 1800) / 100 * 10)
    # its p99 at its share is below the accelerator's, but it needs 53 cores, the other one
    assert cpu.load.p99_us < d.chosen.load.p99_us
    assert d.chosen.target == "cpu.onnxruntime" and "fewest cores (1)" in d.chosen.reasons[0]
    assert "needs 53 cores" in cpu.reasons[0]


def test_one_core_holds_a_light_load_and_the_lowest_p99_wins(tmp_path) -> None:
    res = _results(_profile("cpu.native", [SLOW]), _profile("cpu.onnxruntime", [FAST]))
    cfg, s = _cfg(tmp_path, "{ streams = 2, tick_rate_hz = 200 }")  # 400 ticks/s
    d = decide_from_results(res, "desk", s, cfg, get_registry())
    assert d.chosen.target == "cpu.native" and d.chosen.load.cores_used == 1
    assert d.chosen.load.p99_us == 20.0 and d.chosen.load.p99_how == "below the sweep"


def test_a_p99_past_the_budget_everywhere_is_refused_on_any_cores(tmp_path) -> None:
    hot = _curve(2_000, {0.25: 500.0, 0.5: 600.0})
    res = _results(_profile("cpu.native", [hot]))
    cfg, s = _cfg(tmp_path, "{ streams = 10, tick_rate_hz = 10, cores = 8 }")
    d = decide_from_results(res, "desk", s, cfg, get_registry())
    assert d.chosen is None
    assert "past the 100 µs budget at every rate measured" in d.candidates[0].reasons[0]


def test_a_sliding_profile_without_a_sweep_is_not_eligible_for_a_load(tmp_path) -> None:
    p = _profile("cpu.native", [SLOW])
    p.sliding.pop("load")
    cfg, s = _cfg(tmp_path, "{ streams = 4, tick_rate_hz = 200 }")
    d = decide_from_results(_results(p), "desk", s, cfg, get_registry())
    assert d.chosen is None and "no load sweep" in d.candidates[0].reasons[0]


def test_the_nearest_measured_count_of_windows_is_read() -> None:
    few, many = _curve(10_000, {0.5: 10.0}, streams=2), _curve(5_000, {0.5: 30.0}, streams=8)
    load = with_budget({"form": "x", "points": [few, many]}, None)
    assert at_load(load, 500, 1, 1, 1e3).streams == 8
    assert at_load(load, 4, 1, 1, 1e3).streams == 2
    assert at_load(load, 1, 1, 1, 1e3).streams == 2  # fewer than any: the fewest measured


def test_knee_and_interpolation_edges() -> None:
    c = [{"offered_hz": 1000, "n": 10, "p99_us": 10.0}, {"offered_hz": 2000, "n": 10, "p99_us": 30.0}]
    assert knee(c, 20.0) == (1500.0, "=")
    assert knee(c, 50.0) == (2000.0, ">=")
    assert knee(c, 5.0) == (1000.0, "<=")
    assert knee([], 5.0) == (None, "")
    assert p99_at(c, 1500) == (20.0, "interpolated")
    assert p99_at(c, 500) == (10.0, "below the sweep")
    assert p99_at(c, 9000) == (30.0, "past the sweep")


_RATES = st.lists(st.floats(1.0, 1e7), min_size=1, max_size=8, unique=True)
_P99 = st.floats(0.1, 1e6)


@settings(max_examples=200, deadline=None)
@given(rates=_RATES, data=st.data(), budget=_P99)
def test_knee_and_p99_at_agree_with_the_curve(rates, data, budget) -> None:
    """On any curve: the p99 read at a rate lies between the measured p99s; the knee is a
    measured rate or between two, and the p99 read there is the budget when it crosses."""
    p99 = data.draw(st.lists(_P99, min_size=len(rates), max_size=len(rates)))
    curve = [{"offered_hz": r, "n": 10, "p99_us": v} for r, v in zip(rates, p99, strict=True)]
    pts = sorted(curve, key=lambda c: c["offered_hz"])
    at = data.draw(st.floats(0.5, 2e7))
    v, how = p99_at(curve, at)
    assert min(p99) <= v <= max(p99)
    assert how in ("interpolated", "below the sweep", "past the sweep")
    hz, bound = knee(curve, budget)
    assert pts[0]["offered_hz"] <= hz <= pts[-1]["offered_hz"]
    if bound == "<=":
        assert pts[0]["p99_us"] > budget and hz == pts[0]["offered_hz"]
    elif bound == "=":
        assert p99_at(curve, hz)[0] == pytest.approx(budget, rel=1e-6, abs=1e-6 * max(p99))
        assert all(c["p99_us"] <= budget for c in pts if c["offered_hz"] < hz)
    else:
        assert bound == ">=" and all(c["p99_us"] <= budget for c in pts)


def test_a_sliding_load_in_the_config_is_checked(tmp_path) -> None:
    base = '[tiers.t]\np99_us = 10\n[strategies.s]\nmodel = "zoo:lstm"\ntier = "t"\n'
    with pytest.raises(ConfigError, match="declares a sliding load, but scenario = 'single-stream'"):
        parse_config(base + 'scenario = "single-stream"\nsliding = { streams = 5, tick_rate_hz = 1 }\n')
    with pytest.raises(ConfigError, match=r":7: strategies.s.sliding.streams: .*greater than or equal to 1"):
        parse_config(base + "\nsliding = { streams = 0, tick_rate_hz = 1 }\n")
    with pytest.raises(ConfigError, match="unknown key 'core'; allowed here: streams, tick_rate_hz, cores"):
        parse_config(base + "sliding = { streams = 5, tick_rate_hz = 1, core = 2 }\n")
    with pytest.raises(ConfigError, match="tick_rate_hz"):
        parse_config(base + "sliding = { streams = 5 }\n")
    ok = parse_config(base + "sliding = { streams = 5, tick_rate_hz = 200 }\n").strategies["s"]
    assert ok.scenario == "sliding" and (ok.sliding.streams, ok.sliding.cores) == (5, 1)


def test_hwb_route_explains_a_declared_load_end_to_end(store_dir, tmp_path) -> None:
    f = tmp_path / "s.toml"
    f.write_text("""
[tiers.slack]
p99_us = 1000000
[router.bench]
n = 100
warmup = 10
rounds = 2
max_s = 1.0
[strategies.desk]
model = "zoo:lstm"
tier = "slack"
targets = ["cpu.native", "cpu.onnxruntime"]
precisions = ["fp32"]
sliding = { streams = 3, tick_rate_hz = 500, cores = 2 }
""")
    rc, text = _run(["route", str(f), "--explain", "--cache-dir", str(store_dir)])
    assert rc == 0, text
    assert "3 streams × 500 ticks/s = 1,500 ticks/s on at most 2 core(s)" in text
    assert "load 1,500 ticks/s (curve at NMI 3)" in text and "core(s) needed" in text
    rc, text = _run(["route", str(f), "--json", "--cache-dir", str(store_dir)])
    d = json.loads(text)["strategies"][0]
    assert d["load"] == {"streams": 3, "tick_rate_hz": 500.0, "cores": 2}
    assert d["chosen_cores"] == 1  # 1,500 ticks/s: one core holds it on either target
    for c in d["candidates"]:
        if c["status"] in ("chosen", "fallback"):
            assert c["load"]["cores_needed"] == 1 and c["load"]["offered_hz"] == 1500


# -- labels carry the push form ---------------------------------------------------------------

def test_labels_carry_and_parse_the_push_form() -> None:
    assert label("cpu.native", "fp32", "int8") == "cpu.native:fp32+push=int8"
    assert label("cpu.native", "fp32", "fp32") == label("cpu.native", "fp32") == "cpu.native:fp32"
    assert parse_label("cpu.native:fp32+push=int8") == ("cpu.native", "fp32", "int8")
    assert parse_label("cpu.native:fp32+push=bf16").push == "bf16"
    assert parse_label("cpu.native:fp32+push=nope") == ("cpu.native", "fp32+push=nope", None)
    assert push_form({"sliding": {"push_weights": "int8"}}) == "int8"
    assert push_form({"sliding": {"push_weights": "fp32"}}) is None and push_form({}) is None
    rec = VariantRecord.from_dict({"target": "cpu.native", "precision": "fp32", "push": "int8"})
    assert rec.variant == "cpu.native:fp32+push=int8"


def test_a_row_with_an_unknown_push_form_is_refused(tmp_path, load_run) -> None:
    out, _ = load_run
    raw = json.loads(out.read_text())
    raw["variants"][0]["push"] = "int3"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(ResultsError, match="push 'int3' is not one of"):
        BenchResults.load(bad)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
def test_a_compiled_int8_push_variant_is_labelled_so(store_dir) -> None:
    from hwb_plugins.cpu_native import build, push_weights

    lacks = push_weights.missing_features("int8", build.host_flags())
    if lacks:
        pytest.skip(f"push_weights=int8 needs CPU feature(s) {', '.join(lacks)}, which this CPU lacks")
    cm = hwb.compile("zoo:lstm", "cpu.native", "fp32", store=store_dir,
                     options={"push_weights": "int8"})
    assert cm.variant == "cpu.native:fp32+push=int8"
    assert VariantRecord.from_compiled(cm, get_registry()).variant == cm.variant
    assert hwb.compile("zoo:lstm", "cpu.native", "fp32", store=store_dir).variant == "cpu.native:fp32"


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
def test_hwb_bench_option_builds_and_labels_the_push_variant(store_dir, tmp_path) -> None:
    from hwb_plugins.cpu_native import build, push_weights

    lacks = push_weights.missing_features("int8", build.host_flags())
    if lacks:
        pytest.skip(f"push_weights=int8 needs CPU feature(s) {', '.join(lacks)}, which this CPU lacks")
    out = tmp_path / "r.json"
    rc, text = _run(["bench", "zoo:lstm", "-t", "cpu.native", "-p", "fp32", "-O", "push_weights=int8",
                     "-s", "sliding:n=100,rounds=1,streams=none", "-o", str(out), "--cache-dir", str(store_dir)])
    assert rc == 0, text
    res = BenchResults.load(out)
    assert [v.variant for v in res.variants] == ["cpu.native:fp32+push=int8"]
    assert res.variants[0].push == "int8"
    assert [p.variant for p in res.profiles] == ["cpu.native:fp32+push=int8"]
    assert "cpu.native:fp32+push=int8  sliding" in text


def test_export_refuses_a_push_label(store_dir, capsys) -> None:
    rc = main(["export", "zoo:lstm", "-t", "cpu.native:fp32+push=int8", "-f", "triton",
               "-o", "/nonexistent/x", "--cache-dir", str(store_dir)])
    err = capsys.readouterr().err
    assert rc != 0 and "UnsupportedError" in err and "+push=int8" in err
    assert "export cpu.native:fp32" in err
