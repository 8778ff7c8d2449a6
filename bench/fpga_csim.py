"""fpga.hls4ml: compile/load times, auto-precision fidelity table, C-sim per-sample cost.

Everything is measured in one run on this machine (mode *emulated*: hls4ml's C-simulation on
the CPU; no FPGA latency is measured or implied here).

1. Per zoo model, ``ap_fixed<16,6>`` (hls4ml's default) vs ``auto``: fidelity on the
   validation data, total bits, g++ builds, cold compile seconds (as recorded when built),
   warm load (fresh ``dlopen`` of the stored library, median of 5).
2. Per-sample cost, interleaved (A B C A B C …):
     bare     ``myproject_float(x, y)`` through ctypes, pointers precomputed (the floor);
              also ``hwb_predict_batch(x, y, 1)`` bare (our C entry point)
     hwb      ``cm.predict_into(x, out)`` (shape/dtype guard + one ctypes call)
     hls4ml   ``ModelGraph.predict(x)`` on one sample (hls4ml's own Python loop), same design

    .venv/bin/python bench/fpga_csim.py [--models mlp,lstm,signal,conv1d] [--latency mlp,lstm]
                                        [--rounds 15] [--calls 300] [--store DIR]
"""
from __future__ import annotations

import argparse
import atexit
import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import interleaved  # noqa: E402  (bench/ is on sys.path)


def warm_load_ms(cm, n: int = 5) -> float:
    """Fresh dlopen of a copy of the stored artifact (a new path, so a real dlopen) + the first
    call (hls4ml reads the weights then)."""
    from hwbackends.registry import get_registry
    from hwbackends.target import CompileOptions

    tgt = get_registry().target("fpga.hls4ml")
    times = []
    x = np.zeros(cm.input.batched(1), np.float32)
    y = np.zeros(cm.output.batched(1), np.float32)
    for _ in range(n):
        d = Path(tempfile.mkdtemp(prefix="hwb-load-"))
        try:
            shutil.copytree(cm.artifact.path, d / "a")
            art = type(cm.artifact)(**{**cm.artifact.__dict__, "path": d / "a"})
            t0 = time.perf_counter()
            ex = tgt.load(art, CompileOptions(cm.precision))
            ex.predict_into(x, y)
            times.append((time.perf_counter() - t0) * 1e3)
        finally:  # the library stays mapped; its copy on disk is this run's only
            shutil.rmtree(d, ignore_errors=True)
    return statistics.median(times)


def fidelity_table(models: list[str], store: str | None) -> list[dict]:
    import hwbackends as hwb
    from hwb_plugins.fpga_hls4ml.precision import FidelityTarget

    tol = FidelityTarget().tolerance()
    rows = []
    for name in models:
        for prec in ("ap_fixed<16,6>", "auto"):
            t0 = time.perf_counter()
            try:
                cm = hwb.compile(f"zoo:{name}", "fpga.hls4ml", prec, store=store, gate=False)
            except Exception as exc:  # report, keep going (e.g. a layer hls4ml refuses)
                rows.append({"model": name, "precision": prec, "error": f"{type(exc).__name__}: {exc}"[:200]})
                print(f"{name} {prec}: {exc}", file=sys.stderr)
                continue
            wall = time.perf_counter() - t0
            meta = cm.artifact.meta
            f = cm.fidelity
            rows.append({
                "model": name, "precision": prec, "fid": f, "passes": not tol.violations(f),
                "violations": tol.violations(f), "bits": meta["bits"]["total_bits"],
                "weight_bits": meta["bits"]["weight_bits"], "builds": meta["builds"],
                "frac_bits": meta["search"].get("frac_bits"),
                "compile_s": cm.artifact.compile_seconds, "cached": cm.artifact.cached,
                "wall_s": wall, "load_ms": warm_load_ms(cm), "cm": cm,
                "types": meta["types"],
            })
            print(f"{name} {prec}: {f}  bits={meta['bits']['total_bits']} builds={meta['builds']} "
                  f"compile={cm.artifact.compile_seconds:.1f}s", file=sys.stderr)
    return rows


