"""Fleet evaluation on Ray (hwbackends.fleet, hwb fleet / node / route --fleet-results, the fleet report).

The multi-node test runs a real three-node Ray cluster on this machine inside a fresh network
namespace holding only loopback (Ray binds the host's external interface otherwise); it skips
with the reason where namespaces are refused."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hwbackends.bench import BenchResults
from hwbackends.context import RunContext
from hwbackends.fleet import netns
from hwbackends.fleet.resources import advertised, resource_name, target_of

ROOT = Path(__file__).resolve().parents[1]


def _ray_tmp() -> tuple[dict[str, str], Path]:
    """An environment whose TMPDIR is a fresh short directory (Ray's session dirs, sockets and
    ray_current_cluster follow TMPDIR), and that directory: remove it once the Ray processes
    started under it are gone."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="hwb-ray-"))
    return dict(os.environ, TMPDIR=str(d)), d


def _netns_or_skip() -> list[str]:
    pytest.importorskip("ray", reason="Ray is the fleet's engine: pip install '.[fleet]'")
    pre = netns.wrap([sys.executable, "-c", "pass"])
    if pre is None:
        pytest.skip("cannot create a loopback-only network namespace here (unshare -n / -rn "
                    "refused); the Ray tests must not listen on external interfaces")
    return pre


def _chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                       "google-chrome")) if p), None)


def _render_in_chromium(html: Path, needle: str) -> None:
    exe = _chromium()
    if exe is None:
        return  # test_report.py skips with the reason; here the HTML content is checked anyway
    dom = subprocess.run([exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          html.as_uri()], capture_output=True, text=True, timeout=120)
    assert needle in dom.stdout


# -- small, no Ray cluster -----------------------------------------------------------------

# Importing a peer's artifact (pack / import_packed): tests/test_fleet_import.py.
def test_targets_map_to_ray_resources() -> None:
    assert resource_name("fpga.hls4ml") == "hwb.fpga.hls4ml"
    assert target_of("hwb.cpu.litert") == "cpu.litert" and target_of("CPU") is None
    assert advertised({"CPU": 4, "hwb.cpu.litert": 1, "hwb.ref": 0, "node:1.2.3.4": 1}) == ["cpu.litert"]


