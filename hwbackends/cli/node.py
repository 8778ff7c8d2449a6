"""``hwb node``: start (or print) the ``ray start`` command that joins this machine to a fleet,
advertising the targets it can run as Ray custom resources (``hwb.cpu.litert: 1``, …)."""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys

from ..units import parse_port
from . import count, emit, number
from .bench import csv_list


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("node", help="join this machine to a Ray fleet, advertising its targets")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--head", action="store_true", help="start the cluster's head node here")
    where.add_argument("--address", metavar="HOST:PORT", help="join the cluster at this head address")
    p.add_argument("--targets", "-t", action="append", default=None, metavar="GLOB[,GLOB]",
                   help="advertise only these targets (default: every target available here)")
    p.add_argument("--hardware-only", action="store_true",
                   help="do not advertise targets that would run emulated here")
    p.add_argument("--port", type=number(parse_port, "port", allow_any=False), default=None, help="head: GCS port (ray default 6379)")
    p.add_argument("--node-ip-address", default=None,
                   help="the address other nodes reach this one at (default: Ray's choice)")
    p.add_argument("--num-cpus", type=count("CPU count", 0, 1 << 16), default=None,
                   help="CPUs this node offers Ray (default: all of them)")
    p.add_argument("--dry-run", action="store_true", help="print the ray start command, run nothing")
    p.add_argument("--json", action="store_true", help="print the resources and command as JSON")
    p.set_defaults(func=run)


def command(args: argparse.Namespace, resources: dict[str, float]) -> list[str]:
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--resources", json.dumps(resources)]
    cmd += ["--head", "--include-dashboard=false"] if args.head else [f"--address={args.address}"]
    if args.port is not None:
        cmd.append(f"--port={args.port}")
    if args.node_ip_address:
        cmd.append(f"--node-ip-address={args.node_ip_address}")
    if args.num_cpus is not None:
        cmd.append(f"--num-cpus={args.num_cpus}")
    return cmd


def run(args: argparse.Namespace) -> int:
    from ..errors import UnavailableError
    from ..fleet.resources import local_targets, resources_for
    from ..registry import get_registry

    targets = local_targets(get_registry(), csv_list(args.targets) or ["*"],
                            include_emulated=not args.hardware_only)
    if not targets:
        raise UnavailableError("no target matching the patterns can run on this machine "
                               "(see `hwb targets`); nothing to advertise")
    res = resources_for(targets)
    cmd = command(args, res)
    text = shlex.join(cmd)
    emit(args, {"targets": targets, "resources": res, "command": cmd},
         "advertising " + ", ".join(f"{t} ({m})" for t, m in targets.items()) + f"\n{text}")
    if args.dry_run:
        return 0
    return subprocess.run(cmd).returncode
