"""Bounded soak of the serving engine: N predictions or M seconds, whichever comes first.
Reports RSS growth, p99 drift (first vs last window) and output drift (the same probe inputs
answered at the start and at the end must be bit-identical).

    HWB_CACHE_DIR=/tmp/hwbstore .venv/bin/python bench/soak.py --n 200000 --seconds 60
"""
from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000, help="predictions at most")
    ap.add_argument("--seconds", type=float, default=60.0, help="wall time at most")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--preset", default="latency")
    ap.add_argument("--cache", type=int, default=0, help="cache entries (0: off)")
    a = ap.parse_args()
    from hwbackends import zoo
    from hwbackends.serve import Engine, EngineConfig, compile_batch_variants

    m = zoo.get("signal")
    xs = np.ascontiguousarray(m.validation_data, dtype=np.float32)
    probe = xs[:64]
    variants = compile_batch_variants(m, "cpu.litert", None, (1, 2, 4), fidelity=False)
    eng = Engine(variants, EngineConfig.preset(a.preset, cache_entries=a.cache)).start()
    before = np.stack([eng.predict(x) for x in probe])
    rss0 = rss_mb()
    count = [0] * a.threads
    lat: list[list[float]] = [[] for _ in range(a.threads)]
    t_end = time.perf_counter() + a.seconds
    per = a.n // a.threads

    def work(i: int) -> None:
        o = np.empty(1, np.float32)
        clock = time.perf_counter
        L = lat[i]
        for j in range(per):
            t0 = clock()
            eng.try_predict_into(xs[(i * 7919 + j) % len(xs)], o)
            L.append(clock() - t0)
            count[i] += 1
            if (j & 1023) == 0 and clock() > t_end:
                break
    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(a.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    after = np.stack([eng.predict(x) for x in probe])
    rss1 = rss_mb()
    st = eng.stats()
    eng.stop()
    allv = np.concatenate([np.asarray(v) for v in lat]) * 1e6
    k = max(1000, len(allv) // 10)
    first, last = allv[:k], allv[-k:]
    print(f"soak: {sum(count)} predictions in {wall:.1f} s ({sum(count) / wall:.0f}/s), "
          f"{a.threads} threads, preset {a.preset}, cache {a.cache}")
    print(f"RSS {rss0:.1f} → {rss1:.1f} MiB (growth {rss1 - rss0:+.1f} MiB)")
    print(f"p99 first 10%: {np.percentile(first, 99):.0f} µs, last 10%: {np.percentile(last, 99):.0f} µs "
          f"(drift {np.percentile(last, 99) / np.percentile(first, 99):.2f}x); overall p50 "
          f"{np.percentile(allv, 50):.0f} µs p99 {np.percentile(allv, 99):.0f} µs")
    print(f"output drift on {len(probe)} probe inputs: max |Δ| = {float(np.abs(after - before).max()):.3g}")
    print(f"errors {st['errors']}, deadline misses {st['deadline_misses']}, batches {st['batches']}, "
          f"batch sizes {st['batch_sizes']}")


if __name__ == "__main__":
    main()
