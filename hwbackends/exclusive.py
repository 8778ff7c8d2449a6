"""One lock per executor: an executor never runs on two threads at once.

Executors are not thread-safe (a LiteRT interpreter has one input tensor; two threads in
``Invoke`` give each other's answers, or the answer for zeros). Everything in the serving
layer that runs a backend — the engine's serving thread, an inline call, a swap's warm-up and
shadow replay, a second engine serving the same compiled model — takes the backend's lock
from here, so sharing one object between them is safe. Uncontended it costs about 0.1 µs a
batch; the router's lanes are single-caller by contract and do not take it on their direct
path, but their deadline workers do, from the hand-off until the call ends: an abandoned call
goes on running while its lane, or another lane over the same compiled model, moves on. A
direct lane built while such a call is in flight waits for it, or calls that executor under
its lock (``router.runtime._unless_abandoned``).

A wrapper around another backend (a test double, a router strategy) names what it runs in
``exclusive_key`` so it shares the lock of the thing it wraps; a
:class:`~hwbackends.compiled.CompiledModel` is keyed by its executor.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

_LOCKS: "weakref.WeakKeyDictionary[Any, threading.Lock]" = weakref.WeakKeyDictionary()
_STRONG: dict[int, tuple[Any, threading.Lock]] = {}  # objects that cannot be weakly referenced
_GUARD = threading.Lock()


def key_of(backend: Any) -> Any:
    """What ``backend`` actually runs: its ``exclusive_key``, else its ``executor``, else
    itself — followed through wrappers."""
    for _ in range(8):  # a wrapper of a wrapper of a compiled model → its executor
        key = getattr(backend, "exclusive_key", None)
        if key is None:
            key = getattr(backend, "executor", None)
        if key is None or key is backend:
            return backend
        backend = key
    return backend


def lock_for(backend: Any) -> threading.Lock:
    """The process-wide lock of what ``backend`` runs (:func:`key_of`)."""
    backend = key_of(backend)
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
