"""What one run shares across its layers: the artifact store, the plugin registry, the
profile cache and where progress goes (:class:`RunContext`).

The run's entry builds one and hands it down: a CLI command (``RunContext.at(args.cache_dir,
…)``), a top-level API call (``compile``, ``export``, ``bench_model``, ``Router.from_config``,
``run_fleet``: their ``context`` argument, or one built from their ``store=``,
``registry=`` and ``progress=`` keywords by :meth:`RunContext.given`), a fleet node's task.
Below the entry nothing looks any of these up for itself: ``bench_model`` → compile and
measure; ``Router.from_config`` → ``plan_strategy`` → compile and measure; ``export`` →
compile and measure; a fleet node's bench. So a test or a notebook that passes its own store
or registry gets it everywhere, and a caller who passes nothing gets the process-wide defaults
(``HWB_CACHE_DIR``'s store, the entry-point registry, no profile cache, progress to the
``hwbackends`` log), resolved here and nowhere else (tests/test_run_context.py scans the core
for any other lookup).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .errors import ConfigError
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
    def at(cls, store: ArtifactStore | str | Path | None = None, *,
           progress: Progress | None = None, profiles: ProfileCache | None = None,
           registry: Registry | None = None) -> "RunContext":
        """A context whose store is ``store`` or the one at that path (``None``: the default
        store), the form a command's ``--cache-dir`` takes; ``registry`` and ``progress``
        default as the fields do."""
        return cls(store=store if isinstance(store, ArtifactStore) else ArtifactStore(store),
                   registry=registry if registry is not None else get_registry(),
                   profiles=profiles, progress=progress or log_progress)

    @classmethod
    def given(cls, context: "RunContext | None", caller: str, *, store: Any = None,
              registry: Registry | None = None, progress: Progress | None = None) -> "RunContext":
        """The context of a top-level API call that also takes the run's pieces loose:
        ``context`` itself, or one built from ``store``/``registry``/``progress`` (:meth:`at`).
        Both at once is refused: which store or registry the run meant would be a guess."""
        if context is None:
            return cls.at(store, registry=registry, progress=progress)
        if not isinstance(context, RunContext):
            raise ConfigError(f"{caller}(context=) takes a hwbackends.RunContext; got "
                              f"{type(context).__name__}")
        loose = [k for k, v in (("store", store), ("registry", registry), ("progress", progress))
                 if v is not None]
        if loose:
            raise ConfigError(f"{caller}() got context= and {', '.join(f'{k}=' for k in loose)}: the "
                              f"run's store, registry and progress come from one place; pass "
                              f"them in the context (RunContext(store=…, registry=…, "
                              f"progress=…)) or loose, not both")
        return context

    def with_profiles(self, profiles: ProfileCache | None = None) -> "RunContext":
        """This context with ``profiles`` (the default cache when ``None``) if it has none."""
        from .bench.profile_cache import ProfileCache

        return self if self.profiles is not None else replace(self, profiles=profiles or ProfileCache())
