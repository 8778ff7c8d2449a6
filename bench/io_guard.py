"""Cost of the input guard in ``predict_into`` (shape/dtype/contiguity of ``x`` and ``out``
checked before the library call, so numpy cannot silently broadcast or cast a wrong array).

Measured in one run, interleaved (A B A B …): the built-in executors' ``predict_into`` with
the guard against the same body without it, on the zoo mlp at batch 1.

    .venv/bin/python bench/io_guard.py [--rounds 30] [--calls 5000]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import types

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def unguarded(ex):
    """The pre-guard body of a :class:`~hwbackends.target.BufferedExecutor` (both built-in CPU
    executors are one): assign, run, copy out (errors caught only after the fact)."""
    from hwbackends.target import BufferedExecutor

    if not isinstance(ex, BufferedExecutor):
        raise SystemExit(f"{type(ex).__name__} is not a BufferedExecutor (_in/_invoke/_out): "
                         f"this bench measures the guard of those")

    def predict_into(self, x, out):
        self._in[...] = x
        self._invoke()
        out[...] = self._out
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
    try:
        run(hwb, m, store, args)
    finally:  # the store holds only this run's artifacts
        shutil.rmtree(store, ignore_errors=True)
    return 0


def run(hwb, m, store: str, args: argparse.Namespace) -> None:
    clock = time.perf_counter_ns
    for target in ("cpu.litert", "cpu.onnxruntime"):
        cm = hwb.compile(m, target, "fp32", store=store, fidelity=False)
        ex = cm.executor
        fns = {"guarded": cm.predict_into,
               "unguarded": types.MethodType(unguarded(ex), ex)}
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


if __name__ == "__main__":
    sys.exit(main())
