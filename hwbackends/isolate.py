"""Run toolchain work (conversions, compiles, g++ builds) in a child process.

Converters can end the process that calls them (TF 2.21's full-int8 converter segfaults on
a Keras LSTM that is not unrolled). The work therefore runs in a spawned worker process that
stays alive between jobs, so the framework imports are paid once, and is replaced after a
crash, a timeout or an interrupt.

What the worker leaves behind is bounded:

- **Replies match requests.** Every job carries an id and every reply echoes it; a reply for
  another job is discarded. Ctrl-C (or any exception) while a job runs kills the worker, so
  the next job gets a fresh worker and its own reply.
- **Every process it starts dies with it.** The worker leads its own process group *and* is a
  child subreaper (``PR_SET_CHILD_SUBREAPER``), so a compiler helper that calls ``setsid`` or
  double-forks stays its descendant; a timeout stops the worker and kills its whole tree.
- **Files are private and temporary.** The log and each job's ``TMPDIR`` live in a per-user
  0700 directory (:func:`private_dir`); the log is created with ``mkstemp`` (never a
  predictable name) and unlinked at once — parent and worker hold it open, so it has no name
  left behind however either process ends (a Ray worker killed at shutdown included) —, and
  truncated when it grows past :data:`LOG_LIMIT`; each job's temp dir (converter scratch, ``cc*.s``) is removed when the job ends,
  however it ends.
- **Memory is bounded.** Each job runs under :func:`hwbackends.cost.worker_memory`
  (``HWB_WORKER_MEMORY``): the worker sets it as its ``RLIMIT_DATA`` (not ``RLIMIT_AS``: CUDA
  and XLA reserve address space they never touch; ``RLIMIT_DATA`` counts only writable private
  memory, so an allocation past it fails in the job as a ``MemoryError``), and the parent
  watches the resident memory of the worker and every process it started while it waits
  (:data:`WATCH_EVERY`), stopping the tree past the limit. Either way the caller gets a
  :class:`CompileError` that names the limit and how to raise it.
"""
from __future__ import annotations

import atexit
import ctypes
import fcntl
import itertools
import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from .errors import CompileError, HwbError
from .store import trust
from .units import fmt_bytes

logger = logging.getLogger("hwbackends.isolate")

_SIGNALS = {getattr(signal, n): n for n in dir(signal) if n.startswith("SIG") and not n.startswith("SIG_")}
#: The log is truncated before a job when it is larger than this.
LOG_LIMIT = 4 << 20
_PR_SET_CHILD_SUBREAPER = 36
#: Seconds between two reads of the worker tree's resident memory while a job runs (its list
#: of descendants, a scan of /proc, is re-read every :data:`TREE_EVERY`).
WATCH_EVERY = 0.2
TREE_EVERY = 1.0
_MEMORY_ADVICE = ("raise it with HWB_WORKER_MEMORY=SIZE (e.g. 32G; 0 turns it off), or compile a "
                  "smaller model or with options that need less")


_FALLBACK: dict[str, Path] = {}


