"""cpu.native ``fixed`` against fpga.hls4ml's C-simulation at the same precision
(bit-exact, ≥ 20× faster per sample): both compiled through the public API for the zoo signal
model, checked bit-exact on the timed inputs, then timed per batch-1 ``predict_into`` call
(timer included), interleaved in blocks of ``--block`` calls for ``--rounds`` rounds so a
shared machine's noise hits both alike. Reported: p50 / p99 per target and the p50 ratio.

    .venv/bin/python bench/native_fixed.py [--precision ap_fixed<16,6>] [--rounds 10] [--block 2000]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def timed_block(f, x, out, samples: np.ndarray, start: int, n: int) -> None:
    clock = time.perf_counter_ns
    for i in range(start, start + n):
        t0 = clock()
        f(x[i % len(x)], out)
        samples[i] = clock() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", default="ap_fixed<16,6>")
    ap.add_argument("--model", default="signal")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--block", type=int, default=2000)
    ap.add_argument("--store", default=None, help="artifact store (default: a temporary one)")
    args = ap.parse_args()

    import hwbackends as hwb
    from hwbackends import zoo

    store = args.store or tempfile.mkdtemp(prefix="hwb-fixed-bench-")
    m = zoo.get(args.model)
    cms = {t: hwb.compile(m, t, args.precision, store=store, fidelity=False)
           for t in ("cpu.native", "fpga.hls4ml")}
    # the bundled data (2,048 samples for the signal), scaled ×3 and ×0.02 (overflow and
    # sub-step inputs) and Gaussian noise: 10,000 distinct samples
    base = np.asarray(m.representative(10_000), np.float32)
    rng = np.random.default_rng(0)
    parts = [base, base * 3.0, base * 0.02, rng.normal(0, 2, (10_000, *base.shape[1:]))]
    x = np.ascontiguousarray(np.concatenate(parts)[:10_000], np.float32)
    rows = [np.ascontiguousarray(x[i:i + 1]) for i in range(len(x))]
    outs = {}
    for t, cm in cms.items():
        y = np.zeros((len(x), *cm.artifact.outputs[0].shape), np.float32)
        for i, r in enumerate(rows):
            cm.predict_into(r, y[i:i + 1])
        outs[t] = y
    exact = bool(np.array_equal(outs["cpu.native"], outs["fpga.hls4ml"]))
    n = args.rounds * args.block
    samples = {t: np.zeros(n, np.int64) for t in cms}
    bufs = {t: np.zeros((1, *cm.artifact.outputs[0].shape), np.float32) for t, cm in cms.items()}
    for r in range(args.rounds):
        for t, cm in cms.items():
            timed_block(cm.predict_into, rows, bufs[t], samples[t], r * args.block, args.block)
    p = {t: (np.percentile(s, 50) / 1e3, np.percentile(s, 99) / 1e3) for t, s in samples.items()}
    print(f"model {args.model}, precision {args.precision}: bit-exact on {len(x)} samples: {exact}")
    for t, (p50, p99) in p.items():
        print(f"  {t:12s} p50 {p50:8.2f} µs   p99 {p99:8.2f} µs   (batch-1 predict_into, timer included)")
    print(f"  speed-up (C-sim p50 / native p50): {p['fpga.hls4ml'][0] / p['cpu.native'][0]:.1f}×")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
