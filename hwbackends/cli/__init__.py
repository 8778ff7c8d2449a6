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
from typing import Any, Callable, Sequence

from .. import strict_json
from ..errors import ConfigError, HwbError
from ..version import __version__

#: The ``--cache-dir`` help every command that compiles shares.
CACHE_DIR_HELP = "artifact store root (default: $HWB_CACHE_DIR, else ~/.cache/hwbackends)"
#: Core subcommand modules, in the order ``hwb --help`` lists them (plugins' commands follow).
COMMANDS = ("targets", "compile", "predict", "bench", "route", "report", "demo", "plugin", "serve",
            "fleet", "node", "export", "store", "compare")

#: What ``hwb`` exits with (``hwb --help`` lists them; the README's table): a script or CI job can
#: tell a failed check from a broken run from a typo.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_GATE, EXIT_REGRESSION, EXIT_BROKEN = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success"),
    (EXIT_ERROR, "an error hwb reports (bad model or file, unavailable target, failed build; "
                 "bench: nothing measured; route: a strategy with no variant)"),
    (EXIT_USAGE, "usage error: a bad or missing argument (the message names the expected form)"),
    (EXIT_GATE, "hwb compile: the variant was built but failed its precision's fidelity gate"),
    (EXIT_REGRESSION, "hwb compare: a variant moved past a --max-* threshold"),
    (EXIT_BROKEN, "hwb compare: a figure a --max-* threshold checks is missing, NaN, infinite "
                  "or out of range in either file"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C); bench keeps its partial results"),
)


class UsageError(ConfigError):
    """A bad argument found once the registry is known (a precision the target does not
    offer): ``main`` reports it as argparse reports a usage error, exit 2, one line."""


def check_precision_arg(target: str, precision: str | None) -> None:
    """``-p`` for ``-t``: a :class:`UsageError` when the registered target does not accept
    it (``-p int4``), naming what it offers; an unknown target is left to the command (its
    own error names the registered ones)."""
    from ..registry import get_registry

    tgt = get_registry().targets.get(target)
    if tgt is None or precision is None or tgt.accepts(precision):
        return
    rule = f" and {tgt.precision_rule}" if tgt.precision_rule else ""
    raise UsageError(f"argument --precision/-p: {precision[:40]!r} is not a precision of "
                     f"{target}; expected one of {', '.join(tgt.precisions)}{rule}")


def exit_codes_epilog() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:<4} {what}" for code, what in EXIT_CODES)


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


class EpilogFormatter(argparse.RawDescriptionHelpFormatter, DefaultsFormatter):
    """The top-level help: the exit-code table in the epilog keeps its lines."""


class Parser(argparse.ArgumentParser):
    """Every ``hwb`` subcommand's parser: help through :class:`DefaultsFormatter`; no
    abbreviated options (``--fleet`` never silently means ``--fleet-results``)."""

    def __init__(self, *a: Any, **k: Any) -> None:
        k.setdefault("formatter_class", DefaultsFormatter)
        k.setdefault("allow_abbrev", False)
        super().__init__(*a, **k)


VERBOSE_HELP = "more detail (and debug logs, toolchain log lines included)"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hwb", description="Compile one signal model for every hardware target, measure "
                                "it, and serve it behind one predict interface.",
        epilog=exit_codes_epilog(), formatter_class=EpilogFormatter)
    p.add_argument("--version", action="version", version=f"hwb (hwbackends) {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add(sub)
    add_plugin_commands(sub)
    add_verbose_everywhere(sub)
    return p


def add_verbose_everywhere(sub: argparse._SubParsersAction) -> None:
    """``-v`` after the command too (``hwb targets -v`` as ``hwb -v targets``), on every
    subcommand and sub-subcommand. Its default is SUPPRESS, so a subcommand that is not given
    ``-v`` leaves the top-level value as it is."""
    seen: set[int] = set()
    todo = list(sub.choices.values())
    while todo:
        parser = todo.pop()
        if id(parser) in seen:
            continue
        seen.add(id(parser))
        if not {"-v", "--verbose"} & set(parser._option_string_actions):
            parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                help=VERBOSE_HELP)
        for act in parser._actions:
            if isinstance(act, argparse._SubParsersAction):
                todo += act.choices.values()


def split_list(items: Sequence[str] | None) -> list[str]:
    """Repeatable comma-separated options (``-t a,b -t c``) as one list. A comma inside
    ``<...>`` belongs to its item, so ``-p 'ap_fixed<16,6>,fp32'`` is two precisions."""
    out: list[str] = []
    for item in items or []:
        depth, start = 0, 0
        for i, ch in enumerate(item + ","):
            depth += (ch == "<") - (ch == ">")
            if ch == "," and depth <= 0:
                part = item[start:i].strip()
                if part:
                    out.append(part)
                start, depth = i + 1, 0
    return out


#: The most threads or instances an option asks for (far past any machine's cores).
MAX_THREADS = 1024


def positive_int(text: str) -> int:
    """A count of timed calls such as ``--n``: a whole number 1.. the scenarios' ``MAX_CALLS``
    (:mod:`hwbackends.bench.scenarios`: each call keeps an 8-byte timing)."""
    from ..bench.scenarios import MAX_CALLS
    from ..units import parse_count

    return parse_count(text, 1, MAX_CALLS, "a count", 2000, "each call keeps an 8-byte timing")


def number(parse: Callable[..., Any], name: str, **bounds: Any) -> Callable[[str], Any]:
    """The argparse ``type=`` of a numeric option: one of the number parsers of
    :mod:`hwbackends.units` (``parse_count``, ``parse_port``, ``parse_seconds``, ``parse_us``,
    ``parse_rate``, ``parse_fraction``, ``parse_real``, ``parse_size``) with its bounds, through
    :func:`usage_type` (a bad value is a usage error, exit 2, naming the form). The type keeps
    ``number_kind`` (the parser's name), so every numeric option can be found and tested."""
    conv = usage_type(lambda text: parse(text, **bounds), name)
    conv.number_kind = parse.__name__  # type: ignore[attr-defined]
    return conv


def count(name: str, lo: int, hi: int, **kw: Any) -> Callable[[str], Any]:
    """:func:`number` of :func:`hwbackends.units.parse_count` (``lo..hi``)."""
    from ..units import parse_count

    return number(parse_count, name, lo=lo, hi=hi, what=f"a {name}", **kw)


def usage_type(check: Callable[[str], Any], name: str = "") -> Callable[[str], Any]:
    """An argparse ``type=`` from a parser that raises :class:`~hwbackends.errors.HwbError`
    (or ValueError) for a bad value: argparse then reports it as a usage error (exit 2,
    ``argument --pin: …``) with the check's own message, which names the expected form."""

    def convert(text: str) -> Any:
        try:
            return check(text)
        except (HwbError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name or getattr(check, "__name__", "value")
    if check is positive_int:
        convert.number_kind = "parse_count"  # type: ignore[attr-defined]
    return convert


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
        print(strict_json.dumps(data, indent=2))
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
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"hwb {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HwbError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}, indent=2))
        print(f"hwb {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"hwb {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
