"""The hot path before and after a change of the Executor contract, in one run.

Interleaved rounds (A B C A B C …, so the noise of a shared machine hits all alike) of:
  raw     the library's documented calls (LiteRT set_tensor/invoke/get_tensor; ORT sess.run)
  before  the CPU executors as written against ``hwbackends/target.py`` at ``--before`` (the
          file is loaded from git, its executors rebuilt over the same model file)
  after   ``cm.predict_into`` of this tree (what ``hwb.compile`` returns now)
  fresh   this tree's executor class built here over the same file, as ``before`` is (so a
          difference between before and after is the code, not where the runtime was made)
and the guard alone: the old and new BufferedExecutor over a no-op "model" (``int``), where
the whole cost is the Python of the call (the part a contract change can move).

    .venv/bin/python bench/executor_ab.py [--before 669e52b] [--rounds 30] [--calls 2000]
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import interleaved  # noqa: E402  (bench/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]


def old_target(rev: str) -> ModuleType:
    """``hwbackends/target.py`` at ``rev`` as a module of the package (relative imports)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:hwbackends/target.py"],
                         check=True, capture_output=True, text=True).stdout
    name = "hwbackends._target_before"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "hwbackends"
    sys.modules[name] = mod
    exec(compile(src, f"{rev}:hwbackends/target.py", "exec"), mod.__dict__)
    return mod


def old_litert(T: ModuleType, path: str, inp, out):  # noqa: ANN001, ANN201
    """The LiteRT executor as it was written against the old contract (one tensor each way)."""
    from ai_edge_litert.interpreter import Interpreter

    class Old(T.BufferedExecutor):
        def __init__(self) -> None:
            self.interpreter = Interpreter(model_path=path, num_threads=1)
            self.interpreter.allocate_tensors()
            self._init_io(inp, out, 1)
            self._in = self.interpreter.tensor(self.interpreter.get_input_details()[0]["index"])()
            self._out = self.interpreter.tensor(self.interpreter.get_output_details()[0]["index"])()
            self._invoke = self.interpreter._interpreter.Invoke
    return Old()


def old_ort(T: ModuleType, path: str, inp, out):  # noqa: ANN001, ANN201
    """The ONNX Runtime IOBinding executor as written against the old contract."""
    import onnxruntime as ort

    class Old(T.BufferedExecutor):
        def __init__(self) -> None:
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            self._init_io(inp, out, 1)
            self._in = np.zeros(inp.batched(1), np.float32)
            self._out = np.zeros(out.batched(1), np.float32)
            b = self.session.io_binding()
            self._xv = ort.OrtValue.ortvalue_from_numpy(self._in)
            self._yv = ort.OrtValue.ortvalue_from_numpy(self._out)
            b.bind_ortvalue_input(self.session.get_inputs()[0].name, self._xv)
            b.bind_ortvalue_output(self.session.get_outputs()[0].name, self._yv)
            self._binding = b
            self._invoke = functools.partial(self.session._sess.run_with_iobinding, b._iobinding, None)
    return Old()


def guard_only(T: ModuleType, rounds: int, calls: int) -> dict[str, float]:
    """Old vs new BufferedExecutor with a no-op invoke: the call's own Python, nothing else."""
    from hwbackends.specs import TensorSpec
    from hwbackends.target import BufferedExecutor

    inp, outp = TensorSpec("x", (64,)), TensorSpec("y", (3,))

    class Old(T.BufferedExecutor):
        def __init__(self) -> None:
            self._init_io(inp, outp, 1)
            self._in, self._out = np.zeros((1, 64), np.float32), np.zeros((1, 3), np.float32)
            self._invoke = int

    class New(BufferedExecutor):
        def __init__(self) -> None:
            self._init_io([inp], [outp], 1)
            self._buffers([np.zeros((1, 64), np.float32)], [np.zeros((1, 3), np.float32)], int)

    x, out = np.ones((1, 64), np.float32), np.zeros((1, 3), np.float32)
    old, new = Old().predict_into, New().predict_into
    return interleaved({"before": lambda: old(x, out), "after": lambda: new(x, out)},
                       rounds, calls)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="669e52b")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()

    import hwbackends as hwb
    from hwbackends import zoo

    T = old_target(a.before)
    m = zoo.get(a.model)
    x = m.representative(1, seed=3)
    out = np.empty((1, *m.output.shape), np.float32)
    store = tempfile.mkdtemp(prefix="hwb-bench-")
    try:
        cm = hwb.compile(m, "cpu.litert", "fp32", store=store)
        path = str(cm.artifact.file("model.tflite"))
        from ai_edge_litert.interpreter import Interpreter
        raw_it = Interpreter(model_path=path, num_threads=1)
        raw_it.allocate_tensors()
        i, o = raw_it.get_input_details()[0]["index"], raw_it.get_output_details()[0]["index"]

        def raw() -> None:
            raw_it.set_tensor(i, x)
            raw_it.invoke()
            out[...] = raw_it.get_tensor(o)

        from hwb_plugins._shared.litert import LiteRTExecutor
        before, after = old_litert(T, path, m.input, m.output).predict_into, cm.predict_into
        fresh = LiteRTExecutor(Path(path), 1, 1, m.inputs, m.outputs).predict_into
        lite = interleaved({"raw": raw, "before": lambda: before(x, out),
                            "after": lambda: after(x, out), "fresh": lambda: fresh(x, out)},
                           a.rounds, a.calls, progress=True)

        cmo = hwb.compile(m, "cpu.onnxruntime", "fp32", store=store)
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
        sess = ort.InferenceSession(str(cmo.artifact.file("model.onnx")), so,
                                    providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: x}

        def run() -> None:
            out[...] = sess.run(None, feed)[0]

        obefore = old_ort(T, str(cmo.artifact.file("model.onnx")), m.input, m.output).predict_into
        oafter = cmo.predict_into
        from hwb_plugins.cpu_onnxruntime.target import OnnxRuntimeExecutor
        ofresh = OnnxRuntimeExecutor(cmo.artifact.file("model.onnx"), 1, 1, m.inputs,
                                     m.outputs).predict_into
        onx = interleaved({"raw": run, "before": lambda: obefore(x, out),
                           "after": lambda: oafter(x, out), "fresh": lambda: ofresh(x, out)},
                          a.rounds, a.calls, progress=True)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    g = guard_only(T, a.rounds, a.calls)
    print(f"zoo:{a.model}, batch 1, 1 thread; median ns per call over {a.rounds} interleaved "
          f"rounds of {a.calls} calls; before = hwbackends/target.py at {a.before}")
    for name, r in (("cpu.litert", lite), ("cpu.onnxruntime", onx)):
        print(f"  {name:16s} raw {r['raw']:7.0f}  before {r['before']:7.0f}  after {r['after']:7.0f}"
              f"  fresh {r['fresh']:7.0f}   after/raw {r['after'] / r['raw']:.3f} (target ≤ 1.10)"
              f"  before/raw {r['before'] / r['raw']:.3f}  after/before "
              f"{r['after'] / r['before']:.3f}  fresh/before {r['fresh'] / r['before']:.3f}")
    print(f"  guard alone (no-op model)  before {g['before']:6.0f}  after {g['after']:6.0f}   "
          f"after/before {g['after'] / g['before']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
