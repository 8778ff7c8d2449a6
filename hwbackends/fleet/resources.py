"""Targets as Ray custom resources: a node holding ``hwb.fpga.hls4ml: 1`` can run fpga.hls4ml.

A resource of 1 per target also means one variant at a time per target per node, so two
fleet runs never measure on the same device at once (the second waits, then times out as
"busy")."""
from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from ..registry import Registry

RESOURCE_PREFIX = "hwb."


def resource_name(target: str) -> str:
    """``cpu.litert`` → ``hwb.cpu.litert``."""
    return RESOURCE_PREFIX + target


def target_of(resource: str) -> str | None:
    """``hwb.cpu.litert`` → ``cpu.litert``; ``None`` for resources that are not targets."""
    return resource[len(RESOURCE_PREFIX):] if resource.startswith(RESOURCE_PREFIX) else None


def advertised(resources: Mapping[str, Any]) -> list[str]:
    """The targets a node's resource map advertises (held with a positive amount)."""
    return sorted(t for r, v in resources.items() if (t := target_of(r)) and float(v) > 0)


def local_targets(reg: "Registry", patterns: Iterable[str] = ("*",),
                  include_emulated: bool = True) -> dict[str, str]:
    """``{target: mode}`` of the targets of the run's registry ``reg`` matching ``patterns``
    that can run on this machine (probed here, as ``hwb targets`` does). What ``hwb node``
    advertises."""
    pats = list(patterns)
    out: dict[str, str] = {}
    for name in sorted(reg.targets):
        if not any(fnmatch.fnmatchcase(name, p) for p in pats):
            continue
        try:
            mode = reg.targets[name].probe().mode.value
        except Exception:  # a raising probe means the target cannot run here
            continue
        if mode == "hardware" or (mode == "emulated" and include_emulated):
            out[name] = mode
    return out


def resources_for(targets: Iterable[str]) -> dict[str, float]:
    return {resource_name(t): 1.0 for t in targets}
