"""Fleet evaluation on Ray: one command measures a model on every machine's hardware.

    from hwbackends.fleet import run_fleet
    res = run_fleet("zoo:signal", "local", targets=["cpu.*"])   # or address="10.0.0.5:6379"
    res.save("fleet.json")                                     # `hwb report fleet.json`

Nodes advertise the targets they hold as Ray custom resources (``hwb.cpu.litert: 1``, …; see
:mod:`.resources` and ``hwb node``). Each variant is compiled and measured by
:func:`.node.bench_on_node` on the node holding its resource, with the same
:func:`hwbackends.bench.bench_model` code ``hwb bench`` runs; the driver (:mod:`.runner`)
merges the profiles, tagged with the node's machine fingerprint, hostname and Ray node id.

``ray`` is imported only inside this package's functions, never at ``import hwbackends``.
"""
from __future__ import annotations

from .resources import RESOURCE_PREFIX, resource_name, target_of

__all__ = ["RESOURCE_PREFIX", "place", "resource_name", "run_fleet", "target_of"]


def run_fleet(*args, **kwargs):  # type: ignore[no-untyped-def]
    """See :func:`hwbackends.fleet.runner.run_fleet` (imported lazily: it needs ray)."""
    from .runner import run_fleet as _run

    return _run(*args, **kwargs)


def place(*args, **kwargs):  # type: ignore[no-untyped-def]
    """See :func:`hwbackends.fleet.placement.place`."""
    from .placement import place as _place

    return _place(*args, **kwargs)
