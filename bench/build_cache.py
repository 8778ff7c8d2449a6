"""The store's build cache and build lock: what a second build of an FPGA design
costs with them. For each case, in one fresh store: the first compile (everything built), then
the same variant again after evicting its artifact (what a corrupted or evicted entry costs:
the build cache serves the C-sim library / Verilator model), then a retrained model (same
architecture, other weights) at the same precision (fpga.da4ml: its RTL is new, Verilator's
runtime library comes from the cache). Prints seconds per compile and the
cache's hits as each target records them.

    .venv/bin/python bench/build_cache.py [--store DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default=None, help="artifact store (default: a temporary one)")
    args = ap.parse_args()

    import keras
    import numpy as np

    import hwbackends as hwb

    store = args.store or tempfile.mkdtemp(prefix="hwb-bench-build-cache-")
    cases = [("fpga.hls4ml", "ap_fixed<16,6>", {}), ("fpga.hls4ml", "auto", {}),
             ("fpga.da4ml", "auto", {"synth": False})]
    m = hwb.load_model("zoo:signal")
    km = keras.models.clone_model(m.obj)
    km.set_weights([w * 0.75 + 0.01 * np.sign(w) for w in m.obj.get_weights()])
    retrained = hwb.load_model(km, name="signal-retrained", validation_data=m.validation_data)
    print(f"{'target':<12} {'precision':<16} {'first s':>8} {'again s':>8} {'retrained s':>12}  cache")
    for target, precision, opts in cases:
        if not hwb.get_registry().target(target).probe().usable:
            print(f"{target:<12} unavailable here")
            continue
        times, hits, key = [], [], None
        for i, model in enumerate((m, m, retrained)):
            if i == 1 and key:
                hwb.ArtifactStore(store).evict(key)
            t0 = time.perf_counter()
            cm = hwb.compile(model, target, precision, store=store, options=opts, fidelity=False)
            times.append(time.perf_counter() - t0)
            key, meta = cm.artifact.key, cm.artifact.meta
            hits.append(f"{meta['builds_cached']}/{meta['builds']} builds" if "builds" in meta
                        else f"verilator {'cached' if meta.get('verilator_cached') else 'built'} "
                        f"{meta['seconds']['verilator']} s (from the cache: "
                        f"{', '.join(meta.get('verilator_reused') or ['nothing shared'])})")
        print(f"{target:<12} {precision:<16} {times[0]:8.1f} {times[1]:8.1f} {times[2]:12.1f}  "
              + "; ".join(hits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
