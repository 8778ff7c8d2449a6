"""What serving a multi-IO model costs on top of its own call (zoo:two_head: features (16,) +
state (4,) → signal (1,) + confidence (1,)), batch 1, one thread.

Measured in one run, interleaved (A B C … A B C) so machine noise hits all alike:
  direct   cm.predict_into((features, state), (signal, confidence))  — what the router calls
  packed   Packed(cm).predict_into(record, out_record)  — what the engine's serving thread calls
           (copies into the model's per-tensor buffers and back)
  inline   Engine(cm, "single" preset, inline=True).try_predict_into(record, out_record):
           the engine in the caller's thread (queue, breaker, metrics; no thread hand-off)
  inline-tuples  the same call with a tuple in and a tuple of buffers out
  threaded the "single" preset as shipped: the request crosses to the serving thread

    .venv/bin/python bench/multi_io.py [--target cpu.onnxruntime] [--rounds 20] [--calls 2000]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import interleaved  # noqa: E402  (bench/ is on sys.path when run as a script)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="cpu.onnxruntime")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()

    import hwbackends as hwb
    from hwbackends import zoo
    from hwbackends.packing import Packed
    from hwbackends.serve import Engine, EngineConfig

    m = zoo.get("two_head")
    cm = hwb.compile(m, a.target, "fp32", batch_size=1)
    xs = tuple(np.ascontiguousarray(x) for x in m.representative(1, seed=3))
    outs = tuple(np.zeros(s.batched(1), np.float32) for s in cm.outputs)
    p = Packed(cm)
    rec = p.inputs_layout.pack(xs)
    out_rec = np.zeros((1, p.outputs_layout.size), np.float32)
    eng = Engine(cm, EngineConfig.preset("single", inline=True)).start()
    thr = Engine(cm, EngineConfig.preset("single")).start()
    one = rec[0]
    out_one = np.zeros(p.outputs_layout.size, np.float32)
    sample = tuple(x[0] for x in xs)
    sample_outs = tuple(o[0] for o in outs)
    hot, packed, engine, threaded = cm.predict_into, p.predict_into, eng.try_predict_into, \
        thr.try_predict_into

    res = interleaved({
        "direct": lambda: hot(xs, outs),
        "packed": lambda: packed(rec, out_rec),
        "inline": lambda: engine(one, out_one),
        "inline-tuples": lambda: engine(sample, sample_outs),
        "threaded": lambda: threaded(one, out_one),
    }, a.rounds, a.calls, progress=True)
    eng.stop()
    thr.stop()
    assert np.allclose(out_one, out_rec[0]) and np.allclose(np.r_[outs[0][0], outs[1][0]], out_one)

    print(f"zoo:two_head on {cm.variant}, batch 1, 1 thread; median over {a.rounds} interleaved "
          f"rounds of {a.calls} calls (ns per call), load average {os.getloadavg()[0]:.1f}")
    for k, v in res.items():
        print(f"  {k:<14} {v:9.0f}   ×{v / res['direct']:.2f} of direct")


if __name__ == "__main__":
    main()
