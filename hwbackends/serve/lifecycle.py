"""Model versions, background swap with shadow validation, and rollback.

``Engine.swap(new)`` runs :func:`run_swap` in a background thread:

1. **build** the new version (a factory such as ``lambda: hwb.compile(...)`` runs here; the
   compile itself already runs in the isolated worker *process*, whose priority is lowered with
   ``os.setpriority`` for the duration, and this thread lowers its own nice value — Linux
   nice values are per thread — so the serving thread keeps its CPU share);
2. **warm** every batch slot of the new version;
3. **shadow**: the serving thread copies the next ``shadow_samples`` live inputs and the
   serving version's outputs into a ring (a copy, no extra model call on the hot path); this
   thread runs the new version on exactly those inputs and compares with
   :func:`~hwbackends.fidelity.compare` against the tolerance;
4. **switch** atomically (one reference assignment the serving thread reads once per batch)
   only if it passes; the old version stays for :meth:`Engine.rollback`.

A request is never lost: batches in flight finish on the version they started with.

Every backend call of a swap (warm-up, shadow replay) holds that backend's
:func:`~hwbackends.exclusive.lock_for` lock, so swapping in an object that is already serving
(the same compiled model, or one shared with another engine) never runs it on two threads.
A swap has a time limit (``EngineConfig.swap_timeout_s``): a factory or a backend that hangs
ends the swap as rejected and frees the engine for the next swap; the abandoned thread can
never install its version afterwards (:class:`SwapTicket`).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import HwbError
from ..fidelity import Fidelity, Tolerance, compare
from ..packing import layouts
from .batch_plan import BatchPlan, BatchPolicy
from .servable import normalise, servable_label
from .versions import ShadowCollector, Version, Versions

log = logging.getLogger("hwbackends.serve")


class SwapError(HwbError):
    """A swap or rollback cannot run (another is in progress, nothing to roll back to)."""


@dataclass
class SwapResult:
    accepted: bool
    version: int | None          # the new version's number (None when it never built)
    serving: int                 # the version serving after the swap
    reason: str
    fidelity: Fidelity | None = None
    violations: list[str] = field(default_factory=list)
    shadow_samples: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "version": self.version, "serving": self.serving,
                "reason": self.reason, "violations": self.violations,
                "fidelity": self.fidelity.to_dict() if self.fidelity else None,
                "shadow_samples": self.shadow_samples, "seconds": self.seconds}


def lower_thread_priority(nice: int = 10) -> None:
    """Raise this thread's nice value (Linux applies ``setpriority(PRIO_PROCESS, tid)`` to one
    thread). The swap thread keeps it until it ends: build, warm-up and shadow replay all run
    behind the serving thread."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except (OSError, AttributeError) as exc:  # not Linux, or not permitted: carry on
        log.info("could not lower the swap thread's priority: %s", exc)


def lower_worker_priority(nice: int = 10) -> Callable[[], None]:
    """Lower the isolated compile worker process' priority for a build; returns the undo
    (raising it back needs privileges: without them it stays lowered, which only slows later
    compiles)."""
    try:
        from .. import isolate

        w = isolate.worker()
        w.run(os.setpriority, os.PRIO_PROCESS, 0, nice, timeout=30,
              what="lowering the compile worker's priority")
    except Exception as exc:
        log.info("could not lower the compile worker's priority: %s", exc)
        return lambda: None

    def restore() -> None:
        try:
            w.run(os.setpriority, os.PRIO_PROCESS, 0, 0, timeout=30,
                  what="restoring the compile worker's priority")
        except Exception as exc:
            log.info("compile worker priority not restored (%s); it stays lowered", exc)
    return restore


