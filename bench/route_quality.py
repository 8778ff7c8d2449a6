"""Routing quality: the chosen variant's p99 against the best variant measured in the same run.

    .venv/bin/python bench/route_quality.py [--config examples/strategies.toml] [--rounds 20] [--n 2000]

Builds the router (fresh profiles: ``reuse_profiles=False``), then measures every eligible candidate
of every strategy again, interleaved in rounds (each round measures each candidate once, so
machine noise falls on all of them alike), pools the samples per candidate and prints, per
strategy, the chosen variant's pooled p99 over the best pooled p99 among its candidates
within budget. Target: ≤ 1.10.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from hwbackends.bench.harness import input_set
from hwbackends.bench.scenarios import closed_loop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "examples" / "strategies.toml"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--n", type=int, default=2000)
    a = ap.parse_args()
    from hwbackends.router import Router

    router = Router.from_config(a.config, reuse_profiles=False, strict=False)
    worst = 0.0
    for d in router.decisions.values():
        if not d.order:
            print(f"{d.strategy}: no variant ({d.note})")
            continue
        cands = [c for c in d.order if c.target != "ref"] or d.order
        pools: dict[str, list[np.ndarray]] = {c.variant: [] for c in cands}
        for _ in range(a.rounds):
            for c in cands:
                xs = input_set(None, c.cm, c.cm.batch_size)
                out = np.zeros(c.cm.output.batched(c.cm.batch_size), np.float32)
                pools[c.variant].append(closed_loop(c.cm.predict_into, xs, out, a.n, 5.0, 50).latency_ns)
        p99 = {v: float(np.quantile(np.concatenate(x), 0.99)) / 1e3 for v, x in pools.items()}
        within = {v: p for v, p in p99.items() if p <= d.budget_us} or p99
        best_v = min(within, key=within.get)
        ratio = p99[d.chosen.variant] / within[best_v]
        worst = max(worst, ratio)
        print(f"{d.strategy:<16} tier {d.tier:<9} chosen {d.chosen.variant:<22} p99 {p99[d.chosen.variant]:7.2f} µs"
              f" | best {best_v:<22} p99 {within[best_v]:7.2f} µs | ratio {ratio:.3f}"
              f"  ({len(cands)} candidates × {a.rounds} rounds × {a.n} calls)")
    print(f"worst ratio {worst:.3f} ({'OK' if worst <= 1.10 else 'OVER'} vs 1.10)")


if __name__ == "__main__":
    main()
