"""zoo:deeplob (DeepLOB reconstructed from its paper, random weights) at batch 1, fp32:
cpu.native's ``predict_into`` against cpu.onnxruntime and cpu.litert, interleaved in one run.

Each call is timed on its own (``perf_counter_ns`` around it) and the targets take turns in
blocks of ``--block`` calls, ``--rounds`` times, so the noise of a shared machine hits them
alike. Printed: the CPU, each target's median and p99, the ratios of medians against ONNX
Runtime, and the largest |difference| of the answers from cpu.native's on the books timed.
Every runtime gets ``--threads`` intra-op threads (default 1: cpu.native is one thread).

    .venv/bin/python bench/deeplob.py [--rounds 20] [--block 50] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from _timing import timed  # noqa: E402  (bench/ is on sys.path when run as a script)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
TARGETS = ("cpu.native", "cpu.onnxruntime", "cpu.litert")



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of ORT and LiteRT")
    args = ap.parse_args()
    import hwbackends as hwb
    from hwbackends import zoo
    from hwbackends.machine import cpu_model

    store = Path(tempfile.mkdtemp(prefix="hwb-bench-deeplob-"))
    try:
        m = zoo.get("deeplob")
        cms = {}
        for t in TARGETS:
            kw = {} if t == "cpu.native" else {"threads": args.threads}
            cms[t] = hwb.compile(m, t, "fp32", store=store, batch_size=1, **kw)
        x = np.random.default_rng(0).standard_normal((1, *m.input.shape)).astype(np.float32)
        outs = {t: np.empty((1, *m.output.shape), np.float32) for t in TARGETS}
        for t in TARGETS:  # warm up: first calls allocate, JIT and fill caches
            for _ in range(20):
                cms[t].predict_into(x, outs[t])
        n = args.rounds * args.block
        s = {t: np.zeros(n, np.int64) for t in TARGETS}
        for r in range(args.rounds):
            for t in TARGETS:
                timed(cms[t].predict_into, (x, outs[t]), s[t], r * args.block, args.block)
        print(f"zoo:deeplob batch 1 fp32 on {cpu_model()} ({os.cpu_count()} CPUs); {args.rounds} "
              f"rounds × {args.block} calls, interleaved; ORT/LiteRT threads={args.threads}")
        ort = float(np.median(s["cpu.onnxruntime"]))
        for t in TARGETS:
            med, p99 = float(np.median(s[t])), float(np.percentile(s[t], 99))
            diff = float(np.abs(outs[t] - outs["cpu.native"]).max())
            print(f"  {t:16s} median {med / 1e3:8.1f} µs  p99 {p99 / 1e3:8.1f} µs  "
                  f"{med / ort:5.2f}× ORT  max |Δ vs cpu.native| {diff:.2e}")
    finally:
        shutil.rmtree(store, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
