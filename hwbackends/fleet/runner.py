"""The driver of a fleet evaluation: find the nodes, ask each what it can run, place every
variant on the node holding its target's resource, merge what comes back.

One variant at a time per node (measurements on one machine must not overlap), nodes in
parallel. A node lost or busy fails its rows with the reason; the rest completes. Ctrl-C keeps
what was measured."""
from __future__ import annotations

import atexit
import fnmatch
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..bench import fingerprint
from ..bench.profile import LatencyProfile
from ..bench.results import BenchResults
from ..context import Progress, RunContext
from ..errors import ConfigError, HwbError, UnknownTargetError, UnsupportedError
from ..labels import label
from ..variant import VariantRecord
from . import netns
from .resources import advertised, local_targets, resource_name, resources_for

if TYPE_CHECKING:  # pragma: no cover
    from ..registry import Registry

log = logging.getLogger("hwbackends.fleet")
#: ``on_event(kind, item)``: ``"start"`` / ``"done"`` / ``"failed"`` per variant (tests use it).
OnEvent = Callable[[str, "Item"], None]


class FleetError(HwbError):
    """The fleet cannot be reached or offers nothing to run."""


@dataclass
class Item:
    """One variant on one node."""

    node_id: str
    label: str
    target: str
    precision: str
    toolchain: str
    mode: str
    submitted: float = 0.0
    status: str = "queued"
    artifact_from: str | None = None
    ref: Any = field(default=None, repr=False)
    art_ref: Any = field(default=None, repr=False)
    art_out: Any = field(default=None, repr=False)

    @property
    def variant(self) -> str:
        return label(self.target, self.precision)


_LOCAL_DIRS: list[str] = []
#: A socket path's limit (sun_path less its NUL) and how far below its temp dir Ray puts the
#: longest of its sockets: ``/session_<date>_<time>_<µs>_<pid>/sockets/plasma_store``.
AF_UNIX_PATH_MAX = 107
RAY_SOCKET_TAIL = len("/session_2026-12-01_15-14-56_465287_4194304/sockets/plasma_store")


def local_ray_dir() -> str:
    """A fresh directory for an embedded Ray's session (sockets, logs, object spill, its
    ``ray_current_cluster``), so a run leaves nothing under /tmp/ray for a later ``ray.init()``
    to join: pass it as ``ray.init(address="local", _temp_dir=...)`` and call
    :func:`remove_local_ray_dirs` after ``ray.shutdown()`` (also done at exit)."""
    d = tempfile.mkdtemp(prefix="hwb-ray-")
    if len(d.encode()) + RAY_SOCKET_TAIL > AF_UNIX_PATH_MAX:
        # Ray refuses to start when its plasma_store socket path would not fit (a long TMPDIR:
        # a CI workspace, a test runner's nested temp dirs): its session goes under /tmp.
        os.rmdir(d)
        d = tempfile.mkdtemp(prefix="hwb-ray-", dir="/tmp")
    if not _LOCAL_DIRS:  # registered before ray.init registers its own shutdown: runs after it
        atexit.register(remove_local_ray_dirs)
    _LOCAL_DIRS.append(d)
    return d


def remove_local_ray_dirs() -> None:
    """Remove the session directories of embedded Rays this process started and shut down."""
    import ray

    if ray.is_initialized():
        return
    while _LOCAL_DIRS:
        shutil.rmtree(_LOCAL_DIRS.pop(), ignore_errors=True)


def jax_threads_run() -> bool:
    """Whether JAX has started its backends, and with them its threads, in this process
    (``import jax`` alone does not): then a fork of it may deadlock, and JAX warns so."""
    xb = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(xb, "_at_fork_handler_installed", xb is not None))


