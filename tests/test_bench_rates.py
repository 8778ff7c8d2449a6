"""Open-loop rows say what was offered and what was achieved: the terminal table of ``hwb
bench`` gives every server and burst row its offered rate (the server's Poisson rate, the
burst trace's mean) and the samples/s answered over the run's wall time, beside the median
call's samples/s; closed-loop rows leave both empty. A results file another party wrote with
a rate that is no number shows "—", never a crash."""
from __future__ import annotations

import pytest

from hwbackends.bench import BenchResults, LatencyProfile
from hwbackends.bench.profile import RATE_NOTE, table
from hwbackends.cli import main

BASE = dict(variant="v", target="t", precision="fp32", batch_size=2, params={}, mode="hardware",
            n=1000, p50_us=1.0, p90_us=2.0, p99_us=3.0, p999_us=50.0, max_us=60.0, mean_us=2.0,
            min_us=0.5, throughput=300_000.0, duration_s=1.25)


def test_offered_and_achieved_rates_of_open_loop_rows() -> None:
    server = LatencyProfile(**(BASE | {"scenario": "server", "params": {"rate_hz": 800.0}}))
    assert server.offered_per_s == 1600.0 and server.achieved_per_s == 1600.0  # 1000 × 2 / 1.25 s
    burst = LatencyProfile(**(BASE | {"scenario": "burst", "params": {"trace": {"mean_rate_hz": 400.0}}}))
    assert burst.offered_per_s == 800.0 and burst.achieved_per_s == 1600.0
    single = LatencyProfile(**(BASE | {"scenario": "single-stream"}))
    assert single.offered_per_s is None and single.achieved_per_s is None
    for hostile in ({"rate_hz": "fast"}, {"rate_hz": True}, {"trace": "x"}, {}):
        p = LatencyProfile(**(BASE | {"scenario": "server" if "rate_hz" in hostile else "burst",
                                      "params": hostile}))
        assert p.offered_per_s is None and p.row().split()[-2] == "—"
    text = table([server, single])
    head, srow, crow = text.splitlines()[:3]
    assert head.split()[-2:] == ["offered/s", "achieved/s"]
    assert srow.split()[-3:] == ["300,000", "1,600", "1,600"]
    assert crow.split()[-2:] == ["—", "—"]
    assert RATE_NOTE in text
    assert RATE_NOTE not in table([single])


def test_html_report_server_table_offered_achieved_fit_and_footer_version(tmp_path) -> None:
    from hwbackends.bench.results import VERSION
    from hwbackends.registry import get_registry
    from hwbackends.report import write_report

    server = LatencyProfile(**(BASE | {"scenario": "server", "params": {"rate_hz": 800.0}}))
    hostile = LatencyProfile(**(BASE | {"scenario": "server", "params": {"rate_hz": "x"}}))
    res = BenchResults(model={"name": "m"}, machine={}, profiles=[server, hostile])
    page = write_report(res, tmp_path / "r.html", registry=get_registry()).read_text()
    assert f"results format v{VERSION}" in page and VERSION != 1
    server_table = page[page.index("achieved/s"):]
    assert "1,600/s" in server_table and "<td class=\"num\">1,600</td>" in server_table
    # every table sits in a wrapper that scrolls it inside its card
    assert page.count("<table>") == page.count('<div class="tbl"><table>') > 0
    assert ".tbl{max-width:100%;overflow-x:auto}" in page


@pytest.mark.slow
def test_hwb_bench_table_gives_every_open_loop_row_its_rates(store_dir, tmp_path, capsys) -> None:
    out = tmp_path / "res.json"
    rc = main(["bench", "zoo:signal", "-t", "cpu.onnxruntime", "-p", "fp32",
               "-s", "server:rate_hz=500,n=200", "-s", "server:rate_hz=1000,n=200",
               "-s", "burst:duration=0.3", "-o", str(out), "--cache-dir", str(store_dir)])
    assert rc == 0
    text = capsys.readouterr().out
    res = BenchResults.load(out)
    rows = [line for line in text.splitlines() if line.startswith("cpu.onnxruntime:fp32")
            and ("server" in line or "burst" in line) and "floor" not in line]
    assert len(rows) == 3
    for p in res.profiles:
        assert p.offered_per_s is not None and p.achieved_per_s is not None
        assert f"{p.offered_per_s:,.0f}" in text
        # a variant far faster than the arrivals answers about what was offered
        assert 0.3 * p.offered_per_s < p.achieved_per_s < 3 * p.offered_per_s
