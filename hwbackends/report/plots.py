"""The report's plots: matplotlib (Agg) rendered to inline SVG strings (self-contained)."""
from __future__ import annotations

import io
from typing import Any, Sequence

from ..bench.profile import LatencyProfile


def _mpl() -> Any:
    try:
        import matplotlib
    except ImportError:
        from ..errors import UnavailableError
        raise UnavailableError("the report's plots need matplotlib: pip install 'hwbackends[report]' "
                               "(the cpu extra has it); `hwb report RESULTS --csv` prints the "
                               "tables without it") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"svg.fonttype": "path", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
                         "legend.fontsize": 8, "legend.frameon": False})
    return plt


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    _mpl().close(fig)
    s = buf.getvalue()
    return s[s.index("<svg"):]


def colors(variants: Sequence[str]) -> dict[str, str]:
    """One stable colour per variant across every plot."""
    plt = _mpl()
    cmap = plt.get_cmap("tab10" if len(variants) <= 10 else "tab20")
    return {v: "#%02x%02x%02x" % tuple(int(255 * c) for c in cmap(i % cmap.N)[:3])
            for i, v in enumerate(variants)}


def _label(p: LatencyProfile) -> str:
    return p.variant + (" (emulated)" if p.emulated else "")


def _style(p: LatencyProfile) -> str:
    return "--" if p.emulated else "-"


def _legend_right(ax: Any, source: Any = None) -> None:
    """Legend outside the axes, on the right: lines stay visible whatever their number."""
    h, l = (source or ax).get_legend_handles_labels()
    if h:
        ax.legend(h, l, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def cdf(profiles: list[LatencyProfile], col: dict[str, str], title: str) -> str:
    plt = _mpl()
    fig, ax = plt.subplots(figsize=(8.6, 3.6))
    for p in profiles:
        if not p.cdf:
            continue
        q = [c[0] for c in p.cdf]
        us = [max(c[1], 1e-3) for c in p.cdf]
        ax.plot(us, q, _style(p), color=col.get(p.variant), label=_label(p), lw=1.6)
    ax.set_xscale("log")
    ax.set_xlabel("latency per call (µs, log scale)")
    ax.set_ylabel("fraction of calls ≤ x")
    ax.axhline(0.99, color="#888", lw=0.8, ls=":")
    ax.text(ax.get_xlim()[0], 0.99, " p99", va="bottom", fontsize=7, color="#666")
    ax.set_title(title, loc="left", fontsize=10)
    _legend_right(ax)
    return _svg(fig)


def batch(profiles: list[LatencyProfile], col: dict[str, str]) -> str:
    plt = _mpl()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.2, 3.4))
    by: dict[str, list[LatencyProfile]] = {}
    for p in profiles:
        by.setdefault(p.variant, []).append(p)
    for v, ps in by.items():
        ps.sort(key=lambda p: p.batch_size)
        xs = [p.batch_size for p in ps]
        a1.plot(xs, [p.p99_us for p in ps], _style(ps[0]) + "o", color=col.get(v), label=_label(ps[0]), ms=3)
        a2.plot(xs, [p.throughput for p in ps], _style(ps[0]) + "o", color=col.get(v), ms=3)
    from matplotlib.ticker import FuncFormatter, NullFormatter
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("batch size (symbols per tick)")
        a.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a1.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a1.yaxis.set_minor_formatter(NullFormatter())
    a1.set_ylabel("p99 per tick (µs)")
    a2.set_ylabel("throughput (samples/s)")
    a1.set_title("p99 latency vs batch size", loc="left", fontsize=10)
    a2.set_title("throughput vs batch size", loc="left", fontsize=10)
    _legend_right(a2, a1)
    fig.tight_layout()
    return _svg(fig)


def burst(profiles: list[LatencyProfile], col: dict[str, str]) -> str:
    plt = _mpl()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10.2, 4.6), sharex=True,
                                 gridspec_kw={"height_ratios": [1, 2]})
    first = next(p for p in profiles if p.timeline)
    t = first.timeline
    a1.fill_between(t["t_s"], t["rate_hz"], step="mid", color="#9aa7b8", alpha=0.8)
    a1.set_ylabel("arrivals (ticks/s)")
    a1.set_title("burst replay: tick arrival rate (top) and p99 latency per time bin (bottom)",
                 loc="left", fontsize=10)
    for p in profiles:
        if not p.timeline:
            continue
        tl = p.timeline
        pts = [(x, y) for x, y in zip(tl["t_s"], tl["p99_us"], strict=True) if y == y and y > 0]
        if pts:
            a2.plot([x for x, _ in pts], [y for _, y in pts], _style(p), color=col.get(p.variant),
                    label=_label(p), lw=1.2)
    a2.set_yscale("log")
    a2.set_ylabel("p99 in bin (µs, log)")
    a2.set_xlabel("time since the start of the trace (s)")
    _legend_right(a2)
    fig.tight_layout()
    return _svg(fig)


def server_load(profiles: list[LatencyProfile], col: dict[str, str]) -> str:
    plt = _mpl()
    fig, ax = plt.subplots(figsize=(7.2, 3.4))
    by: dict[str, list[LatencyProfile]] = {}
    for p in profiles:
        by.setdefault(p.variant, []).append(p)
    for v, ps in by.items():
        # offered_per_s: the rate as a number, or None for one a results file spells otherwise
        ps = sorted((p for p in ps if p.offered_per_s is not None), key=lambda p: p.offered_per_s)
        if not ps:
            continue
        ax.plot([p.offered_per_s / (p.batch_size or 1) for p in ps], [p.p99_us for p in ps],
                _style(ps[0]) + "o", color=col.get(v), label=_label(ps[0]), ms=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (Poisson arrivals per second)")
    ax.set_ylabel("p99 from scheduled arrival (µs)")
    ax.set_title("server scenario: p99 vs offered load", loc="left", fontsize=10)
    _legend_right(ax)
    return _svg(fig)


def sliding_load(profiles: list[LatencyProfile], col: dict[str, str]) -> str:
    """The sliding load sweep: p99 (and p50, thin) against offered aggregate tick rate, one
    curve per variant and count of windows (marker per count), the budget as a line."""
    plt = _mpl()
    fig, ax = plt.subplots(figsize=(7.6, 3.6))
    markers = "osD^v<>ph*"
    budgets = set()
    for p in profiles:
        load = (p.sliding or {}).get("load") or {}
        if load.get("budget_us"):
            budgets.add(float(load["budget_us"]))
        for j, pt in enumerate(load.get("points", [])):
            o = sorted((q for q in pt.get("open", []) if q.get("n")), key=lambda q: q["offered_hz"])
            if not o:
                continue
            xs = [q["offered_hz"] for q in o]
            ax.plot(xs, [q["p99_us"] for q in o], _style(p) + markers[j % len(markers)],
                    color=col.get(p.variant), ms=3.5, lw=1.2,
                    label=f"{_label(p)} NMI {pt['streams']} p99")
            ax.plot(xs, [q["p50_us"] for q in o], ":", color=col.get(p.variant), lw=0.8)
    for b in sorted(budgets):
        ax.axhline(b, color="#b3261e", lw=0.8, ls="--")
        ax.annotate(f"budget {b:g} µs", (0.01, b), xycoords=("axes fraction", "data"),
                    fontsize=7, color="#b3261e", va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered tick rate, all windows (Poisson ticks per second, one core)")
    ax.set_ylabel("latency from scheduled tick (µs)")
    ax.set_title("sliding load sweep: p99 (p50 dotted) vs offered tick rate", loc="left",
                 fontsize=10)
    _legend_right(ax)
    return _svg(fig)
