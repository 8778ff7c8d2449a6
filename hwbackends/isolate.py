"""Run toolchain work (conversions, compiles, g++ builds) in a child process.

Converters can end the process that calls them (TF 2.21's full-int8 converter segfaults on
a Keras LSTM that is not unrolled). The work therefore runs in a spawned worker process that
stays alive between jobs, so the framework imports are paid once, and is replaced after a
crash or a timeout. The worker leads its own process group: a timeout kills it *and* every
compiler it started (no orphan g++).
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any, Callable

from .errors import CompileError, HwbError

_SIGNALS = {getattr(signal, n): n for n in dir(signal) if n.startswith("SIG") and not n.startswith("SIG_")}


def _worker_main(fd: int, log_path: str) -> None:
    """The worker's loop: receive (fn, args, kwargs), run, send the outcome back."""
    from multiprocessing.connection import Connection

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    conn = Connection(fd)
    # C++ toolchains write to fd 1/2 directly: send both to the log the parent reads on failure.
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        fn, args, kwargs = job
        try:
            result = fn(*args, **kwargs)
            conn.send(("ok", result))
        except BaseException as exc:  # report everything, including SystemExit from a toolchain
            tb = traceback.format_exc()
            if isinstance(exc, HwbError):
                try:
                    conn.send(("hwb", exc, tb))
                    continue
                except Exception:
                    pass
            conn.send(("err", f"{type(exc).__name__}: {exc}", tb))


class Worker:
    """One long-lived child process that runs jobs one at a time."""

    def __init__(self) -> None:
        self._proc: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()
        self.log_path = Path(tempfile.gettempdir()) / f"hwb-worker-{os.getpid()}.log"

    def _start(self) -> None:
        # A fresh interpreter (not multiprocessing's spawn, which re-imports the caller's
        # __main__ and breaks scripts without a main guard), in its own session/process group.
        from multiprocessing.connection import Connection

        parent, child = socket.socketpair()
        self.log_path.write_text("")
        code = "import sys; from hwbackends.isolate import _worker_main; _worker_main(int(sys.argv[1]), sys.argv[2])"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code, str(child.fileno()), str(self.log_path)],
            pass_fds=(child.fileno(),), start_new_session=True, stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
        child.close()
        self._conn = Connection(parent.detach())
        atexit.register(self.kill)

    def _log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._proc.kill()
            self._proc.wait(5)
        self._proc = None
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float, what: str,
            target: str = "", precision: str = "", **kwargs: Any) -> Any:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._conn.send((fn, args, kwargs))
            except Exception as exc:
                raise CompileError(f"{what}: could not send the job to the compile process "
                                   f"({type(exc).__name__}: {exc}); is the model picklable?",
                                   target=target, precision=precision) from exc
            if not self._conn.poll(timeout):
                self.kill()
                raise CompileError(
                    f"{what} timed out after {timeout:.0f} s and was stopped (with every compiler "
                    f"it started). Raise the timeout (timeout=…) or use a smaller model/options.",
                    target=target, precision=precision, log=self._log_tail())
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                try:
                    code = self._proc.wait(5)
                except subprocess.TimeoutExpired:
                    code = None
                sig = _SIGNALS.get(-code, "") if code is not None and code < 0 else ""
                how = f"signal {sig} ({code})" if sig else f"exit code {code}"
                log = self._get_log(log_start)
                self.kill()
                raise CompileError(
                    f"{what} crashed the compile process ({how}). Your process is unaffected. "
                    f"This is a bug or limit of the toolchain; try another precision or option. "
                    f"Last output:\n{log[-2000:]}", target=target, precision=precision, log=log) from None
            status = msg[0]
            if status == "ok":
                return msg[1]
            if status == "hwb":
                raise msg[1]
            raise CompileError(f"{what} failed: {msg[1]}\n{msg[2][-3000:]}",
                               target=target, precision=precision, log=self._get_log(log_start))

    def _get_log(self, start: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""


_WORKER: Worker | None = None


def worker() -> Worker:
    global _WORKER
    if _WORKER is None:
        _WORKER = Worker()
    return _WORKER
