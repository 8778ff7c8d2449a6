"""The batch dimension of a source model: dynamic, made symbolic here, or fixed.

Exporters often bake a batch size into a model: 1 from Keras exporters (tf2onnx of a model
built with ``batch_size=1``), whatever the example batch was from ``torch.onnx.export``
without ``dynamic_axes``. Every target must then either run at that batch (padding and
chunking in ``predict``) or use a copy of the graph whose batch dimension is symbolic.

:func:`relax_onnx` tries the second: it marks the graph inputs/outputs' batch dimension
symbolic, drops stale intermediate shapes, and rewrites ``Reshape`` shape constants that
start with the baked-in batch to ``-1`` (or ``0`` where the constant already has a ``-1``).
The rewrite is only trusted if the rewritten graph reproduces the original on random data
at the fixed batch *and* row for row at other batch sizes (ONNX Runtime, no optimisation;
for a batch too large to run the original, that the copy treats rows independently);
otherwise the model keeps its fixed batch and the reason names the constant-shape Reshape
nodes that may bake it in.

The outcome is a :class:`BatchInfo` kept in ``Model.meta["batch"]``; ``Model.meta
["fixed_batch"]`` is set only when the model must run at its exported batch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: Largest fixed batch a model may keep: each predict() pads to it, so beyond this a target
#: would run (and hold) a huge batch for every call; such models must be re-exported.
FIXED_BATCH_MAX = 65536
#: Input elements up to which the original graph is run at its fixed batch to check a rewrite.
VERIFY_MAX_ELEMENTS = 1 << 24

DYNAMIC, SYMBOLIC, FIXED = "dynamic", "symbolic", "fixed"


@dataclass(frozen=True)
class BatchInfo:
    """How a model's batch dimension is handled.

    ``exported``: the batch in the file (``None``: already dynamic). ``handling``:
    ``dynamic`` (nothing to do), ``symbolic`` (a rewritten copy runs at any batch) or
    ``fixed`` (targets compile at ``exported`` and ``predict`` pads/chunks). ``detail`` says
    what was rewritten, or why it could not be.
    """

    exported: int | None
    handling: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reexport_advice(fmt: str) -> str:
    """What to do to get a model with a dynamic batch, per source format."""
    return {
        "onnx": ("re-export it with a dynamic batch: torch.onnx.export(model, x, path, "
                 "input_names=['input'], output_names=['output'], dynamic_axes={'input': {0: "
                 "'batch'}, 'output': {0: 'batch'}}), or for Keras tf2onnx.convert.from_keras("
                 "model, input_signature=[tf.TensorSpec([None, ...], tf.float32)]); and build "
                 "reshapes from x.shape[0] or -1 instead of a constant batch"),
        "torch": ("re-export with a dynamic batch: torch.export.export(m, (x,), dynamic_shapes="
                  "({0: torch.export.Dim('batch')},))"),
        "keras": "rebuild the model with keras.Input(shape) (no batch_size=) and save it again",
    }.get(fmt, "re-export the model with a dynamic batch dimension")


def dim0(vi: Any) -> int | None:
    """The declared batch (first) dimension of an ONNX ValueInfo, ``None`` when symbolic."""
    return _dim0(vi)


def _dim0(vi: Any) -> int | None:
    dims = vi.type.tensor_type.shape.dim
    if not len(dims) or not dims[0].HasField("dim_value"):
        return None
    return int(dims[0].dim_value)


def _constant_arrays(graph: Any) -> dict[str, tuple[Any, Any]]:
    """name → (holder, array) for initializers and Constant nodes (holder is rewritten)."""
    from onnx import numpy_helper

    found: dict[str, tuple[Any, Any]] = {}
    for init in graph.initializer:
        found[init.name] = (init, numpy_helper.to_array(init))
    for node in graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    found[node.output[0]] = (a.t, numpy_helper.to_array(a.t))
    return found


def _rewrite_reshapes(graph: Any, batch: int) -> tuple[list[str], list[str]]:
    """Rewrite Reshape shape constants that start with ``batch``; returns (rewritten node
    names, the other Reshapes with a fully constant shape: where a batch is baked in when
    the rewrite fails)."""
    from onnx import numpy_helper

    consts = _constant_arrays(graph)
    done: list[str] = []
    constant: list[str] = []
    for node in graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] not in consts:
            continue
        label = node.name or node.output[0]
        holder, shape = consts[node.input[1]]
        if shape.ndim != 1 or not len(shape) or int(shape[0]) != batch:
            if shape.ndim == 1 and len(shape) and (shape > 0).all():
                constant.append(f"{label} {shape.tolist()}")
            continue
        new = shape.copy()
        new[0] = 0 if (shape == -1).any() else -1
        holder.CopyFrom(numpy_helper.from_array(new.astype(shape.dtype), holder.name))
        consts[node.input[1]] = (holder, new)
        done.append(label)
    return done, constant


def _session(proto: Any) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4  # failures are expected while verifying the rewrite; we report them
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run(sess: Any, x: np.ndarray) -> np.ndarray:
    return np.asarray(sess.run(None, {sess.get_inputs()[0].name: x})[0], dtype=np.float64)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    scale = float(np.max(np.abs(a), initial=0.0)) or 1.0
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-4, atol=1e-5 * scale))


def _verify(original: Any, relaxed: Any, batch: int, sample: tuple[int, ...]) -> str | None:
    """None when ``relaxed`` reproduces ``original`` at its batch and row for row at other
    batch sizes; else what differed."""
    if batch * int(np.prod(sample, dtype=np.int64)) > VERIFY_MAX_ELEMENTS:
        return _verify_rows(relaxed, sample)
    rng = np.random.default_rng(0)
    xa = rng.standard_normal((batch, *sample)).astype(np.float32)
    xb = rng.standard_normal((batch, *sample)).astype(np.float32)
    orig, new = _session(original), _session(relaxed)
    ya, yb = _run(orig, xa), _run(orig, xb)
    if len(ya) != batch:
        return f"the output's first dimension is {len(ya)}, not the batch {batch}"
    cases = [(xa, ya), (xa[:1], ya[:1]), (np.concatenate([xa, xb[:1]]), np.concatenate([ya, yb[:1]]))]
    if batch > 2:
        cases.append((xb[:2], yb[:2]))
    for x, want in cases:
        try:
            got = _run(new, x)
        except Exception as exc:  # noqa: BLE001 - any runtime failure means "not batch-free"
            return f"at batch {len(x)} the rewritten graph fails ({type(exc).__name__}: {str(exc)[:200]})"
        if not _same(want, got):
            return f"at batch {len(x)} the rewritten graph's outputs differ from the original's"
    return None


def _verify_rows(relaxed: Any, sample: tuple[int, ...]) -> str | None:
    """For a batch too large to run the original: the rewritten graph must at least treat
    rows independently (a batch of 3 gives, row for row, what batches of 1 give)."""
    x = np.random.default_rng(0).standard_normal((3, *sample)).astype(np.float32)
    try:
        new = _session(relaxed)
        whole = _run(new, x)
        rows = np.concatenate([_run(new, x[i:i + 1]) for i in range(3)])
    except Exception as exc:  # noqa: BLE001 - any runtime failure means "not batch-free"
        return f"the rewritten graph fails at a small batch ({type(exc).__name__}: {str(exc)[:200]})"
    if not _same(whole, rows):
        return "the rewritten graph mixes samples across the batch"
    return None


def relax_onnx(proto: Any, sample: tuple[int, ...]) -> tuple[Any, BatchInfo]:
    """``(graph, info)``: the graph to use (a symbolic-batch copy, or ``proto`` itself) and
    how its batch is handled. ``sample`` is the per-sample input shape."""
    import onnx

    g = proto.graph
    inits = {i.name for i in g.initializer}
    real = [i for i in g.input if i.name not in inits]
    batch = _dim0(real[0]) if real else None
    if batch is None:
        return proto, BatchInfo(None, DYNAMIC, "the batch dimension is already symbolic")
    relaxed = onnx.ModelProto()
    relaxed.CopyFrom(proto)
    for vi in [*relaxed.graph.input, *relaxed.graph.output]:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_param = "batch"
    del relaxed.graph.value_info[:]  # intermediate shapes carry the old batch; ORT re-infers
    rewritten, constant = _rewrite_reshapes(relaxed.graph, batch)
    problem = _verify(proto, relaxed, batch, sample)
    if problem is None:
        what = f"; Reshape constants rewritten: {', '.join(rewritten)}" if rewritten else ""
        return relaxed, BatchInfo(batch, SYMBOLIC,
                                  f"exported with batch {batch}; batch dimension made symbolic{what}")
    where = (f" (Reshape node(s) with a constant shape that may bake the batch in: "
             f"{', '.join(constant)})" if constant else "")
    return proto, BatchInfo(batch, FIXED, f"exported with batch {batch}; cannot make it "
                            f"symbolic: {problem}{where}")


def resolve_batch(meta: dict[str, Any], fmt: str, name: str, requested: int | None,
                  static_target: bool) -> int:
    """The batch to compile at: ``requested``, else the model's fixed batch, else 1.
    Raises :class:`UnsupportedError` for a fixed batch a target cannot or should not use."""
    from .errors import UnsupportedError

    fixed = meta.get("fixed_batch")
    info = meta.get("batch") or {}
    why = f" ({info['detail']})" if info.get("detail") else ""
    if fixed is not None and fixed > FIXED_BATCH_MAX:
        raise UnsupportedError(
            f"model {name!r} has a fixed batch of {fixed}{why}; every call would run {fixed} "
            f"samples (limit {FIXED_BATCH_MAX}). To fix, {reexport_advice(fmt)}")
    if requested is None:
        return fixed or 1
    if requested < 1:
        raise UnsupportedError(f"batch_size must be ≥ 1, got {requested}")
    if fixed is not None and fixed != requested and static_target:
        raise UnsupportedError(
            f"model {name!r} runs only at its exported batch of {fixed}{why}; compile it with "
            f"batch_size={fixed} (the default; predict() pads and chunks), or "
            f"{reexport_advice(fmt)}")
    return requested
