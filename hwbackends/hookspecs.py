"""Hook specifications: the whole plugin contract, one documented empty function per hook.

A plugin is a module (or object) with functions decorated ``@hwbackends.hookimpl`` named
like the hooks below, registered under the entry-point group ``hwbackends``::

    [project.entry-points.hwbackends]
    my_target = "my_package.plugin"

The built-in targets in ``hwb_plugins/`` use exactly this path. A plugin that fails to import or
raises inside a hook is reported by ``hwb targets`` (name and error) and skipped; the others
keep working.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    import argparse

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


@hookspec
def hwb_cli_commands(subparsers: "argparse._SubParsersAction") -> None:
    """Add this plugin's own ``hwb`` subcommands (``hwb fpga-trace`` is the ``fpga.hls4ml``
    plugin's), so the core's command line never names a plugin.

    ``subparsers`` is the ``hwb`` parser's subparsers action: call
    ``subparsers.add_parser(NAME, help=...)``, add the arguments, and
    ``set_defaults(func=run)`` where ``run(args) -> int`` is the exit status. ``run`` may raise
    :class:`hwbackends.errors.HwbError` subclasses; ``hwb`` prints them as it does for its own
    commands. Called every time ``hwb`` builds its parser (every invocation): keep it cheap —
    import the command's heavy machinery inside ``run``, not here nor at module level. The
    helpers the core's commands use to load and compile a model (``add_model_args`` and
    ``compile_from_args`` in :mod:`hwbackends.cli.compile`, ``model_from_args`` in
    :mod:`hwbackends.cli.source`, ``emit`` in :mod:`hwbackends.cli`) are public for this.

    A name already taken (a core command, another plugin's) is refused by argparse. A plugin
    whose hook raises is reported (``hwb targets`` lists it, ``hwb`` says so on stderr) and
    skipped: every other command keeps working.
    """


@hookspec
def hwb_report_sections(results: Any) -> "Sequence[str]":
    """Return this plugin's sections of the HTML report (``hwb report``) for ``results``, a
    :class:`hwbackends.bench.results.BenchResults` (annotated ``Any``: the contract module
    imports nothing from ``bench``).

    Each item is one self-contained HTML fragment, normally ``<section><h2>…</h2>…</section>``
    (figures as inline SVG; the report has no external resources). Return an empty sequence
    (or ``""`` items) when ``results`` holds nothing of the plugin's: a section appears only
    for the targets it describes. Select your rows by your own target names
    (``results.variants``, ``results.profiles``) and read only metadata keys your own
    ``Target.compile`` wrote; a plugin must not parse another plugin's keys. Escape every
    string taken from ``results`` (``html.escape``): a results file can come from another
    machine.

    The sections come after the core's fidelity section, plugins in name order. A plugin whose
    hook raises is reported inside the report (a note naming the plugin and the error) and
    skipped; the rest of the report is written.
    """
