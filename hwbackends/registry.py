"""Plugin discovery on pluggy, with isolation: one broken plugin never takes the others down."""
from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import logging
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Sequence

import pluggy

from . import hookspecs
from .errors import PluginError, UnknownTargetError
from .specs import Availability
from .target import CONTRACT_VERSION, Converter, Target

ENTRY_POINT_GROUP = "hwbackends"
#: Comma-separated plugin modules (``pkg.mod`` or ``pkg.mod:attr``) registered after the entry
#: points, like pytest's ``PYTEST_PLUGINS``: try a plugin before packaging it. An environment
#: variable, so every process that builds a registry (compile worker, Ray node, `hwb serve`)
#: sees the same plugins.
PLUGINS_ENV = "HWB_PLUGINS"
log = logging.getLogger(__name__)


@dataclass
class PluginProblem:
    """A plugin that could not be used, and why (shown by ``hwb targets``)."""

    plugin: str
    stage: str  # "import", "register", "contract", or the hook that raised ("hwb_targets", ...)
    error: str

    def to_dict(self) -> dict[str, str]:
        return {"plugin": self.plugin, "stage": self.stage, "error": self.error}


@dataclass
class Registry:
    """All targets and converters the installed plugins provide."""

    pm: pluggy.PluginManager
    targets: dict[str, Target] = field(default_factory=dict)
    target_plugin: dict[str, str] = field(default_factory=dict)
    converters: list[Converter] = field(default_factory=list)
    problems: list[PluginProblem] = field(default_factory=list)
    import_seconds: dict[str, float] = field(default_factory=dict)

    def target(self, name: str) -> Target:
        try:
            return self.targets[name]
        except KeyError:
            hint = ""
            broken = [p.plugin for p in self.problems]
            if broken:
                hint = f" (plugins that failed to load: {', '.join(broken)}; see `hwb targets`)"
            raise UnknownTargetError(
                f"unknown target {name!r}; registered targets: {', '.join(sorted(self.targets)) or 'none'}{hint}"
            ) from None

    def family(self, name: str) -> str:
        """The family (``Target.family``: cpu, gpu, tpu, fpga, ref) of registered target
        ``name``, or "" when no plugin here provides it (a results file from another
        installation). What the core tests instead of the target's name."""
        t = self.targets.get(name)
        return t.family if t is not None else ""

    def call_each(self, hook_name: str,
                  **kwargs: Any) -> tuple[list[tuple[str, Any]], list[PluginProblem]]:
        """Call hook ``hook_name`` on each registered plugin *separately*, in plugin-name
        order: ``([(plugin, result)], [problem])`` — the answers of those that answered, and
        one problem for each that raised. A plugin that raises is also recorded in
        :attr:`problems` (once, however often the hook is called, so ``hwb targets`` lists
        it) and left out: it never takes the others down, which pluggy's own
        ``pm.hook.X()`` would (its first exception ends the whole call)."""
        hook = getattr(self.pm.hook, hook_name)
        out: list[tuple[str, Any]] = []
        failed: list[PluginProblem] = []
        for impl in sorted(hook.get_hookimpls(), key=lambda i: i.plugin_name):
            try:
                # an implementation may take fewer arguments than the spec (pluggy's rule)
                out.append((impl.plugin_name, impl.function(**{a: kwargs[a] for a in impl.argnames})))
            except (Exception, SystemExit) as exc:  # a plugin's bug is reported, not propagated
                problem = PluginProblem(impl.plugin_name, hook_name, _short(exc))
                failed.append(problem)
                if problem not in self.problems:
                    self.problems.append(problem)
        return out, failed

    def call_first(self, hook_name: str, **kwargs: Any) -> tuple[str, Any] | None:
        """A ``firstresult`` hook (``hwb_choose``), called as pluggy would — implementations
        in pluggy's call order, the first answer that is not ``None`` wins — but with each
        implementation isolated as in :meth:`call_each`: one that raises is recorded in
        :attr:`problems` and skipped, and the next one is asked. ``(plugin, answer)``, or
        ``None`` when no plugin answered."""
        hook = getattr(self.pm.hook, hook_name)
        for impl in reversed(hook.get_hookimpls()):  # pluggy calls the last registered first
            try:
                answer = impl.function(**{a: kwargs[a] for a in impl.argnames})
            except (Exception, SystemExit) as exc:  # a plugin's bug is reported, not propagated
                problem = PluginProblem(impl.plugin_name, hook_name, _short(exc))
                if problem not in self.problems:
                    self.problems.append(problem)
                log.warning("plugin %s raised in %s (skipped): %s", impl.plugin_name, hook_name,
                            problem.error)
                continue
            if answer is not None:
                return impl.plugin_name, answer
        return None

    def register(self, plugin: Any, name: str) -> None:
        """Register one plugin object (module or instance) and collect its targets/converters."""
        self.pm.register(plugin, name=name)
        self._collect(name, plugin)

    def _call(self, hook_name: str, plugin_name: str, plugin: Any) -> list[Any]:
        impl = getattr(plugin, hook_name, None)
        if impl is None:
            return []
        try:
            return list(impl() or [])
        except (Exception, SystemExit) as exc:  # a plugin's bug is reported, not propagated
            self.problems.append(PluginProblem(plugin_name, hook_name, _short(exc)))
            return []

    def _collect(self, plugin_name: str, plugin: Any) -> None:
        for t in self._call("hwb_targets", plugin_name, plugin):
            if not isinstance(t, Target) or not t.name:
                self.problems.append(PluginProblem(plugin_name, "contract",
                                                   f"hwb_targets returned {t!r}, not a named Target"))
                continue
            if t.contract_version != CONTRACT_VERSION:
                self.problems.append(PluginProblem(
                    plugin_name, "contract",
                    f"target {t.name} was written for contract version {t.contract_version}, "
                    f"this hwbackends implements version {CONTRACT_VERSION}; update the plugin"))
                continue
            if t.name in self.targets:
                self.problems.append(PluginProblem(
                    plugin_name, "contract",
                    f"target {t.name!r} is already provided by plugin "
                    f"{self.target_plugin[t.name]!r}; refused the one from {plugin_name!r}"))
                continue
            self.targets[t.name] = t
            self.target_plugin[t.name] = plugin_name
        for c in self._call("hwb_converters", plugin_name, plugin):
            if isinstance(c, Converter):
                self.converters.append(c)
            else:
                self.problems.append(PluginProblem(plugin_name, "contract",
                                                   f"hwb_converters returned {c!r}, not a Converter"))


