"""Hook specifications: the whole plugin contract, one documented empty function per hook.

A plugin is a module (or object) with functions decorated ``@hwbackends.hookimpl`` named
like the hooks below, registered under the entry-point group ``hwbackends``::

    [project.entry-points.hwbackends]
    my_target = "my_package.plugin"

The built-in targets in ``plugins/`` use exactly this path. A plugin that fails to import or
raises inside a hook is reported by ``hwb targets`` (name and error) and skipped; the others
keep working.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from .target import Converter, Target

PROJECT = "hwbackends"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def hwb_targets() -> "Sequence[Target]":
    """Return the targets this plugin provides.

    Each item is an instance of a :class:`hwbackends.target.Target` subclass with a unique
    ``name`` (``family.runtime``, e.g. ``cpu.litert``). Called once per process when the
    registry is built; must be fast and must not import heavy frameworks (TensorFlow, torch,
    JAX, hls4ml): do that inside ``Target.compile``/``Target.load``. Two plugins providing the
    same name is an error that names both plugins.
    """


@hookspec
def hwb_converters() -> "Sequence[Converter]":
    """Return the format conversions this plugin offers.

    Each item is a :class:`hwbackends.target.Converter` from one source format to another
    (``keras`` → ``onnx``, ``torch`` → ``onnx`` …). When a target's ``formats`` do not include
    the model's format, the core chains converters along the shortest path. Conversions run in
    the isolated compile child process, so a crashing converter cannot take the caller down.
    """


@hookspec(firstresult=True)
def hwb_choose(candidates: "Sequence[Any]", tier: Any) -> Any:
    """Choose the variant that serves one strategy in one latency tier, or return ``None`` to
    leave the choice to the next plugin and finally to the built-in policy.

    ``candidates`` are the router's measured candidates (each with its target, precision,
    mode, latency profile and fidelity, already filtered by the strategy's allowed targets),
    ``tier`` the tier with its p99 budget. Return one of ``candidates``. The first non-``None``
    answer wins (``firstresult``).
    """
