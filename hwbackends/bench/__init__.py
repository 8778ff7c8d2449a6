"""Benchmark harness: scenarios, latency profiles, the machine fingerprint, the profile cache.

    from hwbackends.bench import measure, SingleStream, Server
    prof = measure(cm, Server(rate_hz=2000))
    print(prof.p99_us, prof.mode)
"""
from __future__ import annotations

from ..machine import fingerprint
from .harness import bench_model, cached_measure, measure, pinned, select_targets
from .profile import LatencyProfile, summarize, table
from .profile_cache import ProfileCache, profile_key
from .results import BenchResults, ResultsError
from .scenarios import Batch, Burst, Server, SingleStream, Sliding, parse

__all__ = ["Batch", "BenchResults", "Burst", "LatencyProfile", "ProfileCache", "ResultsError",
           "Server", "SingleStream", "Sliding", "bench_model", "cached_measure", "fingerprint", "measure",
           "parse", "pinned", "profile_key", "select_targets", "summarize", "table"]
