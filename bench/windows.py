"""Many windows over one model, as STAC-ML counts them (NMI: number of model instances, one
input stream each): per NMI, cpu.native's ``sliding(streams=NMI)`` with ticks taken round-robin
over the windows, each tick's ``push_into`` (tick → answer) and its window's ``prepare`` timed
apart, and the rate one core sustains (ticks ÷ the time of their pushes and prepares); then
``push_many`` with every window's tick at once (the symbols of one market event), per call and
per tick; then the same from C++ (examples/windows_push.cpp --bench) when g++ builds it.

Every push takes a new step (cycled from 4,096 seeded ones). Each NMI's loops are timed in
one process; NMIs take turns in ``--rounds`` rounds so a shared machine's noise hits them
alike. The answers are checked: after the timed ticks every window's last answer equals
``predict_into`` on its own window (fp32 within 1e-5).

    .venv/bin/python bench/windows.py [--model lstm_a] [--nmi 1,2,4,8,24] [--ticks 2000]
        [--rounds 3] [--push-weights int8] [--cpp]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]


def closed_loop(ws, steps: np.ndarray, ticks: int, k0: int,
                hist: list[list[int]] | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Round-robin ticks over ``ws``'s windows: push ns, prepare ns, and the wall seconds
    (``hist``: each window's step indices, appended outside the timed calls)."""
    n = ws.streams
    out = np.zeros(ws.output_shape, np.float32)
    push = np.zeros(ticks, np.int64)
    prep = np.zeros(ticks, np.int64)
    clock = time.perf_counter_ns
    k = len(steps)
    start = clock()
    for t in range(ticks):
        x = steps[(k0 + t) % k]
        t0 = clock()
        ws.push_into(t % n, x, out)
        t1 = clock()
        ws.prepare()
        prep[t] = clock() - t1
        push[t] = t1 - t0
        if hist is not None:
            hist[t % n].append((k0 + t) % k)
    return push, prep, (clock() - start) / 1e9


def many_loop(ws, steps: np.ndarray, rounds: int, hist: list[list[int]]) -> np.ndarray:
    """``push_many`` of every window's tick, then the prepares: ns per call."""
    n = ws.streams
    ids = np.arange(n, dtype=np.int64)
    outs = np.zeros((n, *ws.output_shape), np.float32)
    took = np.zeros(rounds, np.int64)
    clock = time.perf_counter_ns
    for r in range(rounds):
        idx = (r * n + ids) % len(steps)
        xs = np.ascontiguousarray(steps[idx])
        t0 = clock()
        ws.push_many(ids, xs, outs)
        took[r] = clock() - t0
        ws.prepare()
        for i, j in enumerate(idx.tolist()):
            hist[i].append(j)
    return took


def check_answers(cm, ws, steps: np.ndarray, hist: list[list[int]]) -> float:
    """Each window's answer to one more tick against predict_into on its own last ticks."""
    n, t = ws.streams, cm.input.shape[0]
    worst = 0.0
    out = np.zeros(ws.output_shape, np.float32)
    for i in range(n):
        mine = [steps[j] for j in hist[i][-(t - 1):]]
        x = steps[(7 * i + 1) % len(steps)]
        ws.push_into(i, x, out)
        win = np.zeros(cm.input.shape, np.float32)
        seq = [*mine, x][-t:]
        win[t - len(seq):] = np.stack(seq)
        want = cm.predict(win[None])[0]
        worst = max(worst, float(np.abs(out - want).max()) / max(1.0, float(np.abs(want).max())))
    return worst


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) / 1e3


