"""``hwb report`` on a fleet results file shows the tail percentiles of the single-machine report
(p50, p90, p95, p99, p99.9) in the cross-machine table and in each machine's table, and p95
beside p50/p99 in the fastest-per-family table.

No Ray: the profiles are measured for real by ``hwb bench`` on this machine, then laid out as
``hwb fleet`` writes them (hwbackends.fleet.runner ``merge`` and node ``_tag``): each row
tagged with the node that measured it, its variant suffixed ``@ label``, ``results.fleet``
listing the nodes. Two nodes here share this machine's fingerprint: each holds one target."""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from hwbackends.bench import BenchResults
from hwbackends.units import fmt_us

NODES = {"cpu.onnxruntime": ("a" * 56, "desk-1"), "cpu.native": ("b" * 56, "desk-2")}


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory, store_dir: Path) -> Path:
    from hwbackends.cli import main

    d = tmp_path_factory.mktemp("fleet-report")
    one = d / "one.json"
    assert main(["bench", "zoo:mlp", "-t", ",".join(NODES), "-p", "fp32", "-s", "single-stream",
                 "--n", "300", "-q", "-o", str(one), "--cache-dir", str(store_dir)]) == 0
    raw = json.loads(one.read_text())
    fp = raw["machine"]
    nodes = []
    for target, (node_id, label) in NODES.items():
        nodes.append({"node_id": node_id, "label": label, "hostname": fp.get("hostname", "host"),
                      "fingerprint": fp, "status": "ok", "advertised": [target]})
    for kind in ("availability", "variants", "profiles"):
        for row in raw[kind]:
            node_id, label = NODES.get(row["target"], ("c" * 56, "desk-3"))
            row["machine"] = dict(fp, node_id=node_id, label=label)
            if "variant" in row and row["variant"]:
                row["variant"] = f"{row['variant']} @ {label}"
    raw["fleet"] = {"address": "local", "mode": "local", "ray_version": "2.60.0", "nodes": nodes,
                    "tasks": [], "targets": list(NODES), "scenarios": ["single-stream"]}
    path = d / "fleet.json"
    path.write_text(json.dumps(raw))  # the bench wrote strict JSON: so is this
    return path


def _tables_with(page: str, heading: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header cells, body rows) of each table whose header holds ``heading``."""
    out = []
    for t in re.findall(r"<table>.*?</table>", page, re.S):
        head = [html.unescape(re.sub(r"<[^>]+>", "", h)) for h in re.findall(r"<th[^>]*>(.*?)</th>", t, re.S)]
        if heading not in head:
            continue
        rows = [[html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
                for r in re.findall(r"<tr>(.*?)</tr>", t.split("<tbody>", 1)[1], re.S)]
        out.append((head, rows))
    return out


def test_fleet_report_shows_the_tail_percentiles(fleet_file: Path, tmp_path: Path, hwb_cli) -> None:
    res = BenchResults.load(fleet_file)
    assert res.fleet and len(res.profiles) == 2
    out = tmp_path / "report.html"
    rc, _, err = hwb_cli("report", str(fleet_file), "-o", str(out))
    assert rc == 0, err
    page = out.read_text()
    assert "Fleet: 2 machine(s), 2 measured" in page
    want = {f"{p.target}:{p.precision}": [fmt_us(v) for v in (p.p50_us, p.p90_us, p.p95_us,
                                                              p.p99_us, p.p999_us)]
            for p in res.profiles}
    tails = ["p50", "p90", "p95", "p99", "p99.9"]
    tables = _tables_with(page, "p95")
    cross = [t for t in tables if "machine" in t[0] and "n" in t[0]]
    per_machine = [t for t in tables if "artifact" in t[0]]
    fastest = [t for t in tables if "family" in t[0]]
    assert len(cross) == 1 and len(per_machine) == 2 and len(fastest) == 1, [t[0] for t in tables]
    for head, rows in cross + per_machine:
        i = head.index("p50")
        assert head[i:i + 5] == tails, head
        for row in rows:
            variant = next(c for c in row if c in want)
            assert row[i:i + 5] == want[variant], (head, row)
    ((head, rows),) = fastest
    assert head[head.index("p50"):head.index("p50") + 3] == ["p50", "p95", "p99"]
    for row in rows:
        variant = next(c for c in row if c in want)
        i = head.index("p50")
        assert row[i:i + 3] == [want[variant][0], want[variant][2], want[variant][3]]