class SwapTicket:
    """One swap's right to install: the engine cancels it when the swap times out, and a
    cancelled ticket never installs (checked and set under one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cancelled = False
        self.phase = "build"

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True

    def install(self, versions: Versions, version: Version) -> bool:
        with self._lock:
            if self.cancelled:
                return False
            versions.install(version)
            return True


def run_swap(versions: Versions, new: Any, *, tolerance: Tolerance | None, shadow_samples: int,
             shadow_timeout_s: float, warmup: int, policy: BatchPolicy, nice: int = 10,
             on_reject: Callable[[], None] = lambda: None,
             ticket: SwapTicket | None = None) -> SwapResult:
    """The background half of :meth:`Engine.swap` (see the module docstring)."""
    ticket = ticket or SwapTicket()
    t: dict[str, float] = {}
    active = versions.active
    factory = callable(new) and not hasattr(new, "predict_into")
    # Only a factory builds anything (a compile in the worker process); a ready backend needs
    # no priority games.
    if nice:
        lower_thread_priority(nice)
    restore = lower_worker_priority(nice) if (nice and factory) else (lambda: None)
    t0 = time.perf_counter()
    try:
        backends = new() if factory else new
        plan = BatchPlan(normalise(backends), policy)
    except Exception as exc:
        return SwapResult(False, None, active.number, f"the new version failed to build: "
                          f"{type(exc).__name__}: {exc}")
    finally:
        restore()
    t["build_s"] = time.perf_counter() - t0
    if plan.input.shape != active.plan.input.shape or plan.output.shape != active.plan.output.shape:
        return SwapResult(False, None, active.number,
                          f"the new version takes {plan.input.shape} → {plan.output.shape}; the "
                          f"serving one {active.plan.input.shape} → {active.plan.output.shape}")
    new_io, old_io = _tensors(plan), _tensors(active.plan)
    if new_io != old_io:  # same record size, different tensors: callers would mis-read it
        return SwapResult(False, None, active.number,
                          f"the new version's tensors {new_io} differ from the serving one's "
                          f"{old_io}")
    number = versions.next_number()
    version = Version(number, plan, servable_label(plan.slots[0].backend))
    ticket.phase = "warm-up"
    t0 = time.perf_counter()
    try:
        plan.warmup(warmup)
    except Exception as exc:  # a backend that fails on zeros will not serve either
        on_reject()
        return SwapResult(False, number, active.number, f"the new version failed its warm-up: "
                          f"{type(exc).__name__}: {exc}")
    t["warmup_s"] = time.perf_counter() - t0

    fid: Fidelity | None = None
    violations: list[str] = []
    got = 0
    if tolerance is not None and shadow_samples > 0:
        ticket.phase = "shadow"
        t0 = time.perf_counter()
        sh = ShadowCollector(active.number, shadow_samples, plan.input.shape, plan.output.shape)
        versions.shadow = sh
        sh.full.wait(shadow_timeout_s)
        versions.shadow = None
        got = sh.k
        if got < min(shadow_samples, 16):
            on_reject()
            return SwapResult(False, number, versions.active.number,
                              f"shadow saw {got} live request(s) in {shadow_timeout_s:g} s (need "
                              f"{min(shadow_samples, 16)}); swap when traffic flows, or pass "
                              f"tolerance=None to switch without shadow validation", shadow_samples=got)
        ny = np.empty_like(sh.y[:got])

        def take(start: int, _x: np.ndarray, y: np.ndarray) -> None:
            ny[start:start + len(y)] = y
        try:
            plan.run([sh.x[i] for i in range(got)], take)
        except Exception as exc:
            on_reject()
            return SwapResult(False, number, versions.active.number, f"the new version failed on "
                              f"the shadow inputs: {type(exc).__name__}: {exc}", shadow_samples=got)
        fid = compare(sh.y[:got], ny)
        violations = tolerance.violations(fid)
        t["shadow_s"] = time.perf_counter() - t0
        if violations:
            on_reject()
            return SwapResult(False, number, versions.active.number,
                              f"shadow comparison against version {active.number} failed: "
                              f"{'; '.join(violations)}", fid, violations, got, t)
    # The switch: one reference assignment; in-flight batches finish on the old version.
    if not ticket.install(versions, version):
        return SwapResult(False, number, versions.active.number, "the swap timed out before it "
                          "could switch; the serving version is unchanged", fid, [], got, t)
    return SwapResult(True, number, number, "accepted" + ("" if fid else " without shadow validation"),
                      fid, [], got, t)


def _tensors(plan: BatchPlan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """The packed layout of a multi-IO version (hwbackends.packing), else ``None``."""
    lay = layouts(plan.slots[0].backend)
    return (lay[0].to_dict(), lay[1].to_dict()) if lay is not None else None
