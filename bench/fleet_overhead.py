"""Cost of the Ray layer of ``hwb fleet``, per variant: what a fleet run spends beyond what
the node spends compiling and measuring.

Runs on an embedded local Ray inside a loopback-only network namespace (entered by this
script), twice over the same variants so the second pass has every artifact cached:
  ray start      ray.init of the embedded cluster (once per run)
  overhead       driver wall time from submitting a variant's task to holding its result,
                 minus the time the task's function ran on the node (scheduling, worker
                 hand-off, argument/result transfer through the object store)
  task           the function on the node: load model, compile (or store hit), fidelity,
                 measurement
  timed calls    the measured calls alone (n per scenario)
and the same variants through ``bench_model`` in this process, for the whole-run comparison.

    .venv/bin/python bench/fleet_overhead.py [--targets cpu.onnxruntime,cpu.litert]
        [--precisions fp32,int8-dynamic] [--n 2000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="cpu.onnxruntime,cpu.litert")
    ap.add_argument("--precisions", default="fp32,int8-dynamic")
    ap.add_argument("--n", type=int, default=2000)
    a = ap.parse_args()

    from hwbackends.fleet import netns

    if not netns.loopback_only():
        argv = netns.wrap([sys.executable, *sys.argv])
        if argv is None:
            sys.exit("needs a loopback-only network namespace (unshare -n / -rn refused)")
        os.execvp(argv[0], argv)

    import ray

    from hwbackends.bench import SingleStream, bench_model
    from hwbackends.fleet import run_fleet
    from hwbackends.fleet.runner import local_ray_dir, remove_local_ray_dirs

    targets, precs = a.targets.split(","), a.precisions.split(",")
    for rnd in ("first pass", "cached artifacts"):
        t0 = time.perf_counter()
        # address="local" (as the runner does): a stale /tmp/ray/ray_current_cluster or
        # RAY_ADDRESS would make a bare ray.init() try to join a cluster that is gone
        ray.init(address="local", resources={f"hwb.{t}": 1 for t in targets},
                 include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                 configure_logging=False, _temp_dir=local_ray_dir())
        start = time.perf_counter() - t0
        try:
            res = run_fleet("zoo:signal", "local", targets, precs, ["single-stream"], n=a.n,
                            shutdown=False)
        finally:
            ray.shutdown()
            remove_local_ray_dirs()
        tasks = [t for t in res.fleet["tasks"] if t["status"] == "done"]
        over = [1e3 * (t["wall_s"] - t["task_s"]) for t in tasks]
        print(f"\n{rnd}: ray start {start:.1f} s; {len(tasks)} variants, whole run "
              f"{res.fleet['wall_s']:.1f} s")
        print(f"  {'variant':<28} {'overhead ms':>12} {'task s':>8} {'timed calls s':>14} {'cached':>7}")
        for t, o in zip(tasks, over, strict=True):
            print(f"  {t['variant']:<28} {o:>12.1f} {t['task_s']:>8.2f} {t['bench_s']:>14.3f} "
                  f"{str(t['cached']):>7}")
        print(f"  median overhead {statistics.median(over):.1f} ms, max {max(over):.1f} ms")
    t0 = time.perf_counter()
    res = bench_model("zoo:signal", targets, precs, [SingleStream(n=a.n)], bars=False)
    print(f"\nin-process bench_model, same variants (cached): {time.perf_counter() - t0:.1f} s, "
          f"{len(res.profiles)} profiles")


if __name__ == "__main__":
    main()
