"""What one run shares across its layers: the artifact store, the plugin registry, the
profile cache and where progress goes (:class:`RunContext`).

The CLI (or an API caller) builds one and hands it down: ``bench_model`` → compile and
measure; ``Router.from_config`` → ``plan_strategy`` → compile and measure; a fleet node's
bench. Nothing below the caller looks any of these up for itself, so a test or a notebook
that passes its own store or registry gets it everywhere, and a caller who passes nothing
gets the process-wide defaults (``HWB_CACHE_DIR``'s store, the entry-point registry, no
profile cache, progress to the ``hwbackends`` log).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .registry import Registry, get_registry
from .store.artifacts import ArtifactStore

if TYPE_CHECKING:  # pragma: no cover - imported where used: bench/ imports this module
    from .bench.profile_cache import ProfileCache

log = logging.getLogger("hwbackends")

#: Where a run's progress lines go: one human sentence per call.
Progress = Callable[[str], None]


def log_progress(msg: str) -> None:
    """The default progress: the ``hwbackends`` logger at INFO (silent unless configured)."""
    log.info(msg)


def quiet(msg: str) -> None:
    """Progress that goes nowhere (``--quiet``, ``--json``)."""


@dataclass(frozen=True)
class RunContext:
    """The resources of one run, built once by its caller and passed down unchanged.

    ``profiles`` is the cache of measured latency profiles (per artifact and machine);
    ``None`` means measure without keeping anything (a library call to ``bench_model``);
    the router, whose start-up depends on it, uses the default cache then. Whether a cached
    profile may stand for a new measurement is the call's own choice (``reuse_profiles``),
    not the context's: ``hwb bench`` re-measures by default and ``hwb route`` reuses."""

    store: ArtifactStore = field(default_factory=ArtifactStore)
    registry: Registry = field(default_factory=get_registry)
    profiles: ProfileCache | None = None
    progress: Progress = log_progress

    @classmethod
    def at(cls, cache_dir: str | Path | None, *, progress: Progress = log_progress,
           profiles: ProfileCache | None = None, registry: Registry | None = None) -> "RunContext":
        """A context whose store is at ``cache_dir`` (``None``: the default store), the
        form a command's ``--cache-dir`` takes."""
        return cls(store=ArtifactStore(cache_dir), registry=registry or get_registry(),
                   profiles=profiles, progress=progress)

    def with_profiles(self, profiles: ProfileCache | None = None) -> "RunContext":
        """This context with ``profiles`` (the default cache when ``None``) if it has none."""
        from .bench.profile_cache import ProfileCache

        return self if self.profiles is not None else replace(self, profiles=profiles or ProfileCache())