def _connect(address: str, ctx: RunContext, local_patterns: Sequence[str], allow_external: bool,
             num_cpus: int | None) -> str:
    progress = ctx.progress
    import ray

    if ray.is_initialized():
        return "existing"
    if address == "local":
        if not netns.loopback_only() and not allow_external:
            raise FleetError(
                "the embedded local Ray binds the host's external interfaces; run it through "
                "`hwb fleet --fleet local` (which enters a loopback-only network namespace), "
                "or inside `unshare -n` yourself, or pass allow_external=True")
        if jax_threads_run():
            raise FleetError(
                "JAX has started its threads in this process, and starting the embedded local "
                "Ray forks it (Ray's preexec_fn; a fork of a process JAX runs in may deadlock). "
                "Run the fleet from a process that has not used JAX (`hwb fleet --fleet local`), "
                "or start a head with `hwb node --head` and pass its address")
        targets = local_targets(ctx.registry, local_patterns)
        progress(f"starting an embedded local Ray advertising {', '.join(targets) or 'nothing'}")
        for attempt in (1, 2):
            try:
                # address="local": a new instance even when RAY_ADDRESS or a stale
                # /tmp/ray/ray_current_cluster names another (Ray would try to join it).
                # Its session lives in a directory of its own, removed after shutdown.
                ray.init(address="local", resources=resources_for(targets), include_dashboard=False,
                         _node_ip_address="127.0.0.1", num_cpus=num_cpus or os.cpu_count() or 1,
                         log_to_driver=False, configure_logging=False, _temp_dir=local_ray_dir())
                return "local"
            except Exception as exc:  # Ray gives its raylet a fixed 30 s to register
                ray.shutdown()
                remove_local_ray_dirs()
                if attempt == 2:
                    raise FleetError(f"the embedded Ray did not start: {exc} (an overloaded "
                                     f"machine: Ray allows its raylet 30 s to register)") from exc
                progress(f"embedded Ray did not start ({exc}); retrying once")
    progress(f"connecting to the Ray cluster at {address}")
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except Exception as exc:  # ConnectionError, RuntimeError… differ by Ray version
        raise FleetError(f"cannot connect to a Ray cluster at {address!r}: {type(exc).__name__}: "
                         f"{exc}. Start one with `hwb node --head` (or `ray start --head`); a "
                         f"cluster with token authentication needs its token here "
                         f"(~/.ray/auth_token or RAY_AUTH_TOKEN); or use --fleet local") from exc
    return "cluster"


def _auth_env() -> None:
    """`ray start` (2.60) turns token authentication on, but a driver sends its token
    (~/.ray/auth_token, RAY_AUTH_TOKEN[_PATH]) only with RAY_AUTH_MODE=token, which Ray reads
    when it is imported: set it before."""
    has_token = (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                 or (Path.home() / ".ray" / "auth_token").is_file())
    if has_token and not os.environ.get("RAY_AUTH_MODE"):
        os.environ["RAY_AUTH_MODE"] = "token"


def _model_blob(model: str) -> bytes | None:
    """Model files travel to the nodes; ``zoo:`` names and directories do not."""
    if model.startswith("zoo:"):
        return None
    p = Path(model)
    if p.is_file():
        return p.read_bytes()
    if p.is_dir():
        raise UnsupportedError(f"{model} is a directory; a fleet run ships model files to the "
                               f"nodes. Export it to one file (.keras, .onnx, .pt2) or use zoo:NAME")
    raise ConfigError(f"model {model!r}: no such file, and not zoo:NAME")


