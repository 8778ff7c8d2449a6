"""The hardware-evaluation report: one self-contained HTML file (inline CSS, inline SVG).

Written for a platform team deciding what to buy: the answer first (routing per tier and the
fastest accurate variant), then the evidence (availability, latency distributions, batch
and burst behaviour, fidelity, build cost), and how it was measured. Emulated figures are
labelled wherever they appear: a badge in tables, dashed lines and "(emulated)" in plots.
"""
from __future__ import annotations

import datetime as _dt
import html
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..bench.profile import FLOOR_FACTOR, LatencyProfile
from ..bench.results import VERSION as RESULTS_VERSION
from ..bench.results import BenchResults
from ..machine import describe as machine_line
from ..units import fmt_us
from ..variant import VariantRecord
from . import plots
from .text import long_text

if TYPE_CHECKING:  # pragma: no cover
    from ..registry import Registry

CSS = """
:root{--ink:#1d2733;--mute:#5d6b7a;--line:#e2e7ee;--bg:#f6f8fb;--ok:#1b7f4b;--warn:#b26a00;
--bad:#b3261e;--acc:#1f5fbf}
*{box-sizing:border-box}body{margin:0;font:14px/1.5 -apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
color:var(--ink);background:var(--bg)}
header{background:#14202e;color:#fff;padding:28px 40px 22px}header h1{margin:0 0 4px;font-size:22px}
header .sub{color:#b8c4d2;font-size:13px}main{max-width:1120px;margin:0 auto;padding:24px 40px 60px}
section{background:#fff;border:1px solid var(--line);border-radius:8px;padding:18px 22px;margin:18px 0}
h2{font-size:16px;margin:0 0 10px}p.note{color:var(--mute);font-size:12.5px;margin:6px 0 0}
table{border-collapse:collapse;width:100%;font-size:12.5px}th,td{text-align:left;padding:5px 8px;
border-bottom:1px solid var(--line);vertical-align:top}th{color:var(--mute);font-weight:600;background:#fafbfd}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.badge{display:inline-block;padding:1px 7px;border-radius:10px;font-size:11px;font-weight:600;letter-spacing:.02em}
.hardware{background:#e3f4ea;color:var(--ok)}.emulated{background:#fff1dc;color:var(--warn)}
.unavailable,.failed{background:#f1f3f6;color:var(--mute)}.rejected{background:#fde7e6;color:var(--bad)}
.chosen{background:#e2ecfb;color:var(--acc)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(220px,1fr));gap:12px}
.card{border:1px solid var(--line);border-radius:8px;padding:12px 14px;background:#fbfcfe}
.card .k{color:var(--mute);font-size:12px}.card .v{font-size:20px;font-weight:600;margin:2px 0}
.card .d{font-size:12px;color:var(--mute)}
.emu-banner{border-left:4px solid var(--warn);background:#fff8ec;padding:8px 12px;margin:10px 0;font-size:13px}
.plot svg{max-width:100%;height:auto}.over{color:var(--bad);font-weight:600}.ok{color:var(--ok);font-weight:600}
code{background:#f1f3f6;padding:0 4px;border-radius:3px;font-size:12px}
details.long summary{cursor:pointer}pre.full{white-space:pre-wrap;word-break:break-word;font-size:11.5px;
background:#f6f8fb;border:1px solid var(--line);padding:6px 8px;margin:4px 0;max-height:420px;overflow:auto}
footer{color:var(--mute);font-size:12px;margin-top:26px}
.tbl{max-width:100%;overflow-x:auto}th.num{white-space:normal}
.tbl table{font-size:12px}.tbl th,.tbl td{padding:5px 4px}.tbl td .over{white-space:normal}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _in_run(r: dict[str, Any]) -> bool:
    """Whether a routing row's strategy is about the model this run measured (rows written
    before ``model_in_run`` was kept count as this run's)."""
    return r.get("model_in_run", True) is not False


