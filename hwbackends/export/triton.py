"""``hwb export --format triton``: a Triton model repository from a measured variant.

Layout (``DIR/NAME/``): ``config.pbtxt``, ``1/`` with the model, and ``configs/<machine>.pbtxt``
per machine of a fleet results file (``tritonserver --model-config-name=<machine>`` picks one).
What goes in ``1/`` is the variant's target's to say (:meth:`Target.triton
<hwbackends.target.Target.triton>`, a :class:`~hwbackends.target.TritonForm`): a model file
for one of Triton's own backends (:meth:`TritonForm.native
<hwbackends.target.TritonForm.native>`), or the python backend: ``model.py``
(:mod:`.triton_model`, the same file for every model) with the target's runner module beside
it as ``hwb_runtime.py``, one compiled artifact per measured batch size, listed in
``hwb_model.json``. This module writes the config and the python backend's files; it names no
target and runs no framework.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import UnsupportedError
from .measurements import Measured, Settings
from .textproto import Enum, comment, dumps

#: The name the python backend's runner module is copied under, beside ``model.py``.
RUNTIME_FILE = "hwb_runtime.py"
#: numpy dtype name → Triton's DataType.
TRITON_DTYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "float64": "TYPE_FP64",
                 "int8": "TYPE_INT8", "uint8": "TYPE_UINT8", "int32": "TYPE_INT32",
                 "int64": "TYPE_INT64", "bool": "TYPE_BOOL"}


def flavour_for(target: str, form: Any, flavour: str | None,
                targets: Mapping[str, Any] | None = None) -> str:
    """``"native"`` or ``"python"`` for ``target`` whose Triton form is ``form`` (``None``:
    none); a clear error when Triton can run neither, naming those of the registered
    ``targets`` (name → :class:`~hwbackends.target.Target`) it can run."""
    if flavour not in (None, "native", "python"):
        raise UnsupportedError(f"--flavour must be native or python, got {flavour!r}")
    native = form is not None and form.native_backend
    python = form is not None and form.runtime is not None

    def having(native_backend: bool) -> str:
        forms = [(n, t.triton()) for n, t in sorted((targets or {}).items())]
        return ", ".join(n for n, f in forms if f is not None and (
            f.native_backend if native_backend else f.runtime is not None)) or "none"
    if flavour == "python" or (flavour is None and not native):
        if not python:
            raise UnsupportedError(
                f"{target} has no Triton backend and no python-backend flavour (Triton runs "
                f"{having(True)} natively and {having(False)} through model.py); export a "
                f"variant of one of those")
        return "python"
    if not native:
        raise UnsupportedError(f"{target} has no native Triton backend; use --flavour python "
                               f"(model.py runs it) or a variant of {having(True)}")
    return "native"


@dataclass
class TritonModel:
    """What the config describes besides the settings: name, tensors, how it is run
    (``keys``: backend or platform; ``parameters``: the backend's; ``gpu``: ``KIND_GPU``
    instances), from the target's :class:`~hwbackends.target.TritonFile` or the python
    backend."""

    name: str
    inputs: list[Any]   # TensorSpec, per sample
    outputs: list[Any]
    keys: dict[str, str]
    threads: int
    static_batch: int | None = None  # a file with one batch size inside: max_batch_size 0
    parameters: dict[str, str] = field(default_factory=dict)
    gpu: bool = False

    @classmethod
    def native(cls, name: str, inputs: list[Any], outputs: list[Any], f: Any,
               threads: int) -> "TritonModel":
        """The model a target's native :class:`~hwbackends.target.TritonFile` ``f`` describes;
        ``inputs``/``outputs``: the served specs (``f.bound`` replaces them)."""
        ins, outs = f.bound if f.bound is not None else (inputs, outputs)
        return cls(name, list(ins), list(outs), dict(f.keys), threads, f.static_batch,
                   dict(f.parameters), f.gpu)


def _dtype(spec: Any) -> Enum:
    if spec.dtype not in TRITON_DTYPES:
        raise UnsupportedError(f"tensor {spec.name} has dtype {spec.dtype}, which Triton "
                               f"types do not cover here ({', '.join(TRITON_DTYPES)})")
    return Enum(TRITON_DTYPES[spec.dtype])


def config_text(tm: TritonModel, s: Settings, provenance: list[str]) -> str:
    """``config.pbtxt`` for ``tm`` with settings ``s``, the measurement as its comment."""
    static = tm.static_batch is not None

    def dims(spec: Any) -> list[int]:
        return [tm.static_batch, *spec.shape] if static else list(spec.shape)

    cfg: dict[str, Any] = {"name": tm.name, **tm.keys,
                           "max_batch_size": 0 if static else s.max_batch_size,
                           "input": [{"name": t.name, "data_type": _dtype(t), "dims": dims(t)}
                                     for t in tm.inputs],
                           "output": [{"name": t.name, "data_type": _dtype(t), "dims": dims(t)}
                                      for t in tm.outputs]}
    if not static:
        # Triton's core refuses a preferred size above max_batch_size (plan() never gives
        # one; settings built by hand are checked here, not left to the server's load error)
        if any(b > s.max_batch_size for b in s.preferred):
            raise UnsupportedError(f"preferred_batch_size {list(s.preferred)} exceeds "
                                   f"max_batch_size {s.max_batch_size}; Triton would refuse "
                                   f"to load the model")
        db: dict[str, Any] = {"preferred_batch_size": list(s.preferred),
                              "max_queue_delay_microseconds": s.queue_delay_us}
        if s.timeout_us is not None:
            db["default_queue_policy"] = {"timeout_action": Enum("REJECT"),
                                          "default_timeout_microseconds": s.timeout_us,
                                          "allow_timeout_override": False}
        cfg["dynamic_batching"] = db
    cfg["instance_group"] = [{"count": s.instances,
                              "kind": Enum("KIND_GPU" if tm.gpu else "KIND_CPU")}]
    if tm.parameters:  # strings in Triton's config, whatever the backend reads from them
        cfg["parameters"] = [{"key": k, "value": {"string_value": str(v)}}
                             for k, v in tm.parameters.items()]
    sizes = [tm.static_batch] if static else list(s.warmup_sizes)
    cfg["model_warmup"] = [
        {"name": f"batch_{b}", "batch_size": 1 if static else b,
         "inputs": [{"key": t.name, "value": {"data_type": _dtype(t), "dims": dims(t),
                                              "random_data": True}} for t in tm.inputs]}
        for b in sizes]
    return comment(provenance + [""] + s.why) + dumps(cfg)


def write_repository(outdir: Path, tm: TritonModel, settings: dict[str, Settings],
                     measured: dict[str, Measured], main: str, command: str) -> list[Path]:
    """``config.pbtxt`` (machine ``main``'s settings) and, with several machines,
    ``configs/<machine>.pbtxt`` for each. Returns the files written."""
    root = outdir / tm.name
    root.mkdir(parents=True, exist_ok=True)
    written = []

    def prov(m: Measured) -> list[str]:
        return [f"written by: {command}"] + m.provenance()

    p = root / "config.pbtxt"
    p.write_text(config_text(tm, settings[main], prov(measured[main])))
    written.append(p)
    if len(settings) > 1:
        (root / "configs").mkdir(exist_ok=True)
        for name in sorted(settings):
            q = root / "configs" / f"{name}.pbtxt"
            q.write_text(config_text(tm, settings[name], prov(measured[name])))
            written.append(q)
    return written


# -- the python backend's files -----------------------------------------------------------------
def stage_artifact(version_dir: Path, fname: str, batch: int, artifact: Any) -> Path:
    """Copy ``artifact``'s file ``fname`` (the form's ``artifact_file``) into
    ``version_dir/bN/``, where the python backend reads it and a native form makes its file
    from it; a copy taken right after its compile, before another compile's store cap can
    prune it. A pruned file raises ``FileNotFoundError``."""
    d = version_dir / f"b{batch}"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(artifact.file(fname), d / fname)
    return d / fname


def python_files(version_dir: Path, form: Any, compiled: dict[int, Any], threads: int,
                 inputs: list[Any], outputs: list[Any]) -> list[Path]:
    """``model.py``, the form's runner as ``hwb_runtime.py`` and ``hwb_model.json`` for the
    python backend, beside one artifact per compiled batch size (``bN/``, from
    :func:`stage_artifact`). ``compiled``: batch size → :class:`~hwbackends.CompiledModel`;
    ``inputs``/``outputs``: the served specs. The manifest names tensors by their served
    names and finds them in the runtime by position (:meth:`TritonForm.positions
    <hwbackends.target.TritonForm.positions>`): it holds no text from the model."""
    fname = form.artifact_file
    batches = {str(b): f"b{b}/{fname}" for b in sorted(compiled)}
    written = [version_dir / p for p in batches.values()]
    any_b = min(compiled)
    ikeys, okeys = form.positions(compiled[any_b], version_dir / batches[str(any_b)])
    manifest = {
        "format": "hwbackends-triton-python", "runtime": form.runtime_name,
        "variant": compiled[any_b].variant, "threads": threads, "batches": batches,
        "inputs": [{"name": s.name, "index": k, "shape": list(s.shape), "dtype": s.dtype}
                   for s, k in zip(inputs, ikeys, strict=True)],
        "outputs": [{"name": s.name, "index": k, "shape": list(s.shape), "dtype": s.dtype}
                    for s, k in zip(outputs, okeys, strict=True)],
    }
    (version_dir / "hwb_model.json").write_text(json.dumps(manifest, indent=1))
    shutil.copyfile(Path(__file__).with_name("triton_model.py"), version_dir / "model.py")
    shutil.copyfile(form.runtime, version_dir / RUNTIME_FILE)
    return written + [version_dir / n for n in ("hwb_model.json", "model.py", RUNTIME_FILE)]