def test_hwb_node_dry_run_advertises_available_targets(capsys) -> None:
    from hwbackends.cli import main

    assert main(["node", "--head", "-t", "cpu.onnxruntime,gpu.*", "--dry-run", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["resources"] == {"hwb.cpu.onnxruntime": 1.0}  # no GPU here: not advertised
    assert "start" in d["command"] and "--head" in d["command"]


def test_fleet_local_refuses_external_interfaces_in_library(tmp_path) -> None:
    pytest.importorskip("ray", reason="Ray is the fleet's engine: pip install '.[fleet]'")
    from hwbackends.fleet.runner import FleetError, run_fleet

    if netns.loopback_only():
        pytest.skip("already in a loopback-only namespace")
    with pytest.raises(FleetError, match="loopback-only"):
        run_fleet("zoo:signal", "local", ["cpu.onnxruntime"])


def test_fleet_bad_model_is_a_clear_error(tmp_path) -> None:
    from hwbackends.errors import ConfigError
    from hwbackends.fleet.runner import run_fleet

    with pytest.raises(ConfigError, match="no such file"):
        run_fleet(str(tmp_path / "missing.keras"), "local")


# -- a real multi-node Ray cluster, loopback only --------------------------------------------

@pytest.fixture(scope="module")
def cluster_run(store_dir, zoo_model, tmp_path_factory) -> dict:
    pre = _netns_or_skip()
    zoo_model("signal")  # trained once into the session store; the nodes copy it
    out = tmp_path_factory.mktemp("fleet")
    cmd = netns.wrap([sys.executable, str(ROOT / "tests" / "fleet_cluster.py"), str(out),
                      str(store_dir)])
    assert cmd is not None and pre
    t0 = time.time()
    env, ray_tmp = _ray_tmp()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    finally:  # the cluster is shut down when fleet_cluster.py returns
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"out": out, "res": BenchResults.load(out / "results.json"),
            "meta": json.loads((out / "meta.json").read_text()), "seconds": time.time() - t0}


@pytest.mark.slow
def test_cluster_places_each_variant_on_its_node(cluster_run) -> None:
    res, meta = cluster_run["res"], cluster_run["meta"]
    nodes = {n["node_id"]: n for n in res.fleet["nodes"]}
    assert set(nodes) == set(meta["nodes"].values())
    measured = {p.machine["node_id"] for p in res.profiles}
    assert len(measured) >= 2  # head (cpu.litert only) and n2 (cpu.onnxruntime + cpu.litert)
    for p in res.profiles:  # measured where its resource was, tagged with who measured it
        assert p.target in nodes[p.machine["node_id"]]["advertised"], p.variant
        assert p.machine["hostname"] and p.machine["id"] and p.machine["label"] in p.variant
    head, n2 = meta["nodes"]["head"], meta["nodes"]["n2"]
    got = {(p.machine["node_id"], p.target) for p in res.profiles}
    assert {(head, "cpu.litert"), (n2, "cpu.litert"), (n2, "cpu.onnxruntime")} <= got


@pytest.mark.slow
def test_cluster_survives_a_node_killed_mid_run(cluster_run) -> None:
    res, meta = cluster_run["res"], cluster_run["meta"]
    victim = meta["victim"]
    assert meta["killed"], "the victim node was never given a variant"
    lost = [v for v in res.variants if v.machine["node_id"] == victim]
    assert lost and all("node lost" in v.error for v in lost), lost
    assert {v.target for v in lost} == {"cpu.onnxruntime", "ref"}  # both of its rows
    assert not any(p.machine["node_id"] == victim for p in res.profiles)
    assert next(n for n in res.fleet["nodes"] if n["node_id"] == victim)["status"] == "lost"
    ok = [v for v in res.variants if v.machine["node_id"] != victim]
    assert len(ok) == 3 and not any(v.error for v in ok)
    assert not res.interrupted


@pytest.mark.slow
def test_cluster_compiles_once_for_identical_toolchains(cluster_run) -> None:
    res = cluster_run["res"]
    lit = [v for v in res.variants if v.target == "cpu.litert" and not v.error]
    assert len(lit) == 2
    built = [v for v in lit if not v.cached]
    fetched = [v for v in lit if v.cached]
    assert len(built) == 1 and len(fetched) == 1  # separate stores: the cache hit is the import
    assert fetched[0].artifact_from_node == built[0].machine["node_id"]
    imported = [t for t in res.fleet["tasks"] if t.get("imported") == "imported"]
    assert len(imported) == 1


@pytest.mark.slow
def test_cluster_report_and_placement(cluster_run) -> None:
    res, out = cluster_run["res"], cluster_run["out"]
    html = (out / "report.html").read_text()
    for h in ("Fleet: 3 machine(s), 2 measured", "Machine differences", "Cost of the Ray layer",
              "Fastest hardware per target family", "Fastest placement per latency tier"):
        assert h in html, h
    for n in res.fleet["nodes"]:
        assert f"Machine {n['label']}" in html
    assert "node lost" in html
    (pl,) = res.fleet["placement"]
    assert len(pl["machines"]) == 3 and pl["best"]["meets_budget"]
    victim = cluster_run["meta"]["victim"]
    dv = next(m for m in pl["machines"] if m["node_id"] == victim)["decision"]
    assert dv["chosen"] is None  # nothing measured there: the router's policy has no candidate
    assert pl["best"]["node_id"] != victim
    _render_in_chromium(out / "report.html", "Machine differences")


#: ``hwb`` as ``python -c``, SIGINT back to Python's default and unblocked first: an ignored
#: disposition and a blocked mask both survive exec, and a test run that inherited either (it
#: happened in full runs) makes the child never see the Ctrl-C (it ran to the end and exited
#: 0, not 130). Done by the child itself, not in a preexec_fn, which would fork the test
#: process in Python (unsafe once JAX's threads run in it).
HWB_SIGINT_DEFAULT = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                      "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
                      "from hwbackends.cli import main; sys.exit(main())")


