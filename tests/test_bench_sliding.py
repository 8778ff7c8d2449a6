"""``hwb bench -s sliding`` (tick → answer, the prepare apart, the full window
in the same run), strategies routed by their scenario, and the report showing both; through
``hwb bench`` / ``hwb route`` / ``hwb report`` on zoo:lstm with cpu.native (incremental) and
cpu.onnxruntime (the recompute fallback)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hwbackends.bench import BenchResults, Sliding, measure
from hwbackends.bench.results import VERSION
from hwbackends.cli import main
from hwbackends.context import RunContext
from hwbackends.errors import UnsupportedError

TARGETS = "cpu.native,cpu.onnxruntime"


def _strategies(tmp_path: Path, model: str = "zoo:lstm", p99_us: float = 100_000) -> Path:
    p = tmp_path / "strategies.toml"
    p.write_text(f"""
[tiers.t]
p99_us = {p99_us}

[router.bench]
n = 300
warmup = 20
rounds = 3
max_s = 2.0

[strategies.slide]
model = "{model}"
tier = "t"
targets = ["cpu.native", "cpu.onnxruntime"]
precisions = ["fp32"]
scenario = "sliding"

[strategies.whole]
model = "{model}"
tier = "t"
targets = ["cpu.native", "cpu.onnxruntime"]
precisions = ["fp32"]
""")
    return p


@pytest.fixture(scope="module")
def sliding_run(tmp_path_factory, store_dir) -> tuple[Path, Path, str]:
    """One `hwb bench -s sliding -s single-stream --route` on zoo:lstm, shared by the tests."""
    tmp = tmp_path_factory.mktemp("sliding")
    out = tmp / "res.json"
    cfg = _strategies(tmp)
    import io
    from contextlib import redirect_stdout
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["bench", "zoo:lstm", "-t", TARGETS, "-p", "fp32", "-s", "sliding:n=600,rounds=3",
                   "-s", "single-stream:n=300", "-o", str(out), "--cache-dir", str(store_dir),
                   "-q", "--route", str(cfg)])
    assert rc == 0
    return out, cfg, buf.getvalue()


def test_bench_sliding_rows_carry_push_prepare_full_and_form(sliding_run) -> None:
    out, _, text = sliding_run
    raw = json.loads(out.read_text())  # strict JSON: the standard parser reads it as it is
    assert raw["version"] == VERSION
    res = BenchResults.load(out)
    rows = {p.variant: p for p in res.profiles if p.scenario == "sliding"}
    assert set(rows) == {"cpu.native:fp32", "cpu.onnxruntime:fp32"}
    forms = {v: p.sliding["form"] for v, p in rows.items()}
    assert forms == {"cpu.native:fp32": "incremental", "cpu.onnxruntime:fp32": "recompute"}
    for p in rows.values():
        assert p.n == 600 and p.p50_us <= p.p90_us <= p.p95_us <= p.p99_us <= p.p999_us
        assert p.sliding["window"] == 16
        for part in ("prepare", "full"):
            d = p.sliding[part]
            assert d["n"] == 600 and 0 < d["p50_us"] <= d["p99_us"] <= d["max_us"]
    # the incremental push is cheaper than its own full window, measured in the same run
    nat = rows["cpu.native:fp32"]
    assert nat.p50_us < nat.sliding["full"]["p50_us"]
    # the text table shows the sliding figures beside the full window
    assert "cpu.native:fp32 sliding (incremental, window 16): push p50" in text
    assert "full window p50" in text and "prepare p50" in text


def test_sliding_profile_answers_equal_the_full_window(compiled) -> None:
    """What the scenario times is the real window: its pushes, replayed, answer what
    predict_into answers on the window ending at each step (else the figure would be of
    something else)."""
    cm = compiled("lstm", "cpu.native", "fp32")
    w = cm.sliding()
    t = cm.input.shape[0]
    steps = np.random.default_rng(4).standard_normal((3 * t, *cm.input.shape[1:])).astype(np.float32)
    y, full = np.zeros(cm.output.shape, np.float32), np.zeros((1, *cm.output.shape), np.float32)
    for i in range(len(steps)):
        w.push_into(steps[i], y)
        win = np.zeros(cm.input.shape, np.float32)
        part = steps[max(0, i + 1 - t):i + 1]
        win[t - len(part):] = part
        cm.predict_into(win[None], full)
        np.testing.assert_allclose(y, full[0], atol=1e-5)
    prof = measure(cm, Sliding(n=100, warmup=5, rounds=2))
    assert prof.scenario == "sliding" and prof.n == 100 and prof.sliding["form"] == "incremental"


def test_a_model_without_a_window_is_refused_or_skipped(store_dir, tmp_path, capsys) -> None:
    out = tmp_path / "mlp.json"
    with pytest.raises(UnsupportedError, match=r"not windowed.*-s single-stream"):
        from hwbackends.bench import bench_model
        bench_model("zoo:mlp", ["cpu.onnxruntime"], ["fp32"], [Sliding(n=50)], bars=False)
    rc = main(["bench", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "-s", "sliding",
               "-o", str(out), "--cache-dir", str(store_dir), "-q"])
    assert rc != 0
    err = capsys.readouterr().err
    assert "not windowed" in err and "Traceback" not in err
    # beside another scenario: skipped, saying so, and the rest measured
    rc = main(["bench", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "-s", "sliding",
               "-s", "single-stream:n=100", "-o", str(out), "--cache-dir", str(store_dir)])
    assert rc == 0
    assert "sliding: skipped" in capsys.readouterr().err
    assert [p.scenario for p in BenchResults.load(out).profiles] == ["single-stream"]


def test_bench_route_ranks_a_sliding_strategy_by_the_sliding_p99(sliding_run) -> None:
    out, _, _ = sliding_run
    res = BenchResults.load(out)
    routes = {r["strategy"]: r for r in res.routing}
    slide, whole = routes["slide"], routes["whole"]
    assert slide["scenario"] == "sliding" and whole["scenario"] == "single-stream"
    by = {(p.variant, p.scenario): p for p in res.profiles}
    for r, sc in ((slide, "sliding"), (whole, "single-stream")):
        p99 = {c["variant"]: c["p99_us"] for c in r["candidates"]}
        assert p99 == {v: by[(v, sc)].p99_us for v in p99}  # each ranked by its own scenario
        assert r["chosen"] == min(p99, key=p99.get)


def test_bench_route_without_sliding_rows_says_not_eligible(store_dir, tmp_path) -> None:
    out = tmp_path / "ss.json"
    rc = main(["bench", "zoo:lstm", "-t", TARGETS, "-p", "fp32", "-s", "single-stream:n=100",
               "-o", str(out), "--cache-dir", str(store_dir), "-q",
               "--route", str(_strategies(tmp_path))])
    assert rc == 0
    slide = {r["strategy"]: r for r in BenchResults.load(out).routing}["slide"]
    assert slide["chosen"] is None
    assert {c["status"] for c in slide["candidates"]} == {"rejected"}
    assert all("no sliding measurement" in c["reasons"][0] and "hwb bench -s sliding"
               in c["reasons"][0] for c in slide["candidates"])


def test_route_explain_sliding_strategy(store_dir, tmp_path, capsys) -> None:
    cfg = _strategies(tmp_path)
    assert main(["route", str(cfg), "--explain", "--strategy", "slide",
                 "--cache-dir", str(store_dir)]) == 0
    text = capsys.readouterr().out
    assert "ranked by the sliding scenario: p99 of push_into" in text
    assert "cpu.native:fp32: sliding (incremental, window 16): push p50" in text
    assert "cpu.onnxruntime:fp32: sliding (recompute, window 16)" in text and "full window p50" in text
    # a model with no window: no candidate has a sliding measurement, and the explanation says so
    cfg = _strategies(tmp_path, model="zoo:mlp")
    assert main(["route", str(cfg), "--explain", "--strategy", "slide",
                 "--cache-dir", str(store_dir)]) == 1
    text = capsys.readouterr().out
    assert "NO VARIANT" in text and "no sliding measurement" in text and "not windowed" in text


def test_report_shows_sliding_beside_full_window(sliding_run, tmp_path, capsys) -> None:
    out, _, _ = sliding_run
    html = tmp_path / "r.html"
    assert main(["report", str(out), "-o", str(html)]) == 0
    page = html.read_text()
    assert "Sliding window: one tick in, the answer out" in page
    for col in ("push p50", "prepare p50", "full window p50", "push / full (p50)"):
        assert col in page
    assert "incremental" in page and "recompute" in page
    assert "slide <i>(sliding)</i>" in page
    assert "fastest tick → answer (sliding p99)" in page
    # the CSV carries the same figures, beside the usual percentiles
    import csv
    import io
    capsys.readouterr()
    assert main(["report", str(out), "--csv"]) == 0
    rows = {(r["variant"], r["scenario"]): r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    nat = rows[("cpu.native:fp32", "sliding")]
    res = BenchResults.load(out)
    prof = next(p for p in res.profiles if p.variant == "cpu.native:fp32" and p.scenario == "sliding")
    assert nat["form"] == "incremental"
    assert float(nat["full_p50_us"]) == pytest.approx(prof.sliding["full"]["p50_us"], rel=1e-5)
    assert rows[("cpu.native:fp32", "single-stream")]["form"] == ""


def test_older_results_without_the_new_fields_still_load(sliding_run, tmp_path) -> None:
    out, _, _ = sliding_run
    d = json.loads(out.read_text())
    for p in d["profiles"]:
        p.pop("sliding", None)
        p.pop("noise_floor", None)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(d))
    res = BenchResults.load(old)
    assert all(p.sliding is None and p.noise_floor is None for p in res.profiles)
    assert main(["report", str(old), "-o", str(tmp_path / "old.html")]) == 0


def test_router_sliding_handle_serves_the_ticks_it_was_ranked_by(store_dir, tmp_path) -> None:
    from hwbackends.router import Router

    r = Router.from_config(_strategies(tmp_path), strategies=["slide"], context=RunContext.at(store_dir))
    try:
        d = r.decisions["slide"]
        assert d.scenario == "sliding" and d.chosen.profile.sliding is not None
        w = r.sliding("slide")
        cm = r.lane("slide").cms[0]
        assert w.form == d.chosen.profile.sliding["form"]
        t, step = cm.input.shape[0], tuple(cm.input.shape[1:])
        xs = np.random.default_rng(1).standard_normal((t + 3, *step)).astype(np.float32)
        y, full = np.zeros(cm.output.shape, np.float32), np.zeros((1, *cm.output.shape), np.float32)
        for i in range(len(xs)):
            w.push_into(xs[i], y)
        cm.predict_into(xs[-t:][None], full)
        np.testing.assert_allclose(y, full[0], atol=1e-5)
        # the lane times whole windows: a tick's budget never re-routes it on latency
        assert r.lane("slide").budget_us == float("inf") and d.budget_us == 100_000
    finally:
        r.close()