def latency(cm, name: str, rounds: int, calls: int, with_hls4ml: bool) -> dict[str, float]:
    from hwbackends import zoo

    meta = cm.artifact.meta
    lib = ctypes.CDLL(str(cm.artifact.file(meta["lib"])))  # same handle as the executor's
    fn = lib.myproject_float
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    m = zoo.get(name)
    x = np.ascontiguousarray(m.representative(1, seed=3))
    out = np.empty(cm.output.batched(1), np.float32)
    xp, yp = x.ctypes.data, out.ctypes.data
    batch = cm.executor.lib.batch_fn
    n1 = ctypes.c_long(1)
    fns = {"bare": lambda: fn(xp, yp), "bare_batch": lambda: batch(xp, yp, n1),
           "hwb": lambda: cm.predict_into(x, out)}
    # The Python side alone: the same executor code with the C-sim swapped for a C function
    # that does ~nothing with the same signature (strncmp of 1 byte), against that function
    # called bare. The C-sim's own ~0.3-5 ms per sample would drown a µs difference.
    from hwb_plugins.fpga_hls4ml.csim import CsimExecutor
    libc = ctypes.CDLL(None)
    noop = libc.strncmp
    noop.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    ex = CsimExecutor(cm.executor.lib, 1, cm.input, cm.output)
    ex._fn = noop
    fns["noop_bare"] = lambda: noop(xp, yp, n1)
    fns["noop_hwb"] = lambda: ex.predict_into(x, out)
    if with_hls4ml:
        hm = _hls4ml_model(m, meta)
        xs = x.reshape(-1)
        fns["hls4ml"] = lambda: hm.predict(xs)
        ref = np.asarray(hm.predict(xs)).reshape(out.shape)
        cm.predict_into(x, out)
        assert np.array_equal(ref, out), "hls4ml's own library and ours disagree"
    return interleaved(fns, rounds, calls)


def _hls4ml_model(m, meta):
    """The same design built by hls4ml itself (its build_lib.sh) for its own predict()."""
    from hwb_plugins.fpga_hls4ml import convert

    opts = convert.HlsOptions.from_extra({k: v for k, v in meta["options"].items() if v is not None})
    d = tempfile.mkdtemp(prefix="hwb-h4m-")
    atexit.register(shutil.rmtree, d, True)  # hls4ml's project: used until the run ends
    hm = convert.convert(m, meta["hls4ml_config"], opts, Path(d))
    hm.compile()
    return hm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,lstm,signal,conv1d")
    ap.add_argument("--latency", default="mlp,lstm")
    ap.add_argument("--hls4ml-predict", default="mlp", help="models to also time hls4ml's predict on")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--store", default=None)
    a = ap.parse_args()
    from hwbackends.machine import describe

    rows = fidelity_table([s for s in a.models.split(",") if s], a.store)
    print(f"\nmachine: {describe()}; mode: emulated (hls4ml C-simulation, g++ -O3)\n")
    print("| model | precision | corr | max abs / range | sign | argmax | target | total bits "
          "(weights) | g++ builds | cold compile s | warm load ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['precision']} | — | — | — | — | refused: {r['error']} | | | | |")
            continue
        f = r["fid"]
        am = "—" if f.argmax_agree is None else f"{f.argmax_agree:.3f}"
        prec = r["precision"] + (f" (f={r['frac_bits']})" if r["frac_bits"] is not None else "")
        print(f"| {r['model']} | {prec} | {f.corr:.6f} | {f.rel_err:.4f} | {f.sign_agree:.3f} | {am} | "
              f"{'meets' if r['passes'] else 'fails'} | {r['bits']:,} ({r['weight_bits']:,}) | "
              f"{r['builds']} | {r['compile_s']:.1f} | {r['load_ms']:.1f} |")
    by = {(r["model"], r["precision"]): r for r in rows if "error" not in r}
    print("\n| model | precision | bare ctypes µs | bare hwb_predict_batch µs | hwb predict_into µs | hls4ml predict µs | "
          "hls4ml / bare | guard+call, no-op C fn µs | bare no-op call µs | hwb Python overhead µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in [s for s in a.latency.split(",") if s]:
        r = by.get((name, "auto"))
        if r is None:
            continue
        t = latency(r["cm"], name, a.rounds, a.calls, name in a.hls4ml_predict.split(","))
        h = t.get("hls4ml")
        hs = "—" if h is None else f"{h / 1e3:.1f}"
        hr = "—" if h is None else f"{h / t['bare']:.2f}×"
        print(f"| {name} | auto | {t['bare'] / 1e3:.1f} | {t['bare_batch'] / 1e3:.1f} | {t['hwb'] / 1e3:.1f} | {hs} | {hr} | "
              f"{t['noop_hwb'] / 1e3:.2f} | {t['noop_bare'] / 1e3:.2f} | "
              f"{(t['noop_hwb'] - t['noop_bare']) / 1e3:.2f} |")


if __name__ == "__main__":
    main()
