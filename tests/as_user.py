"""Run a test's function as another user, in a fresh interpreter and without a fork of the
test process.

A fork of the test process would copy whatever threads the session started (JAX's, once a
test used it: "os.fork() was called ... JAX is multithreaded ... likely lead to a deadlock"),
and a ``preexec_fn`` forks in Python as well. So :class:`AsUser` starts ``python -c`` as this
user through ``subprocess`` (no ``preexec_fn``: CPython forks and execs in C), and the new
interpreter imports what the function needs, then drops to ``uid``/``gid`` itself and calls
it. The interpreter may live where the other user cannot exec or read it (``/root/.pyenv``),
which is why it changes user after starting, not before: the function's module is imported
first, so what that module imports at its top is what the function may use.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

NOBODY = 65534
HERE = Path(__file__).resolve().parent

CHILD = """
import ctypes, importlib, os, pickle, sys
w = int(sys.argv[1])
uid, gid, dumpable, module, name, args = pickle.loads(bytes.fromhex(sys.argv[2]))
def send(line):
    os.write(w, (str(line) + "\\n").encode())
try:
    fn = getattr(importlib.import_module(module), name)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if dumpable:  # setuid made it non-dumpable; a process nobody started is not
        ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)
    fn(send, *args)
except BaseException as exc:  # report anything to the parent
    send(f"error: {exc!r}")
    sys.stdout.flush()
    os._exit(1)
os._exit(0)
"""


class AsUser:
    """Run ``fn(send, *args)`` as ``uid``/``gid`` in a fresh interpreter (``fn`` a module-level
    function, ``args`` picklable). The child writes lines through ``send``; the parent reads
    them with :meth:`line`. ``pid`` is the process that runs ``fn``."""

    def __init__(self, uid: int, fn: Callable[..., Any], *args: Any, gid: int = NOBODY,
                 dumpable: bool = True):
        r, w = os.pipe()
        module = fn.__module__
        if module == "__main__" or "." in fn.__qualname__:
            raise ValueError(f"AsUser needs a module-level function, got {fn.__qualname__}")
        blob = pickle.dumps((uid, gid, dumpable, module, fn.__name__, args)).hex()
        path = os.pathsep.join([str(HERE), *(p for p in sys.path if p)])
        try:
            self._proc = subprocess.Popen([sys.executable, "-c", CHILD, str(w), blob], pass_fds=(w,),
                                          cwd="/", env=dict(os.environ, PYTHONPATH=path),
                                          stdin=subprocess.DEVNULL)
        finally:
            os.close(w)
        self.pid = self._proc.pid
        self._r = os.fdopen(r)

    def line(self) -> str:
        return self._r.readline().strip()

    def finish(self, timeout: float = 60) -> int:
        t0 = time.time()
        while self._proc.poll() is None:
            if time.time() - t0 > timeout:
                os.kill(self.pid, signal.SIGKILL)
            time.sleep(0.05)
        self._r.close()
        return self._proc.returncode
