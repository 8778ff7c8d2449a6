"""cpu.native against LiteRT (the ultra tier's previous winner) in one run, interleaved:
``predict_into`` per call from Python, timer included, for the signal MLP
and the zoo mlp/conv1d/lstm; the same model's C ABI from C++ (examples/native_strategy.cpp);
the compile time of a fresh build.

Each call is timed on its own (``perf_counter_ns`` before and after: the timer is included,
as a strategy's own timing would be) and the variants take turns in blocks of ``--block``
calls, ``--rounds`` times, so the noise of a shared machine hits them alike. Reported: p50,
p99 per variant and cpu.native's p50 as a fraction of LiteRT's.

    .venv/bin/python bench/native.py [--rounds 40] [--block 2000] [--precisions fp32,int8]
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


def timed_block(f, x, out, samples: np.ndarray, start: int, n: int) -> None:
    clock = time.perf_counter_ns
    for i in range(start, start + n):
        t0 = clock()
        f(x, out)
        samples[i] = clock() - t0


def timer_block(samples: np.ndarray, start: int, n: int) -> None:
    clock = time.perf_counter_ns
    for i in range(start, start + n):
        t0 = clock()
        samples[i] = clock() - t0


def cpp_ns(cm, tgt, workdir: Path, calls: int) -> str:
    """ns per hwb_model_predict call from C++ (median of 5 rounds), or why not measured."""
    gxx = shutil.which("g++")
    if gxx is None:
        return "g++ not found"
    lib = workdir
    tgt.export(cm.artifact, "c", lib)
    exe = lib / "native_strategy"
    subprocess.run([gxx, "-O2", "-std=c++17", f"-I{lib}", str(ROOT / "examples" / "native_strategy.cpp"),
                    str(lib / "libhwb_model.so"), f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    res = subprocess.run([str(exe), "--bench", str(calls)], check=True, capture_output=True, text=True)
    return res.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=2000)
    ap.add_argument("--precisions", default="fp32", help="cpu.native precisions (comma-separated)")
    ap.add_argument("--models", default="signal,mlp,conv1d,lstm")
    args = ap.parse_args()
    import hwbackends as hwb
    from hwbackends import machine, zoo
    from hwbackends.registry import get_registry

    store = Path(tempfile.mkdtemp(prefix="hwb-bench-native-"))
    try:
        tgt = get_registry().target("cpu.native")
        variants: dict[str, object] = {}
        compile_s: dict[str, tuple[float, float]] = {}
        for name in args.models.split(","):
            m = zoo.get(name)
            for prec in args.precisions.split(","):
                t0 = time.perf_counter()
                cm = hwb.compile(m, "cpu.native", prec, store=store, gate=False)
                compile_s[f"{name} cpu.native:{prec}"] = (time.perf_counter() - t0,
                                                          cm.artifact.meta["build_seconds"])
                variants[f"{name} cpu.native:{prec}"] = cm
            variants[f"{name} cpu.litert:fp32"] = hwb.compile(m, "cpu.litert", "fp32", store=store)
        n = args.rounds * args.block
        samples = {k: np.zeros(n, np.int64) for k in [*variants, "timer alone"]}
        io = {k: (np.random.default_rng(0).standard_normal(cm.input.batched(1)).astype(np.float32),
                  np.empty(cm.output.batched(1), np.float32)) for k, cm in variants.items()}
        for k, cm in variants.items():  # warm
            timed_block(cm.predict_into, *io[k], samples[k], 0, args.block)
        for r in range(args.rounds):
            s = r * args.block
            for k, cm in variants.items():
                timed_block(cm.predict_into, *io[k], samples[k], s, args.block)
            timer_block(samples["timer alone"], s, args.block)
            print(f"\r  round {r + 1}/{args.rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        print(f"machine: {machine.describe()}")
        print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
              f"(other jobs were running: figures are from a loaded machine)")
        print(f"{args.rounds} interleaved rounds x {args.block} calls, batch 1, timer included\n")
        print(f"{'variant':34} {'p50 µs':>8} {'p99 µs':>8}  vs LiteRT p50")
        p50 = {k: float(np.percentile(v, 50)) / 1e3 for k, v in samples.items()}
        for k, v in samples.items():
            name = k.split()[0]
            ratio = ""
            ref = f"{name} cpu.litert:fp32"
            if "cpu.native" in k and ref in p50:
                ratio = f"  {p50[k] / p50[ref]:.2f}x"
            print(f"{k:34} {p50[k]:8.3f} {np.percentile(v, 99) / 1e3:8.3f}{ratio}")
        print("\ncompile, fresh store: hwb.compile wall (the first starts the worker, which imports "
              "Keras; fidelity check included) / the target's build (IR, C, cc, link)")
        for k, (wall, build) in compile_s.items():
            print(f"  {k:32} {wall:6.2f} s / {build:6.2f} s")
        print("\nC++ in-process (examples/native_strategy.cpp --bench, exported library):")
        for k, cm in variants.items():
            if "cpu.native" in k:
                print(f"  {k:32} {cpp_ns(cm, tgt, store / 'cpp' / k.replace(' ', '_').replace(':', '_'), 200000)}")
    finally:
        shutil.rmtree(store, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
