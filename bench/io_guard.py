"""Cost of the input guard in ``predict_into`` (shape/dtype/contiguity of ``x`` and ``out``
checked before the library call, so numpy cannot silently broadcast or cast a wrong array).

Measured in one run, interleaved (A B A B …): the built-in executors' ``predict_into`` with
the guard against the same body without it, on the zoo mlp at batch 1.

    .venv/bin/python bench/io_guard.py [--rounds 30] [--calls 5000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import types

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def unguarded(buf_in: str, run_attr: str, buf_out: str, arg: str | None):
    """The pre-guard body: assign, run, copy out (errors caught only after the fact)."""
    def predict_into(self, x, out):
        getattr(self, buf_in)[...] = x
        run = getattr(self, run_attr)
        run() if arg is None else run(getattr(self, arg), None)
        out[...] = getattr(self, buf_out)
    return predict_into


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    import hwbackends as hwb
    from hwbackends import zoo

    m = zoo.get("mlp")
    store = tempfile.mkdtemp(prefix="hwb-bench-")
    specs = {"cpu.litert": ("_in", "_invoke", "_out", None),
             "cpu.onnxruntime": ("_x", "_run", "_y", "_cbinding")}
    clock = time.perf_counter_ns
    for target, spec in specs.items():
        cm = hwb.compile(m, target, "fp32", store=store, fidelity=False)
        ex = cm.executor
        fns = {"guarded": cm.predict_into,
               "unguarded": types.MethodType(unguarded(*spec), ex)}
        x = np.random.default_rng(0).standard_normal(cm.input.batched(1)).astype(np.float32)
        out = np.zeros(cm.output.batched(1), np.float32)
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, f in fns.items():
                t0 = clock()
                for _ in range(args.calls):
                    f(x, out)
                samples[k].append((clock() - t0) / args.calls)
        g, u = (statistics.median(samples[k]) for k in ("guarded", "unguarded"))
        print(f"{target:<16} guarded {g:7.0f} ns  unguarded {u:7.0f} ns  "
              f"guard cost {g - u:+5.0f} ns  ratio {g / u:.3f}  "
              f"(median of {args.rounds} rounds × {args.calls} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
