"""One lock per executor: an executor never runs on two threads at once.

Executors are not thread-safe (a LiteRT interpreter has one input tensor; two threads in
``Invoke`` give each other's answers, or the answer for zeros). Everything in the serving
layer that runs a backend — the engine's serving thread, an inline call, a swap's warm-up and
shadow replay, a second engine serving the same compiled model — takes the backend's lock
from here, so sharing one object between them is safe. Uncontended it costs about 0.1 µs a
batch; the router's lanes are single-caller by contract and do not take it.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

_LOCKS: "weakref.WeakKeyDictionary[Any, threading.Lock]" = weakref.WeakKeyDictionary()
_STRONG: dict[int, tuple[Any, threading.Lock]] = {}  # objects that cannot be weakly referenced
_GUARD = threading.Lock()


def lock_for(backend: Any) -> threading.Lock:
    """The process-wide lock of ``backend`` (the same object → the same lock)."""
    with _GUARD:
        try:
            lk = _LOCKS.get(backend)
            if lk is None:
                lk = _LOCKS[backend] = threading.Lock()
            return lk
        except TypeError:  # no __weakref__ slot: keep it alive with its lock
            held = _STRONG.get(id(backend))
            if held is None or held[0] is not backend:
                held = _STRONG[id(backend)] = (backend, threading.Lock())
            return held[1]
