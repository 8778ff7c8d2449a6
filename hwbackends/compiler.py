"""``compile()``: model + target + precision → a loaded, fidelity-checked ``CompiledModel``.

Resolve the target, convert the model to a format it takes (through the converter plugins),
look the artifact up in the store, else build it in the isolated worker process, load it,
warm it up and measure its fidelity against the reference.
"""
from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import shutil
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from . import build_cache, cost, isolate
from .batchdim import resolve_batch
from .compiled import CompiledModel
from .context import Progress, log_progress
from .errors import CacheError, CompileError, ConfigError, HwbError, UnavailableError, UnsupportedError
from .fidelity import Fidelity, check_kind, compare, gate_violations, precision_family
from .labels import label
from .manifest import Manifest
from .models import Model, load_model, load_saved
from .registry import Registry, get_registry
from .specs import Availability
from .store import ArtifactStore, cache_key
from .store_prune import keep_within_limit
from .target import Artifact, CompileOptions, Converter, Target, close_executor

log = logging.getLogger("hwbackends")


#: Bumped when the core changes how models travel to the worker or how artifacts are laid out.
CORE_FORMAT = 1


def conversion_path(reg: Registry, src: str, dst_formats: Sequence[str],
                    target: str = "the target") -> list[Converter]:
    """Shortest chain of available converters from ``src`` to any of ``dst_formats``."""
    if src in dst_formats:
        return []
    usable = [c for c in reg.converters if c.available() is None]
    queue: deque[tuple[str, list[Converter]]] = deque([(src, [])])
    seen = {src}
    while queue:
        fmt, chain = queue.popleft()
        for c in usable:
            if c.src == fmt and c.dst not in seen:
                if c.dst in dst_formats:
                    return chain + [c]
                seen.add(c.dst)
                queue.append((c.dst, chain + [c]))
    offered = ", ".join(f"{c.src}→{c.dst}" + ("" if c.available() is None else f" (unavailable: {c.available()})")
                        for c in reg.converters) or "none"
    raise UnsupportedError(f"{target} takes {', '.join(dst_formats)} models and no installed "
                           f"converter reaches them from {src} (installed: {offered}); pick another "
                           f"target or export the model to {dst_formats[0]}")


def _data(m: Model, calibration_data: Any, validation_data: Any,
          uses_calib: bool) -> tuple[Any, Any, dict[str, Any]]:
    """Calibration inputs, validation inputs, and where each came from (hwbackends/samples.py;
    tuples, one array per input, for a multi-input model).

    Validation data is ``validation_data``, else the model's own. With explicit calibration
    data it is all validation data (or, without any, the calibration data itself, labelled
    *not held out*); without, calibration and validation are the two disjoint halves of the
    validation data (at most 256/512 samples of a model's own data, enough for a stable
    correlation while a compile stays quick; up to
    :data:`~hwbackends.samples.MAX_CALIBRATION`/``MAX_VALIDATION`` of data given here). No
    data at all: seeded synthetic N(0,1), and the label says so."""
    from . import samples as S

    cal = S.as_samples(calibration_data, m.inputs, "calibration_data") if calibration_data is not None else None
    val = S.as_samples(validation_data, m.inputs, "validation_data") if validation_data is not None else None
    if val is None and m.validation_data is not None:
        val = S.Samples(m.validation_data, S.own_source(m.meta, S.count(m.validation_data)))

    def capped(x: S.Samples, limit: int) -> tuple[Any, S.DataSource]:
        n = S.count(x.arrays)
        if n <= limit:
            return S.head(x.arrays, n), x.source
        return S.head(x.arrays, limit), x.source.part(f"the first {limit} samples", limit)

    if cal is not None:
        calib, csrc = capped(cal, S.MAX_CALIBRATION)
        if val is not None:
            v, vsrc = capped(val, S.MAX_VALIDATION)
        else:
            v, vsrc = capped(cal, S.MAX_VALIDATION)
            vsrc = dataclasses.replace(vsrc, label=f"{vsrc.label}: the calibration data itself, "
                                                   f"not held out (give validation data for a "
                                                   f"held-out check)")
    elif val is not None and S.count(val.arrays) >= 2:
        n = S.count(val.arrays)
        half = n // 2
        own = val.source.kind == "model"
        kc, kv = (256, 512) if own else (S.MAX_CALIBRATION, S.MAX_VALIDATION)
        calib = S.rows(val.arrays, 0, min(half, kc))
        v = S.rows(val.arrays, half, half + min(n - half, kv))
        nc, nv = S.count(calib), S.count(v)
        csrc = val.source.part(f"samples 0–{nc - 1}", nc)
        vsrc = val.source.part(f"samples {half}–{half + nv - 1} (held out from calibration)", nv)
    else:
        calib, csrc = m.synthetic(256, 0), S.synthetic(256, 0)
        if val is not None:
            v, vsrc = capped(val, S.MAX_VALIDATION)
        else:
            v, vsrc = m.synthetic(512, 1), S.synthetic(512, 1)
    data = {"validation": vsrc.to_dict(), "calibration": csrc.to_dict() if uses_calib else None}
    return calib, v, data


