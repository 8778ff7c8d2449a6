"""Server scenario: p99 (from the scheduled arrival) vs offered load for the demo model.

    .venv/bin/python bench/server_load.py [--variants cpu.litert:fp32,cpu.onnxruntime:fp32] [--n 3000]

Open loop with seeded Poisson arrivals; latency is counted from each request's scheduled
arrival (queueing included, no coordinated omission). Prints p50/p99/p99.9 and the achieved
rate per offered rate, for each variant of zoo:signal.
"""
from __future__ import annotations

import argparse
import os

RATES = (500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="cpu.litert:fp32,cpu.onnxruntime:fp32")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--rates", default=",".join(map(str, RATES)))
    a = ap.parse_args()
    import hwbackends as hwb
    from hwbackends.bench import Server, SingleStream, measure

    m = hwb.load_model("zoo:signal")
    print(f"zoo:signal, server scenario, n={a.n} per point, load avg {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    for v in a.variants.split(","):
        t, p = v.split(":")
        cm = hwb.compile(m, t, p, gate=False)
        ss = measure(cm, SingleStream(n=a.n))
        print(f"\n{cm.variant} ({cm.mode.value}); single-stream service p50 {ss.p50_us:.2f} µs "
              f"p99 {ss.p99_us:.2f} µs")
        print(f"  {'offered/s':>10} {'achieved/s':>11} {'p50 µs':>9} {'p99 µs':>10} {'p99.9 µs':>10} "
              f"{'queue µs':>9}")
        for r in map(float, a.rates.split(",")):
            prof = measure(cm, Server(rate_hz=r, n=a.n, max_s=20))
            print(f"  {r:>10,.0f} {prof.throughput:>11,.0f} {prof.p50_us:>9.2f} {prof.p99_us:>10.2f} "
                  f"{prof.p999_us:>10.2f} {prof.queue_mean_us or 0:>9.2f}")


if __name__ == "__main__":
    main()
