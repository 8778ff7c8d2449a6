"""Serving: the in-process :class:`Engine` (micro-batching, cache, deadlines, pinning, hot
swap) and its endpoints (shared memory for co-located processes, gRPC with TLS and tokens,
Prometheus metrics). See docs/serving.md."""
from __future__ import annotations

from .batch_plan import PRESETS, BatchPolicy
from .engine import Engine, EngineConfig
from .inference_cache import InferenceCache
from .lifecycle import SwapError, SwapResult
from .request import BREAKER_OPEN, DEADLINE, OK, STOPPED, Status, Unavailable, check_deadline_us
from .servable import RouterStrategy, Servable, compile_batch_variants

__all__ = ["BREAKER_OPEN", "BatchPolicy", "DEADLINE", "Engine", "EngineConfig",
           "InferenceCache", "OK", "PRESETS", "RouterStrategy", "STOPPED", "Servable", "Status", "SwapError",
           "SwapResult", "Unavailable", "check_deadline_us", "compile_batch_variants"]
