"""``hwb``: the command line. One module per core subcommand; each exposes ``add(subparsers)``
which registers its parser and sets ``func(args) -> int``. Plugins add their own commands
through the ``hwb_cli_commands`` hook (``hwb fpga-trace`` is the fpga.hls4ml plugin's): the
core names no plugin here."""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from typing import Any, Sequence

from ..errors import HwbError

#: The ``--cache-dir`` help every command that compiles shares.
CACHE_DIR_HELP = "artifact store root (default: $HWB_CACHE_DIR, else ~/.cache/hwbackends)"
#: Core subcommand modules, in the order ``hwb --help`` lists them (plugins' commands follow).
COMMANDS = ("targets", "compile", "predict", "bench", "route", "report", "demo", "plugin", "serve",
            "fleet", "node", "export", "store")


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that always states the default: an option whose help does not mention it gets
    ``(default: VALUE)`` appended when it has a value to show (flags default to off; an
    option whose default is "none" says what that means in its own help)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        h = action.help or ""
        if ("default" in h.lower() or action.default in (None, False, argparse.SUPPRESS, [])
                or not action.option_strings):
            return h
        return h + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """Every ``hwb`` subcommand's parser: help through :class:`DefaultsFormatter`."""

    def __init__(self, *a: Any, **k: Any) -> None:
        k.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*a, **k)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hwb", description="Compile one signal model for every hardware target, measure "
                                "it, and serve it behind one predict interface.")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="more detail (and debug logs, toolchain log lines included)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add(sub)
    add_plugin_commands(sub)
    return p


def add_plugin_commands(sub: argparse._SubParsersAction) -> None:
    """The plugins' own subcommands (hook ``hwb_cli_commands``). A plugin whose hook raises
    (or takes a name already used) is said on stderr and skipped; ``hwb targets`` lists it
    with the other plugin problems, and every other command works."""
    from ..registry import get_registry

    _, failed = get_registry().call_each("hwb_cli_commands", subparsers=sub)
    for prob in failed:
        print(f"hwb: plugin {prob.plugin!r} could not add its commands ({prob.error}); "
              f"they are left out (see `hwb targets`)", file=sys.stderr)


def emit(args: argparse.Namespace, data: Any, human: str) -> None:
    """Print ``data`` as JSON with ``--json``, else the human text."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=str))
    else:
        print(human)


def stderr_progress(msg: str) -> None:
    print(f"  · {msg}", file=sys.stderr, flush=True)


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``hwb … -- rest``: the arguments before the first ``--``, and ``rest`` (handed on
    unparsed, e.g. to pytest by ``hwb plugin check``)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv_list = list(argv) if argv is not None else sys.argv[1:]
    own, rest = split_passthrough(argv_list)
    args = parser.parse_args(own)
    if rest and not getattr(args, "passthrough", False):
        parser.error(f"arguments after -- ({' '.join(rest)}) are only taken by hwb plugin check")
    args.rest = rest
    args.argv = argv_list  # hwb fleet re-executes itself
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # TF/absl start-up lines are noise here (-v keeps them)
        from ..quiet import install
        install()
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except HwbError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}, indent=2))
        print(f"hwb {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"hwb {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
