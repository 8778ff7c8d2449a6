"""The fleet's artifact adoption: an artifact another node built, checked here against this
node's own request and reference model before it is committed to the store."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..compiled import CompiledModel
from ..errors import CacheError, CompileError
from ..fidelity import gate_violations, precision_family
from ..registry import Registry
from ..specs import Availability
from ..store.artifacts import ArtifactStore
from ..target import Artifact, close_executor
from .build import load_new, record
from .reload_check import make_reload_check
from .request import CompileRequest, Request, differences, fidelity_of, resolve


def import_artifact(store: ArtifactStore, staged: Path, sent: Any, model: Any, target: str,
                    precision: str | None = None, *, registry: Registry) -> str:
    """Adopt an artifact another node built as this store's compile of ``model`` for
    ``target:precision`` (default options, as ``hwb bench`` compiles; the target from the
    run's ``registry``): ``staged`` is a directory from ``store.stage()`` holding its files,
    ``sent`` the sender's manifest.
    Returns ``"present"`` (this store already holds the key) or ``"imported"``.

    Nothing the sender says is believed. The key is computed here from the request and the
    package must be for it (its ``key_parts`` equal this node's: model fingerprint, target,
    precision, options, toolchain); its files must match its sha256 list; the artifact is
    loaded and its outputs on this node's validation data must meet the precision family's
    tolerance (:func:`hwbackends.fidelity.gate_violations`) against this node's own
    reference model. Only then is it committed, with a manifest and stored outputs made
    here and signed with this node's key. Anything else raises :class:`CacheError` (the
    caller compiles locally); ``staged`` is always consumed (committed or removed)."""
    try:
        req = resolve(CompileRequest(model, target, precision), registry)
        if store.get(req.key) is not None:
            return "present"
        _adopt(store, staged, sent, req)
        return "imported"
    finally:
        store.discard(staged)  # a no-op once committed (renamed into objects/)


def _adopt(store: ArtifactStore, staged: Path, sent: Any, req: Request) -> None:
    m, tgt, opts, key = req.m, req.tgt, req.opts, req.key
    what = f"artifact for {m.name!r} on {tgt.name}:{opts.precision} from another node"
    local = "; compiling locally instead"
    if not isinstance(sent, dict):
        raise CacheError(f"{what}: its manifest is a JSON {type(sent).__name__}, not an "
                         f"object{local}")
    theirs = sent.get("key_parts")
    if sent.get("key") != key or theirs != req.parts:
        diff = differences(theirs, req.parts) if isinstance(theirs, dict) else "no key_parts"
        raise CacheError(f"{what} was built for another request (key "
                         f"{str(sent.get('key'))[:12]}, this node asks for {key[:12]}: "
                         f"{diff or 'the key does not match its parts'}){local}")
    files = store.staged_files(staged)
    listed = sent.get("files") if isinstance(sent.get("files"), dict) else {}
    if files != listed:
        bad = sorted(k for k in set(files) | set(listed) if files.get(k) != listed.get(k))
        raise CacheError(f"{what} failed sha256 verification ({', '.join(bad[:8]) or 'no files'})"
                         f"{local}")
    meta, seconds = sent.get("meta", {}), sent.get("compile_seconds", 0.0)
    if not isinstance(meta, dict) or not isinstance(seconds, (int, float)):
        raise CacheError(f"{what}: malformed manifest (meta {type(meta).__name__}, "
                         f"compile_seconds {type(seconds).__name__}){local}")
    man = record(req, meta, float(seconds))
    art = man.artifact(staged)
    try:
        executor = load_new(tgt, art, opts)
    except CompileError as exc:
        raise CacheError(f"{what} does not load here ({exc}){local}") from exc
    try:
        problem = _reference_problem(executor, art, req)
        if problem:
            raise CacheError(f"{what} does not match this node's reference model "
                             f"({problem}){local}")
        man.reload_check = make_reload_check(executor, art, tgt, m, req.val)
    finally:
        close_executor(executor)
    store.commit(staged, key, man.to_dict())


def _reference_problem(executor: Any, art: Artifact, req: Request) -> str | None:
    """What keeps ``executor`` from being ``req``'s model: its fidelity against this
    process's own reference on the validation data, gated by the precision family."""
    cm = CompiledModel(executor, art, Availability.hardware("import"), req.m.name, "pass",
                       req.tgt.static_batch)
    try:
        f = fidelity_of(req.m, cm, req.val)
    except Exception as exc:
        return f"predict on the validation data raised {type(exc).__name__}: {exc}"
    bad = gate_violations(req.opts.precision, f)
    return f"{'; '.join(bad)} for {precision_family(req.opts.precision)} precision; {f}" if bad else None