def safe_probe(tgt: Target) -> Availability:
    """``tgt.probe()``, or an *unavailable* answer naming what went wrong: a probe that
    raises or returns something else is reported as that target's reason, never raised
    (``hwb targets``, ``hwb bench`` and the router all ask through here)."""
    try:
        av = tgt.probe()
    except Exception as exc:  # the contract says probe never raises; a plugin's bug is a reason
        return Availability.unavailable(f"probe raised {type(exc).__name__}: {exc}")
    if not isinstance(av, Availability):
        return Availability.unavailable(f"probe returned {av!r}, not an Availability (plugin bug)")
    return av


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def select_targets(reg: "Registry", patterns: Sequence[str], where: str = "targets") -> list[str]:
    """Registered target names matching ``patterns`` (exact names or globs), in pattern order
    then name order, each once; ``hwb bench``, the router and the fleet select with it, so
    a pattern means the same everywhere:

    * an exact name that is not registered is a typo → :class:`UnknownTargetError`;
    * a glob may match nothing on this installation (``fpga.*`` without the FPGA plugin), but
      if *nothing* matches at all → :class:`UnknownTargetError`;

    both errors name the targets that are registered."""
    names = sorted(reg.targets)
    listed = ", ".join(names) or "none"
    chosen: list[str] = []
    for pat in patterns:
        hit = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hit and not is_glob(pat):
            raise UnknownTargetError(f"{where}: unknown target {pat!r}; registered: {listed}")
        chosen += [n for n in hit if n not in chosen]
    if not chosen:
        raise UnknownTargetError(f"{where}: {', '.join(map(repr, patterns)) or 'no pattern'} "
                                 f"matches no registered target; registered: {listed}")
    return chosen


