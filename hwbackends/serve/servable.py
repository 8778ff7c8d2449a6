"""What the serving engine runs: anything with ``predict_into(x, out)``, input/output specs
and a batch size (a :class:`~hwbackends.compiled.CompiledModel`, or a router strategy through
:class:`RouterStrategy`). Duck typing keeps the engine independent of the router's classes."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from ..compiler import compile as hwb_compile
from ..errors import ConfigError
from ..packing import Packed
from ..specs import TensorSpec


@runtime_checkable
class Servable(Protocol):
    """What the engine serves: its view of a compiled variant (or a router strategy). Optional extras it uses when present:
    ``variant`` (a label), ``static_batch`` (False: any batch size works), ``warmup(n)``,
    ``close()``, ``failovers()``."""

    batch_size: int
    input: TensorSpec
    output: TensorSpec

    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None: ...


def check_servable(obj: Any) -> Any:
    """``obj`` if it quacks like a :class:`Servable` (a model with several inputs or outputs
    comes back wrapped in :class:`~hwbackends.packing.Packed`: one float32 record each way),
    else a :class:`ConfigError` naming what lacks."""
    missing = [a for a in ("predict_into", "input", "output", "batch_size") if not hasattr(obj, a)]
    if missing:
        raise ConfigError(f"{type(obj).__name__} cannot be served: it lacks {', '.join(missing)}; "
                          f"pass a CompiledModel (hwb.compile(...)), a RouterStrategy(router, name) "
                          f"or an object with predict_into(x, out), input, output and batch_size")
    if getattr(obj, "multi_io", False):
        return Packed(obj)
    return obj


def servable_label(backend: Any) -> str:
    """The variant label metrics and logs use."""
    return str(getattr(backend, "variant", None) or type(backend).__name__)


class RouterStrategy:
    """One strategy of a :class:`~hwbackends.router.Router` as a serving backend: the lane's
    hot-path callable (dispatch, failover, breakers, re-routing stay the router's job)."""

    def __init__(self, router: Any, name: str):
        self.router = router
        self.name = name
        lane = router.lane(name)  # raises the router's own clear error for unknown strategies
        self.lane = lane
        #: What the engine locks around a call (see hwbackends.exclusive): the lane, so two
        #: RouterStrategy objects over one strategy never run it on two threads.
        self.exclusive_key = lane
        cm = lane.cms[0]
        self.input: TensorSpec = cm.input
        self.output: TensorSpec = cm.output
        self.inputs: list[TensorSpec] = list(cm.inputs)
        self.outputs: list[TensorSpec] = list(cm.outputs)
        #: Several inputs/outputs: the engine serves it packed (hwbackends.packing).
        self.multi_io: bool = bool(getattr(cm, "multi_io", False))
        self.batch_size: int = cm.batch_size
        # Every candidate of a lane is compiled at the same batch size (the router's plan).
        self.static_batch = True
        self.predict_into: Callable[[np.ndarray, np.ndarray], None] = router.handle(name)
        self._label_for = -1
        self._label = ""
        # Swaps are validated with the strategy's own fidelity tolerance.
        s = router.config.strategies[name]
        self.tolerance = s.fidelity.tolerance(s.output_kind)

    @property
    def variant(self) -> str:
        """``router:STRATEGY→VARIANT``, the variant serving *now* (it follows every switch)."""
        lane = self.lane
        cur = lane.cur
        if cur != self._label_for:  # one string per switch, not per call
            self._label = f"router:{self.name}→{lane.variants[cur].variant}"
            self._label_for = cur
        return self._label

    def failovers(self) -> int:
        """Calls a candidate failed or timed out on (each one was served by the next), plus the
        router's switches off a failing or slow variant (re-route, breaker-open, retry-failed)."""
        lane = self.lane
        return sum(v.errors + v.timeouts for v in lane.variants) + lane.failovers

    def warmup(self, n: int = 20) -> None:
        for cm in self.lane.cms:
            cm.warmup(n)


def compile_batch_variants(model: Any, target: str, precision: str | None = None,
                           sizes: Sequence[int] = (1,), **kw: Any) -> dict[int, Any]:
    """One compiled variant per allowed batch size (static-batch targets such as LiteRT fix the
    batch at compile time; TF Serving's ``allowed_batch_sizes`` needs one program per size)."""
    return {int(s): hwb_compile(model, target, precision, batch_size=int(s), **kw) for s in sizes}


def normalise(backends: Any) -> dict[int, Any] | Any:
    """A single backend, or ``{batch_size: backend}`` from a mapping or a sequence."""
    if isinstance(backends, Mapping):
        out = {int(k): check_servable(v) for k, v in backends.items()}
    elif isinstance(backends, (list, tuple)):
        out = {int(b.batch_size): check_servable(b) for b in backends}
    else:
        return check_servable(backends)
    if not out:
        raise ConfigError("no backend given to serve")
    return out
