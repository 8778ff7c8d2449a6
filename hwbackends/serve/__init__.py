"""Serving: the in-process :class:`Engine` (micro-batching, cache, deadlines, pinning, hot
swap) and its endpoints (shared memory for co-located processes, gRPC with TLS and tokens,
Prometheus metrics). See docs/serving.md."""
from __future__ import annotations

from .backend import Backend, RouterStrategy, compile_batch_variants
from .batching import PRESETS, BatchPolicy
from .cache import InferenceCache
from .engine import BREAKER_OPEN, DEADLINE, OK, STOPPED, Engine, EngineConfig, Unavailable
from .lifecycle import SwapError, SwapResult

__all__ = ["BREAKER_OPEN", "Backend", "BatchPolicy", "DEADLINE", "Engine", "EngineConfig",
           "InferenceCache", "OK", "PRESETS", "RouterStrategy", "STOPPED", "SwapError",
           "SwapResult", "Unavailable", "compile_batch_variants"]