def _badge(mode: str) -> str:
    return f'<span class="badge {_e(mode)}">{_e(mode.upper())}</span>'


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def _table(head: list[str], rows: list[list[str]], num: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    th = "".join(f'<th class="{"num" if i in num else ""}">{h}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"num" if i in num else ""}">{c}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    # the wrapper scrolls a table wider than its section instead of letting it run past the card
    return f'<div class="tbl"><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


def _cards(res: BenchResults) -> str:
    ss = [p for p in res.profiles if p.scenario == "single-stream" and p.batch_size == 1]
    hw = [p for p in ss if not p.emulated]
    cards = []
    if hw:
        best = min(hw, key=lambda p: p.p99_us)
        cards.append(("fastest hardware variant (p99, batch 1)", fmt_us(best.p99_us),
                      f"{best.variant} · p50 {fmt_us(best.p50_us)} · n={best.n:,}"))
    sl = [p for p in res.profiles if p.scenario == "sliding" and p.sliding and not p.emulated]
    if sl:
        best = min(sl, key=lambda p: p.p99_us)
        full = (best.sliding or {}).get("full") or {}
        cards.append(("fastest tick → answer (sliding p99)", fmt_us(best.p99_us),
                      f"{best.variant} ({(best.sliding or {}).get('form')}) · push p50 "
                      f"{fmt_us(best.p50_us)} vs full window p50 {fmt_us(full.get('p50_us'))}"))
    emu = sorted({p.variant for p in ss if p.emulated})
    if emu:  # no latency figure here: a stand-in's time is not the device's
        cards.append(("emulated variants (no device latency)", f"{len(emu)} emulated",
                      f"{', '.join(emu)}: timed on a stand-in (C-simulation, the CPU instead of "
                      f"the accelerator), not the hardware; their figures in the tables below "
                      f"are marked EMULATED"))
    av = res.availability
    failed = sum(not v.ok for v in res.variants)
    cards.append(("targets", f"{sum(a['mode'] == 'hardware' for a in av)} hw · "
                             f"{sum(a['mode'] == 'emulated' for a in av)} emu · "
                             f"{sum(a['mode'] == 'unavailable' for a in av)} n/a",
                  f"{sum(v.ok for v in res.variants)} variants compiled, {failed} failed"
                  + (" (see Fidelity, build cost)" if failed else "")))
    ours = [r for r in res.routing or [] if _in_run(r)]
    others = [r for r in res.routing or [] if not _in_run(r)]
    if ours:
        met = sum(1 for r in ours if r.get("meets_budget"))
        cards.append(("strategies served within budget", f"{met} / {len(ours)}",
                      ", ".join(f"{r['strategy']}→{r['chosen'] or 'none'}" for r in ours)
                      + (f"; {len(others)} of other models, not in this run" if others else "")))
    elif others:
        cards.append(("strategies", f"{len(others)} of other models",
                      f"no strategy of {res.model.get('name', 'this model')} in the strategies "
                      f"file: {', '.join(sorted({str(r.get('model')) for r in others}))}"))
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div>'
        f'<div class="d">{_e(d)}</div></div>' for k, v, d in cards) + "</div>"


def _routing(res: BenchResults) -> str:
    if not res.routing:
        return ('<p class="note">No routing decisions in this results file. Run <code>hwb demo</code> '
                'or <code>hwb bench MODEL --route strategies.toml</code> to include them.</p>')
    rows = []
    for r in res.routing:
        ok = r.get("meets_budget")
        verdict = (f'<span class="note">other model ({_e(r.get("model"))}): not in this run</span>'
                   if not _in_run(r) and not r.get("chosen") else
                   '<span class="ok">within budget</span>' if ok else
                   '<span class="over">over budget</span>' if r.get("chosen") else
                   '<span class="over">no variant</span>')
        rows.append([_e(r["strategy"]) + (" <i>(sliding)</i>" if r.get("scenario") == "sliding" else ""),
                     _e(r["tier"]), fmt_us(r["budget_us"]),
                     f"<b>{_e(r['chosen'] or '—')}</b> " + (_badge(r["chosen_mode"]) if r.get("chosen_mode") else ""),
                     fmt_us(r.get("chosen_p99_us")), verdict, _e(r.get("chosen_by", "")),
                     _e(" → ".join(r.get("failover", [])) or "—")])
    out = _table(["strategy", "tier", "p99 budget", "chosen", "measured p99", "", "by", "failover order"],
                 rows, {2, 4})
    out += ('<p class="note">“Measured p99” is the router\'s own profile: every eligible candidate '
            'measured interleaved in rounds, so they share the same machine noise. The latency '
            'tables below are separate runs; variants within a few percent of each other may '
            'trade places between the two. A <i>(sliding)</i> strategy is ranked by the p99 of '
            '<code>push_into</code> (one tick in, the window\'s answer out).</p>')
    notes = [f"<li><b>{_e(r['strategy'])}</b>: {long_text(r['note'], 240)}</li>"
             for r in res.routing if r.get("note")]
    if notes:
        out += "<ul class='note'>" + "".join(notes) + "</ul>"
    # per-strategy candidate details
    for r in res.routing:
        crow = []
        for c in r["candidates"]:
            f = c.get("fidelity") or {}
            crow.append([_e(c["variant"]), _badge(c["mode"]), fmt_us(c.get("p99_us")),
                         f"{f['corr']:.6f}" if "corr" in f else "—",
                         f"{f['max_abs']:.2g}" if "max_abs" in f else "—",
                         f'<span class="badge {"chosen" if c["status"] == "chosen" else c["status"] if c["status"] in ("rejected", "failed", "unavailable") else ""}">{_e(c["status"])}</span> '
                         + long_text("; ".join(c.get("reasons", [])), 240)])
        out += (f"<details><summary>{_e(r['strategy'])}: every candidate and why</summary>"
                + _table(["variant", "mode", "p99", "corr", "max abs", "verdict"], crow, {2, 3, 4})
                + "</details>")
    return out


@dataclass
class _Ctx:
    """What the sections share: the results, one colour per variant, and the run's registry
    (whose plugins add their sections)."""

    res: BenchResults
    col: dict[str, str]
    registry: "Registry"


def render(res: BenchResults, registry: "Registry") -> str:
    """The report as one HTML string: the sections of :data:`SECTIONS`, in order. A section is
    ``f(ctx) -> str`` ("" to leave it out); modules that add one (hwbackends/report/fleet.py)
    plug in here rather than into each other, and the plugins of the run's ``registry`` add
    theirs through the ``hwb_report_sections`` hook (:func:`_plugins`)."""
    variants = list(dict.fromkeys(p.variant for p in res.profiles))
    ctx = _Ctx(res, plots.colors(variants) if variants else {}, registry)
    return "".join(section(ctx) for section in SECTIONS)


def _head(ctx: _Ctx) -> str:
    res, m = ctx.res, ctx.res.model
    when = _dt.datetime.fromtimestamp(res.created, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>Hardware evaluation: {_e(m.get('name'))}</title><style>{CSS}</style></head><body>
<header><h1>Hardware evaluation — model <i>{_e(m.get('name'))}</i></h1>
<div class="sub">fingerprint {_e(str(m.get('fingerprint', ''))[:16])} · {_e(m.get('format', ''))} ·
measured {when} on {_e(machine_line(res.machine))}</div></header><main>"""
    if res.interrupted:
        out += ('<div class="emu-banner"><b>Interrupted run.</b> This report holds what was '
                'measured before the run was stopped.</div>')
    return out


def _summary(ctx: _Ctx) -> str:
    emulated = sorted({p.variant for p in ctx.res.profiles if p.emulated})
    out = f"<section><h2>Summary</h2>{_cards(ctx.res)}"
    if emulated:
        out += (f'<div class="emu-banner"><b>Emulated figures</b> ({_e(", ".join(emulated))}) '
                'come from a stand-in for the accelerator (C-simulation, the CPU instead of a '
                'TPU, a CPU interpreter instead of an Edge TPU). They show that the artifact '
                'works and how accurate it is, <b>not</b> how fast the hardware would be; they '
                'are drawn dashed and never ranked against hardware by the router unless '
                'a config allows it.</div>')
    return out + "</section>"


def _fleet(ctx: _Ctx) -> str:
    """Several machines: the cross-machine sections (hwbackends/report/fleet.py)."""
    if not ctx.res.fleet:
        return ""
    from .fleet import sections  # only fleet results need it

    return sections(ctx.res)


def _routing_section(ctx: _Ctx) -> str:
    return f"<section><h2>Routing decision per tier</h2>{_routing(ctx.res)}</section>"


def _availability(ctx: _Ctx) -> str:
    rows = [[f"<b>{_e(a['target'])}</b>", _e(a.get("family", "")), _badge(a["mode"]),
             _e(a.get("device", "") or "—"),
             _e(a.get("reason", "")) + (f"<br><b>{_e(a['skipped'])}</b>" if a.get("skipped") else "")]
            for a in ctx.res.availability]
    return ("<section><h2>Availability on this machine</h2>"
            + _table(["target", "family", "mode", "device", "why / how"], rows)
            + '<p class="note"><b>hardware</b>: runs on the real device. <b>emulated</b>: the '
              'same artifact on a stand-in. <b>unavailable</b>: what to install or attach.</p>'
              "</section>")


def _single_stream(ctx: _Ctx) -> str:
    ss = [p for p in ctx.res.profiles if p.scenario == "single-stream"]
    if not ss:
        return ""
    return ('<section><h2>Latency distribution (single stream, closed loop)</h2><div class="plot">'
            + plots.cdf(ss, ctx.col, "CDF of per-call latency, batch 1") + "</div>"
            + _profile_table(ss) + "</section>")


def _server(ctx: _Ctx) -> str:
    sv = [p for p in ctx.res.profiles if p.scenario == "server"]
    if not sv:
        return ""
    rates: dict[str, set] = {}
    for p in sv:
        rates.setdefault(p.variant, set()).add(p.params.get("rate_hz"))
    swept = [p for p in sv if len(rates[p.variant]) > 1]
    base = sorted({p.params.get("rate_hz") for p in sv}, key=lambda r: -sum(
        1 for q in sv if q.params.get("rate_hz") == r))[0]
    plot = plots.cdf([p for p in sv if p.params.get("rate_hz") == base], ctx.col,
                     f"CDF of latency from scheduled arrival, Poisson {base:g}/s")
    if swept:
        plot += plots.server_load(swept, ctx.col)
    return ('<section><h2>Server scenario (open loop, Poisson arrivals)</h2><div class="plot">'
            + plot + "</div>" + _profile_table(sv, server=True)
            + '<p class="note">Latency is counted from each request\'s <i>scheduled</i> arrival, '
              'so time spent queued behind a slow call is included (no coordinated omission).</p>'
            + FLOOR_NOTE
            + _load_note(sv, ctx.res) + "</section>")


def _burst(ctx: _Ctx) -> str:
    bu = [p for p in ctx.res.profiles if p.scenario == "burst" and p.timeline]
    if not bu:
        return ""
    tr = bu[0].params.get("trace") or {}
    # A timeline per variant is unreadable past a handful: plot the best few, list all.
    shown = sorted(bu, key=lambda p: (p.emulated, p.p99_us))[:4]
    more = (f" The plot shows {len(shown)} variants (hardware first, lowest burst p99); the table "
            f"lists all {len(bu)}.") if len(shown) < len(bu) else ""
    return ('<section><h2>Burst replay (tick-arrival trace)</h2><div class="plot">'
            + plots.burst(shown, ctx.col) + "</div>" + _profile_table(bu, server=True)
            + f'<p class="note">Trace: {_e(tr.get("ticks", "?"))} ticks over '
              f'{float(tr.get("duration_s", 0)):.2f} s, mean {float(tr.get("mean_rate_hz", 0)):.0f}/s, '
              f'peak {float(tr.get("peak_rate_hz_10ms", 0)):.0f}/s over 10 ms '
              f'({_e(tr.get("source", ""))}, {_e(tr.get("bursts", "?"))} bursts).{_e(more)}</p>'
            + FLOOR_NOTE
            + _load_note(bu, ctx.res) + "</section>")


def _sliding(ctx: _Ctx) -> str:
    """The sliding scenario: tick → answer (``push_into``) beside the prepare (timed apart)
    and the full window (``predict_into``) of the same interleaved run."""
    sl = [p for p in ctx.res.profiles if p.scenario == "sliding" and p.sliding]
    if not sl:
        return ""
    rows = []
    for p in sl:
        d = p.sliding or {}
        pr, fu = d.get("prepare") or {}, d.get("full") or {}
        ratio = d.get("push_over_full_p50")
        rows.append([f"<b>{_e(p.variant)}</b>" + _other_model(p)
                     + (" ⚠ interrupted" if p.interrupted else ""),
                     _badge(p.mode), _e(d.get("form", "?")), _e(d.get("window", "?")),
                     f"{p.n:,}", fmt_us(p.p50_us), fmt_us(p.p90_us), fmt_us(p.p95_us),
                     fmt_us(p.p99_us), fmt_us(p.p999_us), fmt_us(pr.get("p50_us")),
                     fmt_us(pr.get("p99_us")), fmt_us(fu.get("p50_us")), fmt_us(fu.get("p99_us")),
                     f"{ratio:.3f}" if isinstance(ratio, float) else "—"])
    return ('<section><h2>Sliding window: one tick in, the answer out</h2>'
            + _table(["variant", "mode", "form", "window", "n", "push p50", "p90", "p95", "p99",
                      "p99.9", "prepare p50", "prepare p99", "full window p50", "full p99",
                      "push / full (p50)"], rows, set(range(3, 15)))
            + '<p class="note">Each tick pushes a new step of the model\'s sample windows '
              '(<code>push_into</code> on a preallocated output); the <i>prepare</i> (the work '
              'that does not need the new step) is timed apart, as STAC-ML Tacana reports it, '
              'and the full window (<code>predict_into</code>) runs in the same interleaved '
              'rounds. <b>incremental</b>: the target\'s own form (only the newest step on the '
              'critical path); <b>recompute</b>: the window recomputed each tick.</p>'
            + _load_note(sl, ctx.res) + "</section>" + _sliding_load(ctx, sl))


def _other_model(p: LatencyProfile) -> str:
    """`` (MODEL)`` for a profile of another model than the run's (the demo's sliding one)."""
    m = (p.params or {}).get("model")
    return f" <i>({_e(m)})</i>" if isinstance(m, str) else ""


def _sliding_load(ctx: _Ctx, sl: list[LatencyProfile]) -> str:
    """The sliding load sweep (STAC-ML's NMI × offered rate): the curve per variant, and per
    count of windows the rate one core sustains, the knee and the open-loop points."""
    from ..bench.load import parse_load

    ps = [p for p in sl if (p.sliding or {}).get("load")]
    if not ps:
        return ""
    rows = []
    for p in ps:
        load = parse_load(p.sliding["load"], f"profile {p.variant}")  # type: ignore[index]
        for pt in load["points"]:
            c = pt["closed"]
            k, bound = pt.get("knee_hz"), pt.get("knee_bound", "")
            knee = "—" if k is None else f"{'≥ ' if bound == '>=' else '≤ ' if bound == '<=' else ''}{k:,.0f}/s"
            pts = "; ".join(f"{q['offered_hz']:,.0f}/s → {fmt_us(q['p99_us'])}"
                            for q in sorted(pt["open"], key=lambda q: q["offered_hz"]))
            rows.append([f"<b>{_e(p.variant)}</b>" + _other_model(p), _badge(p.mode),
                         _e(load.get("form", "?")),
                         str(pt["streams"]), fmt_us((c.get("push") or {}).get("p99_us")),
                         fmt_us((c.get("prepare") or {}).get("p50_us")),
                         fmt_us((c.get("prepare") or {}).get("p99_us")),
                         f"{c['sustainable_hz']:,.0f}/s", _e(knee), _e(pts or "—")])
    budget = {(p.sliding or {}).get("load", {}).get("budget_from") for p in ps}
    return ('<section><h2>Sliding windows under load: latency against offered tick rate</h2>'
            '<div class="plot">' + plots.sliding_load(ps, ctx.col) + "</div>"
            + _table(["variant", "mode", "form", "windows (NMI)", "push p99 (closed)",
                      "prepare p50", "prepare p99", "one core sustains", "knee",
                      "p99 at offered rate"], rows, set(range(3, 9)))
            + '<p class="note">Per count of windows (<code>cm.sliding(streams=N)</code>, '
              'STAC-ML\'s NMI): a closed loop, ticks round-robin over the windows, push and '
              'prepare timed apart (<i>one core sustains</i> = 1 / (median push + median '
              'prepare): the work a core must fit between ticks); then open loops of Poisson '
              'ticks at each offered rate to windows drawn at random, latency from each tick\'s '
              'scheduled arrival, so a tick that waits behind a prepare is charged the wait. '
              'The <b>knee</b> is the offered rate where p99 leaves the budget ('
              + _e("; ".join(sorted(b for b in budget if b))) + ').</p>'
            + _load_note(ps, ctx.res) + "</section>")


def _batch(ctx: _Ctx) -> str:
    ba = [p for p in ctx.res.profiles if p.scenario == "batch"]
    if not ba:
        return ""
    return ('<section><h2>Batching: N symbols per tick</h2><div class="plot">'
            + plots.batch(ba, ctx.col) + "</div>" + _profile_table(ba) + "</section>")


def _fidelity_row(v: VariantRecord) -> list[str]:
    f = v.fidelity
    if v.error:
        return [_e(v.variant) + (f" (batch {v.batch_size})" if v.batch_size != 1 else ""),
                _badge("failed"), "—", "—", "—", "—", "—", "—",
                f'<span class="note">{long_text(v.error, 200)}</span>']
    nan = math.nan
    return [f"<b>{_e(v.variant)}</b>", _badge(v.mode),
            f"{f.corr if f else nan:.6f}", f"{f.max_abs if f else nan:.2g}",
            f"{f.mae if f else nan:.2g}", f"{f.sign_agree if f else nan:.4f}",
            f"{v.compile_seconds:.1f} s" + (" (cached)" if v.cached else ""),
            _bytes(v.artifact_bytes),
            f'<span class="note">degenerate: {_e(f.warning)}</span>' if f and f.degenerate else ""]


def data_note(data: dict[str, Any] | None, n: Any) -> str:
    """What the fidelity figures were measured (and the quantized variants calibrated) on:
    the results' data provenance (hwbackends/samples.py), with a banner for synthetic inputs."""
    v, c = (data or {}).get("validation"), (data or {}).get("calibration")
    if not v:  # a results file from before provenance was recorded
        return f'<p class="note">Compared on {_e(n)} validation samples (their source was not recorded).</p>'
    out = f'<p class="note">Compared on {_e(v["label"])}.'
    if c:
        out += f' Quantized and fixed-point variants calibrated on {_e(c["label"])}.'
    out += "</p>"
    if v.get("synthetic") or (c or {}).get("synthetic"):
        out += ('<div class="emu-banner"><b>Synthetic inputs.</b> No data of the model\'s real '
                "inputs was given, so fidelity (and calibration) used seeded N(0,1) samples: the "
                "figures show that a variant computes what the source model computes on such "
                "inputs, not how it behaves on market data. Pass <code>--validation-data</code> "
                "(and <code>--calibration-data</code>), or <code>validation_data</code> per "
                "strategy in strategies.toml.</div>")
    return out


def _fidelity(ctx: _Ctx) -> str:
    res = ctx.res
    rows = [_fidelity_row(v) for v in res.variants]
    n = next((v.fidelity.n for v in res.variants if v.fidelity), "?")
    data = res.data or next((v.data for v in res.variants if v.data), None)
    return ("<section><h2>Fidelity against the fp32 source model, build cost</h2>"
            + _table(["variant", "mode", "corr", "max abs err", "MAE", "sign agree",
                      "compile time", "artifact", ""], rows, {2, 3, 4, 5, 6, 7})
            + data_note(data, n)
            + '<p class="note"><i>sign agree</i> is the share of outputs whose sign '
              "(trade direction) matches the reference. Compile time is the first build; "
              "“cached” variants were loaded from the artifact store.</p></section>")


def _plugins(ctx: _Ctx) -> str:
    """The plugins' own sections (hook ``hwb_report_sections``: the FPGA plugins' modelled
    cycles and C-simulation fidelity). A plugin whose hook raises, or answers with something
    other than HTML strings, gets a note naming it here instead; the report is still written."""
    answers, failed = ctx.registry.call_each("hwb_report_sections", results=ctx.res)
    out: list[str] = []
    notes = [f"{p.plugin}: {p.error}" for p in failed]
    for plugin, got in answers:
        items = [got] if isinstance(got, str) else list(got or [])
        bad = [x for x in items if not isinstance(x, str)]
        if bad:
            notes.append(f"{plugin}: hwb_report_sections returned {type(bad[0]).__name__}, "
                         f"not HTML strings (plugin bug)")
            continue
        out += [x for x in items if x]
    if notes:
        out.append('<section><h2>Plugin sections left out</h2><p class="note">These plugins '
                   "failed to write their report sections (run <code>hwb targets</code>):</p><ul>"
                   + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul></section>")
    return "".join(out)


def _method(ctx: _Ctx) -> str:
    res = ctx.res
    return f"""<section><h2>How this was measured</h2><p class="note">
Each variant runs its compiled artifact through <code>predict_into</code> (preallocated buffers,
no allocation per call), timed with <code>perf_counter_ns</code> around each call, after a
warm-up, with the garbage collector paused. <b>single-stream</b>: closed loop, one call after
another. <b>server</b>: open loop with seeded Poisson arrivals. <b>burst</b>: open-loop replay of
a seeded tick trace (quiet periods and bursts); both also run the same loop over a no-op (the
noise floor){_e(_affinity(res))}. <b>batch</b>: closed loop at N samples per call. <b>sliding</b>:
one new step per tick through <code>cm.sliding()</code>, the prepare timed apart, the full window
interleaved; under load, per count of windows, ticks round-robin (closed loop) and Poisson ticks
at offered rates (open loop, from each tick's scheduled arrival).
Percentiles are over all timed calls (n per row). Machine: {_e(machine_line(res.machine))}
(fingerprint {_e(res.machine.get('id', ''))}).{' Command: <code>' + _e(res.command) + '</code>' if res.command else ''}
</p></section>
<footer>hwbackends hardware-evaluation report · results format v{RESULTS_VERSION} · generated
{_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}</footer></main></body></html>"""


#: The report's sections in order (each ``f(ctx) -> str``; "" leaves it out).
SECTIONS: list[Callable[[_Ctx], str]] = [
    _head, _summary, _fleet, _routing_section, _availability, _single_stream, _sliding, _server,
    _burst, _batch,
    _fidelity, _plugins, _method,
]


#: What the open-loop tables' last column means.
FLOOR_NOTE = ('<p class="note"><i>No-op floor</i>: the same loop, same arrivals, over a call '
              'that does nothing, in the same run: the harness\'s and the machine\'s own tail. '
              f'<b>p99 at the noise floor</b> marks a p99 within {FLOOR_FACTOR:g}× of it: that '
              'tail says nothing about the variant.</p>')


def _affinity(res: BenchResults) -> str:
    """Where the open loops ran, from the results' machine info (" " + a sentence, or "")."""
    a = res.machine.get("open_loop") or {}
    if not a:
        return ""
    cpus = a.get("measured_cpus")
    return (f"; the measuring thread on CPU {', '.join(map(str, cpus))} ({a.get('pinned_by')})"
            if cpus else f"; not pinned ({a.get('pinned_by')})")


def _load_note(ps: list[LatencyProfile], res: BenchResults) -> str:
    """Open-loop tails on a shared machine include time the measuring thread was descheduled:
    say so when the load average exceeded the cores."""
    loads = [p.params.get("loadavg_1m") for p in ps if p.params.get("loadavg_1m") is not None]
    cores = res.machine.get("usable_cores") or res.machine.get("cores") or 1
    if not loads or max(loads) <= cores:
        return ""
    return (f'<div class="emu-banner"><b>Shared machine.</b> The 1-minute load average was '
            f"{min(loads):.1f}–{max(loads):.1f} on {cores} cores during these runs: other work "
            f"competed for the CPUs, so open-loop tails include time the measuring thread waited "
            f"to be scheduled. Re-run on an idle machine (and with <code>--pin</code>) for "
            f"figures to compare with other hardware.</div>")


def _profile_table(ps: list[LatencyProfile], server: bool = False) -> str:
    head = ["variant", "mode", "batch", "n", "p50", "p90", "p95", "p99", "p99.9", "max", "samples/s"]
    if server:
        head.insert(3, "offered")
        head += ["achieved/s", "mean queue wait", "no-op floor p99"]
    rows = []
    for p in ps:
        r = [f"<b>{_e(p.variant)}</b>" + (" ⚠ interrupted" if p.interrupted else ""), _badge(p.mode),
             str(p.batch_size), f"{p.n:,}", fmt_us(p.p50_us), fmt_us(p.p90_us), fmt_us(p.p95_us), fmt_us(p.p99_us),
             fmt_us(p.p999_us), fmt_us(p.max_us), f"{p.throughput:,.0f}"]
        if server:
            offered, achieved = p.offered_per_s, p.achieved_per_s
            r.insert(3, f"{offered:,.0f}/s" if offered is not None else "—")
            r.append(f"{achieved:,.0f}" if achieved is not None else "—")
            r.append(fmt_us(p.queue_mean_us))
            nf = p.noise_floor or {}
            r.append(fmt_us(nf.get("p99_us")) + ('<br><span class="over">p99 at the noise floor</span>'
                                                  if p.at_noise_floor else ""))
        rows.append(r)
    num = set(range(2, len(head)))
    return _table(head, rows, num)