class _Fleet:
    """The scheduling state of one run (kept out of :func:`run_fleet` to keep it readable)."""

    def __init__(self, res: BenchResults, progress: Progress, on_event: OnEvent | None,
                 task_timeout: float, submit: Callable[[Item], None]):
        self.res, self.progress, self.on_event = res, progress, on_event
        self.task_timeout, self.submit = task_timeout, submit
        self.queues: dict[str, list[Item]] = {}
        self.running: dict[str, Item] = {}
        self.compiling: set[tuple[str, str, str]] = set()
        self.artifacts: dict[tuple[str, str, str], tuple[Any, str]] = {}
        self.tasks: list[dict[str, Any]] = []
        self.labels: dict[str, str] = {}

    def key(self, it: Item) -> tuple[str, str, str]:
        return (it.target, it.precision, it.toolchain)

    def next_for(self, node: str) -> Item | None:
        """The next variant for ``node``: one whose artifact exists or is not being compiled
        elsewhere right now (then this node waits for it instead of compiling it again)."""
        for it in self.queues.get(node, []):
            k = self.key(it)
            if k in self.artifacts or k not in self.compiling:
                return it
        return None

    def fill(self) -> None:
        for node in list(self.queues):
            if node in self.running:
                continue
            it = self.next_for(node)
            if it is None:
                continue
            # Running before it leaves the queue: a Ctrl-C at any point finds it somewhere.
            it.status = "running"
            self.running[node] = it
            self.queues[node].remove(it)
            k = self.key(it)
            if k in self.artifacts:
                it.art_ref, it.artifact_from = self.artifacts[k]
            else:
                self.compiling.add(k)
            it.submitted = time.time()
            self.submit(it)
            self.progress(f"{it.variant} → {it.label}"
                     + (f" (artifact from {self.labels.get(it.artifact_from, '?')})" if it.artifact_from else ""))
            if self.on_event:
                self.on_event("start", it)

    def fail(self, it: Item, reason: str) -> None:
        it.status = "failed"
        self.compiling.discard(self.key(it))
        self.res.variants.append(VariantRecord.failed(
            it.target, it.precision, it.mode, reason, variant=f"{it.variant} @ {it.label}",
            machine=self._machine(it.node_id)))
        self.tasks.append({"node_id": it.node_id, "variant": it.variant, "status": "failed",
                           "reason": reason})
        self.progress(f"{it.variant} @ {it.label}: FAILED ({reason})")
        if self.on_event:
            self.on_event("failed", it)

    def fail_node(self, node: str, reason: str) -> None:
        """Every remaining row of ``node`` failed with ``reason`` (the node is gone)."""
        for it in self.queues.pop(node, []):
            self.fail(it, reason)
        for n in self.res.fleet["nodes"]:
            if n["node_id"] == node:
                n["status"], n["error"] = "lost", reason

    def _machine(self, node: str) -> dict[str, Any]:
        for n in self.res.fleet["nodes"]:
            if n["node_id"] == node:
                return dict(n.get("fingerprint") or {}, hostname=n.get("hostname"),
                            node_id=node, label=n.get("label"))
        return {"node_id": node}

    def merge(self, it: Item, out: dict[str, Any]) -> None:
        wall = time.time() - it.submitted
        it.status = "done"
        self.compiling.discard(self.key(it))
        if out.get("error"):
            self.fail(it, out["error"])
            return
        label = out["identity"]["label"]
        for v in out["variants"]:
            v["variant"] = f"{v['variant']} @ {label}"
            v["artifact_from_node"] = it.artifact_from
            self.res.variants.append(VariantRecord.from_dict(v))
        for p in out["profiles"]:
            p["variant"] = f"{p['variant']} @ {label}"
            self.res.profiles.append(LatencyProfile.from_dict(p))
        if not self.res.model and out.get("model"):
            self.res.model = out["model"]
        if out.get("data"):  # where the nodes' calibration/validation inputs came from
            from ..bench.harness import note_data
            note_data(self.res, out["data"])
        self.tasks.append({"node_id": it.node_id, "variant": it.variant, "status": "done",
                           "wall_s": wall, "task_s": out.get("task_s"),
                           "bench_s": out.get("bench_s"), "imported": out.get("imported"),
                           "compile_s": sum(v.get("compile_seconds") or 0 for v in out["variants"]),
                           "cached": any(v.get("cached") for v in out["variants"])})
        self.progress(f"{it.variant} @ {label}: done in {wall:.1f} s, " + ", ".join(
            f"{p['scenario']} p99 {p['p99_us']:.1f} µs" for p in out["profiles"]))
        if out.get("interrupted"):
            raise KeyboardInterrupt
        if self.on_event:
            self.on_event("done", it)


