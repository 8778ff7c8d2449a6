"""The compile itself: load a stored artifact (checked against its request and its reload
check) or build one in the isolated worker, load it and commit it to the store."""
from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import cost, isolate
from ..compiled import CompiledModel
from ..context import Progress
from ..errors import CompileError, HwbError
from ..labels import label, push_form
from ..models import load_saved
from ..store import build_cache
from ..store.artifacts import ArtifactStore
from ..store.manifest import Manifest
from ..store.prune import keep_within_limit
from ..target import Artifact, CompileOptions, Converter, Target, close_executor
from .heartbeat import elapsed, heartbeat
from .reload_check import check_reload, make_reload_check
from .request import Request, differences

log = logging.getLogger("hwbackends")


@dataclasses.dataclass(frozen=True)
class Run:
    """How a build runs: the store it lands in, whether in the worker process, its timeout
    and where progress goes."""

    store: ArtifactStore
    isolated: bool
    timeout: float
    progress: Progress


def compile_job(tgt: Target, chain: list[Converter], model_src: Any, options: CompileOptions,
                 workdir: str, build_cache_dir: str | None = None,
                 limits: cost.Limits | None = None) -> dict[str, Any]:
    """Runs in the worker process (or in-process when isolation is off). ``build_cache_dir``:
    the store's build cache, offered to the target for the compile (:mod:`hwbackends.store.build_cache`).
    The saved model's cost is checked against ``limits`` again as the worker reads it."""
    model = (load_saved(Path(model_src), limits) if isinstance(model_src, (str, Path))
             else model_src)
    scratch = Path(tempfile.mkdtemp(prefix="hwb-convert-"))
    try:
        for i, conv in enumerate(chain):
            try:
                model = conv.convert(model, scratch / f"{i}-{conv.dst}")
            except HwbError:
                raise
            except Exception as exc:
                raise CompileError(f"converter {conv.name} ({conv.src}→{conv.dst}) failed on "
                                   f"{model.name!r}: {type(exc).__name__}: {exc}") from exc
        with build_cache.active(build_cache_dir):
            meta = tgt.compile(model, options, Path(workdir))
        return dict(meta or {})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def wrap(executor: Any, art: Artifact, avail: Any, name: str, nan_policy: str,
          tgt: Target) -> CompiledModel:
    """A warmed-up CompiledModel. What load() found decides the mode: an FPGA target serves
    from a board when a matching bitstream is there, and from its C-simulation otherwise."""
    # load() may return any object with predict_into (the contract's Executor or a duck type)
    avail = getattr(executor, "availability", None) or avail
    cm = CompiledModel(executor, art, avail, name, nan_policy, tgt.static_batch)
    cm.warmup()
    return cm


def _identity_problem(rec: dict[str, Any], req: Request) -> str | None:
    """``None`` when a (signed) manifest is the one ``req`` asked for: its key's parts are
    this request's and its model, target and precision agree with them; else what differs."""
    parts = rec.get("key_parts")
    if not isinstance(parts, dict):
        return "the manifest signs no key_parts"
    diff = differences(parts, req.parts)
    if diff:
        return f"signed for another request ({diff})"
    for name, want in (("fingerprint", req.m.fingerprint), ("target", req.tgt.name),
                       ("precision", req.opts.precision)):
        if rec.get(name) != want:
            return f"its {name} is {rec.get(name)!r}, not {want!r}"
    return None


def load_cached(req: Request, run: Run) -> tuple[Any, Artifact] | None:
    """The stored artifact loaded and checked against its stored outputs, or ``None`` (absent,
    or refused and removed: the caller rebuilds it)."""
    key, tgt, opts, st = req.key, req.tgt, req.opts, run.store
    rec = st.get(key)
    if rec is None:
        return None
    problem = _identity_problem(rec, req)
    try:
        man = Manifest.from_dict(rec)
    except (KeyError, TypeError, ValueError) as exc:
        problem = problem or f"its manifest is malformed ({type(exc).__name__}: {exc})"
    if problem:
        log.warning("cached artifact %s is not this model's (%s); removing it, it will be "
                    "rebuilt", key[:12], problem)
        st.evict(key)
        return None
    art = man.artifact(st.path_for(key), cached=True)
    if tgt.batch_independent:  # built once for any size: serve this one
        art.batch_size = opts.batch_size
    run.progress(f"{label(tgt.name, opts.precision, push_form(art.meta))} cached artifact {key[:12]}")
    try:
        executor = tgt.load(art, opts)
    except Exception as exc:
        log.warning("cached artifact %s failed to load (%s); rebuilding", key[:12], exc)
        st.evict(key)
        return None
    problem = check_reload(executor, art, tgt, man.reload_check)
    if problem:
        log.warning("cached artifact %s does not reproduce its stored outputs (%s); removing "
                    "it, it will be rebuilt", key[:12], problem)
        close_executor(executor)
        st.evict(key)
        return None
    st.touch(key)
    return executor, art


