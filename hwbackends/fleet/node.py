"""What runs on a fleet node (as Ray tasks): report which targets it can run, and compile +
measure one variant with the same :func:`hwbackends.bench.bench_model` ``hwb bench`` uses.

Plain functions: :mod:`.runner` wraps them with ``ray.remote``; they import ray only to learn
the node id. Each task is its node's entry: it builds the node's own
:class:`~hwbackends.RunContext` (the node's plugins, its store at ``cache_dir``), since
nothing of the driver's process reaches it."""
from __future__ import annotations

import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from ..errors import HwbError
from .artifacts import Packed, import_packed, pack


def identity() -> dict[str, Any]:
    """This node: Ray node id, hostname, machine fingerprint, and a short label for tables."""
    import ray

    from ..bench import fingerprint

    node_id = ray.get_runtime_context().get_node_id()
    host = socket.gethostname()
    return {"node_id": node_id, "hostname": host, "label": f"{host}·{node_id[:6]}",
            "fingerprint": fingerprint()}


def node_info(targets: Sequence[str]) -> dict[str, Any]:
    """Availability (probed here, as ``hwb targets`` does), precisions (the listed ones and
    the rule of the further ones it accepts) and toolchain of each advertised target on this
    node."""
    from ..context import RunContext
    from ..registry import safe_probe

    reg = RunContext.at().registry  # this node's plugins
    out: dict[str, Any] = {}
    for name in targets:
        tgt = reg.targets.get(name)
        if tgt is None:
            out[name] = {"mode": "unavailable", "family": "", "precisions": [], "toolchain": {},
                         "device": "", "reason": f"advertised, but no plugin registers {name} "
                                                 f"on this node (registered: {', '.join(sorted(reg.targets))})"}
            continue
        av = safe_probe(tgt).to_dict()
        try:
            tc = tgt.toolchain() if av["mode"] != "unavailable" else {}
        except Exception as exc:  # a plugin's bug is this target's reason, as for its probe
            av, tc = {"mode": "unavailable", "reason": f"toolchain() raised {type(exc).__name__}: {exc}",
                      "device": ""}, {}
        out[name] = {"mode": av["mode"], "reason": av.get("reason", ""),
                     "device": av.get("device", ""), "family": tgt.family,
                     "precisions": list(tgt.precisions), "precision_rule": tgt.precision_rule,
                     "toolchain": tc,
                     "target_version": str(tgt.version)}
    return identity() | {"targets": out}


def _model_arg(model: str, blob: bytes | None, tmp: Path) -> str:
    """A model file shipped from the driver is written here; ``zoo:…`` names load as is."""
    if blob is None:
        return model
    p = tmp / Path(model).name
    p.write_bytes(blob)
    return str(p)


def _tag(d: dict[str, Any], ident: dict[str, Any]) -> None:
    d["machine"] = dict(ident["fingerprint"], hostname=ident["hostname"],
                        node_id=ident["node_id"], label=ident["label"])


def data_from_payload(data: dict[str, Any] | None) -> dict[str, Any]:
    """The driver's samples (``run_fleet(data=)``) as ``bench_model`` keyword arguments:
    :class:`~hwbackends.samples.Samples` that keep the driver's source (file name, sha256)."""
    from ..samples import DataSource, Samples

    out: dict[str, Any] = {}
    for k in ("calibration", "validation"):
        d = (data or {}).get(k)
        if d:
            arrays = tuple(d["arrays"]) if isinstance(d["arrays"], list) else d["arrays"]
            out[f"{k}_data"] = Samples(arrays, DataSource.from_dict(d["source"]))
    return out


def bench_on_node(model: str, model_blob: bytes | None, target: str, precision: str,
                  scenarios: Sequence[str], n: int | None, pin: Sequence[int] | None,
                  reuse_profiles: bool, artifact: Packed | None,
                  cache_dir: str | None = None,
                  data: dict[str, Any] | None = None) -> tuple[dict[str, Any], Packed | None]:
    """Compile and measure ``target:precision`` here; return the results (as a
    ``BenchResults`` dict, every row tagged with this machine) and the packed artifact for
    other nodes with the same toolchain. ``artifact``: one compiled elsewhere, imported
    before compiling so the compile becomes a store hit — only if it is this node's own
    request (key computed here) and matches this node's reference model
    (:func:`.artifacts.import_packed`); otherwise the note says why and it is compiled here."""
    t0 = time.perf_counter()
    from ..bench import ProfileCache, bench_model, parse
    from ..context import RunContext

    ident = identity()
    notes: list[str] = []
    ctx = RunContext.at(cache_dir, profiles=ProfileCache(), progress=notes.append)
    store = ctx.store
    imported = None
    sc = [parse(s) for s in scenarios]
    if n:
        sc = [replace(s, n=n) if hasattr(s, "n") else s for s in sc]
    with tempfile.TemporaryDirectory(prefix="hwb-fleet-") as tmp:
        src: Any = _model_arg(model, model_blob, Path(tmp))
        if artifact is not None:
            try:
                from ..models import load_model

                src = load_model(src)  # loaded once: the import's reference, then the bench's
                imported = import_packed(store, artifact, src, target, precision,
                                         registry=ctx.registry)
            except HwbError as exc:  # refused: compiled here instead, the note says why
                notes.append(str(exc))
        try:
            res = bench_model(src, [target], [precision], sc, context=ctx, pin=pin, bars=False,
                              reuse_profiles=reuse_profiles, **data_from_payload(data))
        except HwbError as exc:  # bad pattern/precision on this node: a failed row, not a crash
            return ({"error": f"{type(exc).__name__}: {exc}", "identity": ident,
                     "task_s": time.perf_counter() - t0}, None)
    out = res.to_dict()
    for row in out["availability"] + out["variants"] + out["profiles"]:
        _tag(row, ident)
    packed = None
    key = next((p.artifact_key for p in res.profiles if p.artifact_key), None)
    if key and imported is None:
        packed = pack(store, key)
    for v in out["variants"]:
        v["artifact_from"] = artifact.key[:12] if imported and artifact else None
    out.update(identity=ident, notes=notes[-20:], imported=imported,
               task_s=time.perf_counter() - t0,
               bench_s=sum(p.duration_s for p in res.profiles))
    return out, packed