def slow_unless_named(reg: "Registry", names: Sequence[str],
                      patterns: Sequence[str]) -> dict[str, str]:
    """Of ``names`` (from :func:`select_targets`), the slow-to-build targets
    (``Target.slow_compile``) that only the catch-all pattern ``*`` matched, each with the
    reason to give: a default or "every target" set does not spend minutes building them;
    a pattern that names them (``fpga.*``, ``fpga.da4ml``) does."""
    out: dict[str, str] = {}
    for n in names:
        why = getattr(reg.targets[n], "slow_compile", "")
        if why and not any(p != "*" and fnmatch.fnmatchcase(n, p) for p in patterns):
            out[n] = (f"not built by default ({why}); name it to include it, e.g. "
                      f"--targets {n} or targets = [\"{reg.targets[n].family}.*\"]")
    return out


def precisions_to_build(tgt: Target, requested: Sequence[str] | None) -> list[str]:
    """The precisions to build on ``tgt``: all it lists when none are requested, else
    exactly the requested ones it :meth:`accepts <hwbackends.target.Target.accepts>` (listed
    or not: an FPGA target takes any ``ap_fixed<W,I>``). ``hwb bench -p``, the router's
    ``precisions = [...]`` and ``hwb fleet`` choose through here."""
    if not requested:
        return list(tgt.precisions)
    return [p for p in dict.fromkeys(requested) if tgt.accepts(p)]


def unaccepted_precisions(targets: Sequence[Target], requested: Sequence[str]) -> str | None:
    """Why some of ``requested`` can be built by none of ``targets`` (naming what they offer,
    their rules included), or ``None`` when each is accepted by at least one."""
    bad = [p for p in dict.fromkeys(requested) if not any(t.accepts(p) for t in targets)]
    if not bad:
        return None
    offered = sorted({p for t in targets for p in t.precisions})
    rules = "".join(f"; {t.name} also takes {t.precision_rule}" for t in targets if t.precision_rule)
    return (f"precision {', '.join(map(repr, bad))} is offered by none of "
            f"{', '.join(t.name for t in targets)}; they offer {', '.join(offered)}{rules}")


def _short(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def build_registry(entry_points: bool = True) -> Registry:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    reg = Registry(pm)
    if entry_points:
        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        seen: set[str] = set()
        for ep in sorted(eps, key=lambda e: e.name):
            if ep.name in seen:  # the same distribution seen twice on sys.path
                continue
            seen.add(ep.name)
            t0 = time.perf_counter()
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as exc:  # some libraries sys.exit() on import
                reg.problems.append(PluginProblem(ep.name, "import", _short(exc)))
                continue
            finally:
                reg.import_seconds[ep.name] = time.perf_counter() - t0
            _register_checked(reg, plugin, ep.name)
        for spec in filter(None, (s.strip() for s in os.environ.get(PLUGINS_ENV, "").split(","))):
            t0 = time.perf_counter()
            try:
                plugin = _import_spec(spec)
            except (Exception, SystemExit) as exc:
                reg.problems.append(PluginProblem(spec, "import", f"{_short(exc)} (named in "
                                                  f"{PLUGINS_ENV}: is it on sys.path?)"))
                continue
            finally:
                reg.import_seconds[spec] = time.perf_counter() - t0
            if reg.pm.is_registered(plugin):  # also an entry point: once is enough
                continue
            _register_checked(reg, plugin, spec)
    return reg


def _import_spec(spec: str) -> Any:
    """``pkg.mod`` → the module; ``pkg.mod:attr`` → that attribute of it."""
    mod, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


def _register_checked(reg: Registry, plugin: Any, name: str) -> None:
    try:
        reg.register(plugin, name)
    except (Exception, SystemExit) as exc:  # pluggy validation (bad hookimpl signature...)
        reg.problems.append(PluginProblem(name, "register", _short(exc)))


_REGISTRY: Registry | None = None


def get_registry(refresh: bool = False) -> Registry:
    """The process-wide registry, built on first use."""
    global _REGISTRY
    if _REGISTRY is None or refresh:
        _REGISTRY = build_registry()
    return _REGISTRY


def register_plugin(plugin: Any, name: str | None = None) -> None:
    """Register a plugin object at run time (tests, notebooks) without an entry point."""
    reg = get_registry()
    name = name or getattr(plugin, "__name__", type(plugin).__name__)
    if reg.pm.is_registered(plugin):
        raise PluginError(f"plugin {name!r} is already registered")
    reg.register(plugin, name)