def _probe_nodes(ray: Any, nodes: list[dict[str, Any]], patterns: Sequence[str],
                 timeout: float, progress: Progress) -> list[dict[str, Any]]:
    """``node_info`` on every node holding hwb.* resources, each scheduled on that node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .node import node_info

    remote = ray.remote(node_info)
    rows, refs = [], {}
    for n in nodes:
        targets = [t for t in advertised(n["Resources"])
                   if any(fnmatch.fnmatchcase(t, p) for p in patterns)]
        row = {"node_id": n["NodeID"], "address": n.get("NodeManagerAddress"),
               "advertised": advertised(n["Resources"]), "selected": targets, "status": "ok",
               "error": None, "hostname": n.get("NodeManagerHostname"),
               "label": f"{n.get('NodeManagerHostname')}·{n['NodeID'][:6]}"}
        rows.append(row)
        if not row["advertised"]:
            row["status"] = "no-targets"
            row["error"] = ("advertises no hwb.* resource; start it with `hwb node` or "
                            "`ray start --resources '{\"hwb.cpu.litert\": 1}'`")
            continue
        if targets:
            strat = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            refs[n["NodeID"]] = remote.options(num_cpus=0, scheduling_strategy=strat,
                                               max_retries=0).remote(targets)
    for row in rows:
        ref = refs.get(row["node_id"])
        if ref is None:
            continue
        try:
            info = ray.get(ref, timeout=timeout)
            row.update(hostname=info["hostname"], label=info["label"],
                       fingerprint=info["fingerprint"], targets=info["targets"])
            progress(f"node {info['label']}: " + ", ".join(
                f"{t} ({d['mode']})" for t, d in info["targets"].items()))
        except Exception as exc:  # lost or busy node: recorded, the others go on
            row["status"], row["error"] = "failed", f"probe failed: {type(exc).__name__}: {exc}"
            ray.cancel(ref, force=True)
            progress(f"node {row['label']}: {row['error']}")
    return rows


def _plan(res: BenchResults, rows: list[dict[str, Any]], precisions: Sequence[str] | None,
          fleet: _Fleet, reg: "Registry") -> None:
    """Queue every (node, target, precision) the node can run; unavailable targets become
    availability rows with their reason, as in ``hwb bench``."""
    from ..registry import precisions_to_build, unaccepted_precisions

    # Target.accepts (the driver's plugins ``reg`` are the nodes' version): -p
    # 'ap_fixed<16,6>' is built on fpga.hls4ml nodes, listed or not.
    advertised = sorted({t for r in rows for t in (r.get("targets") or {})})
    if precisions:  # a target only the nodes register (no plugin here) offers what it lists
        listed = {p for r in rows for t, d in (r.get("targets") or {}).items()
                  if t not in reg.targets for p in d["precisions"]}
        why = unaccepted_precisions([reg.targets[t] for t in advertised if t in reg.targets],
                                    [p for p in precisions if p not in listed])
        if why:
            raise UnsupportedError(f"of the targets the fleet advertises, {why}")
    for r in rows:
        fleet.labels[r["node_id"]] = r["label"]
        for t, d in (r.get("targets") or {}).items():
            machine = dict(r.get("fingerprint") or {}, hostname=r["hostname"],
                           node_id=r["node_id"], label=r["label"])
            res.availability.append({"target": t, "family": d["family"],
                                     "precisions": d["precisions"], "mode": d["mode"],
                                     "reason": d["reason"], "device": d["device"], "details": {},
                                     "machine": machine})
            if d["mode"] == "unavailable":
                continue
            tc = json.dumps([d["toolchain"], d.get("target_version")], sort_keys=True, default=str)
            tgt = reg.targets.get(t)
            build = (precisions_to_build(tgt, precisions) if tgt is not None else
                     [p for p in d["precisions"] if not precisions or p in precisions])
            for p in build:
                fleet.queues.setdefault(r["node_id"], []).append(
                    Item(r["node_id"], r["label"], t, p, tc, d["mode"]))


def run_fleet(model: str, address: str = "local", targets: Sequence[str] = ("*",),
              precisions: Sequence[str] | None = None, scenarios: Sequence[str] = ("single-stream",),
              *, n: int | None = None, pin: Sequence[int] | None = None, reuse_profiles: bool = False,
              task_timeout: float = 1800.0, probe_timeout: float = 300.0,
              share_artifacts: bool = True, cache_dir: str | None = None,
              progress: Progress | None = None, on_event: OnEvent | None = None,
              allow_external: bool = False, num_cpus: int | None = None,
              shutdown: bool = True, data: dict[str, Any] | None = None,
              context: RunContext | None = None) -> BenchResults:
    """Evaluate ``model`` on every node of the Ray cluster at ``address`` (``"local"``: an
    embedded one advertising this machine's available targets). Returns one
    :class:`BenchResults` holding every machine: rows tagged with ``machine`` (fingerprint,
    hostname, node id, label), ``fleet`` describing the nodes and each task's Ray cost.
    ``data``: ``{"calibration"|"validation": {"arrays": …, "source": DataSource dict}}``, the
    user's samples (checked on the driver), sent to every node's compiles
    (:func:`.node.data_from_payload`). ``context`` is the driver's run: its registry says
    which precisions an advertised target builds and what an embedded local Ray advertises,
    its progress callback hears the fleet's lines (``progress`` is the same, loose); each node
    compiles into a store of its own, at ``cache_dir`` there (default: the node's
    ``HWB_CACHE_DIR``)."""
    if address != "local" and "ray" not in sys.modules:
        _auth_env()
    try:
        import ray
    except ImportError as exc:
        raise FleetError("hwb fleet needs Ray: pip install 'hwbackends[fleet]' (ray==2.60.*) on "
                         "this machine and on every node") from exc

    ctx = RunContext.given(context, "run_fleet", progress=progress)
    progress = ctx.progress
    blob = _model_blob(model)
    from ..bench import parse
    for s in scenarios:  # a typo fails here, not once per node
        parse(s)
    t_start = time.time()
    mode = _connect(address, ctx, targets, allow_external, num_cpus)
    res = BenchResults(model={}, machine=dict(fingerprint(), hostname=socket.gethostname(),
                                              role="driver"))
    res.fleet = {"address": address, "mode": mode, "ray_version": ray.__version__, "nodes": [],
                 "tasks": [], "targets": list(targets), "scenarios": list(scenarios)}
    remote = ray.remote(num_returns=2, max_retries=0)(_bench_task())
    blob_ref = ray.put(blob) if blob is not None else None
    data_ref = ray.put(data) if data else None

    def submit(it: Item) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strat = NodeAffinitySchedulingStrategy(it.node_id, soft=False)
        it.ref, it.art_out = remote.options(
            num_cpus=0, resources={resource_name(it.target): 1}, scheduling_strategy=strat,
        ).remote(model, blob_ref, it.target, it.precision, list(scenarios), n,
                 list(pin) if pin else None, reuse_profiles, it.art_ref if share_artifacts else None,
                 cache_dir, data_ref)

    fleet = _Fleet(res, progress, on_event, task_timeout, submit)
    try:
        alive = [x for x in ray.nodes() if x.get("Alive")]
        res.fleet["nodes"] = _probe_nodes(ray, alive, targets, probe_timeout, progress)
        if not any(r.get("selected") for r in res.fleet["nodes"]):
            offered = sorted({t for r in res.fleet["nodes"] for t in r["advertised"]})
            raise UnknownTargetError(
                f"no node of the fleet advertises a target matching {', '.join(targets)}; "
                f"the fleet offers {', '.join(offered) or 'none (start nodes with `hwb node`)'}")
        _plan(res, res.fleet["nodes"], precisions, fleet, ctx.registry)
        _loop(ray, fleet)
    except KeyboardInterrupt:
        res.interrupted = True
        progress("interrupted: keeping what was measured")
        _cancel(ray, [it.ref for it in fleet.running.values() if it.ref is not None])
        for it in list(fleet.running.values()):
            if it.status == "running":  # not already merged or failed
                fleet.fail(it, "interrupted (Ctrl-C) before it finished")
        fleet.running.clear()
        for q in fleet.queues.values():  # progress what was never measured, not just drop it
            while q:
                it = q.pop(0)
                if it.status == "queued":
                    fleet.fail(it, "not run: interrupted (Ctrl-C)")
    finally:
        res.fleet["tasks"] = fleet.tasks
        res.fleet["wall_s"] = time.time() - t_start
        if shutdown and mode != "existing":
            ray.shutdown()
            remove_local_ray_dirs()
    if not res.model:
        res.model = {"name": model}
    return res


#: After Ctrl-C, how long a running task gets to unwind (its ``finally`` blocks: temporary
#: directories, the node's compile worker) before it is killed.
CANCEL_GRACE_S = 5.0


def _cancel(ray: Any, refs: list[Any]) -> None:
    """Cancel ``refs`` as a Ctrl-C would: KeyboardInterrupt in each task first, so it cleans up
    after itself on its node, then, for any still running after :data:`CANCEL_GRACE_S` (stuck
    in a compiler or in C), a kill. A second Ctrl-C skips the wait."""
    for ref in refs:
        ray.cancel(ref, force=False)
    left = refs
    try:
        if refs:
            _, left = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S)
    except KeyboardInterrupt:
        pass
    # Only what is still running: a forced cancel of a task that has just unwound crashed
    # Ray 2.60's core worker when the task's late reply arrived ("Tried to complete task that
    # was not pending", the process exited 1 instead of 130; seen under load).
    for ref in left:
        ray.cancel(ref, force=True)


def _bench_task() -> Callable[..., Any]:
    from .node import bench_on_node

    return bench_on_node


def _node_alive(ray: Any, node: str) -> bool:
    return any(x["NodeID"] == node and x.get("Alive") for x in ray.nodes())


def _loop(ray: Any, fleet: _Fleet) -> None:
    """Submit, wait, merge until every queue is empty."""
    last_check = time.time()
    while True:
        fleet.fill()
        if not fleet.running:
            if any(fleet.queues.values()):  # only waits on compiles that no longer run
                fleet.compiling.clear()
                continue
            return
        refs = [it.ref for it in fleet.running.values()]
        done, _ = ray.wait(refs, num_returns=1, timeout=1.0)
        for node, it in list(fleet.running.items()):
            if it.ref in done:
                _collect(ray, fleet, node, it)  # still "running" until merged: Ctrl-C-safe
                del fleet.running[node]
        now = time.time()
        for node, it in list(fleet.running.items()):
            if now - it.submitted > fleet.task_timeout:
                ray.cancel(it.ref, force=True)
                del fleet.running[node]
                fleet.fail(it, f"not finished within {fleet.task_timeout:g} s: node busy (its "
                               f"{resource_name(it.target)} held by another job) or the build hung")
        if now - last_check > 2.0:  # a node that died with no task on it still fails its queue
            last_check = now
            for node in list(fleet.queues):
                if node not in fleet.running and fleet.queues[node] and not _node_alive(ray, node):
                    fleet.fail_node(node, "node lost before it ran")


def _collect(ray: Any, fleet: _Fleet, node: str, it: Item) -> None:
    try:
        out = ray.get(it.ref)
    except Exception as exc:  # the node died, the worker crashed, the task was cancelled
        # NodeDiedError arrives before the GCS marks the node dead: trust it over ray.nodes().
        died = isinstance(exc, (ray.exceptions.NodeDiedError,
                                ray.exceptions.TaskUnschedulableError))
        alive = not died and _node_alive(ray, node)
        reason = (f"{'node lost' if not alive else 'task failed'}: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0][:300] if str(exc) else ''}")
        fleet.fail(it, reason)
        if not alive:
            fleet.fail_node(node, "node lost before it ran")
        return
    k = fleet.key(it)
    fleet.merge(it, out)
    if k not in fleet.artifacts and out.get("profiles") and not out.get("imported"):
        fleet.artifacts[k] = (it.art_out, node)
