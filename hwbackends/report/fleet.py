"""The cross-machine part of the report, for results written by ``hwb fleet``.

One section per machine, a cross-machine table (model × target × machine → p50/p90/p95/p99/
p99.9, throughput and mode: the percentiles of the single-machine report), the fastest hardware per target family (and per latency tier, when placement
advice was computed) across the fleet, the machine differences (CPU, cores, library versions)
and the cost of the Ray layer per variant. :func:`sections` returns HTML that
:func:`hwbackends.report.html.render` inserts after its summary when ``results.fleet`` is set."""
from __future__ import annotations

import html
import statistics
from typing import Any

from ..bench.profile import LatencyProfile
from ..bench.results import BenchResults
from ..labels import label
from ..units import fmt_us
from ..variant import machine_key
from .text import long_text

#: Fingerprint fields compared between machines (libraries are compared one by one).
MACHINE_FIELDS = (("cpu", "CPU"), ("arch", "arch"), ("cores", "cores"),
                  ("usable_cores", "usable cores"), ("kernel", "kernel"), ("python", "Python"))


def _e(x: Any) -> str:
    return html.escape(str(x))


def _badge(mode: str) -> str:
    return f'<span class="badge {_e(mode)}">{_e(mode.upper())}</span>'


def _table(head: list[str], rows: list[list[str]], num: set[int] | None = None) -> str:
    num = num or set()
    th = "".join(f'<th class="{"num" if i in num else ""}">{h}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"num" if i in num else ""}">{c}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def machines(res: BenchResults) -> dict[str, dict[str, Any]]:
    """``{node id: node row}`` of the fleet, in the order the run listed them."""
    return {n["node_id"]: n for n in (res.fleet or {}).get("nodes", [])}


def _label(nodes: dict[str, dict[str, Any]], key: str) -> str:
    return str(nodes.get(key, {}).get("label") or key[:12])


def _bare(p: LatencyProfile) -> str:
    return label(p.target, p.precision)


def _cross_table(res: BenchResults, nodes: dict[str, dict[str, Any]]) -> str:
    rows = []
    model = res.model.get("name", "?")
    for p in sorted(res.profiles, key=lambda p: (p.scenario, _bare(p), p.batch_size, p.p99_us)):
        rows.append([_e(model), f"<b>{_e(_bare(p))}</b>", _e(_label(nodes, machine_key(p))),
                     _e(p.scenario) + (f" b{p.batch_size}" if p.batch_size != 1 else ""),
                     _badge(p.mode), *_tail(p), f"{p.throughput:,.0f}", f"{p.n:,}"])
    return _table(["model", "variant", "machine", "scenario", "mode", *TAIL_HEAD, "samples/s",
                   "n"], rows, set(range(5, 5 + len(TAIL_HEAD) + 2)))


#: The latency percentiles every fleet table shows, as the single-machine report's tables do.
TAIL_HEAD = ("p50", "p90", "p95", "p99", "p99.9")


def _tail(p: LatencyProfile) -> list[str]:
    return [fmt_us(v) for v in (p.p50_us, p.p90_us, p.p95_us, p.p99_us, p.p999_us)]


def fastest(res: BenchResults) -> list[tuple[str, LatencyProfile]]:
    """``(family, profile)``: the lowest single-stream batch-1 p99 among hardware (not
    emulated) profiles of each target family, across every machine."""
    fam = {a["target"]: a.get("family") or a["target"].split(".")[0] for a in res.availability}
    best: dict[str, LatencyProfile] = {}
    for p in res.profiles:
        if p.scenario != "single-stream" or p.batch_size != 1 or p.mode != "hardware":
            continue
        f = fam.get(p.target, p.target.split(".")[0])
        if f not in best or p.p99_us < best[f].p99_us:
            best[f] = p
    return sorted(best.items())


def _fastest_html(res: BenchResults, nodes: dict[str, dict[str, Any]]) -> str:
    rows = [[_e(f), f"<b>{_e(_bare(p))}</b>", _e(_label(nodes, machine_key(p))), fmt_us(p.p50_us),
             fmt_us(p.p95_us), fmt_us(p.p99_us), f"{p.throughput:,.0f}"] for f, p in fastest(res)]
    out = ("<h3>Fastest hardware per target family</h3>"
           + (_table(["family", "variant", "machine", "p50", "p95", "p99", "samples/s"], rows, {3, 4, 5, 6})
              if rows else '<p class="note">No hardware (non-emulated) single-stream profile.</p>'))
    placement = (res.fleet or {}).get("placement")
    if placement:
        prow = []
        for s in placement:
            b = s.get("best") or {}
            ok = b.get("meets_budget")
            prow.append([_e(s["strategy"]), _e(s["tier"]), fmt_us(s["budget_us"]),
                         f"<b>{_e(b.get('variant') or '—')}</b>", _e(b.get("label") or "—"),
                         fmt_us(b.get("p99_us")),
                         '<span class="ok">within budget</span>' if ok else
                         '<span class="over">over budget</span>' if b else
                         '<span class="over">no variant</span>'])
        out += ("<h3>Fastest placement per latency tier (router policy, per machine)</h3>"
                + _table(["strategy", "tier", "p99 budget", "variant", "machine", "p99", ""],
                         prow, {2, 5}))
    return out


def differences(nodes: dict[str, dict[str, Any]]) -> list[tuple[str, list[str], bool]]:
    """``(field, value per machine, differs)`` for the fingerprint fields and libraries."""
    fps = [n.get("fingerprint") or {} for n in nodes.values()]
    out = []
    for key, name in MACHINE_FIELDS:
        vals = [str(fp.get(key, "—")) for fp in fps]
        out.append((name, vals, len(set(vals)) > 1))
    libs = sorted({lib for fp in fps for lib in fp.get("libraries", {})})
    for lib in libs:
        vals = [str(fp.get("libraries", {}).get(lib, "—")) for fp in fps]
        out.append((lib, vals, len(set(vals)) > 1))
    return out


def _differences_html(nodes: dict[str, dict[str, Any]]) -> str:
    rows = [[("<b>" + _e(f) + "</b>") if d else _e(f)]
            + [(f'<span class="over">{_e(v)}</span>' if d else _e(v)) for v in vals]
            for f, vals, d in differences(nodes)]
    n_diff = sum(1 for _, _, d in differences(nodes) if d)
    return (_table(["", *[_e(n.get("label")) for n in nodes.values()]], rows)
            + f'<p class="note">{n_diff} field(s) differ (highlighted). Machines with the same '
              "CPU, cores and library versions share a fingerprint; their profiles are "
              "comparable directly.</p>")


def ray_cost(res: BenchResults) -> dict[str, float] | None:
    """Median Ray layer cost per variant: driver-side wall time of a task minus the time its
    function ran on the node (scheduling, transfer of arguments and results)."""
    tasks = [t for t in (res.fleet or {}).get("tasks", []) if t.get("status") == "done"
             and t.get("wall_s") is not None and t.get("task_s") is not None]
    if not tasks:
        return None
    over = [t["wall_s"] - t["task_s"] for t in tasks]
    return {"tasks": len(tasks), "overhead_median_s": statistics.median(over),
            "overhead_max_s": max(over),
            "task_median_s": statistics.median(t["task_s"] for t in tasks),
            "bench_median_s": statistics.median(t.get("bench_s") or 0.0 for t in tasks)}


def _machine_section(res: BenchResults, key: str, node: dict[str, Any]) -> str:
    fp = node.get("fingerprint") or {}
    head = (f"<h2>Machine {_e(node.get('label'))}</h2><p class=\"note\">host "
            f"<code>{_e(node.get('hostname'))}</code> · Ray node <code>{_e(key)}</code> · "
            f"{_e(fp.get('cpu', '?'))}, {_e(fp.get('usable_cores', '?'))}/{_e(fp.get('cores', '?'))} "
            f"cores · fingerprint {_e(fp.get('id', '—'))} · advertises "
            f"{_e(', '.join(node.get('advertised') or []) or 'nothing')}</p>")
    if node.get("status") != "ok":
        head += (f'<div class="emu-banner"><b>{_e(node.get("status"))}</b>: '
                 f'{_e(node.get("error") or "")}</div>')
    av = [[f"<b>{_e(a['target'])}</b>", _badge(a["mode"]), _e(a.get("reason", ""))]
          for a in res.availability if machine_key(a) == key]
    rows = []
    for v in res.variants:
        if machine_key(v) != key:
            continue
        ps = [p for p in res.profiles if machine_key(p) == key and _bare(p) == label(v.target, v.precision)]
        if v.error:
            rows.append([_e(label(v.target, v.precision)), _badge("failed"), "—",
                         *["—"] * len(TAIL_HEAD), "—",
                         f'<span class="note">{long_text(v.error, 240)}</span>'])
            continue
        how = ("artifact from " + _e(_label(machines(res), v.artifact_from_node))
               if v.artifact_from_node and v.cached else
               "cached" if v.cached else f"compiled {v.compile_seconds:.1f} s")
        for p in ps:
            rows.append([f"<b>{_e(_bare(p))}</b>", _badge(p.mode), _e(p.scenario), *_tail(p),
                         f"{p.throughput:,.0f}", how])
    return (f"<section>{head}"
            + (_table(["target", "mode", "why / how"], av) if av else "")
            + (_table(["variant", "mode", "scenario", *TAIL_HEAD, "samples/s", "artifact"], rows,
                      set(range(3, 3 + len(TAIL_HEAD) + 1))) if rows else '<p class="note">Nothing measured on this machine.</p>')
            + "</section>")


def sections(res: BenchResults) -> str:
    """The fleet sections of the report (empty for a one-machine results file)."""
    if not res.fleet:
        return ""
    nodes = machines(res)
    measured = {machine_key(p) for p in res.profiles}
    failed = [v for v in res.variants if v.error]
    parts = [f"<section><h2>Fleet: {len(nodes)} machine(s), {len(measured)} measured</h2>"
             f"<p class=\"note\">Ray {_e(res.fleet.get('ray_version', ''))} "
             f"({_e(res.fleet.get('mode', ''))}, {_e(res.fleet.get('address', ''))}); each variant "
             "was compiled and measured on the machine that advertises its target "
             "(<code>hwb.&lt;target&gt;</code> Ray resource). "
             f"{len(failed)} row(s) failed.</p>"
             + _cross_table(res, nodes) + _fastest_html(res, nodes) + "</section>"]
    parts.append("<section><h2>Machine differences</h2>" + _differences_html(nodes) + "</section>")
    cost = ray_cost(res)
    if cost:
        parts.append(
            "<section><h2>Cost of the Ray layer</h2><p class=\"note\">Per variant, median "
            f"{cost['overhead_median_s'] * 1e3:,.0f} ms (max {cost['overhead_max_s'] * 1e3:,.0f} ms) "
            f"between submitting a task and receiving its result, beyond the "
            f"{cost['task_median_s']:,.1f} s (median) the task ran on its node (of which "
            f"{cost['bench_median_s']:,.2f} s timed calls; the rest is model load, compile and "
            f"fidelity). {cost['tasks']} task(s).</p></section>")
    parts += [_machine_section(res, k, n) for k, n in nodes.items()]
    return "".join(parts)