def private_dir() -> Path:
    """A directory only this user can enter: ``$XDG_RUNTIME_DIR/hwbackends`` or
    ``$TMPDIR/hwb-<uid>``, created 0700 (:func:`hwbackends.store.trust.private_dir`, ``closed``).
    A path that exists but is a symlink, another user's, or open to others is not used (and
    not changed: someone else may have put it there): a fresh random ``mkdtemp`` directory
    is, one per process."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "hwbackends" if runtime else Path(tempfile.gettempdir()) / f"hwb-{os.getuid()}"
    try:
        return trust.private_dir(base, "worker directory", closed=True)
    except HwbError as exc:
        if _FALLBACK.get(str(base)) is None:  # one per process, not one per call
            logger.info("%s; using a fresh private directory instead", exc)
            fresh = Path(tempfile.mkdtemp(prefix=f"hwb-{os.getuid()}-"))
            atexit.register(shutil.rmtree, fresh, True)
            _FALLBACK[str(base)] = fresh
        return _FALLBACK[str(base)]


def _become_subreaper() -> None:
    """Orphaned descendants (a ``setsid`` helper whose parent exited) are re-parented to this
    process instead of init, so the parent can still find and kill them. Linux only."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _worker_main(fd: int, log_fd: int) -> None:
    """The worker's loop: receive (job id, tmpdir, fn, args, kwargs), run, reply with the id."""
    from multiprocessing.connection import Connection

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _become_subreaper()
    conn = Connection(fd)
    # C++ toolchains write to fd 1/2 directly: send both to the log the parent reads on failure.
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    base_tmp = os.environ.get("TMPDIR")
    _pin_library_caches()
    while True:
        try:
            job_id, tmpdir, memory, fn, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        _limit_memory(memory)
        # Compilers (g++'s cc*.s, converters' scratch dirs) write under TMPDIR: the job's own.
        os.environ["TMPDIR"] = tempfile.tempdir = tmpdir
        try:
            try:
                result = fn(*args, **kwargs)
            finally:
                # Back to the worker's own TMPDIR before the reply: the parent removes the job
                # dir on the reply, and a library that makes its cache dir under gettempdir()
                # between jobs (torch's) would otherwise re-create the removed job dir.
                _restore_tmpdir(base_tmp)
            conn.send((job_id, "ok", result))
        except BaseException as exc:  # report everything, including SystemExit from a toolchain
            tb = traceback.format_exc()
            if isinstance(exc, MemoryError):
                conn.send((job_id, "memory", f"{type(exc).__name__}: {exc}", tb))
                continue
            if isinstance(exc, HwbError):
                try:
                    conn.send((job_id, "hwb", exc, tb))
                    continue
                except Exception:
                    pass
            conn.send((job_id, "err", f"{type(exc).__name__}: {exc}", tb))
        finally:
            _reap()


def _limit_memory(limit: int) -> None:
    """This job's memory limit as the worker's soft ``RLIMIT_DATA`` (``0``: the hard limit,
    i.e. none of ours); the compilers it starts inherit it."""
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        soft = hard if not limit or (hard != resource.RLIM_INFINITY and limit > hard) else limit
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    except (ValueError, OSError):
        pass


def tree_rss(pid: int, tree: list[int] | None = None) -> int:
    """Resident bytes of ``pid`` and its descendants (``tree``, else read from /proc now);
    processes already gone count 0."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for p in (pid, *(descendants(pid) if tree is None else tree)):
        try:
            with open(f"/proc/{p}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def _pin_library_caches() -> None:
    """Fix the cache dirs libraries derive from ``gettempdir()`` to the worker's own TMPDIR,
    before any job sets the job's. torch computes its cache dir once, when ``torch._dynamo``
    is first imported (``package.DynamoCache``), and writes there later: imported during a job
    (the first ``torch.export``), it re-created the removed job dir (a run under load left
    ``job-N/torchinductor_root``), and exported that path to ``os.environ`` for every later
    job and child. The path is torch's default, so the cache is shared with every other torch
    process as before; an explicit setting (or the parent's torch's export) is kept."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                          os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"))


def _restore_tmpdir(base: str | None) -> None:
    if base is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = base
    tempfile.tempdir = None  # gettempdir() recomputes it from TMPDIR


