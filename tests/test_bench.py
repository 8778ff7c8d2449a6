"""The benchmark harness: scenarios, open-loop accounting, profiles, cache, results files."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from hwbackends.bench import (
    Batch,
    BenchResults,
    Burst,
    ProfileCache,
    ResultsError,
    Server,
    SingleStream,
    bench_model,
    cached_measure,
    measure,
    parse,
    pinned,
    summarize,
)
from hwbackends.bench.scenarios import closed_loop, open_loop
from hwbackends.context import RunContext
from hwbackends.errors import ConfigError, InputError, UnknownTargetError


def _spin(us: float):
    """A service that really takes ``us`` microseconds (busy wait, like a compute call)."""
    ns = int(us * 1e3)

    def fn(x: np.ndarray, out: np.ndarray) -> None:
        end = time.perf_counter_ns() + ns
        while time.perf_counter_ns() < end:
            pass
    return fn


def test_summarize_matches_numpy() -> None:
    lat = np.random.default_rng(0).integers(1000, 100000, 5000)
    s = summarize(lat)
    assert s["n"] == 5000
    assert s["p99_us"] == pytest.approx(np.quantile(lat / 1e3, 0.99))
    assert s["max_us"] == pytest.approx(lat.max() / 1e3)
    assert s["cdf"][-1][0] == 1.0 and s["cdf"][-1][1] == pytest.approx(lat.max() / 1e3)
    assert summarize(np.array([], np.int64))["n"] == 0


def test_server_latency_counts_from_scheduled_arrival() -> None:
    """Offered 4000/s to a 1 ms service: requests queue. Counting from the scheduled arrival
    charges the wait; counting from the call start (coordinated omission) would not."""
    xs, out = [np.zeros((1, 4), np.float32)], np.zeros((1, 1), np.float32)
    arrivals = Server(rate_hz=4000, n=60, seed=3).arrivals()
    t = open_loop(_spin(1000), xs, out, arrivals, max_s=10)
    assert len(t.latency_ns) == 60
    assert (t.latency_ns >= t.service_ns).all()
    svc_us = np.median(t.service_ns) / 1e3
    assert 900 < svc_us < 5000
    # The n-th request cannot finish before n services have run: its latency from the
    # schedule is at least that minus its scheduled offset.
    lower = np.cumsum(t.service_ns) - arrivals * 1e9 - 1e6
    assert (t.latency_ns >= lower).all()
    assert np.quantile(t.latency_ns, 0.99) / 1e3 > 10 * svc_us  # the queue is visible
    # closed loop on the same service: latency is just the service time
    c = closed_loop(_spin(1000), xs, out, 20, 5)
    assert np.quantile(c.latency_ns, 0.5) / 1e3 < 3 * svc_us


def test_open_loop_idle_server_is_near_service_time() -> None:
    xs, out = [np.zeros((1, 4), np.float32)], np.zeros((1, 1), np.float32)
    arrivals = np.arange(1, 41) * 0.003  # one request every 3 ms to a 50 µs service
    t = open_loop(_spin(50), xs, out, arrivals, max_s=5)
    assert (t.latency_ns >= t.service_ns).all()
    # Nothing queues, so requests that were not preempted finish about one service after
    # their arrival (a loaded CI machine preempts some: only require a handful).
    assert (t.latency_ns < 1_000_000).sum() >= 5


def test_interrupt_keeps_what_was_measured() -> None:
    calls = {"n": 0}

    def fn(x: np.ndarray, out: np.ndarray) -> None:
        calls["n"] += 1
        if calls["n"] == 101:
            raise KeyboardInterrupt

    xs, out = [np.zeros((1, 4), np.float32)], np.zeros((1, 1), np.float32)
    t = closed_loop(fn, xs, out, 1000, 10)
    assert t.interrupted and len(t.latency_ns) == 100
    calls["n"] = 0
    t = open_loop(fn, xs, out, np.linspace(0, 0.01, 500), 10)
    assert t.interrupted and len(t.latency_ns) == 100


def test_scenario_parsing() -> None:
    assert parse("server:rate=2500,n=10") == Server(rate_hz=2500, n=10)
    assert parse("batch:sizes=1/4/16").sizes == (1, 4, 16)
    assert parse("single-stream") == SingleStream()
    with pytest.raises(ConfigError, match="choose from single-stream, server, burst, batch"):
        parse("soak")
    with pytest.raises(ConfigError, match="allowed: rate_hz"):
        parse("server:speed=3")
    with pytest.raises(ConfigError, match="not valid"):
        parse("server:rate=fast")


def test_trace_generation_and_loading(tmp_path) -> None:
    import hwb_sim

    a, b = hwb_sim.generate(2.0, seed=5), hwb_sim.generate(2.0, seed=5)
    assert np.array_equal(a.timestamps, b.timestamps)
    assert not np.array_equal(a.timestamps, hwb_sim.generate(2.0, seed=6).timestamps)
    assert {s.kind for s in a.segments} == {"quiet", "burst"}
    assert a.peak_rate() > 5 * len(a) / a.duration  # bursts stand out of the mean rate
    f = tmp_path / "ticks.txt"
    np.savetxt(f, (a.timestamps + 100.0) * 1e3)  # milliseconds, with an offset
    c = hwb_sim.load(f, unit="ms")
    assert c.timestamps[0] == 0 and np.allclose(c.timestamps, a.timestamps - a.timestamps[0], atol=1e-6)
    bad = tmp_path / "bad.txt"
    bad.write_text("12.5\nnot-a-time\n")
    with pytest.raises(InputError, match="one number"):
        hwb_sim.load(bad)
    with pytest.raises(InputError, match="does not exist"):
        hwb_sim.load(tmp_path / "missing.txt")


def test_measure_real_variant_all_scenarios(compiled) -> None:
    cm = compiled("signal", "cpu.onnxruntime", "fp32")
    ss = measure(cm, SingleStream(n=300, warmup=20))
    assert ss.n == 300 and ss.mode == "hardware" and ss.variant == "cpu.onnxruntime:fp32"
    assert 0 < ss.p50_us <= ss.p90_us <= ss.p99_us <= ss.p999_us <= ss.max_us
    assert ss.machine["cores"] >= 1 and "onnxruntime" in ss.machine["libraries"]
    assert ss.fidelity is not None and ss.fidelity["corr"] > 0.999
    sv = measure(cm, Server(rate_hz=2000, n=300, warmup=20))
    assert sv.scenario == "server" and sv.queue_mean_us is not None and sv.p50_us >= ss.min_us
    bu = measure(cm, Burst(duration_s=0.5, seed=1, warmup=20))
    assert bu.timeline and len(bu.timeline["t_s"]) == 100 and bu.params["trace"]["ticks"] == bu.n
    json.dumps(bu.to_dict())  # serialisable


def test_profile_cache_hit_and_miss(compiled, tmp_path) -> None:
    cm = compiled("signal", "cpu.onnxruntime", "fp32")
    cache = ProfileCache(tmp_path / "profiles")
    p1, hit1 = cached_measure(cm, SingleStream(n=200, warmup=10), cache)
    p2, hit2 = cached_measure(cm, SingleStream(n=200, warmup=10), cache)
    p3, hit3 = cached_measure(cm, SingleStream(n=201, warmup=10), cache)
    assert (hit1, hit2, hit3) == (False, True, False)
    assert p2.p99_us == p1.p99_us and p2.created == p1.created


def test_profile_cache_ignores_edited_planted_and_moved_entries(compiled, tmp_path) -> None:
    # Cached profiles decide routing: a faster-looking p99 written into the file, an entry
    # copied under another key or one planted without the user's key is never believed.
    cm = compiled("signal", "cpu.onnxruntime", "fp32")
    cache = ProfileCache(tmp_path / "profiles")
    sc = SingleStream(n=100, warmup=5)
    p1, _ = cached_measure(cm, sc, cache)
    files = list((tmp_path / "profiles").glob("*/*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    key = files[0].stem
    assert cache.get(key) is not None and rec["key"] == key and rec["hmac"]
    rec["profile"]["p99_us"] = 0.001  # "this variant is the fastest"
    files[0].write_text(json.dumps(rec))
    assert cache.get(key) is None
    _, hit = cached_measure(cm, sc, cache)
    assert not hit  # measured again and re-signed
    assert cache.get(key) is not None
    other = "ab" + key[2:]
    moved = tmp_path / "profiles" / other[:2] / f"{other}.json"
    moved.parent.mkdir(parents=True, exist_ok=True)
    moved.write_text(files[0].read_text())  # a valid entry under another key
    assert cache.get(other) is None
    rec = json.loads(files[0].read_text())
    del rec["hmac"]
    files[0].write_text(json.dumps(rec))  # planted: no signature
    assert cache.get(key) is None


def test_bench_model_and_results_roundtrip(store_dir, tmp_path) -> None:
    res = bench_model("zoo:signal", ["cpu.onnxruntime", "ref"], ["fp32"],
                      [SingleStream(n=200, warmup=10), Batch(sizes=(1, 4), n=100, warmup=10)], max_ref_s=0.5,
                      context=RunContext.at(store_dir), bars=False)
    assert {a["target"] for a in res.availability} == {"cpu.onnxruntime", "ref"}
    assert {v.variant for v in res.variants} == {"cpu.onnxruntime:fp32", "ref:fp32"}
    ort = [p for p in res.profiles if p.target == "cpu.onnxruntime"]
    assert sorted((p.scenario, p.batch_size) for p in ort) == [("batch", 1), ("batch", 4),
                                                              ("single-stream", 1)]
    path = res.save(tmp_path / "r.json")
    back = BenchResults.load(path)
    assert [p.p99_us for p in back.profiles] == [p.p99_us for p in res.profiles]
    d = json.loads(path.read_text())
    d["version"] = 999
    path.write_text(json.dumps(d))
    with pytest.raises(ResultsError, match="version 999.*Re-run `hwb bench`"):
        BenchResults.load(path)
    with pytest.raises(ResultsError, match="does not exist"):
        BenchResults.load(tmp_path / "nope.json")
    with pytest.raises(UnknownTargetError, match="matches no registered target"):
        bench_model("zoo:signal", ["gpu.nothing*"], bars=False)


def test_pinning() -> None:
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("os.sched_setaffinity not available on this OS")
    before = os.sched_getaffinity(0)
    cpu = min(before)
    with pinned([cpu]):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before


def test_cli_bench_writes_results(store_dir, tmp_path, capsys) -> None:
    from hwbackends.cli import main

    out = tmp_path / "res.json"
    rc = main(["bench", "zoo:signal", "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "200",
               "-o", str(out), "--cache-dir", str(store_dir), "-q",
               "--report", str(tmp_path / "rep.html")])
    assert rc == 0
    assert "Latency distribution" in (tmp_path / "rep.html").read_text()
    text = capsys.readouterr().out
    assert "cpu.onnxruntime:fp32" in text and "p99 µs" in text
    assert BenchResults.load(out).profiles[0].n == 200
    with pytest.raises(SystemExit) as e:  # a bad scenario is a usage error, refused when parsed
        main(["bench", "zoo:signal", "-s", "warp-speed", "-q"])
    assert e.value.code == 2 and "unknown scenario 'warp-speed'" in capsys.readouterr().err


def test_cli_bench_writes_results_on_every_exit_path(store_dir, tmp_path, monkeypatch) -> None:
    """An interrupted `hwb bench` exited 130 with no results file. Once the
    model is loaded the file is written however the run ends: Ctrl-C while the routing
    decisions are computed (after every variant was measured), or an error mid-run."""
    from hwbackends.bench import harness
    from hwbackends.cli import main
    from hwbackends.router import plan

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(plan, "decide_from_results", ctrl_c)
    out = tmp_path / "res.json"
    args = ["bench", "zoo:signal", "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "200",
            "--cache-dir", str(store_dir), "-q"]
    rc = main(args + ["-o", str(out), "--route", "examples/strategies.toml"])
    assert rc == 130
    res = BenchResults.load(out)
    assert res.interrupted and res.profiles[0].n == 200 and res.model["name"] == "signal"

    def broken(*args, **kwargs):
        raise RuntimeError("measurement failed")
    monkeypatch.setattr(harness, "cached_measure", broken)
    out2 = tmp_path / "res2.json"
    with pytest.raises(RuntimeError, match="measurement failed"):
        main(args + ["-o", str(out2)])
    res = BenchResults.load(out2)
    assert res.interrupted and res.variants[0].variant == "cpu.onnxruntime:fp32"


def _strategies(tmp_path, model: str = "zoo:signal", targets: str = '["cpu.onnxruntime"]') -> Path:
    p = tmp_path / "strategies.toml"
    p.write_text(f"""[tiers.t]
