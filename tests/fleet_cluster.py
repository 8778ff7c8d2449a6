"""Helper of tests/test_fleet.py, run inside a loopback-only network namespace: a three-node
Ray cluster on this machine, nodes advertising different targets, each with its own artifact
store; one fleet run; the third node killed as soon as a variant is placed on it.

    python tests/fleet_cluster.py OUT_DIR SHARED_STORE
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path


def main(out: Path, shared: Path) -> int:
    from ray.cluster_utils import Cluster

    from hwbackends.fleet import netns, run_fleet
    from hwbackends.fleet.placement import place
    from hwbackends.registry import get_registry
    from hwbackends.report import write_report

    assert netns.loopback_only(), "refusing to start Ray outside a loopback-only namespace"
    stores = {}
    for name in ("head", "n2", "n3"):  # separate artifact stores: compiles do not leak between nodes
        stores[name] = out / f"store-{name}"
        shutil.copytree(shared / "zoo", stores[name] / "zoo")  # the trained zoo model, not retrained

    def node(name: str, targets: list[str]) -> dict:
        return {"num_cpus": 1, "resources": {f"hwb.{t}": 1 for t in targets},
                "env_vars": {"HWB_CACHE_DIR": str(stores[name])}, "include_dashboard": False}

    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args=node("head", ["cpu.litert"]))
    n2 = cluster.add_node(**node("n2", ["cpu.onnxruntime", "cpu.litert"]))
    n3 = cluster.add_node(**node("n3", ["cpu.onnxruntime", "ref"]))
    cluster.wait_for_nodes()
    started = time.time() - t0
    victim = n3.node_id
    killed: dict = {}

    def on_event(kind: str, item) -> None:
        if kind == "start" and item.node_id == victim and not killed:
            killed["variant"] = item.variant
            cluster.remove_node(n3, allow_graceful=False)  # lost mid-run, no goodbye

    res = run_fleet("zoo:signal", cluster.address, ["cpu.*", "ref"], ["fp32"],
                    ["single-stream"], n=200, progress=lambda m: print("  ·", m, flush=True),
                    on_event=on_event, task_timeout=600)
    res.command = "tests/fleet_cluster.py"
    cfg = out / "s.toml"
    cfg.write_text('[tiers.fast]\np99_us = 1000\n[strategies.a]\nmodel = "zoo:signal"\n'
                   'tier = "fast"\ntargets = ["cpu.*"]\n')
    res.fleet["placement"] = place(res, cfg, get_registry())
    res.save(out / "results.json")
    write_report(res, out / "report.html", registry=get_registry())
    (out / "meta.json").write_text(json.dumps({
        "victim": victim, "killed": killed, "cluster_start_s": started,
        "nodes": {"head": cluster.head_node.node_id, "n2": n2.node_id, "n3": victim}}))
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
