"""Hot-path overhead of ``CompiledModel.predict_into`` against the raw library calls.

Measured in one run, interleaved (A B C A B C …) so machine noise hits all alike:
  raw     LiteRT's documented calls: set_tensor / invoke / get_tensor (copy out)
  bare    the zero-copy equivalent written by hand: tensor views + the C++ Invoke
  hwb     cm.predict_into(x, out) on cpu.litert
and the same for ONNX Runtime (sess.run vs hwb's IOBinding path).

    .venv/bin/python bench/overhead.py [--model mlp] [--rounds 30] [--calls 2000]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import interleaved  # noqa: E402  (bench/ is on sys.path when run as a script)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()

    import hwbackends as hwb
    from hwbackends import zoo

    m = zoo.get(a.model)
    x = m.representative(1, seed=3)
    out = np.empty((1, *m.output.shape), np.float32)

    cm = hwb.compile(m, "cpu.litert", "fp32")
    from ai_edge_litert.interpreter import Interpreter

    path = str(cm.artifact.file("model.tflite"))
    raw_it = Interpreter(model_path=path, num_threads=1)
    raw_it.allocate_tensors()
    i = raw_it.get_input_details()[0]["index"]
    o = raw_it.get_output_details()[0]["index"]

    def raw() -> None:
        raw_it.set_tensor(i, x)
        raw_it.invoke()
        out[...] = raw_it.get_tensor(o)

    bare_it = Interpreter(model_path=path, num_threads=1)
    bare_it.allocate_tensors()
    vin, vout, invoke = bare_it.tensor(i)(), bare_it.tensor(o)(), bare_it._interpreter.Invoke

    def bare() -> None:
        vin[...] = x
        invoke()
        out[...] = vout

    hot = cm.predict_into

    def hwb_call() -> None:
        hot(x, out)

    lite = interleaved({"raw": raw, "bare": bare, "hwb": hwb_call}, a.rounds, a.calls, progress=True)

    cmo = hwb.compile(m, "cpu.onnxruntime", "fp32")
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    sess = ort.InferenceSession(str(cmo.artifact.file("model.onnx")), so,
                                providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}

    def ort_run() -> None:
        out[...] = sess.run(None, feed)[0]

    hot_o = cmo.predict_into

    def hwb_ort() -> None:
        hot_o(x, out)

    onx = interleaved({"run": ort_run, "hwb": hwb_ort}, a.rounds, a.calls, progress=True)

    print(f"model zoo:{a.model}, batch 1, 1 thread; median over {a.rounds} interleaved rounds "
          f"of {a.calls} calls (ns per call)")
    print(f"  cpu.litert  raw set/invoke/get {lite['raw']:8.0f}   bare views+Invoke "
          f"{lite['bare']:8.0f}   hwb predict_into {lite['hwb']:8.0f}")
    print(f"    ratio hwb/raw  = {lite['hwb'] / lite['raw']:.3f}   (target ≤ 1.10)")
    print(f"    ratio hwb/bare = {lite['hwb'] / lite['bare']:.3f}")
    print(f"  cpu.onnxruntime  sess.run {onx['run']:8.0f}   hwb predict_into {onx['hwb']:8.0f}")
    print(f"    ratio hwb/run  = {onx['hwb'] / onx['run']:.3f}")


if __name__ == "__main__":
    main()
