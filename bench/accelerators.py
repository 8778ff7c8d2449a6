"""Batch-1 latency of the TPU-family targets beside ``cpu.litert``, in one run, and the XLA
hot path's overhead against the bare compiled call.

Part 1: for every zoo model, p50/p99 of ``cm.predict_into`` on ``cpu.litert:fp32`` (Keras
models only: LiteRT takes Keras), ``tpu.xla:fp32``, ``tpu.xla:bf16`` and
``tpu.edgetpu:int8``, interleaved round by round so machine noise hits all alike. The mode
column says *emulated* wherever no TPU ran it.

Part 2 (``tpu.xla``, MLP and LSTM): medians of
  bare      ``compiled(x_on_device).block_until_ready()``: the XLA executable alone
  bare+io   ``np.asarray(compiled(x_numpy))``: plus the host→device and device→host copies
  hwb       ``cm.predict_into(x, out)``
  call_tf   the Keras model reached through ``jax2tf.call_tf`` (the alternative path), jitted

    .venv/bin/python bench/accelerators.py [--models mlp,lstm] [--rounds 10] [--calls 300]
                                           [--targets tpu.xla] [--jax-async-dispatch]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ZOO = ("mlp", "lstm", "conv1d", "signal", "mlp_torch", "lstm_torch")
VARIANTS = (("cpu.litert", "fp32"), ("tpu.xla", "fp32"), ("tpu.xla", "bf16"), ("tpu.edgetpu", "int8"))


def sample_ns(fn: Callable[[], Any], calls: int) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    for _ in range(calls):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, np.ndarray]:
    for f in fns.values():  # warm-up
        sample_ns(f, 50)
    samples: dict[str, list[int]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            samples[k] += sample_ns(f, calls)
    return {k: np.asarray(v) for k, v in samples.items()}


def latency_table(models: list[str], rounds: int, calls: int) -> list[dict[str, Any]]:
    import hwbackends as hwb
    from hwbackends import zoo

    rows = []
    for name in models:
        m = zoo.get(name)
        x = m.representative(1, seed=3)
        out = np.zeros(m.output.batched(1), np.float32)
        fns, info = {}, {}
        for target, prec in VARIANTS:
            tgt = hwb.get_registry().target(target)
            if m.format not in tgt.formats and target != "tpu.xla":
                continue  # LiteRT and the Edge TPU take Keras models
            cm = hwb.compile(m, target, prec, gate=False)
            key = f"{target}:{prec}"
            fns[key] = (lambda cm=cm, x=x, out=out: cm.predict_into(x, out))
            info[key] = cm
        res = interleaved(fns, rounds, calls)
        for key, ns in res.items():
            cm = info[key]
            rows.append({"model": name, "variant": key, "mode": cm.mode.value,
                         "device": cm.availability.device, "n": len(ns),
                         "p50_us": float(np.percentile(ns, 50)) / 1e3,
                         "p99_us": float(np.percentile(ns, 99)) / 1e3,
                         "corr": cm.fidelity.corr if cm.fidelity else None,
                         "max_abs": cm.fidelity.max_abs if cm.fidelity else None})
    return rows


def xla_overhead(name: str, rounds: int, calls: int, call_tf: bool) -> dict[str, float]:
    import jax

    import hwbackends as hwb
    from hwbackends import zoo

    m = zoo.get(name)
    cm = hwb.compile(m, "tpu.xla", "fp32")
    compiled = cm.executor.compiled
    x = m.representative(1, seed=3)
    xd = jax.device_put(x, cm.executor.device)
    out = np.zeros(m.output.batched(1), np.float32)
    fns: dict[str, Callable[[], Any]] = {
        "bare": lambda: compiled(xd).block_until_ready(),
        "bare+io": lambda: np.asarray(compiled(x)),
        "hwb": lambda: cm.predict_into(x, out),
    }
    if call_tf and m.format == "keras":
        import tensorflow as tf
        from jax.experimental import jax2tf

        km = m.obj

        @tf.function(input_signature=[tf.TensorSpec((1, *m.input.shape), tf.float32)],
                     jit_compile=True)
        def serve(v: Any) -> Any:
            return km(v, training=False)

        f = jax.jit(jax2tf.call_tf(serve))
        f(x).block_until_ready()
        fns["call_tf"] = lambda: np.asarray(f(x))
    res = interleaved(fns, rounds, calls)
    return {k: statistics.median(v.tolist()) / 1e3 for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--no-call-tf", action="store_true", help="skip the jax2tf.call_tf comparison")
    ap.add_argument("--jax-async-dispatch", action="store_true",
                    help="keep JAX's asynchronous CPU dispatch (HWB_XLA_ASYNC_DISPATCH=1) to compare")
    ap.add_argument("--targets", default="", help="comma list to restrict the variants (e.g. tpu.xla)")
    a = ap.parse_args()
    if a.jax_async_dispatch:
        os.environ["HWB_XLA_ASYNC_DISPATCH"] = "1"
    if a.targets:
        global VARIANTS
        VARIANTS = tuple(v for v in VARIANTS if v[0] in a.targets.split(","))
    models = [s for s in a.models.split(",") if s]

    rows = latency_table(models, a.rounds, a.calls)
    print(f"\nbatch 1, {a.rounds} interleaved rounds × {a.calls} calls per variant; µs per "
          f"cm.predict_into call")
    print(f"{'model':<11} {'variant':<18} {'mode':<9} {'p50':>8} {'p99':>8} {'corr':>10} "
          f"{'max_abs':>9}  device")
    for r in rows:
        print(f"{r['model']:<11} {r['variant']:<18} {r['mode']:<9} {r['p50_us']:8.1f} "
              f"{r['p99_us']:8.1f} {r['corr']:10.6f} {r['max_abs']:9.2g}  {r['device']}")
    for name in ("mlp", "lstm"):
        if name not in models:
            continue
        med = xla_overhead(name, a.rounds, a.calls, not a.no_call_tf)
        print(f"\ntpu.xla {name}: median µs per call — " +
              ", ".join(f"{k} {v:.1f}" for k, v in med.items()) +
              f"; hwb / bare+io = {med['hwb'] / med['bare+io']:.2f}, hwb − bare = "
              f"{med['hwb'] - med['bare']:.1f} µs")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
