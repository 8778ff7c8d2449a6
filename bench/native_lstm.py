"""cpu.native on the LSTM_A-shaped zoo model: the full window
(``predict_into``, STAC's Sumaco scenario) against cpu.onnxruntime, interleaved in one run,
and the sliding window's ``push_into`` and ``prepare`` (Tacana's) from Python, plus the C++
example's own timing of ``hwb_model_push`` through the exported C ABI.

Each call is timed on its own (``perf_counter_ns`` around it, the timer included) and the
variants take turns in blocks of ``--block`` calls, ``--rounds`` times, so the noise of a
shared machine hits them alike. Also printed: cpu.native's max |error| against ORT on the
windows timed (both are fp32 implementations of the same model).

ONNX Runtime runs with one intra-op thread, as cpu.onnxruntime does by default (cpu.native is
one thread); ``--ort-threads N`` (N >= 2, e.g. the core count) adds a second ORT session
with N intra-op threads to the same interleaving, so a multi-threaded ORT is compared too.
Every ratio printed is against the one-thread session.

    .venv/bin/python bench/native_lstm.py [--model lstm_a] [--rounds 20] [--block 200] [--ort-threads 2]
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
from _timing import timed  # noqa: E402  (bench/ is on sys.path when run as a script)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]



def cpp_push(cm, tgt, workdir: Path, ticks: int) -> str:
    """examples/sliding_push.cpp --bench: ns per hwb_model_push and per prepare, or why not."""
    gxx = shutil.which("g++")
    if gxx is None:
        return "g++ not found"
    tgt.export(cm.artifact, "c", workdir)
    exe = workdir / "sliding_push"
    subprocess.run([gxx, "-O2", "-std=c++17", f"-I{workdir}", str(ROOT / "examples" / "sliding_push.cpp"),
                    str(workdir / "libhwb_model.so"), f"-Wl,-rpath,{workdir}", "-o", str(exe)], check=True)
    return subprocess.run([str(exe), "--bench", str(ticks)], check=True, capture_output=True,
                          text=True).stdout.strip()


def pct(a: np.ndarray) -> str:
    return f"p50 {np.percentile(a, 50) / 1e3:8.1f} µs  p99 {np.percentile(a, 99) / 1e3:8.1f} µs"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lstm_a")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=200)
    ap.add_argument("--ticks", type=int, default=20000, help="C++ example's --bench ticks")
    ap.add_argument("--ort-threads", type=int, default=None,
                    help="also time ORT with this many intra-op threads (>= 2)")
    args = ap.parse_args()
    import hwbackends as hwb
    from hwbackends import zoo
    from hwbackends.registry import get_registry

    store = Path(tempfile.mkdtemp(prefix="hwb-bench-lstm-"))
    try:
        m = zoo.get(args.model)
        native = hwb.compile(m, "cpu.native", "fp32", store=store)
        ort = hwb.compile(m, "cpu.onnxruntime", "fp32", store=store, threads=1)
        ort_n = (None if args.ort_threads is None else
                 hwb.compile(m, "cpu.onnxruntime", "fp32", store=store, threads=args.ort_threads))
        rng = np.random.default_rng(0)
        shape = tuple(native.input.shape)
        x = rng.standard_normal((native.batch_size, *shape)).astype(np.float32)
        out_n = np.empty((native.batch_size, *native.output.shape), np.float32)
        out_o = np.empty_like(out_n)
        native.predict_into(x, out_n)
        ort.predict_into(x, out_o)
        err = float(np.abs(out_n - out_o).max())
        if ort_n is not None:
            ort_n.predict_into(x, out_o)
        win = native.sliding(auto_prepare=False)
        xt = rng.standard_normal(shape[1:]).astype(np.float32)
        yt = np.empty(native.output.shape, np.float32)
        n = args.rounds * args.block
        s = {k: np.zeros(n, np.int64) for k in ("native", "ort", "ort_n", "push", "prepare")}
        for r in range(args.rounds):
            at = r * args.block
            timed(native.predict_into, (x, out_n), s["native"], at, args.block)
            timed(ort.predict_into, (x, out_o), s["ort"], at, args.block)
            if ort_n is not None:
                timed(ort_n.predict_into, (x, out_o), s["ort_n"], at, args.block)
            for i in range(at, at + args.block):
                t0 = time.perf_counter_ns()
                win.push_into(xt, yt)
                t1 = time.perf_counter_ns()
                win.prepare()
                s["push"][i], s["prepare"][i] = t1 - t0, time.perf_counter_ns() - t1
        print(f"{args.model}: {args.rounds} rounds × {args.block} calls, interleaved; "
              f"max |cpu.native - ORT| = {err:.2e}")
        print(f"  full window cpu.native fp32  {pct(s['native'])}")
        print(f"  full window cpu.onnxruntime  {pct(s['ort'])}  (1 thread)")
        if ort_n is not None:
            print(f"  full window ORT, {args.ort_threads} threads    {pct(s['ort_n'])}")
        print(f"  ratio of p50s (native / ORT) {np.median(s['native']) / np.median(s['ort']):.2f}")
        print(f"  ratio of minima              {s['native'].min() / s['ort'].min():.2f}")
        print(f"  sliding push_into (Python)   {pct(s['push'])}")
        print(f"  sliding prepare (Python)     {pct(s['prepare'])}")
        print("  C++ " + cpp_push(native, get_registry().target("cpu.native"), store / "c", args.ticks))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
