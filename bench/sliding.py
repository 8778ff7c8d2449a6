"""The sliding window, one interleaved run: per model, cpu.native's
``push_into`` (tick → answer) and its ``prepare`` timed apart, the full window
(``predict_into``) on cpu.native and on cpu.onnxruntime, and a no-op through the same timed
call (the floor); then the answers: max |push − predict_into on the window| over N ticks; and
the same push from C++ (examples/sliding_push.cpp --bench) when g++ can build it.

``--push-weights fast,bf16,f16,int8`` (the default; ``""`` for none) adds, per model with an
incremental recurrent push, cpu.native variants compiled with that ``push_weights`` option
(``fast``: fp32 weights with ``push_gates="fast"``; ``bf16``, ``f16``, ``int8``; a suffix
``@<isa>`` builds it for that ``isa`` option, e.g. ``int8@x86-64-v3`` for the AVX2 forms on an
AVX-512 CPU, ``fp32@x86-64-v3`` the exact push beside them), where this CPU has the
feature: their push and prepare timed in the same interleaved rounds, their answers
against the fp32 window (they are not bit-equal: gated by their family's tolerance at compile),
and all of a model's pushes from C++ in one process, interleaved in blocks
(bench/sliding_push_weights.cpp, each library dlopen'ed on its own).

Each call is timed on its own (``perf_counter_ns`` before and after, the timer included, as a
strategy's own timing would be); the callables take turns in blocks of ``--block`` calls,
``--rounds`` times, so a shared machine's noise hits them alike. Every push takes a new step
(cycled from 4,096 seeded ones), never one tick repeated.

    .venv/bin/python bench/sliding.py [--rounds 20] [--block 1000] [--ticks 10000]
        [--models lstm,conv1d,lstm_a,lstm_b] [--push-weights fast,bf16,f16,int8] [--quick]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]


def push_block(push, prepare, steps, out, push_ns, prep_ns, start: int, n: int, k0: int) -> None:
    clock = time.perf_counter_ns
    k = len(steps)
    for i in range(start, start + n):
        x = steps[(k0 + i) % k]
        t0 = clock()
        push(x, out)
        t1 = clock()
        prepare()
        prep_ns[i] = clock() - t1
        push_ns[i] = t1 - t0


def call_block(f, x, out, samples: np.ndarray, start: int, n: int) -> None:
    clock = time.perf_counter_ns
    for i in range(start, start + n):
        t0 = clock()
        f(x, out)
        samples[i] = clock() - t0


def noop(x, out) -> None:
    """The floor: a Python call that does nothing, timed like the others."""


def max_error(cm, ticks: int, seed: int = 5) -> float:
    """max |push_into − predict_into on the window ending at the tick| over ``ticks`` ticks."""
    w = cm.sliding()
    step = tuple(cm.input.shape[1:])
    xs = np.random.default_rng(seed).standard_normal((ticks, *step)).astype(np.float32)
    y = np.zeros(cm.output.shape, np.float32)
    full = np.zeros(cm.output.batched(1), np.float32)
    win = np.zeros((1, *cm.input.shape), np.float32)
    worst = 0.0
    for i in range(ticks):
        w.push_into(xs[i], y)
        win[0, :-1] = win[0, 1:]
        win[0, -1] = xs[i]
        cm.predict_into(win, full)
        worst = max(worst, float(np.abs(y - full[0]).max()))
    return worst


def cpp_push(cm, workdir: Path, ticks: int) -> str:
    """examples/sliding_push.cpp --bench on the exported library, or why it was not run."""
    gxx = shutil.which("g++")
    src = ROOT / "examples" / "sliding_push.cpp"
    if gxx is None or not src.exists():
        return "not measured (" + ("g++ not found" if gxx is None else f"{src.name} missing") + ")"
    from hwbackends.registry import get_registry
    get_registry().target("cpu.native").export(cm.artifact, "c", workdir)
    exe = workdir / "sliding_push"
    try:
        subprocess.run([gxx, "-O2", "-std=c++17", f"-I{workdir}", str(src),
                        str(workdir / "libhwb_model.so"), f"-Wl,-rpath,{workdir}", "-o", str(exe)],
                       check=True, capture_output=True, text=True, timeout=300)
        res = subprocess.run([str(exe), "--bench", str(ticks)], check=True, capture_output=True,
                             text=True, timeout=300)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return f"not measured ({type(exc).__name__}: {getattr(exc, 'stderr', '') or exc})"
    return res.stdout.strip()


def push_weights_variants(hwb, name: str, nat, kinds: list[str]) -> tuple[dict, list[str]]:
    """The cpu.native variants of zoo:``name`` with each ``push_weights`` kind, and notes on
    the kinds left out (no incremental recurrent push, a CPU feature missing)."""
    from hwbackends.errors import HwbError

    got, notes = {}, []
    if not kinds:
        return got, notes
    if nat.artifact.meta.get("sliding", {}).get("form") != "incremental" or not nat.artifact.meta.get(
            "sliding", {}).get("stream"):
        return got, [f"{name}: push_weights needs an incremental recurrent push; left out"]
    for kind in kinds:
        base, _, isa = kind.partition("@")  # int8@x86-64-v3: the AVX2 forms on an AVX-512 CPU
        opts = {"push_gates": "fast"} if base == "fast" else {} if base == "fp32" else {"push_weights": base}
        if isa:
            opts["isa"] = isa
        try:
            got[kind] = hwb.compile(f"zoo:{name}", "cpu.native", "fp32", options=opts)
        except HwbError as exc:
            notes.append(f"{name} push_weights={kind}: {exc}")
    return got, notes


def cpp_interleaved(cms: dict, workdir: Path, rounds: int, block: int) -> str:
    """bench/sliding_push_weights.cpp over the libraries of ``cms`` (label -> cpu.native
    variant of one model), or why it was not run."""
    libs = {k: Path(cm.artifact.file("libhwb_model.so")) for k, cm in cms.items()}
    step = int(np.prod(next(iter(cms.values())).input.shape[1:]))
    gxx = shutil.which("g++")
    src = ROOT / "bench" / "sliding_push_weights.cpp"
    if gxx is None:
        return "not measured (g++ not found)"
    exe = workdir / "push_weights"
    try:
        subprocess.run([gxx, "-O2", "-std=c++17", str(src), "-ldl", "-o", str(exe)], check=True,
                       capture_output=True, text=True, timeout=300)
        res = subprocess.run([str(exe), str(step), str(rounds), str(block),
                              *(f"{k}={v}" for k, v in libs.items())],
                             check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return f"not measured ({type(exc).__name__}: {getattr(exc, 'stderr', '') or exc})"
    return res.stdout.strip()


def print_push_weights(pws: dict, notes: list[str], samples: dict, ticks: int) -> None:
    """The push_weights variants' table (their pushes timed in the same rounds as the rest)."""
    if not any(pws.values()) and not notes:
        return
    print("\ncpu.native push_weights variants (same rounds; predict and prepare stay fp32; answers "
          "gated at compile by the family's tolerance, not bit-equal):\n")
    print("| model | push_weights | push p50 µs | push p99 µs | prepare p50 µs | push p50 / fp32 push p50 "
          f"| max err vs fp32 window, {ticks} ticks | compile gate rel_err |")
    print("|---|---|---|---|---|---|---|---|")
    for m, variants in pws.items():
        for kind, cm in variants.items():
            p = samples[(m, f"push {kind}")]
            gate = cm.artifact.meta["sliding"].get("push_gate", {}).get("fidelity", {})
            print(f"| {m} | {kind} | {us(p, 50):.3f} | {us(p, 99):.3f} "
                  f"| {us(samples[(m, f'prepare {kind}')], 50):.3f} "
                  f"| {us(p, 50) / us(samples[(m, 'push')], 50):.3f} | {max_error(cm, ticks):.2e} "
                  f"| {gate.get('rel_err', float('nan')):.2e} |")
    for note in notes:
        print(f"  {note}")


