"""fpga.hls4ml's precompiled header: precision='auto' compiles with and without it.

Each case compiles in a fresh store of its own (so neither run reuses the other's libraries from
the build cache), without the PCH (``HWB_HLS4ML_PCH=0``) and with it, one after the other.
Prints the whole compile, the mean candidate build and the number of builds; the search must
choose the same types both ways (asserted: the PCH changes no object file).

    .venv/bin/python bench/hls4ml_pch.py [--models mlp,lstm]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,lstm", help="zoo models (comma-separated)")
    args = ap.parse_args()

    import hwbackends as hwb
    from hwbackends import isolate

    if not hwb.get_registry().target("fpga.hls4ml").probe().usable:
        print("fpga.hls4ml unavailable here", file=sys.stderr)
        return 1
    print(f"{'model':<8} {'pch':<4} {'compile s':>9} {'mean build s':>12} {'builds':>6}  types")
    for name in args.models.split(","):
        m = hwb.load_model(f"zoo:{name}")
        chosen = []
        for pch in ("0", "1"):
            os.environ["HWB_HLS4ML_PCH"] = pch
            isolate.worker().kill()  # the next compile starts a worker with this environment
            store = tempfile.mkdtemp(prefix="hwb-bench-pch-")
            t0 = time.perf_counter()
            cm = hwb.compile(m, "fpga.hls4ml", "auto", store=store, gate=False)
            secs = time.perf_counter() - t0
            s = cm.artifact.meta["search"]
            builds = [t["build_seconds"] for t in s["trials"] + s["weight_trials"]]
            chosen.append(cm.artifact.meta["types"])
            print(f"{name:<8} {'on' if pch == '1' else 'off':<4} {secs:>9.1f} "
                  f"{statistics.mean(builds):>12.2f} {len(builds) + 1:>6}  "
                  f"f={s['frac_bits']} w={s['weight_frac_bits']}", flush=True)
        assert chosen[0] == chosen[1], "the search chose other types with the PCH"
    return 0


if __name__ == "__main__":
    sys.exit(main())
