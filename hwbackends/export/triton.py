"""``hwb export --format triton``: a Triton model repository from a measured variant.

Layout (``DIR/NAME/``): ``config.pbtxt``, ``1/`` with the model, and ``configs/<machine>.pbtxt``
per machine of a fleet results file (``tritonserver --model-config-name=<machine>`` picks one).
Which model file goes in ``1/`` depends on the variant (:data:`NATIVE`, :data:`PYTHON`):

- ``cpu.onnxruntime`` → ``model.onnx`` (backend ``onnxruntime``), the compiled graph with its
  batch dimension made dynamic and its I/O named after the model's tensors; checked in ONNX
  Runtime against the compiled variant at every measured size before it is written;
- ``gpu.tensorrt`` → ``model.plan`` (platform ``tensorrt_plan``), bound to the TensorRT
  version and compute capability it was built on (recorded in the config's comment);
- ``cpu.litert``, ``tpu.xla`` (and ``cpu.onnxruntime`` with ``flavour="python"``) → the
  python backend: ``model.py`` (:mod:`.triton_model`) runs the compiled artifacts, one per
  measured batch size, listed in ``hwb_model.json``.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UnsupportedError
from .measurements import Measured, Settings
from .textproto import Enum, comment, dumps

#: Variants Triton runs with one of its own backends: target → (model file, config keys).
NATIVE: dict[str, tuple[str, dict[str, str]]] = {
    "cpu.onnxruntime": ("model.onnx", {"backend": "onnxruntime"}),
    "gpu.tensorrt": ("model.plan", {"platform": "tensorrt_plan"}),
}
#: Variants the python backend runs: target → (runtime name in model.py, artifact file).
PYTHON: dict[str, tuple[str, str]] = {
    "cpu.litert": ("litert", "model.tflite"),
    "tpu.xla": ("xla", "model.jax_export"),
    "cpu.onnxruntime": ("onnxruntime", "model.onnx"),
}
#: numpy dtype name → Triton's DataType.
TRITON_DTYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "float64": "TYPE_FP64",
                 "int8": "TYPE_INT8", "uint8": "TYPE_UINT8", "int32": "TYPE_INT32",
                 "int64": "TYPE_INT64", "bool": "TYPE_BOOL"}


def flavour_for(target: str, flavour: str | None) -> str:
    """``"native"`` or ``"python"`` for ``target``; a clear error when Triton can run neither."""
    if flavour not in (None, "native", "python"):
        raise UnsupportedError(f"--flavour must be native or python, got {flavour!r}")
    if flavour == "python" or (flavour is None and target not in NATIVE):
        if target not in PYTHON:
            raise UnsupportedError(
                f"{target} has no Triton backend and no python-backend flavour (Triton runs "
                f"{', '.join(NATIVE)} natively and {', '.join(PYTHON)} through model.py); "
                f"export a variant of one of those")
        return "python"
    if target not in NATIVE:
        raise UnsupportedError(f"{target} has no native Triton backend; use --flavour python "
                               f"(model.py runs it) or a variant of {', '.join(NATIVE)}")
    return "native"


@dataclass
class TritonModel:
    """What the config describes besides the settings: name, tensors, how it is run."""

    name: str
    inputs: list[Any]   # TensorSpec, per sample
    outputs: list[Any]
    keys: dict[str, str]
    threads: int
    static_batch: int | None = None  # a TensorRT engine with a fixed batch: max_batch_size 0


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
    gpu = tm.keys.get("platform") == "tensorrt_plan"
    cfg["instance_group"] = [{"count": s.instances, "kind": Enum("KIND_GPU" if gpu else "KIND_CPU")}]
    if tm.keys.get("backend") == "onnxruntime":
        # ORT backend parameters are strings in Triton's config, numbers inside them.
        cfg["parameters"] = [{"key": "intra_op_thread_count", "value": {"string_value": str(tm.threads)}},
                             {"key": "inter_op_thread_count", "value": {"string_value": "1"}}]
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


# -- model files -------------------------------------------------------------------------------
def stage_artifact(version_dir: Path, target: str, batch: int, artifact: Any) -> Path:
    """Copy ``artifact``'s model file into ``version_dir/bN/`` (where the python backend reads
    it, and what :func:`onnx_file` reads); a copy taken right after its compile, before
    another compile's store cap can prune it. A pruned file raises ``FileNotFoundError``."""
    fname = PYTHON[target][1] if target in PYTHON else NATIVE[target][0]
    d = version_dir / f"b{batch}"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(artifact.file(fname), d / fname)
    return d / fname


