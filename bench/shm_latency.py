"""Shared-memory endpoint latency, in one run: the direct call vs the in-process
engine vs shm from another process (Python client, C++ client), single stream and open-loop
tick replay at several rates. Percentiles of the open loop count from the *scheduled* arrival
(a call that queued behind a slow one is charged the wait: no coordinated omission).

    HWB_CACHE_DIR=$PWD/.hwb-cache .venv/bin/python bench/shm_latency.py [--quick]

The shm server runs in this process (direct mode: its polling thread runs each request);
clients run in child processes. Rounds of the single-stream rows are interleaved, so a
neighbour's load on a shared machine hits every row alike.

``--native`` adds a second server over ``cpu.native``, whose C loop calls the
generated model function itself without the GIL (``*_nat`` rows, beside the LiteRT ones in the
same interleaved rounds), and prints the native/LiteRT ratios.
"""
from __future__ import annotations

import argparse
import json
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


def stats(lat_s: np.ndarray | list[float], lost: int = 0) -> dict[str, float]:
    v = np.asarray(lat_s, dtype=np.float64) * 1e6
    return {"n": int(v.size), "p50_us": float(np.percentile(v, 50)),
            "p99_us": float(np.percentile(v, 99)), "p999_us": float(np.percentile(v, 99.9)),
            "max_us": float(v.max()), "lost": lost}


