"""``hwb plugin new NAME`` (scaffold a target plugin) and ``hwb plugin check NAME`` (run the
conformance kit on a registered target)."""
from __future__ import annotations

import argparse
import sys

from ..errors import ConfigError
from ..registry import get_registry
from ..scaffold import new_plugin


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugin", help="write a new target plugin, or check one against the contract")
    ps = p.add_subparsers(dest="plugin_command", metavar="SUBCOMMAND")

    n = ps.add_parser("new", help="write a ready-to-install target plugin package")
    n.add_argument("name", help="plugin name, a lowercase identifier (the target is FAMILY.NAME)")
    n.add_argument("--family", default="cpu", help="cpu, gpu, tpu, fpga (default cpu)")
    n.add_argument("--dir", default=None, help="where to write it (default ./hwb-NAME)")
    n.add_argument("--force", action="store_true", help="write into a non-empty directory")
    n.set_defaults(func=run_new)

    c = ps.add_parser("check", help="run the conformance kit (pytest) on a registered target",
                      description="Runs `pytest --pyargs hwbackends.testing --hwb-target NAME`; "
                                  "arguments after -- go to pytest.")
    c.add_argument("target", help="registered target name (see hwb targets)")
    c.add_argument("--models", default=None, help="zoo models, comma-separated (default: all claimed)")
    c.add_argument("--precisions", default="all", help="all, default, or a comma-separated list")
    c.add_argument("--store", default=None, help="artifact store (default: a temporary one)")
    c.add_argument("-k", default=None, help="only checks matching this pytest -k expression")
    c.set_defaults(func=run_check, passthrough=True)  # hwb plugin check NAME ... -- PYTEST_ARGS
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_new(args: argparse.Namespace) -> int:
    d = new_plugin(args.name, args.family, args.dir, force=args.force)
    target = args.name if "." in args.name else f"{args.family}.{args.name}"
    print(f"wrote plugin for target {target} in {d}\n"
          f"next:\n  pip install -e {d}\n  hwb targets\n  hwb plugin check {target}\n"
          f"then replace compile()/load()/the executor in {d.name}/hwb_*/target.py with your runtime "
          f"(docs/plugins.md)")
    return 0


def run_check(args: argparse.Namespace) -> int:
    get_registry().target(args.target)  # an unknown name fails here, listing the known ones
    try:
        import pytest
    except ImportError:
        raise ConfigError("hwb plugin check runs pytest: pip install 'hwbackends[test]'") from None
    argv = ["--pyargs", "hwbackends.testing", "--hwb-target", args.target,
            "--hwb-precisions", args.precisions, "-p", "no:cacheprovider", "-rs"]
    if args.models:
        argv += ["--hwb-models", args.models]
    if args.store:
        argv += ["--hwb-store", args.store]
    if args.k:
        argv += ["-k", args.k]
    argv += getattr(args, "rest", [])
    print(f"pytest {' '.join(argv)}", file=sys.stderr)
    return int(pytest.main(argv))