def record(req: Request, meta: dict[str, Any], seconds: float) -> Manifest:
    """The manifest of an artifact built (or imported) for ``req``: everything but the files
    and the stored outputs, all from this process's own request (never from a peer)."""
    m, tgt, opts = req.m, req.tgt, req.opts
    return Manifest(target=tgt.name, precision=opts.precision, fingerprint=m.fingerprint,
                    batch_size=opts.batch_size, inputs=list(m.inputs), outputs=list(m.outputs),
                    model=m.name, options=opts.key_dict(), meta=meta, toolchain=tgt.toolchain(),
                    chain=[c.name for c in req.chain], compile_seconds=seconds,
                    key_parts=req.parts, key=req.key)


def build(req: Request, run: Run) -> tuple[Any, Artifact]:
    """Build the artifact, load it from staging, store its reload check, commit it. Returns
    the executor (it keeps working after the staging directory is renamed into place)."""
    tgt, chain, opts, st = req.tgt, req.chain, req.opts, run.store
    run.progress(req.what + (" via " + " → ".join(c.name for c in chain) if chain else "") + " …")
    staged = st.stage()
    t0 = time.perf_counter()
    try:
        with heartbeat(run.progress, f"{label(tgt.name, opts.precision)} still building"):
            meta = _run_compile(req, run, staged)
        seconds = time.perf_counter() - t0
        man = record(req, meta, seconds)
        staged_art = man.artifact(staged)
        executor = load_new(tgt, staged_art, opts)
        man.reload_check = make_reload_check(executor, staged_art, tgt, req.m, req.val)
        man = Manifest.from_dict(st.commit(staged, req.key, man.to_dict()))
    except CompileError as exc:
        st.discard(staged)
        exc.target, exc.precision = exc.target or tgt.name, exc.precision or opts.precision
        raise
    except HwbError:
        st.discard(staged)
        raise
    except Exception as exc:
        st.discard(staged)
        raise CompileError(f"{req.what} failed: {type(exc).__name__}: {exc}", target=tgt.name,
                           precision=opts.precision) from exc
    except BaseException:
        st.discard(staged)
        raise
    run.progress(f"{label(tgt.name, opts.precision, push_form(man.meta))} built in {elapsed(seconds) if seconds >= 60 else f'{seconds:.1f} s'}")
    keep_within_limit(st, run.progress)  # HWB_CACHE_MAX_SIZE, when set
    return executor, man.artifact(st.path_for(req.key))


def _run_compile(req: Request, run: Run, staged: Path) -> dict[str, Any]:
    """The target's compile into ``staged``, in the worker process (the model travels as a
    saved file) unless ``run`` is not isolated."""
    tgt, opts = req.tgt, req.opts
    cache_dir = str(run.store.root / build_cache.DIRNAME)
    if not run.isolated:
        return compile_job(tgt, req.chain, req.m, opts, str(staged), cache_dir)
    model_dir = run.store.stage()
    try:
        req.m.save(model_dir)
        return isolate.worker().run(compile_job, tgt, req.chain, str(model_dir), opts,
                                    str(staged), cache_dir, req.limits or cost.Limits.from_env(),
                                    timeout=run.timeout, what=req.what,
                                    target=tgt.name, precision=opts.precision)
    finally:
        run.store.discard(model_dir)


def load_new(tgt: Target, art: Artifact, opts: CompileOptions) -> Any:
    try:
        return tgt.load(art, opts)
    except HwbError:
        raise
    except Exception as exc:
        raise CompileError(f"{tgt.name} built an artifact it cannot load: "
                           f"{type(exc).__name__}: {exc}", target=tgt.name,
                           precision=opts.precision) from exc
