"""Deployment into the servers desks already run: ``hwb export``.

:func:`export` writes one measured variant as a Triton model repository (:mod:`.triton`) or a
TF Serving model (:mod:`.tfserving`), every batching and instance setting taken from the
variant's measured latencies (:mod:`.measurements`); what Triton runs is the target's to say
(``Target.triton``), and other formats go to the variant's target (``Target.exports`` /
``Target.export``: a C library and its header). Nothing here names a target or runs its
runtime; TensorFlow loads inside the TF Serving writer, which saves the source model.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import CacheError, ConfigError, InputError, UnsupportedError
from ..identifiers import safe_ident
from .measurements import Measured, Settings, plan, read_measurements, strategy_deadline
from .outdir import ExportPathError
from .textproto import comment

if TYPE_CHECKING:  # pragma: no cover
    from ..context import RunContext

__all__ = ["CORE_FORMATS", "ExportPathError", "ExportResult", "export"]

#: Formats the core writes; a target's own ``exports`` add more.
CORE_FORMATS = ("triton", "tf-serving")


@dataclass
class ExportResult:
    """What :func:`export` wrote, and the settings it chose (per machine) with their reasons."""

    format: str
    directory: Path
    files: list[Path]
    settings: dict[str, Settings] = field(default_factory=dict)
    measured: dict[str, Measured] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: Each served name that is not the model's own, for people (:meth:`.names.Served.lines`).
    names: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "directory": str(self.directory),
                "files": [str(f) for f in self.files], "notes": self.notes,
                "names": self.names,
                "settings": {k: {"max_batch_size": s.max_batch_size,
                                 "preferred_batch_size": list(s.preferred),
                                 "max_queue_delay_us": s.queue_delay_us,
                                 "timeout_us": s.timeout_us, "instances": s.instances,
                                 "threads": s.threads, "warmup_sizes": list(s.warmup_sizes),
                                 "why": s.why} for k, s in self.settings.items()}}


def export(model: Any, target: str, fmt: str, outdir: str | Path, *,
           precision: str | None = None, results: str | Path | None = None,
           config: str | Path | None = None, strategy: str | None = None,
           machine: str | None = None, max_batch_size: int | None = None,
           threads: int = 1, instances: int | None = None, flavour: str | None = None,
           name: str | None = None, version_compatible: bool = False, replace: bool = False,
           store: Any = None, command: str = "", progress: Any = None,
           context: "RunContext | None" = None, bars: bool = False) -> ExportResult:
    """Write ``model``'s variant ``target:precision`` in format ``fmt`` into ``outdir``.

    ``results``: a ``hwb bench``/``hwb fleet`` results file with the variant's batch sweep
    (every ``triton`` and ``tf-serving`` setting comes from it), validated as untrusted input
    (:func:`.measurements.read_measurements`); without one the sweep is measured here first
    (:func:`measure_sweep`). ``config`` + ``strategy``: the
    deadline (the strategy's ``timeout_us``, else its tier's p99). ``outdir`` is written as
    :mod:`.outdir` says: created, or the user's own and not writable by others, no link
    followed; a model directory holding other versions is refused unless ``replace``. Every
    name written comes from :mod:`.names`. ``command`` is not written into the files (they
    carry no free text); it is accepted for callers. ``context``
    (:class:`~hwbackends.RunContext`) is the run the export belongs to: the target comes from
    its registry, every compile and the sweep use its store and send progress to its callback;
    ``store`` (a store or its path) and ``progress`` are the same, loose, for a one-off call
    (both forms at once is a :class:`ConfigError`). ``bars``: live progress bars on stderr
    while the sweep is measured. Errors are :class:`~hwbackends.errors.HwbError` subclasses
    saying what to change."""
    from ..context import RunContext
    from ..models import load_model
    from .names import served
    from .outdir import OutputDir

    ctx = RunContext.given(context, "export", store=store, progress=progress)
    reg = ctx.registry
    tgt = reg.target(target)
    prec = precision or tgt.precisions[0]
    tgt.check_precision(prec)
    if fmt not in CORE_FORMATS:
        if fmt not in tgt.exports:
            raise UnsupportedError(f"unknown export format {fmt!r} for {target}; formats: "
                                   f"{', '.join(CORE_FORMATS + tuple(tgt.exports))}")
        with OutputDir(Path(outdir), replace) as od:
            _with_miss_retry(lambda: tgt.export(
                _compile(model, target, prec, None, threads, ctx).artifact, fmt,
                od.stage), f"{target}:{prec}")
            return ExportResult(fmt, od.real, od.publish())
    if fmt == "triton":  # a variant Triton cannot run is refused before anything is read
        from .triton import flavour_for
        form = tgt.triton()
        how = flavour_for(target, form, flavour, reg.targets)
    if (config is None) != (strategy is None):
        raise ConfigError("--config and --strategy go together: the strategy's deadline is "
                          "read from the strategies file")
    m = load_model(model) if not hasattr(model, "fingerprint") else model
    if fmt == "tf-serving":
        from .tfserving import check_servable
        check_servable(m)
    names = served(m, name)
    variant = f"{target}:{prec}"
    notes: list[str] = []
    if results is None:
        with tempfile.TemporaryDirectory(prefix="hwb-export-bench-") as tmp:
            path = measure_sweep(m, target, prec, max_batch_size, ctx, Path(tmp), notes, bars)
            measured = read_measurements(path, variant, m, machine)
    else:
        measured = read_measurements(results, variant, m, machine)
    deadline = strategy_deadline(config, strategy) if config is not None else None
    main = sorted(measured)[0] if machine is None else machine
    memory = (row_bytes(m), memory_limit())
    entries = TRITON_ENTRIES if fmt == "triton" else TF_SERVING_ENTRIES
    with OutputDir(Path(outdir), replace, entries) as od:
        # refuse a planted link or another version before compiling anything
        od.check({names.name: True} if fmt == "triton" else
                 {names.name: True, **{f: False for f in TF_SERVING_FILES}})
        if fmt == "triton":
            res = _triton(m, names, target, prec, form, how, flavour, od.stage, measured,
                          main, deadline, max_batch_size, threads, instances,
                          version_compatible, ctx, memory)
        else:
            res = _tf_serving(m, names, od, measured[main], deadline, max_batch_size, threads,
                              instances, memory)
        res.files = od.publish()
        res.directory = od.real
    res.names = names.lines()
    res.notes = notes + res.notes
    return res


#: The sweep ``hwb export`` measures itself when no ``--results`` is given (``hwb bench``'s
#: batch scenario, shorter: at most 2 s per size).
SWEEP_SIZES = (1, 8, 32)


def measure_sweep(m: Any, target: str, prec: str, max_batch: int | None, ctx: "RunContext",
                  tmp: Path, notes: list[str], bars: bool = False) -> Path:
    """Measure ``target:prec`` over :data:`SWEEP_SIZES` (those up to ``max_batch``, and it)
    as ``hwb bench -s batch`` would, in the run's context ``ctx`` (its store, registry and
    progress; ``bars`` on stderr); the results file's path (in ``tmp``). A note says what was
    measured and how to keep it."""
    from ..bench.harness import bench_model
    from ..bench.scenarios import Batch

    sizes = tuple(sorted({b for b in SWEEP_SIZES if max_batch is None or b <= max_batch}
                         | ({max_batch} if max_batch is not None and max_batch >= 1 else set())))
    spec = "/".join(map(str, sizes))
    ctx.progress(f"no --results: measuring {target}:{prec} at batch sizes {spec} (about "
                 f"{2 * len(sizes)} s; pass --results R.json from `hwb bench` to skip this)")
    res = bench_model(m, [target], [prec], [Batch(sizes=sizes, n=1000, max_s=2.0, warmup=50)],
                      context=ctx, bars=bars)
    res.command = f"hwb export (measured itself): batch:sizes={spec}"
    failed = [v.error for v in res.variants if v.error]
    if not any(p.n for p in res.profiles):
        raise InputError(f"measuring {target}:{prec} for the export gave no figures"
                         + (f": {failed[0]}" if failed else "") + "; measure it with `hwb bench "
                         f"MODEL -t {target} -p {prec} -s batch:sizes={spec} -o R.json` and "
                         f"pass --results R.json")
    notes.append(f"measured here (no --results): {target}:{prec} at batch sizes {spec}; to "
                 f"export again without measuring, save a sweep: hwb bench MODEL -t {target} "
                 f"-p {prec} -s batch:sizes={spec} -o R.json")
    return res.save(tmp / "measured.json")


#: What an export writes inside the model directory (anything else there is refused).
TRITON_ENTRIES = frozenset({"config.pbtxt", "configs", "1"})
TF_SERVING_ENTRIES = frozenset({"1"})
TF_SERVING_FILES = ("batching_parameters.txt", "models.config", "README.md")


def row_bytes(model: Any) -> int:
    """Bytes one row (sample) takes: its inputs and outputs, and the activations between them
    where the model's declared cost knows them (``meta["cost"]``, :mod:`hwbackends.cost`)."""
    import numpy as np

    io = sum(int(np.prod(s.shape, dtype=np.int64)) * np.dtype(s.dtype).itemsize
             for s in [*model.inputs, *model.outputs])
    cost = (getattr(model, "meta", None) or {}).get("cost")
    act = cost.get("activation_bytes") if isinstance(cost, dict) else getattr(cost, "activation_bytes", None)
    return io + (int(act) if isinstance(act, int) and act > 0 else 0)