def cpp_bench(cm, nmis: list[int], ticks: int) -> list[str]:
    if shutil.which("g++") is None:
        return ["(g++ not found: no C++ figures)"]
    from hwbackends.registry import get_registry

    lines = []
    with tempfile.TemporaryDirectory() as d:
        lib = Path(d) / "lib"
        get_registry().target("cpu.native").export(cm.artifact, "c", lib)
        exe = Path(d) / "windows_push"
        subprocess.run(["g++", "-O2", "-std=c++17", f"-I{lib}", str(ROOT / "examples" / "windows_push.cpp"),
                        str(lib / "libhwb_model.so"), f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
        for n in nmis:
            r = subprocess.run([str(exe), "--bench", str(n), str(ticks)], capture_output=True, text=True,
                               check=True)
            lines.append("C++ " + r.stdout.strip())
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="lstm_a")
    ap.add_argument("--nmi", default="1,2,4,8,24")
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--push-weights", default="", help="also a variant with this push_weights (int8, bf16, …)")
    ap.add_argument("--cpp", action="store_true", help="also time examples/windows_push.cpp per NMI")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import hwbackends as hwb
    from hwbackends.machine import cpu_model, isa

    nmis = [int(v) for v in args.nmi.split(",")]
    model = hwb.load_model(f"zoo:{args.model}")
    variants = [hwb.compile(model, "cpu.native", "fp32", fidelity=False)]
    if args.push_weights:  # labelled cpu.native:fp32+push=KIND
        variants.append(hwb.compile(model, "cpu.native", "fp32", options={"push_weights": args.push_weights}))
    steps = np.random.default_rng(0).normal(size=(4096, *model.inputs[0].shape[1:])).astype(np.float32)
    print(f"# {args.model} on cpu.native, {cpu_model()} ({isa()}); {args.ticks} ticks per NMI per round, "
          f"{args.rounds} rounds (Python, one core)")
    for cm in variants:
        stats: dict[int, list] = {n: [] for n in nmis}
        sets = {n: cm.sliding(streams=n, auto_prepare=False) for n in nmis}
        hists = {n: [[] for _ in range(n)] for n in nmis}
        for r in range(args.rounds):
            for n in nmis:
                stats[n].append(closed_loop(sets[n], steps, args.ticks, r * args.ticks, hists[n]))
        print(f"\n{cm.variant}")
        print(f"{'NMI':>4} {'push p50':>9} {'p99':>7} {'p99.9':>7} {'prepare p50':>12} {'p99':>7} "
              f"{'ticks/s/core':>13} {'push_many/tick':>15} {'max err':>8}")
        for n in nmis:
            push = np.concatenate([s[0] for s in stats[n]])
            prep = np.concatenate([s[1] for s in stats[n]])
            rate = len(push) / sum(s[2] for s in stats[n])
            many = many_loop(sets[n], steps, max(50, args.ticks // n), hists[n])
            err = check_answers(cm, sets[n], steps, hists[n])
            print(f"{n:>4} {pct(push, 50):>8.2f}µ {pct(push, 99):>6.2f}µ {pct(push, 99.9):>6.2f}µ "
                  f"{pct(prep, 50):>11.1f}µ {pct(prep, 99):>6.1f}µ {rate:>13,.0f} "
                  f"{np.median(many) / 1e3 / n:>14.2f}µ {err:>8.1e}")
        if cm.artifact.meta.get("sliding", {}).get("stream"):
            ss = cm.streaming(streams=max(nmis), auto_prepare=False)
            push, prep, secs = closed_loop(ss, steps, args.ticks * args.rounds, 0)
            print(f"streaming(streams={max(nmis)}) (state kept, one step a tick): push p50 "
                  f"{pct(push, 50):.2f}µ p99 {pct(push, 99):.2f}µ, prepare p50 {pct(prep, 50):.2f}µ; "
                  f"{len(push) / secs:,.0f} ticks/s/core")
        if args.cpp:
            print("\n".join(cpp_bench(cm, nmis, args.ticks)))
    print("\nreference (audited, STAC-ML LSTM_A): VOLLO 5.07 µs p99 at NMI 1-4, 6.96 µs at NMI 24, "
          "1.4 M inferences/s on 4 FPGA cards (2023); GH200 4.61 µs p99 (2025)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