def _compile_job(tgt: Target, chain: list[Converter], model_src: Any, options: CompileOptions,
                 workdir: str, build_cache_dir: str | None = None,
                 limits: cost.Limits | None = None) -> dict[str, Any]:
    """Runs in the worker process (or in-process when isolation is off). ``build_cache_dir``:
    the store's build cache, offered to the target for the compile (:mod:`.build_cache`).
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


def compile(model: Any, target: str = "cpu.litert", precision: str | None = None, *,
            batch_size: int | None = None, threads: int | None = None,
            options: dict[str, Any] | None = None,
            calibration_data: Any = None,
            validation_data: np.ndarray | None = None,
            fidelity: bool = True, nan_policy: str = "reject",
            store: ArtifactStore | str | Path | None = None,
            isolate_compile: bool = True, timeout: float | None = None,
            rebuild: bool = False, progress: Progress | None = None,
            registry: Registry | None = None, limits: cost.Limits | None = None,
            output_kind: str | dict[str, str] | None = None) -> CompiledModel:
    """Compile ``model`` for ``target`` at ``precision`` (default: the target's first) and
    return the loaded :class:`CompiledModel`, with ``.fidelity`` measured on validation data.

    ``model`` is anything :func:`load_model` takes. ``calibration_data`` (for the target's
    ``calibrated`` precisions) and ``validation_data`` (the fidelity check) are one array, or
    for a multi-input model a tuple/list in input order or a dict keyed by input name
    (calibrated multi-input precisions only on targets with ``multi_io_calibrated``), or
    :class:`~hwbackends.samples.Samples` (arrays with their source); both are checked
    (shape, dtype, NaN/Inf). Defaults: the model's own validation data, split into disjoint
    calibration and validation halves, else synthetic N(0,1). Where each came from is
    ``cm.data`` (and ``describe()["data"]``). The artifact is cached in ``store``
    (default ``HWB_CACHE_DIR``): a second call with the same model, target, options and
    toolchain versions is a load. Every load, with or without ``fidelity``, re-runs a few
    inputs stored with the artifact and refuses (rebuilds) one whose outputs changed. The
    build runs in an isolated child process unless ``isolate_compile=False``; a crash or
    timeout raises :class:`CompileError`. A model loaded here is refused before any work when
    its declared cost is over ``limits`` (:mod:`hwbackends.cost`; default from the
    environment), and the worker runs under a memory limit (``HWB_WORKER_MEMORY``).
    ``output_kind`` says what the output is (``signed``, ``regression``, ``probabilities``,
    ``logits``; a dict by output name for several), which decides the metrics the fidelity
    gates on; without it the kind is inferred from the reference and ``cm.fidelity`` says so.
    """
    say = progress or log_progress
    req = _resolve(CompileRequest(model, target, precision, batch_size, threads, options,
                                  calibration_data, validation_data, registry, limits))
    kinds = _output_kinds(req.m, output_kind)
    tgt = req.tgt
    run = _Run(store if isinstance(store, ArtifactStore) else ArtifactStore(store),
               isolate_compile, timeout or tgt.compile_timeout, say)
    if rebuild:
        run.store.evict(req.key)
    loaded = None if rebuild else _load_cached(req, run)
    if loaded is None:
        tgt.check_options(req.opts)  # a mistake in the options costs no build
        # One build per key at a time across processes sharing the store: the one that
        # waited loads what the other committed (an FPGA search is not repeated).
        with run.store.build_lock(req.key, req.what, say, run.timeout) as waited:
            if waited and not rebuild:
                loaded = _load_cached(req, run)
            if loaded is None:
                loaded = _build(req, run)
    executor, art = loaded
    cm = _wrap(executor, art, req.avail, req.m.name, nan_policy, tgt)
    cm.data = req.data
    if fidelity:
        cm.fidelity = _fidelity(req.m, cm, req.val, kinds)
        say(f"{cm.variant} fidelity: {cm.fidelity}")
    return cm


def _output_kinds(m: Model, output_kind: str | dict[str, str] | None) -> str | dict[str, str] | None:
    """``output_kind`` checked: one kind, or one per output name of ``m``."""
    if output_kind is None or isinstance(output_kind, str):
        return None if output_kind is None else check_kind(output_kind)
    if not isinstance(output_kind, dict):
        raise ConfigError(f"output_kind must be a kind or a dict of kinds by output name; got "
                          f"{type(output_kind).__name__}")
    names = [s.name for s in m.outputs]
    unknown = sorted(set(output_kind) - set(names))
    if unknown:
        raise ConfigError(f"output_kind names output(s) {', '.join(map(repr, unknown))[:200]}; "
                          f"{m.name!r} has {', '.join(names)}")
    return {k: check_kind(v, f"output_kind[{k!r}]") for k, v in output_kind.items()}


def _fidelity(m: Model, cm: CompiledModel, val: Any, kind: str | dict[str, str] | None = None) -> Fidelity:
    """``cm`` against ``m``'s own fp32 reference on the validation data ``val`` (per output,
    named, for a multi-IO model), judged as output ``kind`` (inferred when ``None``)."""
    xs = _as_tuple(val)
    return compare(m.reference(xs), _as_tuple(cm.predict(xs)), kind=kind,
                   names=[s.name for s in m.outputs] if m.multi_io else None)


@dataclasses.dataclass(frozen=True)
class CompileRequest:
    """What a caller asks :func:`compile` (or a fleet node's import) for, as given: the model
    (anything :func:`load_model` takes), the target's name and the options, unresolved."""

    model: Any
    target: str
    precision: str | None = None
    batch_size: int | None = None
    threads: int | None = None
    options: dict[str, Any] | None = None
    calibration_data: Any = None
    validation_data: Any = None
    registry: Registry | None = None
    #: What a model loaded here may cost (:mod:`hwbackends.cost`); ``None``: the environment's.
    limits: cost.Limits | None = None


@dataclasses.dataclass
class _Request:
    """What one compile asks for, resolved: the model, the target, the options and the store
    key computed from them (``parts``: what the key hashes, signed into the manifest)."""

    m: Model
    tgt: Target
    avail: Availability
    chain: list[Converter]
    opts: CompileOptions
    key: str
    parts: dict[str, Any]
    val: Any
    #: Where the calibration and validation inputs came from (hwbackends/samples.py).
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    limits: cost.Limits | None = None

    @property
    def what(self) -> str:
        """The build in words, for progress and error messages."""
        return f"compiling {self.m.name!r} for {label(self.tgt.name, self.opts.precision)}"


@dataclasses.dataclass(frozen=True)
class _Run:
    """How a build runs: the store it lands in, whether in the worker process, its timeout
    and where progress goes."""

    store: ArtifactStore
    isolated: bool
    timeout: float
    progress: Progress


def _resolve(ask: CompileRequest) -> _Request:
    """Load the model, resolve the target, check the request, and compute its key. The
    caller's :class:`Model` is never changed: the compile works on its own copy (fields and
    ``meta``; the framework object is shared, and the targets receive it read-only)."""
    m = _own_copy(load_model(ask.model, limits=ask.limits))
    reg = ask.registry or get_registry()
    tgt = reg.target(ask.target)
    prec, batch_size = _check_request(m, tgt, ask.precision, ask.batch_size, ask.options)
    if m.multi_io:
        _check_multi_io(m, tgt, prec, reg)
    avail = tgt.probe()
    if not avail.usable:
        raise UnavailableError(f"target {tgt.name} is unavailable here: {avail.reason}")
    chain = conversion_path(reg, m.format, tgt.formats, tgt.name)
    # The caller's data is checked here and used for this compile only (the model is not
    # changed); ``data`` says where calibration and validation inputs came from.
    calib, val, data = _data(m, ask.calibration_data, ask.validation_data,
                             prec in tgt.calibrated)
    opts, key, parts = _plan(m, tgt, prec, chain, calib,
                             CompileOptions(prec, batch_size, ask.threads, dict(ask.options or {}),
                                            None))
    return _Request(m, tgt, avail, chain, opts, key, parts, val, data, ask.limits)


def _own_copy(m: Model) -> Model:
    """A copy of ``m`` whose fields and ``meta`` the compile may set (an in-process target,
    a converter, the reference cache) without reaching the caller's object."""
    own = copy.copy(m)  # a deferred model stays deferred: a cached artifact needs no framework
    own.meta, own.inputs, own.outputs = copy.deepcopy(m.meta), list(m.inputs), list(m.outputs)
    return own


def _check_request(m: Model, tgt: Target, precision: str | None, batch_size: int | None,
                   options: dict[str, Any] | None) -> tuple[str, int]:
    """The precision and batch size to build; refuses precisions, batch sizes and options the
    target lacks."""
    prec = precision or tgt.precisions[0]
    tgt.check_precision(prec)
    # None: the model's fixed batch if it has one (predict() pads/chunks), else 1.
    batch_size = resolve_batch(m.meta, m.format, m.name, batch_size, tgt.static_batch)
    unknown = sorted(set(options or {}) - set(tgt.option_docs))
    if unknown:
        docs = "; ".join(f"{k}: {v}" for k, v in tgt.option_docs.items()) or "none"
        raise UnsupportedError(f"target {tgt.name} has no option(s) {', '.join(unknown)}; "
                               f"its options: {docs}")
    return prec, batch_size


def _check_multi_io(m: Model, tgt: Target, prec: str, reg: Registry) -> None:
    """Refuse a model with several inputs/outputs, before any worker starts, on a target that
    does not take them (and its calibrated precisions unless it declares
    ``multi_io_calibrated``: they would be fed one calibration tensor)."""
    ins = ", ".join(str(s) for s in m.inputs)
    outs = ", ".join(str(s) for s in m.outputs)
    if not tgt.multi_io:
        able = sorted(n for n, t in reg.targets.items() if t.multi_io)
        raise UnsupportedError(f"target {tgt.name} takes models with one input and one output; "
                               f"{m.name!r} has {len(m.inputs)} input(s) ({ins}) and "
                               f"{len(m.outputs)} output(s) ({outs}). Targets that take several: "
                               f"{', '.join(able) or 'none installed'}")
    if prec in tgt.calibrated and not tgt.multi_io_calibrated:
        able = sorted(f"{n}:{'/'.join(t.calibrated)}" for n, t in reg.targets.items()
                      if t.multi_io_calibrated and t.multi_io)
        raise UnsupportedError(f"{label(tgt.name, prec)} calibrates on one input tensor; {m.name!r} has "
                               f"several inputs/outputs. Use an uncalibrated precision of "
                               f"{tgt.name} ({', '.join(p for p in tgt.precisions if p not in tgt.calibrated)})"
                               f", or a target whose calibrated precisions take several inputs: "
                               f"{', '.join(able) or 'none installed'}")


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _digest_inputs(x: Any) -> str:
    h = hashlib.sha256()
    for a in _as_tuple(x):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _plan(m: Model, tgt: Target, prec: str, chain: list[Converter], calib: Any,
          opts: CompileOptions) -> tuple[CompileOptions, str, dict[str, Any]]:
    """The compile options (with calibration data where the precision uses it), the cache
    key and what it hashes. A multi-input model's calibration data is a tuple, one array per
    input (checked and ordered by :func:`_data`)."""
    uses_calib = prec in tgt.calibrated
    opts = dataclasses.replace(opts, calibration=calib if uses_calib else None)
    parts = {
        "core": CORE_FORMAT, "fingerprint": m.fingerprint, "target": tgt.name,
        "target_version": tgt.version, "options": _key_options(tgt, opts),
        "calibration": _digest_inputs(calib) if uses_calib else None,
        "toolchain": tgt.toolchain(), "chain": [c.name for c in chain],
    }
    parts = json.loads(json.dumps(parts, sort_keys=True, default=str))  # as the manifest holds it
    return opts, cache_key(parts), parts


def _key_options(tgt: Target, opts: CompileOptions) -> dict[str, Any]:
    """The options the store key hashes: without the batch size on a target whose artifact
    does not depend on it (``Target.batch_independent``: one build serves every size)."""
    d = opts.key_dict()
    if tgt.batch_independent:
        d.pop("batch_size", None)
    return d


def _wrap(executor: Any, art: Artifact, avail: Any, name: str, nan_policy: str,
          tgt: Target) -> CompiledModel:
    """A warmed-up CompiledModel. What load() found decides the mode: an FPGA target serves
    from a board when a matching bitstream is there, and from its C-simulation otherwise."""
    # load() may return any object with predict_into (the contract's Executor or a duck type)
    avail = getattr(executor, "availability", None) or avail
    cm = CompiledModel(executor, art, avail, name, nan_policy, tgt.static_batch)
    cm.warmup()
    return cm


def _identity_problem(rec: dict[str, Any], req: _Request) -> str | None:
    """``None`` when a (signed) manifest is the one ``req`` asked for: its key's parts are
    this request's and its model, target and precision agree with them; else what differs."""
    parts = rec.get("key_parts")
    if not isinstance(parts, dict):
        return "the manifest signs no key_parts"
    diff = _differences(parts, req.parts)
    if diff:
        return f"signed for another request ({diff})"
    for name, want in (("fingerprint", req.m.fingerprint), ("target", req.tgt.name),
                       ("precision", req.opts.precision)):
        if rec.get(name) != want:
            return f"its {name} is {rec.get(name)!r}, not {want!r}"
    return None


def _differences(got: dict[str, Any], want: dict[str, Any]) -> str:
    """The key parts that differ, each with both values (shortened), for an error message."""
    def short(v: Any) -> str:
        return json.dumps(v, sort_keys=True, default=str)[:60]
    names = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    return "; ".join(f"{k}: {short(got.get(k))} there, {short(want.get(k))} here" for k in names)


def _load_cached(req: _Request, run: _Run) -> tuple[Any, Artifact] | None:
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
    run.progress(f"{label(tgt.name, opts.precision)} cached artifact {key[:12]}")
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


#: Rows of the validation data whose outputs are stored with each artifact, its reload check
#: (in its signed manifest, so they are covered by the HMAC and no file is added to what the
#: target wrote).
RELOAD_CHECK_ROWS = 8


def _pack(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a, dtype=np.float32)
    return {"shape": list(a.shape), "f32": base64.b64encode(a.tobytes()).decode()}


def _unpack(d: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["f32"]), dtype=np.float32).reshape(d["shape"])


