"""Deployment into the servers desks already run: ``hwb export``.

:func:`export` writes one measured variant as a Triton model repository (:mod:`.triton`) or a
TF Serving model (:mod:`.tfserving`), every batching and instance setting taken from the
variant's measured latencies (:mod:`.measurements`); other formats go to the variant's target
(``Target.exports`` / ``Target.export``: ``cpu.native``'s C library). Nothing here imports a
framework at module level: TensorFlow, ONNX and the runtimes load inside the writers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError, UnsupportedError
from .measurements import Measured, Settings, plan, read_measurements, strategy_deadline
from .textproto import comment

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

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "directory": str(self.directory),
                "files": [str(f) for f in self.files], "notes": self.notes,
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
           name: str | None = None, version_compatible: bool = False,
           store: Any = None, command: str = "", progress: Any = None) -> ExportResult:
    """Write ``model``'s variant ``target:precision`` in format ``fmt`` into ``outdir``.

    ``results``: a ``hwb bench``/``hwb fleet`` results file with the variant's batch sweep
    (required for ``triton`` and ``tf-serving``: every setting comes from it). ``config`` +
    ``strategy``: the deadline (the strategy's ``timeout_us``, else its tier's p99). Errors
    are :class:`~hwbackends.errors.HwbError` subclasses saying what to change."""
    from ..models import load_model
    from ..registry import get_registry

    reg = get_registry()
    tgt = reg.target(target)
    prec = precision or tgt.precisions[0]
    tgt.check_precision(prec)
    out = Path(outdir)
    if fmt not in CORE_FORMATS:
        if fmt not in tgt.exports:
            raise UnsupportedError(f"unknown export format {fmt!r} for {target}; formats: "
                                   f"{', '.join(CORE_FORMATS + tuple(tgt.exports))}")
        cm = _compile(model, target, prec, None, threads, store, progress)
        out.mkdir(parents=True, exist_ok=True)
        return ExportResult(fmt, out, list(tgt.export(cm.artifact, fmt, out)))
    if fmt == "triton":  # a variant Triton cannot run is refused before anything is read
        from .triton import flavour_for
        flavour_for(target, flavour)
    if results is None:
        raise InputError(f"--format {fmt} sets batching and instances from measurements: give "
                         f"--results R.json from `hwb bench MODEL -t {target} -p {prec} "
                         f"-s batch:sizes=1/8/32 -o R.json`")
    if (config is None) != (strategy is None):
        raise ConfigError("--config and --strategy go together: the strategy's deadline is "
                          "read from the strategies file")
    m = load_model(model) if not hasattr(model, "fingerprint") else model
    variant = f"{target}:{prec}"
    measured = read_measurements(results, variant, m, machine)
    deadline = strategy_deadline(config, strategy) if config is not None else None
    main = sorted(measured)[0] if machine is None else machine
    nm = name or _safe_name(m.name)
    if fmt == "triton":
        return _triton(m, target, prec, out, nm, measured, main, deadline, max_batch_size,
                       threads, instances, flavour, version_compatible, store, command, progress)
    return _tf_serving(m, out, nm, measured[main], deadline, max_batch_size, threads,
                       instances, command)


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name) or "model"


def _compile(model: Any, target: str, prec: str, batch: int | None, threads: int, store: Any,
             progress: Any) -> Any:
    from ..compiler import compile as hwb_compile

    return hwb_compile(model, target, prec, batch_size=batch, threads=threads, store=store,
                       fidelity=False, progress=progress)


def _triton(m: Any, target: str, prec: str, out: Path, name: str,
            measured: dict[str, Measured], main: str, deadline: float | None,
            max_batch: int | None, threads: int, instances: int | None, flavour: str | None,
            version_compat: bool, store: Any, command: str, progress: Any) -> ExportResult:
    from . import triton as T

    how = T.flavour_for(target, flavour)
    engine_max = None
    art = None
    if target == "gpu.tensorrt":
        # the engine is what the store holds at its compiled batch: its profile is the limit
        art = _compile(m, target, prec, max_batch, threads, store, progress).artifact
        engine_max = art.batch_size
        if version_compat and not T.version_compatible(art):
            raise UnsupportedError("--trt-version-compatible: this engine was not built with "
                                   "VERSION_COMPATIBLE, so it runs only on the TensorRT version "
                                   "it was built with; rebuild it version-compatible first")
    settings = {k: plan(v, deadline_us=deadline, max_batch=max_batch, engine_max=engine_max,
                        threads=threads, instances=instances) for k, v in measured.items()}
    s = settings[main]
    vdir = out / name / "1"
    notes: list[str] = []
    if target == "gpu.tensorrt":
        files, bound = T.plan_file(vdir, art)
        tm = T.TritonModel(name, art.inputs, art.outputs, T.NATIVE[target][1], threads,
                           static_batch=art.batch_size)
        notes += bound
    else:
        sizes = sorted({*s.warmup_sizes, *(b for st in settings.values() for b in st.warmup_sizes)})
        compiled = {b: _compile(m, target, prec, b, threads, store, progress) for b in sizes}
        if how == "native":
            try:
                files = T.onnx_file(vdir, compiled)
                tm = T.TritonModel(name, m.inputs, m.outputs, T.NATIVE[target][1], threads)
            except UnsupportedError as exc:
                if flavour == "native" or target not in T.PYTHON:
                    raise
                # a graph with its batch fixed inside (an LSTM's initial state): the python
                # backend runs the compiled graph per measured size instead
                notes.append(f"python backend instead of {T.NATIVE[target][1]}: {exc}")
                how = "python"
        if how == "python":
            files = T.python_files(vdir, target, compiled, threads)
            tm = T.TritonModel(name, m.inputs, m.outputs, {"backend": "python"}, threads)
    written = T.write_repository(out, tm, settings, measured, main,
                                 command or f"hwb export {m.name} -t {target}:{prec} --format triton")
    if notes:  # the engine's binding or a backend fallback: at the top of every config
        for p in written:
            p.write_text(comment(notes) + p.read_text())
    return ExportResult("triton", out, written + files, settings, measured, notes)


def _tf_serving(m: Any, out: Path, name: str, meas: Measured, deadline: float | None,
                max_batch: int | None, threads: int, instances: int | None,
                command: str) -> ExportResult:
    from . import tfserving as S

    s = plan(meas, deadline_us=deadline, max_batch=max_batch, threads=threads,
             instances=instances)
    vdir = out / name / "1"
    S.saved_model(m, vdir)
    warm = S.warmup_file(vdir / "assets.extra" / "tf_serving_warmup_requests", name, m,
                         s.warmup_sizes)
    cmd = command or f"hwb export {m.name} -t {meas.variant} --format tf-serving"
    files = [vdir / "saved_model.pb", warm]
    for fname, text in (("batching_parameters.txt", S.batching_text(s, meas, cmd)),
                        ("models.config", S.models_config(name, str((out / name).resolve()))),
                        ("README.md", S.readme(name, meas.variant))):
        (out / fname).write_text(text)
        files.append(out / fname)
    return ExportResult("tf-serving", out, files, {meas.machine: s}, {meas.machine: meas})