def _reap() -> None:
    """Collect exited orphans re-parented to the worker (it is their subreaper)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from ``/proc``; empty where there is none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: fields follow the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(e))
    out: list[int] = []
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid: int, rounds: int = 50) -> None:
    """Stop ``pid``, kill every descendant (re-reading the tree until none is left: a dying
    helper's children are re-parented to ``pid``, the subreaper), then ``pid`` itself."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return
    for _ in range(rounds):
        tree = descendants(pid)
        if not tree:
            break
        for c in tree:
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _sweep(d: Path, max_age: float = 24 * 3600) -> None:
    """Remove logs and job dirs a killed process left behind (older than ``max_age``)."""
    now = time.time()
    for p in d.glob("*"):
        if not p.name.startswith(("job-", "worker-")):
            continue
        try:
            if now - p.lstat().st_mtime > max_age:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError:
            pass


class Worker:
    """One long-lived child process that runs jobs one at a time."""

    def __init__(self) -> None:
        self._proc: Any = None
        #: The running job's memory limit (bytes; 0: none), for the crash message.
        self._memory = 0
        #: The worker's descendants as last read, and when (the memory watch).
        self._tree: tuple[float, list[int]] = (0.0, [])
        self._conn: Any = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        #: The parent's descriptor of the worker's (unlinked) log; None while no worker runs.
        self.log_fd: int | None = None
        atexit.register(self.kill)

    def _start(self) -> None:
        # A fresh interpreter (not multiprocessing's spawn, which re-imports the caller's
        # __main__ and breaks scripts without a main guard), in its own session/process group.
        from multiprocessing.connection import Connection

        _sweep(private_dir())
        log_fd, log_name = tempfile.mkstemp(prefix="worker-", suffix=".log", dir=private_dir())
        os.unlink(log_name)  # open in both processes, named nowhere: nothing outlives them
        # O_APPEND on the shared file description: after a truncation the worker writes at 0
        fcntl.fcntl(log_fd, fcntl.F_SETFL, fcntl.fcntl(log_fd, fcntl.F_GETFL) | os.O_APPEND)
        self.log_fd = os.dup(log_fd)
        parent, child = socket.socketpair()
        code = ("import sys; from hwbackends.isolate import _worker_main; "
                "_worker_main(int(sys.argv[1]), int(sys.argv[2]))")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code, str(child.fileno()), str(log_fd)],
                pass_fds=(child.fileno(), log_fd), start_new_session=True, stdin=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
        finally:
            child.close()
            os.close(log_fd)
        self._conn = Connection(parent.detach())

    def _log_tail(self, n: int = 30) -> str:
        return "\n".join(self._get_log(0).splitlines()[-n:])

    def kill(self) -> None:
        """Stop the worker and everything it started; remove its log."""
        if self._proc is not None:
            if self._proc.poll() is None:
                kill_tree(self._proc.pid)
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._proc = None
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        if self.log_fd is not None:
            os.close(self.log_fd)
        self.log_fd = None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float, what: str,
            target: str = "", precision: str = "", **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the worker, within ``timeout`` seconds and the memory
        limit (:func:`hwbackends.cost.worker_memory`, read now)."""
        from .cost import worker_memory

        memory = worker_memory()
        with self._lock:
            if not self.alive():
                self.kill()
                self._start()
            log_start = self._rotate_log()
            job_id = next(self._ids)
            tmpdir = tempfile.mkdtemp(prefix=f"job-{job_id}-", dir=private_dir())
            try:
                return self._exchange(job_id, tmpdir, fn, args, kwargs, timeout, what,
                                      target, precision, log_start, memory)
            except HwbError:
                raise  # a reply (the worker is idle), or a timeout/crash (it was replaced)
            except BaseException:
                # Ctrl-C, or anything else, while the worker may still be busy with this job:
                # replace it, so the next job never receives this job's late reply.
                self.kill()
                raise
            finally:
                shutil.rmtree(tmpdir, ignore_errors=True)

    def _exchange(self, job_id: int, tmpdir: str, fn: Callable[..., Any], args: tuple, kwargs: dict,
                  timeout: float, what: str, target: str, precision: str, log_start: int,
                  memory: int = 0) -> Any:
        self._memory = memory
        try:
            self._conn.send((job_id, tmpdir, memory, fn, args, kwargs))
        except Exception as exc:
            raise CompileError(f"{what}: could not send the job to the compile process "
                               f"({type(exc).__name__}: {exc}); is the model picklable?",
                               target=target, precision=precision) from exc
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready = self._conn.poll(max(0.0, min(left, WATCH_EVERY) if memory else left))
            if not ready and memory and left > WATCH_EVERY:
                self._watch_memory(memory, what, target, precision)
                continue
            if not ready:
                log = self._log_tail()
                self.kill()
                raise CompileError(
                    f"{what} timed out after {timeout:.0f} s and was stopped (with every compiler "
                    f"it started). Raise the timeout (timeout=…) or use a smaller model/options.",
                    target=target, precision=precision, log=log)
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                raise self._crashed(what, target, precision, log_start) from None
            if msg[0] == job_id:
                break
            # A reply to an earlier job (cannot happen while interrupts restart the worker,
            # but a reply is only ever accepted by the job that asked for it).
        status = msg[1]
        if status == "ok":
            return msg[2]
        if status == "hwb":
            raise msg[2]
        if status == "memory":
            raise CompileError(f"{what} ran out of memory under the compile worker's limit of "
                               f"{fmt_bytes(memory)} ({msg[2]}); {_MEMORY_ADVICE}",
                               target=target, precision=precision, log=self._get_log(log_start))
        # A raw exception from a toolchain or plugin: its message, not its traceback, is what
        # the user reads (the traceback goes to the debug log and the error's ``log``).
        logger.debug("%s: the compile worker's traceback:\n%s", what, msg[3])
        raise CompileError(f"{what} failed: {msg[2]} (raised inside the target's toolchain or "
                           f"plugin; `hwb -v` shows its traceback: report it with that output if "
                           f"the target should take this model)", target=target,
                           precision=precision, log=self._get_log(log_start) + msg[3])

    def _watch_memory(self, memory: int, what: str, target: str, precision: str) -> None:
        """Stop the worker tree (and raise) when its resident memory is past ``memory``."""
        if self._proc is None:
            return
        now = time.monotonic()
        if now - self._tree[0] >= TREE_EVERY:
            self._tree = (now, descendants(self._proc.pid))
        used = tree_rss(self._proc.pid, self._tree[1])
        if used <= memory:
            return
        log = self._log_tail()
        self.kill()
        raise CompileError(f"{what} used {fmt_bytes(used)} of memory (the compile worker and "
                           f"the compilers it started), over the worker's limit of "
                           f"{fmt_bytes(memory)}, and was stopped; {_MEMORY_ADVICE}",
                           target=target, precision=precision, log=log)

    def _crashed(self, what: str, target: str, precision: str, log_start: int) -> CompileError:
        try:
            code = self._proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        sig = _SIGNALS.get(-code, "") if code is not None and code < 0 else ""
        how = f"signal {sig} ({code})" if sig else f"exit code {code}"
        log = self._get_log(log_start)
        self.kill()
        memory = self._memory
        mem = (f" If it ran out of memory (a toolchain may abort on a failed allocation): the "
               f"worker's limit is {fmt_bytes(memory)}; {_MEMORY_ADVICE}.") if memory else ""
        return CompileError(
            f"{what} crashed the compile process ({how}). Your process is unaffected. "
            f"This is a bug or limit of the toolchain; try another precision or option.{mem} "
            f"Last output:\n{log[-2000:]}", target=target, precision=precision, log=log)

    def _rotate_log(self) -> int:
        """Where this job's output starts in the log; the log is emptied first when it has
        grown past :data:`LOG_LIMIT` (the worker appends, so truncating is safe between jobs)."""
        if self.log_fd is None:
            return 0
        try:
            size = os.fstat(self.log_fd).st_size
            if size > LOG_LIMIT:
                os.ftruncate(self.log_fd, 0)
                return 0
            return size
        except OSError:
            return 0

    def _get_log(self, start: int) -> str:
        if self.log_fd is None:
            return ""
        chunks, pos = [], start
        try:
            while chunk := os.pread(self.log_fd, 1 << 20, pos):
                chunks.append(chunk)
                pos += len(chunk)
        except OSError:
            pass
        return b"".join(chunks).decode(errors="replace")


_WORKER: Worker | None = None


def worker() -> Worker:
    global _WORKER
    if _WORKER is None:
        _WORKER = Worker()
    return _WORKER