def make_reload_check(executor: Any, art: Artifact, tgt: Target, m: Model, val: Any) -> dict[str, Any]:
    """The reload check: a few inputs (one entry per input tensor), the artifact's outputs for them (flattened
    to one ``(n, total)`` array) and the tolerance a reload must meet:
    ``max(1e-3·(1+max|out|), ½·max|out − reference|)`` — the build's own error against the
    fp32 reference bounds how far a faithful reload may drift; another model is far outside."""
    cm = CompiledModel(executor, art, Availability.hardware("reload-check"), m.name, "pass",
                       tgt.static_batch)
    xs = tuple(np.ascontiguousarray(a[:RELOAD_CHECK_ROWS], dtype=np.float32) for a in _as_tuple(val))
    out = _flat(cm.predict(xs))
    err = float(np.nanmax(np.abs(out - _flat(m.reference(xs))))) if out.size else 0.0
    tol = max(1e-3 * (1.0 + float(np.nanmax(np.abs(out)) if out.size else 0.0)), 0.5 * err)
    return {"xs": [_pack(a) for a in xs], "out": _pack(out), "tol": tol}


def _flat(ys: Any) -> np.ndarray:
    """Outputs (one array or several) as one ``(n, total)`` array (the reload check's stored outputs)."""
    parts = _as_tuple(ys)
    return np.concatenate([np.asarray(p, np.float32).reshape(len(p), -1) for p in parts], axis=1)


