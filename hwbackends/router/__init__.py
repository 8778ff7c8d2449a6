"""The tier router: strategies → the fastest accurate variant within each tier's p99 budget.

    router = hwbackends.Router.from_config("strategies.toml")
    y = router.predict("momentum", x)             # validates, allocates
    router.route_into("momentum", x, out)         # the hot path
    f = router.handle("momentum"); f(x, out)      # the hot path without the name lookup
    print(router.explain())

Build time (:mod:`.plan`): compile, fidelity-gate, measure (profiles cached per artifact and
machine), rank, choose. Run time (:mod:`.runtime`): dispatch, failover, breakers, re-routing.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..chunked import as_returned, predict_in_batches, tuple_call
from ..config import StrategiesFile, load_config, resolve_model
from ..context import RunContext
from ..errors import ConfigError, InputError
from ..sliding import Window
from .plan import Candidate, Decision, Tier, decide, explain, plan_strategy
from .runtime import Lane, NoRouteError, VariantState

log = logging.getLogger("hwbackends.router")

__all__ = ["Candidate", "Decision", "Lane", "NoRouteError", "Router", "Tier", "VariantState",
           "decide", "explain", "plan_strategy"]


class Router:
    """Routing decisions for every strategy of a config, and the lanes that serve them."""

    def __init__(self, config: StrategiesFile, decisions: dict[str, Decision],
                 source: str | None = None):
        self.config = config
        self.source = source
        self.decisions = decisions
        self.events: list[dict[str, Any]] = []
        self._lanes: dict[str, Lane] = {}
        self._handles: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {}
        for name, d in decisions.items():
            if not d.order:
                continue
            s = config.strategies[name]
            # A sliding strategy's budget is a tick's (push_into); the lane times whole windows,
            # which that budget cannot judge: it fails over on errors and deadlines, never on
            # latency (the ticks go through :meth:`sliding`).
            budget = math.inf if s.scenario == "sliding" else d.budget_us
            self._lanes[name] = Lane(name, d.order, budget, config.router,
                                     timeout_us=s.timeout_us, on_event=self.events.append)
            self._handles[name] = self._lanes[name].predict_into

    @classmethod
    def from_config(cls, path: str | Path, *, context: RunContext | None = None,
                    reuse_profiles: bool = True, strict: bool = True,
                    strategies: list[str] | None = None,
                    calibration_data: str | Path | None = None,
                    validation_data: str | Path | None = None) -> "Router":
        """Validate the config, plan every strategy (compile, check, measure, choose) and
        start its lane. ``context``: the store, registry, profile cache (the default cache
        when it has none) and progress callback (default :class:`RunContext`). ``strict``: a
        strategy no variant can serve raises :class:`NoRouteError` (with every candidate's
        reason) instead of being left out. ``reuse_profiles=False`` re-measures instead of
        using cached profiles. ``calibration_data`` /
        ``validation_data`` (``.npy``/``.npz`` paths, ``hwb route --calibration-data``)
        replace every strategy's own ``calibration_data``/``validation_data``."""
        from ..models import load_model
        from ..samples import attach_validation, read_samples

        p = Path(path)
        ctx = (context or RunContext()).with_profiles()
        cfg = load_config(p, ctx.registry)
        models: dict[tuple[str, str], Any] = {}
        decisions: dict[str, Decision] = {}
        for name, s in cfg.strategies.items():
            if strategies and name not in strategies:
                continue
            src = s.model if s.model.startswith("zoo:") else str(resolve_model(s.model, p))
            kw = s.load_kwargs(p)
            files = s.data_paths(p) | {k: Path(v) for k, v in (("calibration", calibration_data),
                                                               ("validation", validation_data)) if v}
            # the same file loaded another way, or with other data, is another model
            key = (src, repr(sorted(kw.items())), str(files.get("validation")))
            where = f"strategy {name!r}"
            if key not in models:
                models[key] = load_model(src, **kw)
                if "validation" in files:
                    attach_validation(models[key], read_samples(
                        files["validation"], models[key].inputs, f"{where} validation_data"))
            calib = (read_samples(files["calibration"], models[key].inputs,
                                  f"{where} calibration_data") if "calibration" in files else None)
            decisions[name] = plan_strategy(name, s, cfg, models[key], ctx,
                                            reuse_profiles=reuse_profiles,
                                            calibration_data=calib)
        if strategies:
            unknown = sorted(set(strategies) - set(cfg.strategies))
            if unknown:
                raise ConfigError(f"unknown strategy {', '.join(unknown)}; {p} defines "
                                  f"{', '.join(cfg.strategies)}")
        router = cls(cfg, decisions, str(p))
        dead = [d for d in decisions.values() if not d.order]
        if strict and dead:
            raise NoRouteError("\n".join(f"strategy {d.strategy}: {d.note}" for d in dead))
        return router

    # -- run time ---------------------------------------------------------------------------
    def lane(self, name: str) -> Lane:
        """The lane serving strategy ``name`` (its candidates' compiled models in ``cms``,
        their live state in ``variants``); a clear error for an unknown or unroutable one."""
        try:
            return self._lanes[name]
        except KeyError:
            d = self.decisions.get(name)
            if d is not None:
                raise NoRouteError(f"strategy {name!r} has no variant: {d.note}") from None
            raise InputError(f"unknown strategy {name!r}; configured: "
                             f"{', '.join(self.decisions) or 'none'}") from None

    def handle(self, name: str) -> Callable[[np.ndarray, np.ndarray], None]:
        """The strategy's hot-path callable ``f(x, out)``: keep it and call it per tick (the
        same dispatch, failover and tracking as :meth:`predict_into`, minus the name lookup)."""
        return self.lane(name).predict_into

    def route_into(self, strategy: str, x: Any, out: Any) -> None:
        """Hot path: ``x`` of shape ``(batch_size, *input)`` float32, ``out`` preallocated (a
        model with several inputs/outputs: tuples, one array per tensor, as its
        ``CompiledModel.predict_into`` takes them)."""
        try:
            h = self._handles[strategy]
        except KeyError:
            self.lane(strategy)  # raises the explanation
            raise
        h(x, out)

    def predict(self, name: str, x: Any) -> Any:
        """Validated, allocating predict (one sample or a batch) through the lane."""
        lane = self.lane(name)
        cm = lane.cms[0]
        xs, single = cm.validate(x)
        # Every candidate is compiled at the lane's batch size, so the lane chunks like one.
        call = tuple_call(lane.predict_into, not getattr(cm, "multi_io", False))
        return as_returned(predict_in_batches(call, xs, cm.batch_size, cm.inputs, cm.outputs),
                           single)

    def sliding(self, name: str, *, auto_prepare: bool = True) -> "Window":
        """The sliding window of the variant serving strategy ``name`` (``cm.sliding()``):
        ``push_into(x_t, out)`` per tick, what a ``scenario = "sliding"`` strategy was ranked
        by. One caller at a time; it does not fail over (open a new one after a switch)."""
        lane = self.lane(name)
        return lane.cms[lane.cur].sliding(auto_prepare=auto_prepare)

    def serving(self, name: str) -> str:
        """The variant serving ``name`` right now."""
        return self.lane(name).serving

    def status(self) -> dict[str, Any]:
        return {n: lane.status() for n, lane in self._lanes.items()}

    # -- explanation ------------------------------------------------------------------------
    def explain(self) -> str:
        return "\n\n".join(explain(d) for d in self.decisions.values())

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.source,
                "tiers": {k: v.model_dump() for k, v in self.config.tiers.items()},
                "router": self.config.router.model_dump(),
                "strategies": [d.to_dict() for d in self.decisions.values()]}

    def close(self) -> None:
        for d in self.decisions.values():
            for c in d.candidates:
                if c.cm is not None:
                    c.cm.close()