@pytest.mark.slow
def test_hwb_fleet_local_cli_end_to_end_and_ctrl_c(store_dir, zoo_model, tmp_path, hwb_cli) -> None:
    """`hwb fleet --fleet local` enters a loopback-only namespace itself; Ctrl-C after the
    first variant keeps it; `hwb report` and `hwb route --fleet-results` read what it wrote."""
    _netns_or_skip()
    zoo_model("signal")
    started, release = tmp_path / "stalled.started", tmp_path / "stalled.release"
    # RAY_ADDRESS naming a cluster that is not there (or a stale /tmp/ray/ray_current_cluster)
    # must not make the embedded Ray try to join it. The second variant, cpu.stalled
    # (tests/hwbt_stalled.py, loaded in every process through HWB_PLUGINS), waits in its Ray
    # worker until the interrupt has killed it: the Ctrl-C lands while a job is provably
    # running, whatever the machine's speed.
    env = dict(os.environ, HWB_CACHE_DIR=str(store_dir), RAY_ADDRESS="127.0.0.1:9",
               HWB_PLUGINS="hwbt_stalled", HWBT_STALLED_STARTED=str(started),
               HWBT_STALLED_RELEASE=str(release),
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                        os.environ.get("PYTHONPATH")])))
    hwb = [sys.executable, "-c", HWB_SIGINT_DEFAULT]
    proc = subprocess.Popen(hwb + ["fleet", "zoo:signal", "-t", "cpu.onnxruntime,cpu.stalled",
                                   "-p", "fp32", "-s", "single-stream:n=300", "--fleet", "local",
                                   "-o", str(tmp_path / "r.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path)
    err = []
    deadline = time.time() + 600
    try:
        for line in proc.stderr:  # exec'd (unshare → sh → python): proc.pid is the hwb process
            err.append(line)
            if ": done in " in line:
                break
            assert time.time() < deadline, "".join(err)
        while not started.exists():
            assert proc.poll() is None and time.time() < deadline, "".join(err)
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=120)
    finally:
        release.touch()  # a stalled job that outlived the interrupt ends now, not in 10 min
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(err) + rest + out
    # the interrupted task unwound on its node (KeyboardInterrupt before any kill): its
    # temporary directory is gone
    assert not list(Path(tempfile.gettempdir()).glob("hwb-fleet-*"))
    res = BenchResults.load(tmp_path / "r.json")
    assert res.interrupted and res.fleet["mode"] == "local" and len(res.fleet["nodes"]) == 1
    assert len(res.profiles) == 1 and res.profiles[0].target == "cpu.onnxruntime"
    assert res.profiles[0].machine["node_id"] == res.fleet["nodes"][0]["node_id"]
    (stalled,) = [v for v in res.variants if v.target == "cpu.stalled"]
    assert "interrupted (Ctrl-C) before it finished" in (stalled.error or ""), stalled
    # reading what it wrote only prints: in this process (hwb_cli), no interpreter start each
    rc, _, err = hwb_cli("report", str(tmp_path / "r.json"), "-o", str(tmp_path / "r.html"))
    assert rc == 0, err
    assert "Interrupted run" in (tmp_path / "r.html").read_text()
    _render_in_chromium(tmp_path / "r.html", "Machine differences")
    cfg = tmp_path / "s.toml"
    cfg.write_text('[tiers.slow]\np99_us = 100000\n[strategies.a]\nmodel = "zoo:signal"\n'
                   'tier = "slow"\ntargets = ["cpu.*"]\nfidelity = { corr_min = 0.9 }\n')
    (tmp_path / "r2.json").write_text((tmp_path / "r.json").read_text().replace(
        '"scenario": "server"', '"scenario": "single-stream"'))  # placement ranks single-stream
    rc, out, err = hwb_cli("route", "--fleet-results", str(tmp_path / "r2.json"), str(cfg), "--json")
    assert rc == 0, err
    (a,) = json.loads(out)
    assert a["best"]["variant"] == res.profiles[0].variant.split(" @ ")[0]
    assert a["best"]["meets_budget"]


def test_ray_is_not_imported_by_hwbackends_or_its_cli() -> None:
    code = ("import sys, hwbackends, hwbackends.fleet, hwbackends.report.fleet; "
            "from hwbackends.cli import build_parser; build_parser(); print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_hwb_node_head_then_hwb_fleet_address(store_dir, zoo_model, tmp_path) -> None:
    """`hwb node --head` starts a real Ray head advertising its targets; `hwb fleet --fleet
    ADDRESS` evaluates on it. In fresh network + PID namespaces: loopback only, and the
    daemonized Ray processes die with the namespace."""
    _netns_or_skip()
    zoo_model("signal")
    hwb = shlex.join([sys.executable, "-c",
                      "import sys; from hwbackends.cli import main; sys.exit(main())"])
    out = tmp_path / "r.json"
    script = (f"{hwb} node --head -t cpu.onnxruntime --port 6391 --num-cpus 1 && "
              f"{hwb} fleet zoo:signal --fleet 127.0.0.1:6391 -p fp32 --n 200 -o {shlex.quote(str(out))}")
    cmd = netns.wrap_pid(["sh", "-c", script])
    assert cmd is not None
    env, ray_tmp = _ray_tmp()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path,
                           env=dict(env, HWB_CACHE_DIR=str(store_dir)))
    finally:  # the head's daemons died with the PID namespace; its session files did not
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if r.returncode != 0 and "--mount-proc" in r.stderr[:500]:
        pytest.skip(f"PID namespace refused: {r.stderr[:200]}")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = BenchResults.load(out)
    assert res.fleet["mode"] == "cluster" and res.fleet["address"] == "127.0.0.1:6391"
    (node,) = res.fleet["nodes"]
    assert node["advertised"] == ["cpu.onnxruntime"]
    assert [p.target for p in res.profiles] == ["cpu.onnxruntime"]
    assert res.profiles[0].machine["node_id"] == node["node_id"]


def test_route_fleet_on_a_multi_output_model(store_dir, tmp_path, hwb_cli) -> None:
    """`hwb route --fleet-results` routes a multi-output model (its fidelity records rebuild
    through ``Fidelity.from_dict``). A real two_head bench, once as written (one machine) and
    once with its rows tagged as a fleet node's, routes from its records and profiles."""
    from hwbackends.bench import BenchResults, SingleStream, bench_model

    res = bench_model("zoo:two_head", ["cpu.onnxruntime"], ["fp32"],
                      [SingleStream(n=200, warmup=10)], context=RunContext.at(store_dir), bars=False)
    cfg = tmp_path / "s.toml"
    cfg.write_text('[tiers.t]\np99_us = 100000\n\n[strategies.s]\nmodel = "zoo:two_head"\n'
                   'tier = "t"\ntargets = ["cpu.onnxruntime"]\nfidelity = { corr_min = 0.99 }\n')
    (prof,) = res.profiles
    one = res.save(tmp_path / "one.json")
    node = {"node_id": "n1", "hostname": "box", "label": "box·n1"}
    res.fleet = {"nodes": [node | {"status": "ok"}]}
    for row in res.availability:
        row["machine"] = dict(node)
    for rec in res.variants:
        rec.machine = dict(node)
    for p in res.profiles:
        p.machine = dict(p.machine, **node)
    fleet = res.save(tmp_path / "fleet.json")
    for path in (one, fleet):
        rc, out, err = hwb_cli("route", "--fleet-results", str(path), str(cfg), "--json")
        assert rc == 0, err
        (row,) = json.loads(out)
        assert row["best"]["variant"] == "cpu.onnxruntime:fp32", row
        (c,) = row["machines"][0]["decision"]["candidates"]
        assert c["p99_us"] == prof.p99_us and c["status"] == "chosen"
        assert set(c["fidelity"]["outputs"]) == set(BenchResults.load(path).variants[0].fidelity.outputs)
        assert len(c["fidelity"]["outputs"]) == 2


def test_fleet_plan_builds_an_unlisted_fixed_point_precision() -> None:
    """`hwb fleet -p 'ap_fixed<16,6>'`: the driver checks -p with the target's ``accepts``, not
    against the precisions the nodes list, so it takes what fpga.hls4ml's compile accepts. Planned with
    the rows a node answers (node_info's shape) and the driver's own targets, without Ray."""
    import hwbackends as hwb
    from hwbackends.bench import BenchResults
    from hwbackends.errors import UnsupportedError
    from hwbackends.fleet.runner import _Fleet, _plan

    reg = hwb.get_registry()
    row = {"node_id": "n1", "hostname": "box", "label": "box·n1", "fingerprint": {},
           "targets": {t: {"mode": "emulated" if t == "fpga.hls4ml" else "hardware", "reason": "",
                           "device": "", "family": reg.targets[t].family,
                           "precisions": list(reg.targets[t].precisions), "toolchain": {}}
                       for t in ("fpga.hls4ml", "cpu.onnxruntime")}}
    res = BenchResults(model={}, machine={})
    fleet = _Fleet(res, lambda m: None, None, 60.0, lambda it: None)
    _plan(res, [row], ["ap_fixed<16,6>"], fleet, reg)
    assert [(it.target, it.precision) for it in fleet.queues["n1"]] == [("fpga.hls4ml", "ap_fixed<16,6>")]
    with pytest.raises(UnsupportedError, match=r"precision 'ap_fixed<99,6>' is offered by none of "
                                               r"cpu.onnxruntime, fpga.hls4ml; .*fpga.hls4ml also takes"):
        _plan(res, [row], ["ap_fixed<99,6>"], _Fleet(res, lambda m: None, None, 60.0, lambda it: None), reg)


def test_an_embedded_rays_session_dir_fits_its_socket_paths(monkeypatch, tmp_path) -> None:
    """Ray refuses to start when its plasma_store socket path passes AF_UNIX's 107 bytes: under
    a long TMPDIR (nested test runners, CI workspaces) the session dir goes under /tmp."""
    from hwbackends.fleet import runner

    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.setattr(runner, "_LOCAL_DIRS", [])
    d = runner.local_ray_dir()
    try:
        assert len(d) + runner.RAY_SOCKET_TAIL <= runner.AF_UNIX_PATH_MAX
        assert Path(d).parent == Path("/tmp") and not any(deep.iterdir())
    finally:
        runner.remove_local_ray_dirs()
    assert not Path(d).exists()
