"""The incremental forms of hwb_plugins/cpu_native/sliding_conv.py and sliding_dense.py on a
50 × 32 window: a Dense over the flattened window (the push reads only the rows that multiply
the newest step, ``W_{T-1}``), a wider one, and a strided conv and a max pool before the
flatten. Per model, one interleaved run (bench/sliding.py's blocks): cpu.native's ``push_into``
and its ``prepare`` timed apart, the full window (``predict_into``) on cpu.native and on
cpu.onnxruntime, a no-op through the same timed call (the floor); then max |push − predict_into
on the window| over N ticks.

    .venv/bin/python bench/sliding_dense.py [--rounds 20] [--block 1000] [--ticks 10000] [--quick]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from sliding import call_block, max_error, noop, push_block, us

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def keras_model(kind: str):
    """50 × 32 → [Conv1D(16, 3, stride 2) | MaxPooling1D(2) after a Conv1D(16, 3)] → Flatten →
    Dense(64, or 256 for "wide", relu) → Dense(1); seeded weights."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((50, 32), name="window")
    h = inp
    if kind == "strided":
        h = keras.layers.Conv1D(16, 3, strides=2, activation="relu")(h)
    elif kind == "pooled":
        h = keras.layers.MaxPooling1D(2)(keras.layers.Conv1D(16, 3, activation="relu")(h))
    h = keras.layers.Dense(256 if kind == "wide" else 64, activation="relu")(keras.layers.Flatten()(h))
    return keras.Model(inp, keras.layers.Dense(1)(h), name=f"flat_dense_{kind}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=1000)
    ap.add_argument("--ticks", type=int, default=10_000, help="ticks of the answer check")
    ap.add_argument("--quick", action="store_true", help="3 rounds × 100 calls, 300 ticks checked")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.block, args.ticks = 3, 100, 300
    import hwbackends as hwb
    from hwbackends import machine

    names = ("flat", "wide", "strided", "pooled")
    cms = {}
    for name in names:
        print(f"compiling {name} (cpu.native, cpu.onnxruntime; cached)", file=sys.stderr)
        model = hwb.load_model(keras_model(name))
        cms[name] = (hwb.compile(model, "cpu.native", "fp32"), hwb.compile(model, "cpu.onnxruntime", "fp32"))
    n = args.rounds * args.block
    rng = np.random.default_rng(0)
    kinds = ("push", "prepare", "native full", "ort full")
    samples = {(m, k): np.zeros(n, np.int64) for m in names for k in kinds}
    floor = np.zeros(n, np.int64)
    io = {}
    for m, (nat, _ort) in cms.items():
        steps = list(np.ascontiguousarray(rng.standard_normal((4096, 32)).astype(np.float32)))
        x = rng.standard_normal(nat.input.batched(1)).astype(np.float32)
        io[m] = (nat.sliding(auto_prepare=False), steps, np.zeros(nat.output.shape, np.float32), x,
                 np.zeros(nat.output.batched(1), np.float32))
    for r in range(-1, args.rounds):  # round -1 warms everything up, unrecorded
        s = max(r, 0) * args.block
        for m, (nat, ort) in cms.items():
            w, steps, y, x, out = io[m]
            push_block(w.push_into, w.prepare, steps, y, samples[(m, "push")], samples[(m, "prepare")], s,
                       args.block, r * args.block)
            call_block(nat.predict_into, x, out, samples[(m, "native full")], s, args.block)
            call_block(ort.predict_into, x, out, samples[(m, "ort full")], s, args.block)
        call_block(noop, None, None, floor, s, args.block)
    print(f"machine: {machine.describe()}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{args.rounds} interleaved rounds × {args.block} calls, timer included; no-op floor p50 "
          f"{us(floor, 50):.3f} µs\n")
    print("| model | form | push p50 µs | push p99 µs | prepare p50 µs | full p50 µs (native) "
          f"| full p50 µs (ORT) | push / full p50 | max err, {args.ticks} ticks |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m, (nat, _) in cms.items():
        g = {k: samples[(m, k)] for k in kinds}
        print(f"| {m} | {io[m][0].form} | {us(g['push'], 50):.3f} | {us(g['push'], 99):.3f} "
              f"| {us(g['prepare'], 50):.3f} | {us(g['native full'], 50):.2f} | {us(g['ort full'], 50):.2f} "
              f"| {us(g['push'], 50) / us(g['native full'], 50):.3f} | {max_error(nat, args.ticks):.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
