"""How Triton serves ``cpu.onnxruntime`` variants (``hwb export --format triton``): natively,
Triton's onnxruntime backend running one ``model.onnx`` with a dynamic batch dimension and the
served tensor names (:meth:`OnnxRuntimeTriton.native`); or, for a graph whose batch is fixed
inside (an LSTM's initial state), the python backend running the compiled graph per batch
size through :mod:`.triton_runtime`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hwbackends.contract import TensorSpec, TritonFile, TritonForm, UnsupportedError

from .._shared.onnx_io import graph_inputs, graph_outputs, spec_order

FILE = "model.onnx"


class OnnxRuntimeTriton(TritonForm):
    """Both flavours: native by default, python where the graph cannot take a dynamic batch."""

    artifact_file = FILE
    native_backend = True
    runtime = Path(__file__).with_name("triton_runtime.py")
    runtime_name = "onnxruntime"

    def native(self, version_dir: Path, compiled: dict[int, Any], inputs: list[TensorSpec],
               outputs: list[TensorSpec], threads: int) -> TritonFile:
        """``model.onnx``: the graph staged from the largest compiled size, its batch
        dimension made dynamic and its I/O renamed to the served names, checked in ONNX
        Runtime against each compiled batch size (same inputs, outputs equal to 1e-5) before
        it is kept."""
        src = version_dir / f"b{max(compiled)}" / FILE
        return TritonFile([dynamic_onnx(version_dir, compiled, src, inputs, outputs)],
                          {"backend": "onnxruntime"},
                          {"intra_op_thread_count": str(threads), "inter_op_thread_count": "1"})

    def positions(self, compiled: Any, path: Path) -> tuple[list[int], list[int]]:
        """Each tensor's position among the graph's inputs/outputs (what ONNX Runtime lists)."""
        import onnx

        proto = onnx.load(str(path))
        gin, gout = graph_inputs(proto), graph_outputs(proto)
        ins, outs = spec_order(gin, compiled.inputs), spec_order(gout, compiled.outputs)
        return [gin.index(n) for n in ins], [gout.index(n) for n in outs]


def dynamic_onnx(version_dir: Path, compiled: dict[int, Any], src: Path,
                 inputs: list[TensorSpec], outputs: list[TensorSpec]) -> Path:
    """``version_dir/model.onnx`` from the compiled graph ``src`` with a dynamic batch and the
    served names ``inputs``/``outputs``; UnsupportedError (the file removed) when ONNX Runtime
    does not run it at every compiled size equal to the compiled variant."""
    import onnx
    import onnxruntime as ort

    top = compiled[max(compiled)]
    proto = onnx.load(str(src))
    g = proto.graph
    ins = spec_order(graph_inputs(proto), top.inputs)
    outs = spec_order(graph_outputs(proto), top.outputs)
    rename = {old: s.name for old, s in zip([*ins, *outs], [*inputs, *outputs], strict=True)}
    taken = ({n for node in g.node for n in [*node.input, *node.output]}
             | {i.name for i in g.initializer}) - set(rename)
    clash = sorted(set(rename.values()) & taken)
    out = version_dir / FILE

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
    return out


TRITON = OnnxRuntimeTriton()