def python_files(version_dir: Path, target: str, compiled: dict[int, Any], threads: int,
                 inputs: list[Any], outputs: list[Any]) -> list[Path]:
    """``model.py`` and ``hwb_model.json`` for the python backend, beside one artifact per
    compiled batch size (``bN/``, from :func:`stage_artifact`). ``compiled``: batch size →
    :class:`~hwbackends.CompiledModel`; ``inputs``/``outputs``: the served specs. The manifest
    names tensors by their served names and finds them in the runtime by position: it holds
    no text from the model."""
    runtime, fname = PYTHON[target]
    batches = {str(b): f"b{b}/{fname}" for b in sorted(compiled)}
    written = [version_dir / p for p in batches.values()]
    any_b = min(compiled)
    ikeys, okeys = runtime_keys(runtime, compiled[any_b], version_dir / batches[str(any_b)])
    manifest = {
        "format": "hwbackends-triton-python", "runtime": runtime,
        "variant": compiled[any_b].variant, "threads": threads, "batches": batches,
        "inputs": [{"name": s.name, "index": k, "shape": list(s.shape), "dtype": s.dtype}
                   for s, k in zip(inputs, ikeys, strict=True)],
        "outputs": [{"name": s.name, "index": k, "shape": list(s.shape), "dtype": s.dtype}
                    for s, k in zip(outputs, okeys, strict=True)],
    }
    (version_dir / "hwb_model.json").write_text(json.dumps(manifest, indent=1))
    shutil.copyfile(Path(__file__).with_name("triton_model.py"), version_dir / "model.py")
    return written + [version_dir / "hwb_model.json", version_dir / "model.py"]


def runtime_keys(runtime: str, cm: Any, path: Path) -> tuple[list[int], list[int]]:
    """Where each input/output (in spec order) is inside the runtime, by position: among the
    LiteRT interpreter's input/output details (as the loaded executor bound them), among the
    ONNX graph's inputs/outputs (what ONNX Runtime lists), or the XLA call's arguments and
    results. ``path``: the staged artifact file."""
    if runtime == "litert":
        ex = cm.executor
        det_in, det_out = ex.input_details, ex.output_details
        det_in = det_in if isinstance(det_in, list) else [det_in]
        det_out = det_out if isinstance(det_out, list) else [det_out]
        all_in = [d["index"] for d in ex.interpreter.get_input_details()]
        all_out = [d["index"] for d in ex.interpreter.get_output_details()]
        return [all_in.index(d["index"]) for d in det_in], [all_out.index(d["index"]) for d in det_out]
    if runtime == "onnxruntime":
        import onnx

        g = onnx.load(str(path)).graph
        ins, outs = graph_names(g, cm.inputs, cm.outputs)
        gin, gout = _graph_io(g)
        return [gin.index(n) for n in ins], [gout.index(n) for n in outs]
    return list(range(len(cm.inputs))), list(range(len(cm.outputs)))


def _graph_io(graph: Any) -> tuple[list[str], list[str]]:
    inits = {i.name for i in graph.initializer}
    return ([i.name for i in graph.input if i.name not in inits], [o.name for o in graph.output])


def graph_names(graph: Any, inputs: list[Any], outputs: list[Any]) -> tuple[list[str], list[str]]:
    """The graph's input and output names in spec order. Converted models keep their
    converter's names in spec order (tf2onnx calls a Keras model's outputs ``Identity:0``,
    ``Identity_1:0``, …), ONNX models carry the spec's names."""
    gin, gout = _graph_io(graph)

    def order(names: list[str], specs: list[Any]) -> list[str]:
        return [s.name for s in specs] if set(names) == {s.name for s in specs} else names
    return order(gin, inputs), order(gout, outputs)


