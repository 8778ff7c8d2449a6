"""What the checks run against: one target under test (:class:`Conformance`), the variants
(zoo model × precision) it claims, and the two outcomes besides success."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .. import zoo
from ..compiled import CompiledModel
from ..compiler import compile as hwb_compile
from ..compiler import conversion_path
from ..context import RunContext
from ..errors import HwbError, UnsupportedError
from ..models import Model
from ..registry import Registry
from ..specs import Availability
from ..target import Target
from .layers import names_layer


class ConformanceError(AssertionError):
    """The target broke a rule of the contract (the message names the rule and the fix)."""


class NotApplicable(Exception):
    """The check cannot run here; ``reason`` says why (shown as the skip reason)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def zoo_format(name: str) -> str:
    """Source format of a zoo model, known without building it (builds import frameworks)."""
    return "torch" if name.endswith("_torch") else "keras"


@dataclass(frozen=True)
class Variant:
    model: str
    precision: str

    @property
    def id(self) -> str:
        return f"{self.model}-{self.precision}"


@dataclass
class Conformance:
    """One target under test: its registry, an artifact store of its own and the variants
    (zoo model × precision) to check. ``models=None`` means every zoo model the target claims
    (its ``formats`` plus the installed converters); ``precisions=None`` means all of them.
    ``options``: target options every compile gets (``hwb.compile(..., options=)``), e.g. to
    skip a slow synthesis step that is not part of the contract. ``store_variant``: the
    variant the store round-trip compiles, caches and rebuilds after corrupting it (default:
    the first claimed model at the default precision, :meth:`first_compilable`). The store
    contract does not depend on the precision, so a target whose default precision runs a
    search (every rebuild repeats it) can name an explicit one here, e.g.
    ``Variant("mlp", "ap_fixed<16,6>")``: the rebuild is then one build, not a search.

    The kit is its run's entry: its :class:`~hwbackends.RunContext` (``run``) is built here,
    from ``store`` and ``registry`` (``None``: the installed plugins), and every compile of
    the checks goes through it."""

    target_name: str
    store: Path
    models: Sequence[str] | None = None
    precisions: Sequence[str] | None = None
    registry: Registry | None = None
    options: Mapping[str, Any] | None = None
    store_variant: Variant | None = None
    _compiled: dict[Variant, CompiledModel | BaseException] = field(default_factory=dict, repr=False)
    _models: dict[str, Model] = field(default_factory=dict, repr=False)
    _availability: Availability | None = field(default=None, repr=False)
    #: Fresh builds made through the kit, and ``Target.compile`` calls seen in *this* process
    #: (there must be none: compiles belong in the worker). See :meth:`compile_variant`.
    fresh_builds: list[str] = field(default_factory=list, repr=False)
    inprocess_compiles: list[int] = field(default_factory=list, repr=False)
    run: RunContext = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.store = Path(self.store)
        self.run = RunContext.at(self.store, registry=self.registry)

    # -- what is under test -----------------------------------------------------------------
    @property
    def reg(self) -> Registry:
        return self.run.registry

    @property
    def target(self) -> Target:
        return self.reg.target(self.target_name)

    def availability(self, fresh: bool = False) -> Availability:
        """The target's ``probe()`` answer (memoised; ``fresh=True`` probes again)."""
        if fresh or self._availability is None:
            try:
                av = self.target.probe()
            except Exception as exc:
                raise ConformanceError(f"{self.target_name}.probe() raised {type(exc).__name__}: "
                                       f"{exc}. probe() must never raise: return "
                                       f"Availability.unavailable(reason) instead") from exc
            self._availability = av
        return self._availability

    def require_usable(self) -> Availability:
        av = self.availability()
        if isinstance(av, Availability) and not av.usable:
            raise NotApplicable(f"{self.target_name} is unavailable here: {av.reason}")
        return av

    def claimed_models(self) -> list[str]:
        """Zoo models whose format the target takes, directly or through converters."""
        names = list(self.models) if self.models is not None else list(zoo.NAMES)
        out = []
        for n in names:
            if n not in zoo.NAMES:
                raise ConformanceError(f"no zoo model {n!r}; the zoo has {', '.join(zoo.NAMES)}")
            try:
                conversion_path(self.reg, zoo_format(n), self.target.formats, self.target_name)
            except UnsupportedError:
                continue
            out.append(n)
        return out

    def variants(self) -> list[Variant]:
        t = self.target
        precs = list(t.precisions) if self.precisions is None else [
            t.precisions[0] if p == "default" else p for p in self.precisions]
        return [Variant(m, p) for m in self.claimed_models() for p in dict.fromkeys(precs)]

    def model(self, name: str) -> Model:
        if name not in self._models:
            self._models[name] = zoo.get(name)
        return self._models[name]

    def compiled(self, v: Variant) -> CompiledModel:
        """The variant compiled through ``hwb.compile`` into this context's store (memoised).
        An ``UnsupportedError`` that names the layer/op is accepted (→ NotApplicable)."""
        self.require_usable()
        if v not in self._compiled:
            try:
                self._compiled[v] = self.compile_variant(v, self.store)
            except BaseException as exc:
                self._compiled[v] = exc
        got = self._compiled[v]
        if isinstance(got, BaseException):
            raise got
        return got

    def compile_variant(self, v: Variant, store: Path, **kw: Any) -> CompiledModel:
        """Compile ``v`` through ``hwb.compile`` into ``store`` in the kit's run (not
        memoised), watching for a ``Target.compile`` call in this process and recording fresh
        builds."""
        try:  # Target.accepts, as compile's own check: not membership of the listed ones
            self.target.check_precision(v.precision)
        except UnsupportedError as exc:
            raise ConformanceError(str(exc)) from exc
        m = self.model(v.model)
        # Spy on the target class in this process only: the worker imports the class afresh,
        # so a call recorded here means compile() ran in the caller's process.
        cls = type(self.target)
        real = cls.__dict__.get("compile")  # None when inherited: then delete the spy after
        orig = cls.compile
        seen = self.inprocess_compiles

        def spy(target: Target, *a: Any, **k: Any) -> Any:
            seen.append(os.getpid())
            return orig(target, *a, **k)

        cls.compile = spy  # type: ignore[method-assign]
        try:
            if self.options:
                kw.setdefault("options", dict(self.options))
            kw.setdefault("gate", False)  # the kit's own fidelity check reports a failed gate
            run = self.run if Path(store) == self.store else RunContext.at(store, registry=self.reg)
            cm = hwb_compile(m, self.target_name, v.precision, context=run, **kw)
            if not cm.artifact.cached:
                self.fresh_builds.append(f"{v.id} ({cm.artifact.compile_seconds:.1f} s)")
            return cm
        except UnsupportedError as exc:
            named = names_layer(m, str(exc))
            if not named:
                raise ConformanceError(
                    f"{self.target_name} raised UnsupportedError for zoo model {v.model!r} "
                    f"({v.precision}) without naming the layer or op it cannot compile: "
                    f"{exc!s:.400}. Say which layer/op (e.g. \"layer 'lstm' (LSTM) is not "
                    f"supported\") so users know what to change") from exc
            raise NotApplicable(f"{v.model} is not supported by {self.target_name}: {exc!s:.300}") from exc
        except HwbError as exc:
            raise ConformanceError(f"compiling zoo model {v.model!r} for {self.target_name}:"
                                   f"{v.precision} failed: {type(exc).__name__}: {exc!s:.1500}") from exc
        finally:
            if real is None:
                del cls.compile
            else:
                cls.compile = real  # type: ignore[method-assign]

    def first_compilable(self) -> Variant:
        """The first claimed model at the default precision that compiles."""
        reasons = []
        for m in self.claimed_models():
            v = Variant(m, self.target.precisions[0])
            try:
                self.compiled(v)
                return v
            except NotApplicable as exc:
                reasons.append(exc.reason)
        raise NotApplicable(f"{self.target_name} compiles none of the selected zoo models"
                            + (f" ({'; '.join(reasons)})" if reasons else ""))

    def round_trip_variant(self) -> Variant:
        """The variant the store checks build: :attr:`store_variant` (a zoo model the target
        takes), else :meth:`first_compilable`. Compiled (memoised) on return."""
        v = self.store_variant
        if v is None:
            return self.first_compilable()
        try:
            if v.model not in zoo.NAMES:
                raise UnsupportedError(f"the zoo has {', '.join(zoo.NAMES)}")
            conversion_path(self.reg, zoo_format(v.model), self.target.formats, self.target_name)
        except UnsupportedError as exc:
            raise ConformanceError(f"store_variant {v.id} names a model {self.target_name} "
                                   f"does not take ({exc}): name a zoo model of one of its "
                                   f"formats {self.target.formats}") from exc
        self.compiled(v)
        return v


def io_arrays(cm: CompiledModel, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random ``x`` and a NaN-filled ``out`` of the variant's batch shapes."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(cm.input.batched(cm.batch_size)).astype(np.float32)
    return x, np.full(cm.output.batched(cm.batch_size), np.nan, np.float32)
