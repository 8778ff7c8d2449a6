"""What the store's prune costs: the scan a capped compile runs after each commit
(HWB_CACHE_MAX_SIZE: sizes and times, no record read), the listing ``hwb store`` shows (each
entry's signed record read), and a prune that removes every entry (``hwb store prune``
over a store of N stale entries), for stores of N entries.

    .venv/bin/python bench/store_prune.py [--sizes 100,1000,5000] [--rounds 5] [--blob-kib 16]

Entries are real build-cache products (signed records, blobs of ``--blob-kib`` KiB, each in
its own two-level directory like an artifact); the store is under a temporary directory and
is rebuilt for each size (the removal empties it). Prints the median of ``rounds`` scans and
listings per size, one prune to a limit that keeps them all (what a commit does when the
store is within its cap), and one that removes all of them."""
from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hwbackends.store.artifacts import ArtifactStore  # noqa: E402
from hwbackends.store.build_cache import DIRNAME, BuildCache, digest  # noqa: E402
from hwbackends.store.prune import prune, usage  # noqa: E402


def _ms(f, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--blob-kib", type=int, default=16)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("HWB_KEY_FILE", str(Path(tmp) / "key"))
        blob = Path(tmp) / "blob"
        blob.write_bytes(os.urandom(a.blob_kib << 10))
        print("entries  scan ms  listing ms  prune (within cap) ms  prune (all) s  per entry µs")
        for n in (int(s) for s in a.sizes.split(",")):
            root = Path(tmp) / f"store-{n}"
            st = ArtifactStore(root)
            cache = BuildCache(st.root / DIRNAME)
            for i in range(n):
                cache.put(digest(str(i)), blob)
            scan = _ms(functools.partial(usage, st, labels=False), a.rounds)
            listing = _ms(functools.partial(usage, st), a.rounds)
            t0 = time.perf_counter()
            r = prune(st, max_bytes=1 << 40, labels=False)
            within = (time.perf_counter() - t0) * 1e3
            assert not r.removed
            t0 = time.perf_counter()
            r = prune(st, max_bytes=0, now=time.time() + 3600)  # all stale: every one goes
            every = time.perf_counter() - t0
            assert len(r.removed) == n and not cache.names(), (len(r.removed), n)
            print(f"{n:7d}  {scan:7.1f}  {listing:10.1f}  {within:21.1f}  {every:13.2f}  "
                  f"{every / n * 1e6:12.0f}", flush=True)
            shutil.rmtree(root)


if __name__ == "__main__":
    main()
