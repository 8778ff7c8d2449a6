"""Placement advice from a fleet results file: for each strategy, on which machine and with
which variant it meets its tier. The router's own policy (:func:`hwbackends.router.decide`:
fidelity gate, emulated rule, pin, ``hwb_choose`` plugins, lowest p99 within budget) applied
to each machine's measured profiles, then the best machine overall.

The live router stays per process; this is advice for where to deploy it."""
from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bench.profile import LatencyProfile
from ..bench.results import BenchResults
from ..fidelity import Fidelity

if TYPE_CHECKING:  # pragma: no cover
    from ..config import StrategiesFile, StrategyConfig
    from ..registry import Registry
    from ..router import Candidate


def _node(row: dict[str, Any] | LatencyProfile) -> str:
    m = row.machine if isinstance(row, LatencyProfile) else row.get("machine") or {}
    return str(m.get("node_id") or m.get("id") or "?")


def _same_model(strategy_model: str, measured: dict[str, Any]) -> bool:
    name = str(measured.get("name", ""))
    return strategy_model in (name, f"zoo:{name}") or Path(strategy_model).stem == name


def candidates(res: BenchResults, node: str, name: str, s: "StrategyConfig",
               cfg: "StrategiesFile") -> list["Candidate"]:
    """The router's candidates for strategy ``name`` on one machine, from its measured rows:
    unavailable/failed rows keep their reason; fidelity and the emulated rule as in
    :func:`hwbackends.router.plan_strategy`; the profile is the machine's single-stream one at
    the strategy's batch size."""
    from ..router import Candidate

    tol = s.fidelity.tolerance()
    allow_emulated = cfg.router.allow_emulated if s.allow_emulated is None else s.allow_emulated

    def wanted(target: str) -> bool:
        return any(fnmatch.fnmatchcase(target, p) for p in s.targets)

    cands: list[Candidate] = []
    for a in res.availability:
        if _node(a) == node and wanted(a["target"]) and a["mode"] == "unavailable":
            cands.append(Candidate(name, a["target"], "", "unavailable", "unavailable",
                                   [a.get("reason", "")]))
    for v in res.variants:
        if _node(v) != node or not wanted(v["target"]):
            continue
        if s.precisions and v["precision"] not in s.precisions:
            continue
        c = Candidate(name, v["target"], v["precision"], v.get("mode") or "unknown")
        cands.append(c)
        if v.get("error"):
            c.status, c.reasons = "failed", [str(v["error"])[:300]]
            continue
        c.fidelity = v.get("fidelity")
        bad = tol.violations(Fidelity(**c.fidelity)) if c.fidelity else ["no fidelity measured"]
        if bad:
            c.status, c.reasons = "rejected", ["fidelity: " + ", ".join(bad)]
            continue
        if c.mode == "emulated" and not allow_emulated:
            c.status, c.reasons = "rejected", ["emulated: its latency is not this hardware's; "
                                               "set allow_emulated = true to rank it"]
            continue
        prof = [p for p in res.profiles if _node(p) == node and p.target == c.target
                and p.precision == c.precision and p.scenario == "single-stream"
                and p.batch_size == s.batch_size and not p.interrupted]
        if not prof:
            c.status, c.reasons = "failed", [f"no single-stream profile at batch {s.batch_size} "
                                             f"on this machine"]
            continue
        c.profile = max(prof, key=lambda p: p.created)  # the newest
        c.status = "candidate"
    return cands


def place(res: BenchResults, config: str | Path, registry: "Registry | None" = None) -> list[dict[str, Any]]:
    """Per strategy: the router's decision on each machine and the best machine overall
    (the lowest chosen p99 among machines meeting the tier; else the closest)."""
    from ..config import load_config
    from ..registry import get_registry
    from ..router import decide

    reg = registry or get_registry()
    cfg = load_config(config, reg)
    nodes = {n["node_id"]: n for n in (res.fleet or {}).get("nodes", [])}
    if not nodes:  # a one-machine results file is a fleet of one
        nodes = {str(res.machine.get("id", "?")): {"node_id": str(res.machine.get("id", "?")),
                                                    "label": res.machine.get("cpu", "this machine")}}
    out = []
    for name, s in cfg.strategies.items():
        budget = cfg.tiers[s.tier].p99_us
        row: dict[str, Any] = {"strategy": name, "tier": s.tier, "budget_us": budget,
                               "machines": [], "best": None, "note": ""}
        out.append(row)
        if not _same_model(s.model, res.model):
            row["note"] = (f"strategy model {s.model} was not measured in this run "
                           f"(it measured {res.model.get('name')})")
            continue
        for node, n in nodes.items():
            d = decide(name, s, budget, candidates(res, node, name, s, cfg), reg)
            row["machines"].append({"node_id": node, "label": n.get("label"),
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
    """The table ``hwb route --fleet`` prints."""
    def us(v: float | None) -> str:
        return "—" if v is None else f"{v:.2f} µs" if v < 10 else f"{v:,.1f} µs"

    lines = [f"{'STRATEGY':<16} {'TIER':<9} {'BUDGET':>10}  {'MACHINE':<22} {'VARIANT':<24} "
             f"{'MODE':<9} {'p99':>10}"]
    for r in placement:
        for m in r["machines"]:
            d = m["decision"]
            best = r["best"] and r["best"]["node_id"] == m["node_id"]
            flag = ("  ← best" if best else "") + ("" if d["meets_budget"] else
                                                   "  ! over budget" if d["chosen"] else "  ! no variant")
            lines.append(f"{r['strategy']:<16} {r['tier']:<9} {us(r['budget_us']):>10}  "
                         f"{str(m['label'])[:22]:<22} {(d['chosen'] or 'NONE'):<24} "
                         f"{(d['chosen_mode'] or ''):<9} {us(d['chosen_p99_us']):>10}{flag}")
        if r["note"]:
            lines.append(f"{r['strategy']:<16} {r['note']}")
    return "\n".join(lines)