def check_reload(executor: Any, art: Artifact, tgt: Target, check: Any) -> str | None:
    """``None`` when the loaded artifact reproduces its reload check's stored outputs, else
    what differs (a check without them, or of another layout, is a difference)."""
    try:
        xs = tuple(_unpack(d) for d in check["xs"])
        out, tol = _flat(_unpack(check["out"])), float(check["tol"])
    except (TypeError, KeyError, ValueError) as exc:
        return f"no usable stored outputs ({type(exc).__name__}: {exc})"
    cm = CompiledModel(executor, art, Availability.hardware("reload-check"), "reload-check", "pass",
                       tgt.static_batch)
    try:
        pred = _flat(cm.predict(xs))
    except Exception as exc:
        return f"predict on the stored inputs raised {type(exc).__name__}: {exc}"
    if pred.shape != out.shape:
        return f"output shape {pred.shape} != stored {out.shape}"
    diff = np.abs(pred - out)
    same = (diff <= tol) | (np.isnan(pred) & np.isnan(out))
    if not same.all():
        return f"max |output − stored output| {float(np.nanmax(diff)):.3g} > tolerance {tol:.3g}"
    return None


def _record(req: _Request, meta: dict[str, Any], seconds: float) -> Manifest:
    """The manifest of an artifact built (or imported) for ``req``: everything but the files
    and the stored outputs, all from this process's own request (never from a peer)."""
    m, tgt, opts = req.m, req.tgt, req.opts
    return Manifest(target=tgt.name, precision=opts.precision, fingerprint=m.fingerprint,
                    batch_size=opts.batch_size, inputs=list(m.inputs), outputs=list(m.outputs),
                    model=m.name, options=opts.key_dict(), meta=meta, toolchain=tgt.toolchain(),
                    chain=[c.name for c in req.chain], compile_seconds=seconds,
                    key_parts=req.parts, key=req.key)


