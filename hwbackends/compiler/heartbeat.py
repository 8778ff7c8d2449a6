"""The build heartbeat: a thread that says a long build is still running."""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from ..context import Progress

#: A build still running after this many seconds says so, and again every HEARTBEAT_EVERY.
HEARTBEAT_FIRST, HEARTBEAT_EVERY = 5.0, 15.0


@contextlib.contextmanager
def heartbeat(progress: Progress, what: str, first: float | None = None,
              every: float | None = None) -> Iterator[None]:
    """While the body runs (a build in the worker: conversion, C++ compile, synthesis),
    ``progress(f"{what}: 20 s elapsed")`` after ``first`` seconds and every ``every`` after."""
    first = HEARTBEAT_FIRST if first is None else first
    every = HEARTBEAT_EVERY if every is None else every
    done = threading.Event()
    t0 = time.monotonic()

    def beat() -> None:
        wait = first
        while not done.wait(wait):
            progress(f"{what}: {elapsed(time.monotonic() - t0)} elapsed")
            wait = every

    th = threading.Thread(target=beat, name="hwb-build-heartbeat", daemon=True)
    th.start()
    try:
        yield
    finally:
        done.set()
        th.join(1.0)


def elapsed(s: float) -> str:
    return f"{s:.0f} s" if s < 60 else f"{int(s // 60)} min {int(s % 60):02d} s"