p99_us = 100000

[strategies.s]
model = "{model}"
tier = "t"
targets = {targets}
fidelity = {{ corr_min = 0.99 }}

[strategies.other]
model = "zoo:mlp"
tier = "t"

[strategies.own]
model = "{model}"
tier = "t"
targets = {targets}
validation_data = "v.npy"
""")
    np.save(tmp_path / "v.npy", np.zeros((8, 32), np.float32))
    return p


def test_bench_route_routes_from_the_profiles_in_the_same_file(store_dir, tmp_path) -> None:
    """`hwb bench --route` loaded, compiled and measured again (the router's
    own n, interleaved, under another cache key), so the routing in a results file disagreed
    with the profiles beside it. It routes from the records and profiles it just wrote."""
    from hwbackends.cli import main

    out = tmp_path / "r.json"
    rc = main(["bench", "zoo:signal", "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "300",
               "-o", str(out), "--cache-dir", str(store_dir), "-q", "--route",
               str(_strategies(tmp_path))])
    assert rc == 0
    res = BenchResults.load(out)
    (prof,) = [p for p in res.profiles if p.scenario == "single-stream"]
    s, other, own = res.routing
    assert s["chosen"] == "cpu.onnxruntime:fp32" and s["meets_budget"]
    assert s["chosen_p99_us"] == prof.p99_us
    (c,) = s["candidates"]
    assert (c["n"], c["p50_us"], c["p999_us"]) == (prof.n, prof.p50_us, prof.p999_us)
    assert prof.n == 300  # bench's own --n, not the router's
    assert c["fidelity"] == res.variants[0].to_dict()["fidelity"]
    assert other["chosen"] is None and "zoo:mlp was not measured in this run" in other["note"]
    assert own["chosen_p99_us"] == prof.p99_us
    assert "fidelity from the results' own data, not this strategy's validation_data" in own["note"]


def test_variant_record_round_trips_and_keeps_newer_keys(compiled, tmp_path) -> None:
    """The typed variant record: to_dict/from_dict round-trip through JSON for
    one output and several (one Fidelity with per-output figures); a key a newer writer added
    is written back; a file of the format before (version 1) is refused, saying to re-run
    `hwb bench`."""
    from hwbackends.fidelity import Fidelity
    from hwbackends.registry import get_registry
    from hwbackends.variant import VariantRecord

    for name in ("signal", "two_head"):
        rec = VariantRecord.from_compiled(compiled(name, "cpu.onnxruntime", "fp32"), get_registry())
        assert rec.ok and rec.artifact_key and rec.fidelity is not None
        back = VariantRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
        assert back == rec
    assert isinstance(back.fidelity, Fidelity) and len(back.fidelity.outputs or {}) == 2
    row = {"variant": "fpga.da4ml:auto", "target": "fpga.da4ml", "precision": "auto",
           "mode": "emulated", "error": None, "fidelity": rec.fidelity.to_dict(),
           "hardware_estimate": {"label": "modelled"},
           "plugin_report": {"bits": {"frac_bits": 6}}, "written_by_a_newer_version": [1]}
    r = VariantRecord.from_dict(row)
    assert r.hardware_estimate == {"label": "modelled"}
    assert r.plugin_report == {"bits": {"frac_bits": 6}}
    assert r.artifact_key == "" and r.fidelity == rec.fidelity
    assert r.to_dict()["written_by_a_newer_version"] == [1]
    res = BenchResults(model={"name": "signal"}, machine={})
    res.variants.append(r)
    path = res.save(tmp_path / "r.json")
    assert BenchResults.load(path).variants == [r]
    d = json.loads(path.read_text())
    d["variants"] = [{"variant": "x"}]
    path.write_text(json.dumps(d))
    with pytest.raises(ResultsError, match=r"variants\[0\]\.target: required key missing; expected a target name"):
        BenchResults.load(path)
    d["version"], d["variants"] = 1, [row | {"fpga": row["plugin_report"]}]
    path.write_text(json.dumps(d))
    with pytest.raises(ResultsError, match="version 1; this hwbackends reads version 2. Re-run `hwb bench`"):
        BenchResults.load(path)


def test_bench_precision_check_takes_what_the_target_accepts(hwb_cli) -> None:
    """`hwb bench -p 'ap_fixed<16,6>' -t fpga.hls4ml` was refused before any
    build ("offered by none of fpga.hls4ml") because -p was checked against the listed
    precisions, not Target.accepts. An explicit -p builds exactly what it names."""
    import hwbackends as hwb
    from hwbackends.errors import UnsupportedError
    from hwbackends.registry import precisions_to_build, unaccepted_precisions

    hls = hwb.get_registry().targets["fpga.hls4ml"]
    assert "ap_fixed<16,6>" not in hls.precisions and hls.accepts("ap_fixed<16,6>")
    assert unaccepted_precisions([hls], ["ap_fixed<16,6>"]) is None
    assert precisions_to_build(hls, ["ap_fixed<16,6>"]) == ["ap_fixed<16,6>"]
    assert precisions_to_build(hls, None) == list(hls.precisions)
    ort = hwb.get_registry().targets["cpu.onnxruntime"]
    assert precisions_to_build(ort, ["ap_fixed<16,6>", "fp32"]) == ["fp32"]
    # what bench_model raises before loading anything for a precision no target takes
    with pytest.raises(UnsupportedError, match=r"precision 'ap_fixed<99,6>' is offered by none "
                                               r"of fpga.hls4ml; .*also takes any ap_fixed"):
        bench_model("zoo:mlp", ["fpga.hls4ml"], ["ap_fixed<99,6>"], bars=False)
    # and `hwb targets` says what each target takes beyond the listed precisions
    rc, out, _ = hwb_cli("targets")
    assert rc == 0 and f"also precisions: {hls.precision_rule}" in out
    rc, out, _ = hwb_cli("targets", "--json")
    rows = {r["name"]: r for r in json.loads(out)["targets"]}
    assert rows["fpga.hls4ml"]["precision_rule"] == hls.precision_rule
    assert rows["cpu.onnxruntime"]["precision_rule"] == ""


@pytest.mark.slow
def test_bench_builds_an_unlisted_fixed_point_precision(store_dir) -> None:
    """The real run of `hwb bench -p 'ap_fixed<16,6>' -t fpga.hls4ml` (C-simulation build)."""
    res = bench_model("zoo:mlp", ["fpga.hls4ml"], ["ap_fixed<16,6>"],
                      [SingleStream(n=50, warmup=5)], context=RunContext.at(store_dir), bars=False)
    if res.availability[0]["mode"] == "unavailable":
        pytest.skip(f"fpga.hls4ml unavailable here: {res.availability[0]['reason']}")
    (v,) = res.variants
    assert v.precision == "ap_fixed<16,6>" and v.ok, v.error
    assert res.profiles and res.profiles[0].precision == "ap_fixed<16,6>"