def memory_limit() -> int:
    """The most one batch's tensors may take: a quarter of this machine's memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError):
        return 4 << 30


def _compile(model: Any, target: str, prec: str, batch: int | None, threads: int, ctx: "RunContext") -> Any:
    from ..compiler import compile as hwb_compile

    return hwb_compile(model, target, prec, batch_size=batch, threads=threads, context=ctx,
                       fidelity=False)


def _with_miss_retry(take: Callable[[], Any], what: str) -> Any:
    """Run ``take`` (compile, then copy the artifact's files out of the store); an entry
    pruned between the two (another compile's ``HWB_CACHE_MAX_SIZE`` cap, or ``hwb store
    prune`` in another process) is a miss: compiled again, once."""
    try:
        return take()
    except FileNotFoundError:
        pass
    try:
        return take()
    except FileNotFoundError as exc:
        raise CacheError(f"the store pruned {what} twice between its compile and the export's "
                         f"copy of it ({exc.filename}); raise HWB_CACHE_MAX_SIZE (or unset it) "
                         f"for this export, or stop the concurrent `hwb store prune`") from None


def _pins(store: Any) -> Any:
    """The store's pin (no prune in this process removes what the export compiled), where the
    store offers one."""
    import contextlib

    return store.pinned() if hasattr(store, "pinned") else contextlib.nullcontext(None)


def _compile_sizes(m: Any, target: str, prec: str, fname: str, sizes: list[int], threads: int,
                   ctx: "RunContext", vdir: Path, pins: Any) -> dict[int, Any]:
    """Each batch size compiled and its artifact's file ``fname`` copied into ``vdir/bN/``
    right away."""
    from .triton import stage_artifact

    compiled: dict[int, Any] = {}
    for b in sizes:
        def take(b: int = b) -> Any:
            cm = _compile(m, target, prec, b, threads, ctx)
            if pins is not None:
                pins.add(cm.artifact.key)
            stage_artifact(vdir, fname, b, cm.artifact)
            return cm
        compiled[b] = _with_miss_retry(take, f"{target}:{prec} at batch {b}")
    return compiled


def _triton(m: Any, names: Any, target: str, prec: str, form: Any, how: str,
            flavour: str | None, stage: Path, measured: dict[str, Measured], main: str,
            deadline: float | None, max_batch: int | None, threads: int, instances: int | None,
            portable: bool, ctx: "RunContext", memory: tuple[int, int]) -> ExportResult:
    """The Triton repository of ``target:prec`` as the target's Triton ``form`` says, in
    flavour ``how`` (:func:`.triton.flavour_for`)."""
    import shutil

    from . import triton as T

    variant = f"{target}:{prec}"
    one = how == "native" and form.one_batch
    engine_max = None
    if one:
        # one file at one batch: the batch the store holds it at is the settings' limit
        art = _compile(m, target, prec, max_batch, threads, ctx).artifact
        engine_max = art.batch_size
        form.check(art, portable)
    settings = {k: plan(v, deadline_us=deadline, max_batch=max_batch, engine_max=engine_max,
                        threads=threads, instances=instances, memory=memory)
                for k, v in measured.items()}
    s = settings[main]
    vdir = stage / names.name / "1"
    notes: list[str] = []     # for people: hwb export's output
    comments: list[str] = []  # our own words only: the config's comment
    if one:
        tf = _with_miss_retry(lambda: form.native(
            vdir, {engine_max: _compile(m, target, prec, max_batch, threads, ctx)},
            names.inputs, names.outputs, threads), variant)
        tm = _native_model(names, tf, threads, variant)
    else:
        sizes = sorted({*s.warmup_sizes, *(b for st in settings.values() for b in st.warmup_sizes)})
        with _pins(ctx.store) as pins:
            compiled = _compile_sizes(m, target, prec, form.artifact_file, sizes, threads,
                                      ctx, vdir, pins)
        if how == "native":
            try:
                tf = form.native(vdir, compiled, names.inputs, names.outputs, threads)
                tm = _native_model(names, tf, threads, variant)
                for b in compiled:
                    shutil.rmtree(vdir / f"b{b}")
            except UnsupportedError as exc:
                if flavour == "native" or form.runtime is None:
                    raise
                # a graph the target cannot serve natively (its batch fixed inside): the
                # python backend runs the compiled graph per measured size instead
                backend = "its native backend"
                notes.append(f"python backend instead of {backend}: {exc}")
                comments.append(f"python backend instead of {backend}: the graph does not "
                                f"take a dynamic batch (hwb export said why)")
                how = "python"
        if how == "python":
            files = T.python_files(vdir, form, compiled, threads, names.inputs, names.outputs)
            tm = T.TritonModel(names.name, names.inputs, names.outputs, {"backend": "python"},
                               threads)
    if how == "native":
        files = tf.files
        notes += tf.notes
        comments += tf.notes
    written = T.write_repository(stage, tm, settings, measured, main,
                                 f"hwb export -t {variant} --format triton")
    if comments:  # what the file is bound to, or a backend fallback: atop every config
        for p in written:
            p.write_text(comment(comments) + p.read_text())
    return ExportResult("triton", stage, written + files, settings, measured, notes)


def _native_model(names: Any, tf: Any, threads: int, variant: str) -> Any:
    """The config's model for a target's native file; a file whose bindings keep names that
    are not plain identifiers is refused (nothing renames tensors inside it)."""
    from .triton import TritonModel

    if tf.bound is not None:
        bad = [s.name for s in [*tf.bound[0], *tf.bound[1]] if safe_ident(s.name) != s.name]
        if bad:
            raise UnsupportedError(f"the {variant} model file binds tensor(s) "
                                   f"{', '.join(repr(b)[:60] for b in bad)}, which are not plain "
                                   f"identifiers, and its bindings cannot be renamed; rename "
                                   f"them in the model, or export a variant whose file takes "
                                   f"the served names (--flavour python, or another target)")
    return TritonModel.native(names.name, names.inputs, names.outputs, tf, threads)


def _tf_serving(m: Any, names: Any, od: Any, meas: Measured, deadline: float | None,
                max_batch: int | None, threads: int, instances: int | None,
                memory: tuple[int, int]) -> ExportResult:
    from . import tfserving as S

    s = plan(meas, deadline_us=deadline, max_batch=max_batch, threads=threads,
             instances=instances, memory=memory)
    stage, name = od.stage, names.name
    vdir = stage / name / "1"
    S.saved_model(m, vdir, names.inputs, names.outputs)
    S.warmup_file(vdir / "assets.extra" / "tf_serving_warmup_requests", name, names.inputs,
                  s.warmup_sizes)
    cmd = f"hwb export -t {meas.variant} --format tf-serving"
    texts = (S.batching_text(s, meas, cmd), S.models_config(name, os.fsencode(od.real / name)),
             S.readme(name, meas.variant))
    for fname, text in zip(TF_SERVING_FILES, texts, strict=True):
        (stage / fname).write_text(text)
    return ExportResult("tf-serving", stage, [], {meas.machine: s}, {meas.machine: meas})
