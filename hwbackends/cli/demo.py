"""``hwb demo``: the main job on the bundled signal model: every available target and
precision → compile → fidelity → batch-1 latency, as a table."""
from __future__ import annotations

import argparse
import time

import numpy as np

from . import emit, stderr_progress


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the bundled signal model on every available target")
    p.add_argument("--model", default="zoo:signal", help="model (default: zoo:signal)")
    p.add_argument("--n", type=int, default=2000, help="timed calls per variant")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def quick_latency(cm: object, n: int) -> dict[str, float]:
    x = np.zeros(cm.input.batched(cm.batch_size), np.float32)  # type: ignore[attr-defined]
    out = np.zeros(cm.output.batched(cm.batch_size), np.float32)  # type: ignore[attr-defined]
    f = cm.predict_into  # type: ignore[attr-defined]
    clock = time.perf_counter_ns
    ts = np.empty(n, np.int64)
    for i in range(n):
        t0 = clock()
        f(x, out)
        ts[i] = clock() - t0
    us = ts / 1e3
    return {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)), "n": n}


def run(args: argparse.Namespace) -> int:
    from .. import compile as hwb_compile
    from ..errors import HwbError
    from ..models import load_model
    from ..registry import get_registry

    model = load_model(args.model)
    reg = get_registry()
    rows = []
    for name in sorted(reg.targets):
        t = reg.targets[name]
        av = t.probe()
        if not av.usable:
            rows.append({"variant": name, "mode": "unavailable", "reason": av.reason})
            continue
        for prec in t.precisions:
            try:
                cm = hwb_compile(model, name, prec, progress=None if args.json else stderr_progress)
            except HwbError as exc:
                rows.append({"variant": f"{name}:{prec}", "mode": "failed", "reason": str(exc)[:200]})
                continue
            lat = quick_latency(cm, args.n if name != "ref" else min(args.n, 200))
            rows.append({"variant": cm.variant, "mode": cm.mode.value,
                         "fidelity": cm.fidelity.to_dict() if cm.fidelity else None, **lat})
    lines = [f"model {model.name} ({model.fingerprint[:12]}), batch 1, single stream",
             f"{'VARIANT':<28} {'MODE':<11} {'p50 µs':>9} {'p99 µs':>9} {'corr':>9} {'max abs':>9}"]
    for r in rows:
        if "p50_us" in r:
            f = r["fidelity"] or {}
            lines.append(f"{r['variant']:<28} {r['mode']:<11} {r['p50_us']:>9.1f} {r['p99_us']:>9.1f} "
                         f"{f.get('corr', float('nan')):>9.6f} {f.get('max_abs', float('nan')):>9.2g}")
        else:
            lines.append(f"{r['variant']:<28} {r['mode']:<11} {r['reason']}")
    emit(args, {"model": model.describe(), "rows": rows}, "\n".join(lines))
    return 0
