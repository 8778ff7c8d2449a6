"""What HWB_CACHE_MAX_SIZE costs a compile: the scan of a store (sizes and times, no manifest)
that each commit runs when the cap is set, for stores of N entries.

    .venv/bin/python bench/store_prune.py [--sizes 100,1000,5000] [--rounds 5]

Entries are real build-cache products (signed records, 16 KiB blobs, each in its own two-level
directory like an artifact); the store is under a temporary directory. Prints the median of
``rounds`` scans per size, and one prune to a limit that keeps them all (what a commit does
when the store is within its cap)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hwbackends.build_cache import DIRNAME, BuildCache, digest  # noqa: E402
from hwbackends.store import ArtifactStore  # noqa: E402
from hwbackends.store_prune import prune, usage  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("HWB_KEY_FILE", str(Path(tmp) / "key"))
        st = ArtifactStore(Path(tmp) / "store")
        cache = BuildCache(st.root / DIRNAME)
        blob = Path(tmp) / "blob"
        blob.write_bytes(os.urandom(16384))
        have = 0
        print("entries  scan median ms  prune (within cap) ms")
        for n in (int(s) for s in a.sizes.split(",")):
            for i in range(have, n):
                cache.put(digest(str(i)), blob)
            have = n
            scans = []
            for _ in range(a.rounds):
                t0 = time.perf_counter()
                usage(st, labels=False)
                scans.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            r = prune(st, max_bytes=1 << 40, labels=False)
            pr = (time.perf_counter() - t0) * 1e3
            assert not r.removed
            print(f"{n:7d}  {statistics.median(scans):13.1f}  {pr:20.1f}", flush=True)


if __name__ == "__main__":
    main()