def us(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=1000)
    ap.add_argument("--ticks", type=int, default=10_000, help="ticks of the answer check")
    ap.add_argument("--models", default="lstm,conv1d,lstm_a,lstm_b")
    ap.add_argument("--push-weights", default="fast,bf16,f16,int8",
                    help="cpu.native push_weights variants to add per recurrent model (fast: fp32 "
                         "with push_gates='fast'; KIND@ISA: built for that isa option, e.g. "
                         "int8@x86-64-v3; '' for none)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 3 rounds × 100 calls, 300 ticks checked, lstm and conv1d "
                         "only unless --models is given")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.block, args.ticks = 3, 100, 300
        if "--models" not in sys.argv:
            args.models = "lstm,conv1d"
    import hwbackends as hwb
    from hwbackends import machine

    names = [m.strip() for m in args.models.split(",") if m.strip()]
    cms = {}
    for name in names:
        print(f"compiling zoo:{name} (cpu.native, cpu.onnxruntime; cached)", file=sys.stderr)
        cms[name] = (hwb.compile(f"zoo:{name}", "cpu.native", "fp32"),
                     hwb.compile(f"zoo:{name}", "cpu.onnxruntime", "fp32"))
    pw_kinds = [k.strip() for k in args.push_weights.split(",") if k.strip()]
    pws, notes = {}, []
    for name in names:
        pws[name], more = push_weights_variants(hwb, name, cms[name][0], pw_kinds)
        notes += more
    n = args.rounds * args.block
    rng = np.random.default_rng(0)
    kinds = ("push", "prepare", "native full", "ort full")
    samples = {(m, k): np.zeros(n, np.int64) for m in names for k in kinds}
    for m, variants in pws.items():
        for kind in variants:
            samples[(m, f"push {kind}")] = np.zeros(n, np.int64)
            samples[(m, f"prepare {kind}")] = np.zeros(n, np.int64)
    floor = np.zeros(n, np.int64)
    io = {}
    for m, (nat, _ort) in cms.items():
        step = tuple(nat.input.shape[1:])
        steps = list(np.ascontiguousarray(rng.standard_normal((4096, *step)).astype(np.float32)))
        x = rng.standard_normal(nat.input.batched(1)).astype(np.float32)
        io[m] = (nat.sliding(auto_prepare=False), steps, np.zeros(nat.output.shape, np.float32),
                 x, np.zeros(nat.output.batched(1), np.float32),
                 {kind: cm.sliding(auto_prepare=False) for kind, cm in pws[m].items()})
    for r in range(-1, args.rounds):  # round -1 warms everything up, unrecorded
        s = max(r, 0) * args.block
        for m, (nat, ort) in cms.items():
            w, steps, y, x, out, reduced = io[m]
            push_block(w.push_into, w.prepare, steps, y, samples[(m, "push")],
                       samples[(m, "prepare")], s, args.block, r * args.block)
            for kind, wk in reduced.items():
                push_block(wk.push_into, wk.prepare, steps, y, samples[(m, f"push {kind}")],
                           samples[(m, f"prepare {kind}")], s, args.block, r * args.block)
            call_block(nat.predict_into, x, out, samples[(m, "native full")], s, args.block)
            call_block(ort.predict_into, x, out, samples[(m, "ort full")], s, args.block)
        call_block(noop, None, None, floor, s, args.block)
        print(f"\r  round {r + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"machine: {machine.describe()}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{args.rounds} interleaved rounds × {args.block} calls, batch 1, timer included; "
          f"no-op floor p50 {us(floor, 50):.3f} µs, p99 {us(floor, 99):.3f} µs\n")
    print("| model | form | push p50 µs | push p99 µs | prepare p50 µs | full p50 µs (native) "
          "| full p99 µs (native) | full p50 µs (ORT) | full p99 µs (ORT) | push / full p50 "
          f"| max err, {args.ticks} ticks |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m, (nat, _) in cms.items():
        g = {k: samples[(m, k)] for k in kinds}
        err = max_error(nat, args.ticks)
        print(f"| {m} | {io[m][0].form} | {us(g['push'], 50):.3f} | {us(g['push'], 99):.3f} "
              f"| {us(g['prepare'], 50):.3f} | {us(g['native full'], 50):.2f} "
              f"| {us(g['native full'], 99):.2f} | {us(g['ort full'], 50):.2f} "
              f"| {us(g['ort full'], 99):.2f} "
              f"| {us(g['push'], 50) / us(g['native full'], 50):.3f} | {err:.2e} |")
    print_push_weights(pws, notes, samples, args.ticks)
    print("\nC++ in-process (examples/sliding_push.cpp --bench, exported library):")
    import tempfile
    work = Path(tempfile.mkdtemp(prefix="hwb-bench-sliding-"))
    try:
        for m, (nat, _) in cms.items():
            d = work / m
            d.mkdir()
            # each tick runs its prepare too: about 30 s of ticks per model, 1,000 at least
            prep_s = max(us(samples[(m, "prepare")], 50), 0.01) * 1e-6
            ticks = 2000 if args.quick else int(min(100_000, max(1_000, 30.0 / prep_s)))
            print(f"  {m}: {cpp_push(nat, d, ticks)}")
            if pws.get(m):
                rounds, block = (3, 300) if args.quick else (args.rounds, args.block)
                print(f"  {m}, interleaved ({rounds} rounds × {block} ticks each, bench/sliding_push_weights.cpp):")
                for line in cpp_interleaved({"fp32": nat, **pws[m]}, d, rounds, block).splitlines():
                    print(f"    {line}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
