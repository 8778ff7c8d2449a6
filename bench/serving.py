"""Serving benchmark: in-process vs shared-memory vs gRPC round trip, batch-1 vs
micro-batched under several offered loads, cache-hit latency. One run, medians and ratios.

    HWB_CACHE_DIR=/tmp/hwbstore .venv/bin/python bench/serving.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pct(a: list[float]) -> str:
    v = np.asarray(a) * 1e6
    return f"p50 {np.percentile(v, 50):7.1f} µs  p99 {np.percentile(v, 99):8.1f} µs"


def timed(fn, xs: np.ndarray, n: int) -> list[float]:
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(xs[i % len(xs)])
        lat.append(time.perf_counter() - t0)
    return lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", default="signal", help="zoo model (lstm: a model whose call dominates)")
    ap.add_argument("--only-batching", action="store_true", help="just the offered-load table")
    ap.add_argument("--scales", default=None, help="offered-load multipliers, e.g. 1,16,64")
    ap.add_argument("--trace-s", type=float, default=None, help="trace length before scaling")
    a = ap.parse_args()
    n = 1000 if a.quick else 5000
    import hwbackends as hwb
    from hwbackends import zoo
    from hwbackends.serve import Engine, EngineConfig
    from hwbackends.serve.grpc_server import GrpcClient, GrpcServer
    from hwbackends.serve.shm import ShmClient, ShmServer

    m = zoo.get(a.model)
    xs = (np.ascontiguousarray(m.validation_data[:512], dtype=np.float32)
          if m.validation_data is not None else m.representative(512, seed=0))
    cm = hwb.compile(m, "cpu.litert", fidelity=False)
    out = np.empty((1, *cm.output.shape), np.float32)
    print(f"model zoo:{a.model} on {cm.variant}, {os.cpu_count()} cores, n={n} per row\n")
    if a.only_batching:
        return batching(m, xs, a.quick, a.scales, a.trace_s)

    print("== round trip, one caller, batch 1 (no batching) ==")
    direct = timed(lambda x: cm.predict_into(x[None], out), xs, n)
    print(f"direct predict_into      {pct(direct)}")
    with Engine(cm, EngineConfig.preset("single")) as eng:
        o = np.empty(1, np.float32)
        inproc = timed(lambda x: eng.try_predict_into(x, o), xs, n)
        print(f"engine (in-process)      {pct(inproc)}")
        with ShmServer(eng, slots=2) as srv, ShmClient(srv.name) as c:
            shm = timed(lambda x: c.try_predict_into(x, o), xs, n)
        print(f"shared memory (same proc){pct(shm)}")
        with GrpcServer(eng, insecure_loopback=True) as g, GrpcClient(g.address, insecure=True) as gc:
            grpc_ = timed(lambda x: gc.predict("default", x), xs, n // 2)
        print(f"gRPC loopback (no TLS)   {pct(grpc_)}")
        import secrets

        from hwbackends.serve.grpc_server import self_signed_cert
        tls, tok = self_signed_cert(), secrets.token_urlsafe(24)
        with GrpcServer(eng, tls=tls, token=tok) as g, \
                GrpcClient(g.address, token=tok, root_cert=tls.cert_pem) as gc:
            grpcs = timed(lambda x: gc.predict("default", x), xs, n // 2)
        print(f"gRPC loopback TLS+token  {pct(grpcs)}")
        m50 = np.median(inproc)
        print(f"overhead over in-process p50: shm {np.median(shm) / m50:.2f}x, gRPC "
              f"{np.median(grpc_) / m50:.2f}x, gRPC+TLS {np.median(grpcs) / m50:.2f}x; engine over "
              f"direct {m50 / np.median(direct):.1f}x")

    print("\n== shared memory from a separate client process (the intended use) ==")
    import subprocess
    import sys
    client = (
        "import sys, time, numpy as np\n"
        "from hwbackends.serve.shm import ShmClient\n"
        "xs = np.random.default_rng(0).standard_normal((256, 32)).astype(np.float32)\n"
        "o = np.empty(1, np.float32); lat = []\n"
        "with ShmClient(sys.argv[1]) as c:\n"
        "    for i in range(int(sys.argv[2])):\n"
        "        t0 = time.perf_counter(); c.try_predict_into(xs[i % 256], o); lat.append(time.perf_counter() - t0)\n"
        "v = np.array(lat[100:]) * 1e6\n"
        "print(f'p50 {np.percentile(v, 50):7.1f} µs  p99 {np.percentile(v, 99):8.1f} µs')\n")
    for label, cfg in (("single", EngineConfig.preset("single")),
                       ("single, inline", EngineConfig.preset("single", inline=True))):
        with Engine(cm, cfg) as eng, ShmServer(eng, slots=2) as srv:
            r = subprocess.run([sys.executable, "-c", client, srv.name, str(n)], capture_output=True,
                               text=True, timeout=300)
            print(f"shm, engine {label:15s} {r.stdout.strip() or r.stderr[-500:]}")
    with Engine(cm, EngineConfig.preset("single", inline=True)) as eng:
        o = np.empty(1, np.float32)
        inl = timed(lambda x: eng.try_predict_into(x, o), xs, n)
        print(f"(in-process engine, inline   {pct(inl)})")

    print("\n== inference cache ==")
    with Engine(cm, EngineConfig.preset("single", cache_entries=1024)) as eng:
        o = np.empty(1, np.float32)
        miss = timed(lambda x: eng.try_predict_into(x, o), xs, 512)
        hit = timed(lambda x: eng.try_predict_into(x, o), xs, n)
        print(f"miss {pct(miss)}\nhit  {pct(hit)}  (hit rate {eng.cache.stats().hit_rate:.2f})")

    batching(m, xs, a.quick, a.scales, a.trace_s)


def batching(m, xs: np.ndarray, quick: bool, scales: str | None = None,
             trace_s: float | None = None) -> None:
    import threading

    from hwbackends.serve import Engine, EngineConfig, compile_batch_variants
    from hwbackends.serve.loadtest import replay

    variants = compile_batch_variants(m, "cpu.litert", None, (1, 2, 4, 8, 16), fidelity=False)
    print("\n== closed loop: 8 threads calling as fast as they can (3000 calls) ==")
    cl = {"single (batch 1)": (variants[1], EngineConfig.preset("single")),
          "latency (≤4, 50µs)": ({s: variants[s] for s in (1, 2, 4)}, EngineConfig.preset("latency")),
          "balanced (≤16, 500µs)": (variants, EngineConfig.preset("balanced"))}
    for label, (b, cfg) in cl.items():
        with Engine(b, cfg) as eng:
            def w(i: int) -> None:
                for j in range(3000 // 8):
                    eng.predict(xs[(i * 31 + j) % len(xs)])
            ts = [threading.Thread(target=w, args=(i,)) for i in range(8)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            dt = time.perf_counter() - t0
            st = eng.stats()
            bs = st["batch_sizes"]
            mean_b = sum(k * v for k, v in bs.items()) / max(1, sum(bs.values()))
        print(f"{label:22s} {3000 / dt:7.0f}/s  p50 {st['latency_us']['p50']:7.0f} µs  p99 "
              f"{st['latency_us']['p99']:8.0f} µs  mean batch {mean_b:.2f}")

    print("\n== batch-1 vs micro-batched, open-loop tick replay (sim.ticks), 8 client threads ==")
    configs = {"single (batch 1)": (variants[1], EngineConfig.preset("single")),
               "latency (≤4, 50µs)": ({s: variants[s] for s in (1, 2, 4)}, EngineConfig.preset("latency")),
               "balanced (≤16, 500µs)": (variants, EngineConfig.preset("balanced"))}
    grid = ([float(v) for v in scales.split(",")] if scales
            else (1.0, 4.0) if quick else (1.0, 4.0, 16.0))
    for scale in grid:
        for label, (b, cfg) in configs.items():
            with Engine(b, cfg) as eng:
                rep = replay(lambda: (lambda x: eng.predict(x)), xs, duration_s=trace_s or (1.0 if quick else 3.0), seed=1,
                             workers=8, max_requests=20000, max_seconds=20, time_scale=scale,
                             endpoint=label)
                bs = eng.stats()["batch_sizes"]
                mean_b = sum(k * v for k, v in bs.items()) / max(1, sum(bs.values()))
            print(f"load x{scale:<4g} {label:22s} {rep.completed:6d} ok  p50 {rep.p50_us:7.0f} µs  "
                  f"p99 {rep.p99_us:8.0f} µs  p99.9 {rep.p999_us:8.0f} µs  {rep.achieved_qps:7.0f}/s  "
                  f"mean batch {mean_b:.2f}")


if __name__ == "__main__":
    main()