def _build(req: _Request, run: _Run) -> tuple[Any, Artifact]:
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
        man = _record(req, meta, seconds)
        staged_art = man.artifact(staged)
        executor = _load_new(tgt, staged_art, opts)
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
    run.progress(f"{label(tgt.name, opts.precision)} built in {_elapsed(seconds) if seconds >= 60 else f'{seconds:.1f} s'}")
    keep_within_limit(st, run.progress)  # HWB_CACHE_MAX_SIZE, when set
    return executor, man.artifact(st.path_for(req.key))


#: A build still running after this many seconds says so, and again every HEARTBEAT_EVERY.
HEARTBEAT_FIRST, HEARTBEAT_EVERY = 5.0, 15.0


@contextlib.contextmanager
def heartbeat(progress: Progress, what: str, first: float | None = None,
              every: float | None = None) -> Iterator[None]:
    """While the body runs (a build in the worker: conversion, C++ compile, synthesis),
    ``progress(f"{what}: 20 s elapsed")`` after ``first`` seconds and every ``every`` after."""
    first = HEARTBEAT_FIRST if first is None else first
    every = HEARTBEAT_EVERY if every is None else every
    done = threading.Event()
    t0 = time.monotonic()

    def beat() -> None:
        wait = first
        while not done.wait(wait):
            progress(f"{what}: {_elapsed(time.monotonic() - t0)} elapsed")
            wait = every

    th = threading.Thread(target=beat, name="hwb-build-heartbeat", daemon=True)
    th.start()
    try:
        yield
    finally:
        done.set()
        th.join(1.0)


