"""Write docs/targets.md's table of what each ONNX-taking target makes of ONNX's own backend
test data (tests/onnx_backend_cases.py; tests/test_onnx_backend_data.py fails when the table
is stale).

    python scripts/onnx_backend_table.py                    # ref, cpu.onnxruntime, cpu.native
    python scripts/onnx_backend_table.py --show-refusals    # and why each case was refused
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import onnx_backend_cases as ob  # noqa: E402

TARGETS = ("ref", "cpu.onnxruntime", "cpu.native")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--show-refusals", action="store_true")
    a = ap.parse_args()
    logging.disable(logging.WARNING)
    tallies = []
    for t in a.targets.split(","):
        tally = ob.run_target(t)
        tallies.append(tally)
        print(f"{ob.table_row(tally)}  ({tally.seconds:.0f} s)")
        for o in tally.outcomes:
            if o.verdict in ("wrong", "raw") or (a.show_refusals and o.verdict == "refused"):
                print(f"  {o.verdict} {o.case}: {o.detail[:240]}")
    ob.write_doc(tallies)
    print(f"wrote {ob.DOC}")
    return 1 if any(o.verdict in ("wrong", "raw") for t in tallies for o in t.outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
