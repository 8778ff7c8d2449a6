"""Placement advice from a fleet results file: for each strategy, on which machine and with
which variant it meets its tier. The router's own policy (:func:`hwbackends.router.plan.judge`:
fidelity gate, modelled and emulated rules; :func:`hwbackends.router.decide`: pin,
``hwb_choose`` plugins, lowest p99 within budget) applied to each machine's variant records
and measured profiles, then the best machine overall.

The live router stays per process; this is advice for where to deploy it."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bench.results import BenchResults
from ..units import fmt_us

if TYPE_CHECKING:  # pragma: no cover
    from ..registry import Registry


def place(res: BenchResults, config: str | Path, registry: "Registry") -> list[dict[str, Any]]:
    """Per strategy: the router's decision on each machine and the best machine overall
    (the lowest chosen p99 among machines meeting the tier; else the closest). Each machine's
    candidates are its variant records judged by the router's own policy
    (:func:`hwbackends.router.plan.decide_from_results`, with the run's ``registry``),
    with its measured profiles."""
    from ..config import load_config
    from ..router.plan import decide_from_results, unmeasured_model

    cfg = load_config(config, registry)
    nodes: dict[str | None, dict[str, Any]] = {n["node_id"]: n for n in (res.fleet or {}).get("nodes", [])}
    if not nodes:  # a one-machine results file is a fleet of one: every row is its
        nodes = {None: {"node_id": str(res.machine.get("id", "?")),
                        "label": res.machine.get("cpu", "this machine")}}
    out = []
    for name, s in cfg.strategies.items():
        budget = cfg.tiers[s.tier].p99_us
        row: dict[str, Any] = {"strategy": name, "tier": s.tier, "budget_us": budget,
                               "machines": [], "best": None, "note": ""}
        out.append(row)
        row["note"] = unmeasured_model(s, res)
        if row["note"]:
            continue
        for node, n in nodes.items():
            d = decide_from_results(res, name, s, cfg, registry, node)
            row["machines"].append({"node_id": n["node_id"], "label": n.get("label"),
                                    "decision": d.to_dict()})
        chosen = [m for m in row["machines"] if m["decision"]["chosen"]]
        if chosen:
            best = min(chosen, key=lambda m: (not m["decision"]["meets_budget"],
                                              m["decision"]["chosen_p99_us"]))
            d = best["decision"]
            row["best"] = {"node_id": best["node_id"], "label": best["label"],
                           "variant": d["chosen"], "mode": d["chosen_mode"],
                           "p99_us": d["chosen_p99_us"], "meets_budget": d["meets_budget"]}
        else:
            row["note"] = "no machine of the fleet can serve this strategy"
    return out


def render(placement: list[dict[str, Any]]) -> str:
    """The table ``hwb route --fleet-results`` prints."""
    lines = [f"{'STRATEGY':<16} {'TIER':<9} {'BUDGET':>10}  {'MACHINE':<22} {'VARIANT':<24} "
             f"{'MODE':<9} {'p99':>10}"]
    for r in placement:
        for m in r["machines"]:
            d = m["decision"]
            best = r["best"] and r["best"]["node_id"] == m["node_id"]
            flag = ("  ← best" if best else "") + ("" if d["meets_budget"] else
                                                   "  ! over budget" if d["chosen"] else "  ! no variant")
            lines.append(f"{r['strategy']:<16} {r['tier']:<9} {fmt_us(r['budget_us']):>10}  "
                         f"{str(m['label'])[:22]:<22} {(d['chosen'] or 'NONE'):<24} "
                         f"{(d['chosen_mode'] or ''):<9} {fmt_us(d['chosen_p99_us']):>10}{flag}")
        if r["note"]:
            lines.append(f"{r['strategy']:<16} {r['note']}")
    return "\n".join(lines)