def _elapsed(s: float) -> str:
    return f"{s:.0f} s" if s < 60 else f"{int(s // 60)} min {int(s % 60):02d} s"


def _run_compile(req: _Request, run: _Run, staged: Path) -> dict[str, Any]:
    """The target's compile into ``staged``, in the worker process (the model travels as a
    saved file) unless ``run`` is not isolated."""
    tgt, opts = req.tgt, req.opts
    cache_dir = str(run.store.root / build_cache.DIRNAME)
    if not run.isolated:
        return _compile_job(tgt, req.chain, req.m, opts, str(staged), cache_dir)
    model_dir = run.store.stage()
    try:
        req.m.save(model_dir)
        return isolate.worker().run(_compile_job, tgt, req.chain, str(model_dir), opts,
                                    str(staged), cache_dir, req.limits or cost.Limits.from_env(),
                                    timeout=run.timeout, what=req.what,
                                    target=tgt.name, precision=opts.precision)
    finally:
        run.store.discard(model_dir)


def _load_new(tgt: Target, art: Artifact, opts: CompileOptions) -> Any:
    try:
        return tgt.load(art, opts)
    except HwbError:
        raise
    except Exception as exc:
        raise CompileError(f"{tgt.name} built an artifact it cannot load: "
                           f"{type(exc).__name__}: {exc}", target=tgt.name,
                           precision=opts.precision) from exc