def onnx_file(version_dir: Path, compiled: dict[int, Any], src: Path, inputs: list[Any],
              outputs: list[Any]) -> list[Path]:
    """``model.onnx`` for Triton's onnxruntime backend: the compiled graph (``src``, staged
    from the largest compiled size) with a dynamic batch dimension and the served tensor
    names, checked in ONNX Runtime against each compiled batch size (same inputs, outputs
    equal to 1e-5) before it is kept."""
    import onnx
    import onnxruntime as ort

    top = compiled[max(compiled)]
    proto = onnx.load(str(src))
    g = proto.graph
    ins, outs = graph_names(g, top.inputs, top.outputs)
    rename = {old: s.name for old, s in zip([*ins, *outs], [*inputs, *outputs], strict=True)}
    taken = ({n for node in g.node for n in [*node.input, *node.output]}
             | {i.name for i in g.initializer}) - set(rename)
    clash = sorted(set(rename.values()) & taken)
    out = version_dir / "model.onnx"

    def refuse(why: str) -> UnsupportedError:
        out.unlink(missing_ok=True)
        return UnsupportedError(f"the {top.variant} graph does not take a dynamic batch under "
                                f"the served names: {why}; export it with --flavour python, "
                                f"which ships the compiled graph per batch size")
    if clash:
        raise refuse(f"served name(s) {', '.join(clash)} name tensors inside the graph")
    for vi in [*g.input, *g.output]:
        if vi.name in rename:
            vi.name = rename[vi.name]
            dims = vi.type.tensor_type.shape.dim
            if len(dims):
                dims[0].Clear()
                dims[0].dim_param = "batch"
    for node in g.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
    del g.value_info[:]  # shapes inferred at the compiled batch; ORT infers them again
    version_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(out))
    rng = np.random.default_rng(0)
    try:
        sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        for b, cm in sorted(compiled.items()):
            xs = tuple(rng.standard_normal(s.batched(b)).astype(np.float32) for s in cm.inputs)
            want = cm.predict(xs if cm.multi_io else xs[0])
            want = want if isinstance(want, tuple) else (want,)
            got = sess.run([s.name for s in outputs],
                           {s.name: x for s, x in zip(inputs, xs, strict=True)})
            for s, w, g_ in zip(outputs, want, got, strict=True):
                if not np.allclose(w, g_, atol=1e-5, rtol=1e-5):
                    raise refuse(f"at batch {b} output {s.name} differs from the compiled "
                                 f"variant by {float(np.max(np.abs(w - g_))):.3g}")
    except UnsupportedError:
        raise
    except Exception as exc:  # ORT's own errors: a shape fixed inside the graph (LSTM states)
        raise refuse(f"ONNX Runtime: {str(exc)[:300]}") from exc
    return [out]


def plan_file(version_dir: Path, artifact: Any) -> tuple[list[Path], list[str]]:
    """``model.plan`` from a ``gpu.tensorrt`` artifact and the comment lines recording what
    the engine is bound to (a plan runs only on the TensorRT version and compute capability
    it was built for, unless built version-compatible)."""
    version_dir.mkdir(parents=True, exist_ok=True)
    out = version_dir / "model.plan"
    shutil.copyfile(artifact.file(artifact.meta.get("file", "model.engine")), out)
    bound = artifact.meta.get("bound_to") or {}
    flags = (artifact.meta.get("build_plan") or {}).get("builder_flags") or ()
    return [out], [f"TensorRT plan: TensorRT {bound.get('tensorrt', '?')}, compute capability "
                   f"{bound.get('compute_capability', '?')} ({bound.get('gpu', '?')}); "
                   + ("built VERSION_COMPATIBLE" if "VERSION_COMPATIBLE" in flags else
                      "runs only there (not built VERSION_COMPATIBLE)"),
                   f"engine optimization profile: batch {artifact.batch_size} (static)"]


def version_compatible(artifact: Any) -> bool:
    """Whether a ``gpu.tensorrt`` artifact's engine was built with VERSION_COMPATIBLE."""
    flags = (artifact.meta.get("build_plan") or {}).get("builder_flags") or ()
    return "VERSION_COMPATIBLE" in flags