def single(fn, xs: np.ndarray, n: int) -> list[float]:
    lat = []
    clock = time.perf_counter
    for i in range(n):
        x = xs[i % len(xs)]
        t0 = clock()
        fn(x)
        lat.append(clock() - t0)
    return lat[n // 20:]  # the first 5 %: warm-up


def replay(fn, xs: np.ndarray, at: np.ndarray) -> tuple[list[float], int]:
    """One call per scheduled arrival; latency from the schedule. Like a strategy waiting for
    its feed, it sleeps until shortly before the tick and spins the rest (a pure busy-wait
    would make the client a CPU hog the scheduler penalises on a shared machine)."""
    lat, lost = [], 0
    clock, sleep = time.perf_counter, time.sleep
    start = clock() + 0.01
    for i, t in enumerate(at):
        due = start + t
        ahead = due - clock()
        if ahead > 300e-6:
            sleep(ahead - 250e-6)
        while clock() < due:
            pass
        if fn(xs[i % len(xs)]) is True:
            lat.append(clock() - due)
        else:
            lost += 1
    return lat, lost


def client_main(argv: list[str]) -> None:
    """Child process: the Python shm client (imports nothing heavy)."""
    from hwbackends.serve.shm import ShmClient
    name, mode, arg = argv
    xs = np.random.default_rng(0).standard_normal((256, 32)).astype(np.float32)
    with ShmClient(name) as c:
        o = np.empty(c.out_shape, np.float32)

        def call(x):
            return c.try_predict_into(x, o)
        if mode == "single":
            print(json.dumps(stats(single(call, xs, int(arg)))))
        else:
            lat, lost = replay(call, xs, np.fromfile(arg, np.float64))
            print(json.dumps(stats(lat, lost)))


def _summary(v: list[dict]) -> dict:
    """Median over the rounds of each percentile, and the best round's p50: on a shared
    machine a round either catches both processes on a core or not (bimodal), so the best
    round shows the protocol's cost and the median what the load allowed."""
    s = {f: float(np.median([r[f] for r in v])) for f in ("p50_us", "p99_us", "p999_us")}
    s["best_p50_us"] = float(min(r["p50_us"] for r in v))
    s["best_p99_us"] = float(min(r["p99_us"] for r in v))
    s["n"] = sum(r["n"] for r in v)
    s["rounds_p50_us"] = [round(r["p50_us"], 2) for r in v]  # the bimodality, round by round
    return s


def single_rows(paths: dict, xs: np.ndarray, n: int, rounds: int) -> dict[str, dict]:
    """Interleaved rounds of each path; in-process paths are callables, others commands."""
    rows: dict[str, list] = {k: [] for k in paths}
    for _ in range(rounds):
        for k, p in paths.items():
            if callable(p):
                rows[k].append(stats(single(p, xs, n)))
            else:
                rows[k].append(_child(p + ["single" if "--client" in p else "bench", str(n)]))
    res = {f"single/{k}": _summary(v) for k, v in rows.items()}
    print(f"\n== single stream, batch 1 (µs; median of {rounds} interleaved rounds | best round) ==")
    for k, s in res.items():
        print(f"{k[7:]:11s} p50 {s['p50_us']:8.2f}  p99 {s['p99_us']:8.2f}  p99.9 {s['p999_us']:9.2f}"
              f"  | best p50 {s['best_p50_us']:7.2f}  best p99 {s['best_p99_us']:8.2f}")
    for f in ("p50_us", "best_p50_us"):
        d = res["single/direct"][f]
        print(f"ratios to direct ({f}): " + ", ".join(
            f"{k[7:]} {v[f] / d:.2f}x" for k, v in res.items()))
    pairs = [(k, f"{k}_nat") for k in ("direct", "shm_py", "shm_cpp") if f"single/{k}_nat" in res]
    for f in ("p50_us", "best_p50_us") if pairs else ():
        print(f"ratios native / litert ({f}): " + ", ".join(
            f"{a} {res[f'single/{b}'][f] / res[f'single/{a}'][f]:.2f}x" for a, b in pairs))
    return res


def open_rows(paths: dict, xs: np.ndarray, rates: list[float], duration: float,
              tmp: Path) -> dict[str, dict]:
    from hwb_sim.ticks import generate

    res = {}
    print("\n== open loop, Poisson tick arrivals (latency from the scheduled arrival, µs) ==")
    for rate in rates:
        tr = generate(duration, seed=1, quiet_rate_hz=rate, burst_rate_hz=(rate, rate))
        at = np.asarray(tr.timestamps, np.float64)
        at.tofile(tmp / "ticks.f64")
        for k, p in paths.items():
            if callable(p):
                s = stats(*replay(p, xs, at))
            else:
                s = _child(p + ["replay", str(tmp / "ticks.f64")])
            res[f"open/{int(rate)}/{k}"] = s
            print(f"{int(rate):6d}/s {k:8s} n {s['n']:6d}  p50 {s['p50_us']:8.2f}  p99 "
                  f"{s['p99_us']:8.2f}  p99.9 {s['p999_us']:9.2f}  lost {s['lost']}")
    return res


def _child(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, default=20000, help="single-stream calls per row per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rates", default="1000,10000,50000", help="open-loop ticks/s (\"\": none)")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds of ticks per rate")
    ap.add_argument("--spin-us", type=float, default=50.0)
    ap.add_argument("--pin", type=int, default=None, help="pin the shm polling thread to a core")
    ap.add_argument("--json", default=None, help="write the results here too")
    ap.add_argument("--native", action="store_true",
                    help="also serve cpu.native (the C loop calls its C entry, no GIL)")
    a = ap.parse_args()
    if a.quick:
        a.n, a.rounds, a.duration = 3000, 1, 0.5
    import hwbackends as hwb
    from hwbackends import zoo
    from hwbackends.serve import Engine, EngineConfig
    from hwbackends.serve.shm import INCLUDE_DIR, ShmServer

    m = zoo.get("signal")
    xs = np.ascontiguousarray(m.validation_data[:256], dtype=np.float32)
    cm = hwb.compile(m, "cpu.litert", fidelity=False)
    tmp = Path(tempfile.mkdtemp(prefix="hwb-shm-bench-"))
    print(f"zoo:signal on {cm.variant}; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; n={a.n} x {a.rounds} rounds; spin {a.spin_us:g} µs")
    out1 = np.empty((1, 1), np.float32)
    o = np.empty(1, np.float32)
    eng = Engine(cm, EngineConfig.preset("single")).start()
    eng_call = getattr(eng, "try_predict_into", None) or eng.predict_into
    srv = ShmServer(eng, slots=4, spin_us=a.spin_us, pin_core=a.pin)

    def direct(x):
        cm.predict_into(x[None], out1)
        return True
    paths: dict = {"direct": direct, "engine": lambda x: eng_call(x, o),
                   "shm_py": [sys.executable, str(Path(__file__).resolve()), "--client", srv.name]}
    cpp = tmp / "shm_strategy"
    if shutil.which("g++"):
        subprocess.run(["g++", "-O2", "-std=c++17", f"-I{INCLUDE_DIR}",
                        str(ROOT / "examples" / "shm_strategy.cpp"), "-o", str(cpp)], check=True)
        paths["shm_cpp"] = [str(cpp), srv.name]
    nsrv = neng = None
    if a.native:
        ncm = hwb.compile(m, "cpu.native", fidelity=False, store=tmp / "store")  # fresh build
        neng = Engine(ncm, EngineConfig.preset("single")).start()
        nsrv = ShmServer(neng, slots=4, spin_us=a.spin_us, pin_core=a.pin)
        if not nsrv.native:
            raise SystemExit(f"the cpu.native server is not on the native path: {nsrv.native_reason}")
        out_n = np.empty((1, 1), np.float32)

        def direct_nat(x):
            ncm.predict_into(x[None], out_n)
            return True
        paths["direct_nat"] = direct_nat
        paths["shm_py_nat"] = [sys.executable, str(Path(__file__).resolve()), "--client", nsrv.name]
        if "shm_cpp" in paths:
            paths["shm_cpp_nat"] = [str(cpp), nsrv.name]
        print(f"native: {ncm.variant} served by the C loop without the GIL")
    try:
        res = single_rows(paths, xs, a.n, a.rounds)
        if a.rates:
            res.update(open_rows(paths, xs, [float(r) for r in a.rates.split(",")], a.duration, tmp))
        res["server"] = srv.stats()
        print(f"\nserver: {res['server']}")
        if nsrv is not None:
            res["server_native"] = nsrv.stats()
            print(f"server (native): {res['server_native']}")
    finally:
        srv.close()
        eng.stop()
        if nsrv is not None:
            nsrv.close()
            neng.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2:])
    else:
        main()