def import_artifact(store: ArtifactStore, staged: Path, sent: Any, model: Any, target: str,
                    precision: str | None = None, *, registry: Registry | None = None) -> str:
    """Adopt an artifact another node built as this store's compile of ``model`` for
    ``target:precision`` (default options, as ``hwb bench`` compiles): ``staged`` is a
    directory from ``store.stage()`` holding its files, ``sent`` the sender's manifest.
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
        req = _resolve(CompileRequest(model, target, precision, registry=registry))
        if store.get(req.key) is not None:
            return "present"
        _adopt(store, staged, sent, req)
        return "imported"
    finally:
        store.discard(staged)  # a no-op once committed (renamed into objects/)


def _adopt(store: ArtifactStore, staged: Path, sent: Any, req: _Request) -> None:
    m, tgt, opts, key = req.m, req.tgt, req.opts, req.key
    what = f"artifact for {m.name!r} on {tgt.name}:{opts.precision} from another node"
    local = "; compiling locally instead"
    if not isinstance(sent, dict):
        raise CacheError(f"{what}: its manifest is a JSON {type(sent).__name__}, not an "
                         f"object{local}")
    theirs = sent.get("key_parts")
    if sent.get("key") != key or theirs != req.parts:
        diff = _differences(theirs, req.parts) if isinstance(theirs, dict) else "no key_parts"
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
    man = _record(req, meta, float(seconds))
    art = man.artifact(staged)
    try:
        executor = _load_new(tgt, art, opts)
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


def _reference_problem(executor: Any, art: Artifact, req: _Request) -> str | None:
    """What keeps ``executor`` from being ``req``'s model: its fidelity against this
    process's own reference on the validation data, gated by the precision family."""
    cm = CompiledModel(executor, art, Availability.hardware("import"), req.m.name, "pass",
                       req.tgt.static_batch)
    try:
        f = _fidelity(req.m, cm, req.val)
    except Exception as exc:
        return f"predict on the validation data raised {type(exc).__name__}: {exc}"
    bad = gate_violations(req.opts.precision, f)
    return f"{'; '.join(bad)} for {precision_family(req.opts.precision)} precision; {f}" if bad else None
