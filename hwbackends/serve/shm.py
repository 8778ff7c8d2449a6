"""Shared-memory endpoint for strategy processes on the same machine.

One ``multiprocessing.shared_memory`` segment holds a header and ``slots`` request/response
slots. A client process claims a slot (an exclusive ``flock`` on the slot's lock file, which
the kernel releases if the client dies), writes its features into the slot's input area and
then bumps the slot's *request sequence number*; the server's poller sees ``req != resp``,
hands the sample to the :class:`~hwbackends.serve.engine.Engine` (so requests of several
clients are micro-batched together), writes the outputs and a status, then publishes the
*response sequence number*. Both sides wait by spinning on the sequence word for a short
while, then sleeping in growing steps: a hot loop answers within microseconds, an idle one
costs no CPU. No syscalls, sockets or pickling on the request path.

Ordering: the payload is written before the sequence word, and x86-64 keeps stores in program
order (TSO), so a reader that sees the new sequence sees the payload. On weakly ordered CPUs
(ARM) this needs a fence this pure-Python endpoint does not issue: it refuses to start there.

Peers dying: the server checks the slot locks periodically and resets a slot whose client is
gone; a client waiting on a dead server (its pid gone) gets ``Unavailable('server-gone')``.
``close()`` on the server unlinks the segment and the lock files.
"""
from __future__ import annotations

import fcntl
import logging
import os
import platform
import secrets
import shutil
import tempfile
import threading
import time
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError
from ..inputs import as_sample
from ..specs import TensorSpec
from .engine import Engine, Unavailable

log = logging.getLogger("hwbackends.serve")

MAGIC = 0x6877625F73686D31  # "hwb_shm1"
_HDR = 64          # bytes: magic, nslots, in_floats, out_floats, slot_bytes, server_pid, beats
_CTL = 8           # int64 words per slot
_MSG = 192         # bytes of status message per slot
# ctl words
REQ, RESP, STATUS, DEADLINE_NS, OWNER, MSGLEN = 0, 1, 2, 3, 4, 5
ST_OK, ST_UNAVAILABLE, ST_ERROR = 0, 1, 2


def _slot_bytes(in_floats: int, out_floats: int) -> int:
    raw = _CTL * 8 + _MSG + 4 * (in_floats + out_floats)
    return (raw + 63) // 64 * 64  # one slot per cache-line group: no false sharing of ctl words


def _lock_dir(name: str) -> Path:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"{name}.locks"


class _Layout:
    """Numpy views of the segment (shared by server and client)."""

    def __init__(self, buf: memoryview, nslots: int, in_shape: tuple[int, ...],
                 out_shape: tuple[int, ...]):
        fi, fo = int(np.prod(in_shape)), int(np.prod(out_shape))
        sb = _slot_bytes(fi, fo)
        self.hdr = np.ndarray((8,), np.int64, buf, 0)
        self.ctl, self.msg, self.x, self.y = [], [], [], []
        for i in range(nslots):
            off = _HDR + i * sb
            self.ctl.append(np.ndarray((_CTL,), np.int64, buf, off))
            self.msg.append(np.ndarray((_MSG,), np.uint8, buf, off + _CTL * 8))
            xo = off + _CTL * 8 + _MSG
            self.x.append(np.ndarray(in_shape, np.float32, buf, xo))
            self.y.append(np.ndarray(out_shape, np.float32, buf, xo + 4 * fi))
        self.all_ctl = np.ndarray((nslots,), dtype=np.dtype([("w", np.int64, (_CTL,)),
                                                            ("pad", np.uint8, (sb - _CTL * 8,))]),
                                  buffer=buf, offset=_HDR)["w"]


def _remove_stale(name: str) -> None:
    """Remove a segment (and its lock files) left by a server that died without ``close()``:
    its header names a pid that no longer exists."""
    try:
        old = shared_memory.SharedMemory(name)
    except FileNotFoundError:
        shutil.rmtree(_lock_dir(name), ignore_errors=True)
        return
    pid = 0
    try:
        hdr = np.ndarray((8,), np.int64, old.buf, 0)
        pid, magic = int(hdr[5]), int(hdr[0])
        del hdr
        try:
            os.kill(pid, 0)
            alive = pid > 0
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
        if magic == MAGIC and not alive:
            log.warning("shm %s: removing the segment of dead server pid %d", name, pid)
            old.unlink()  # also drops this process' tracker registration
            pid = os.getpid()
            shutil.rmtree(_lock_dir(name), ignore_errors=True)
    finally:
        if pid != os.getpid():  # attaching registered it with the tracker; it is not ours
            # (pid is set to ours above once unlink() has already unregistered it)
            try:
                resource_tracker.unregister(old._name, "shared_memory")  # type: ignore[attr-defined]
            except Exception:
                pass
        old.close()


def _check_platform() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise ConfigError(f"the shared-memory endpoint relies on x86-64 store ordering; this is "
                          f"{platform.machine()}: use the gRPC endpoint")


class ShmServer:
    """Serve an engine to co-located processes through a shared-memory segment."""

    def __init__(self, engine: Engine, name: str | None = None, slots: int = 8, *,
                 spin_us: float = 200.0, max_sleep_us: float = 500.0, reap_every_s: float = 0.25):
        _check_platform()
        if not 1 <= slots <= 1024:
            raise ConfigError(f"slots must be 1..1024, got {slots}")
        self.engine = engine
        self.name = name or f"hwb-{os.getpid()}-{secrets.token_hex(4)}"
        self.nslots = slots
        self.in_shape, self.out_shape = engine.input_shape, engine.output_shape
        fi, fo = int(np.prod(self.in_shape)), int(np.prod(self.out_shape))
        size = _HDR + slots * _slot_bytes(fi, fo)
        _remove_stale(self.name)
        try:
            self._shm = shared_memory.SharedMemory(self.name, create=True, size=size)
        except FileExistsError:
            raise ConfigError(f"shared-memory endpoint {self.name!r} is served by a live process; "
                              f"pick another name") from None
        self._lay = _Layout(self._shm.buf, slots, self.in_shape, self.out_shape)
        hdr = self._lay.hdr
        hdr[1:7] = [slots, fi, fo, _slot_bytes(fi, fo), os.getpid(), 0]
        # shapes for the client (up to 4 dims each, packed in the message area of slot 0 is
        # fragile; the header keeps sizes, the shapes travel as a small text file)
        self._dir = _lock_dir(self.name)
        self._dir.mkdir(mode=0o700)
        for i in range(slots):
            (self._dir / f"slot{i}").touch(0o600)
        (self._dir / "shape").write_text(f"{list(self.in_shape)};{list(self.out_shape)}")
        hdr[0] = MAGIC  # last: a client attaching earlier sees no magic and retries
        self.spin_s, self.max_sleep_s, self.reap_every_s = spin_us * 1e-6, max_sleep_us * 1e-6, reap_every_s
        self.served = self.reaped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name=f"hwb-shm-{self.name}", daemon=True)
        self._thread.start()

    # -- the poller -------------------------------------------------------------------------
    def _poll(self) -> None:
        lay, eng = self._lay, self.engine
        ctl = lay.all_ctl
        clock = time.perf_counter
        idle_since = clock()
        next_reap = clock() + self.reap_every_s
        sleep = 0.0
        while not self._stop.is_set():
            lay.hdr[6] += 1  # heartbeat
            pending = np.flatnonzero(ctl[:, REQ] != ctl[:, RESP])
            if pending.size:
                self._handle(pending, lay, eng)
                idle_since = clock()
                sleep = 0.0
                continue
            now = clock()
            if now >= next_reap:
                self._reap()
                next_reap = now + self.reap_every_s
            if now - idle_since < self.spin_s:
                time.sleep(0)  # spin, but let the serving thread have the GIL
            else:
                sleep = min(self.max_sleep_s, max(20e-6, sleep * 2))
                time.sleep(sleep)

    def _handle(self, pending: np.ndarray, lay: _Layout, eng: Engine) -> None:
        work = []
        for i in pending:
            c = lay.ctl[i]
            seq = int(c[REQ])
            dl = int(c[DEADLINE_NS])
            try:
                # a copy: the engine must never hold a view into the mapping past close()
                h = eng.submit(lay.x[i].copy(), dl / 1e3 if dl > 0 else None)
            except InputError as exc:
                self._reply(i, seq, ST_ERROR, str(exc))
                continue
            except Exception as exc:  # never let one request kill the poller
                self._reply(i, seq, ST_UNAVAILABLE, f"server error: {type(exc).__name__}: {exc}")
                continue
            work.append((i, seq, h))
        for i, seq, h in work:  # all submitted first: the engine can batch them together
            res = eng.wait(h, lay.y[i])
            if isinstance(res, Unavailable):
                self._reply(i, seq, ST_UNAVAILABLE, res.reason)
            else:
                self._reply(i, seq, ST_OK, "")
            self.served += 1

    def _reply(self, i: int, seq: int, status: int, msg: str) -> None:
        c = self._lay.ctl[i]
        if msg:
            b = msg.encode()[:_MSG]
            self._lay.msg[i][:len(b)] = np.frombuffer(b, np.uint8)
            c[MSGLEN] = len(b)
        c[STATUS] = status
        c[RESP] = seq  # publish last

    def _reap(self) -> None:
        """Reset slots whose client died (its flock is free while OWNER is still set)."""
        for i in range(self.nslots):
            c = self._lay.ctl[i]
            if c[OWNER] == 0:
                continue
            try:
                fd = os.open(self._dir / f"slot{i}", os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # still owned by a live client
            try:
                c[OWNER] = 0
                c[RESP] = c[REQ]  # drop a request the dead client left behind
                self.reaped += 1
                log.info("shm %s: slot %d freed (client gone)", self.name, i)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        try:
            self._lay = None  # type: ignore[assignment]  # drop views before closing the buffer
            self._shm.close()
            self._shm.unlink()
        except (FileNotFoundError, BufferError):
            pass
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "ShmServer":
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()


class ShmClient:
    """One slot of a :class:`ShmServer`'s segment, for one thread of a client process."""

    def __init__(self, name: str, *, timeout_s: float = 5.0, spin_us: float = 100.0):
        _check_platform()
        self.name = name
        self.timeout_s = timeout_s
        self.spin_s = spin_us * 1e-6
        d = _lock_dir(name)
        try:
            self._shm = shared_memory.SharedMemory(name)
        except FileNotFoundError:
            raise ConfigError(f"no shared-memory endpoint {name!r}; is the server running "
                              f"(hwb serve --shm {name})?") from None
        hdr = np.ndarray((8,), np.int64, self._shm.buf, 0)
        for _ in range(100):
            if hdr[0] == MAGIC:
                break
            time.sleep(0.01)
        else:
            raise ConfigError(f"shared-memory segment {name!r} is not an hwb endpoint")
        # Python < 3.13 registers attached segments with the resource tracker, which would
        # unlink the server's segment when this client exits: the server owns it. (In the
        # server's own process the registration is the server's: leave it.)
        if int(hdr[5]) != os.getpid():
            try:
                resource_tracker.unregister(self._shm._name, "shared_memory")  # type: ignore[attr-defined]
            except Exception:
                pass
        ins, outs = (d / "shape").read_text().split(";")
        self.in_shape = tuple(int(v) for v in ins.strip("[]").split(",") if v.strip())
        self.out_shape = tuple(int(v) for v in outs.strip("[]").split(",") if v.strip())
        self._in_spec = TensorSpec("x", self.in_shape)
        self.server_pid = int(hdr[5])
        self._same_process = self.server_pid == os.getpid()
        self._lay = _Layout(self._shm.buf, int(hdr[1]), self.in_shape, self.out_shape)
        self._fd = -1
        nslots = int(hdr[1])
        del hdr  # numpy views must not outlive the mapping (close() unmaps it)
        for i in range(nslots):
            fd = os.open(d / f"slot{i}", os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._fd, self.slot = fd, i
            break
        if self._fd < 0:
            self.close()
            raise ConfigError(f"all {nslots} slots of {name!r} are taken; start the server "
                              f"with more slots (--shm-slots)")
        c = self._c = self._lay.ctl[self.slot]
        c[RESP] = c[REQ]  # the slot is ours: start clean
        c[OWNER] = os.getpid()
        self._x, self._y = self._lay.x[self.slot], self._lay.y[self.slot]
        self._seq = int(c[REQ])

    def _server_alive(self) -> bool:
        try:
            os.kill(self.server_pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def predict_into(self, x: np.ndarray, out: np.ndarray,
                     deadline_us: float | None = None) -> bool | Unavailable:
        """One sample → ``out``; ``True`` or :class:`Unavailable` (deadline, server gone, …).
        A malformed sample raises :class:`InputError` with the server's message."""
        c = self._c
        if c is None:
            raise ConfigError("this ShmClient is closed")
        if c[RESP] != self._seq:  # an earlier call timed out: wait for it to drain
            if not self._wait(self._seq, time.perf_counter() + self.timeout_s):
                return Unavailable("server-not-responding")
        self._x[...] = x
        c[DEADLINE_NS] = int(deadline_us * 1e3) if deadline_us else 0
        self._seq += 1
        seq = self._seq
        c[REQ] = seq  # publish last
        limit = self.timeout_s if deadline_us is None else deadline_us * 1e-6
        if not self._wait(seq, time.perf_counter() + limit):
            return Unavailable("deadline" if self._server_alive() else "server-gone")
        st = c[STATUS]
        if st == ST_OK:
            out[...] = self._y
            return True
        msg = bytes(self._lay.msg[self.slot][:int(c[MSGLEN])]).decode(errors="replace")
        if st == ST_ERROR:
            raise InputError(msg)
        return Unavailable(msg)

    def _wait(self, seq: int, until: float) -> bool:
        c = self._c
        clock = time.perf_counter
        t_spin = clock() + self.spin_s
        while c[RESP] != seq:
            now = clock()
            if now > until:
                return False
            if now > t_spin:
                time.sleep(50e-6)
                if not self._server_alive():
                    return False
            elif self._same_process:
                time.sleep(0)  # yield the GIL to the server's threads in this very process
        return True

    def predict(self, x: Any, deadline_us: float | None = None) -> np.ndarray | Unavailable:
        out = np.empty(self.out_shape, np.float32)
        x = as_sample(x, self._in_spec, "pass", where=f"shm endpoint {self.name!r}")
        r = self.predict_into(x, out, deadline_us)
        return out if r is True else r

    def close(self) -> None:
        self._c = None  # type: ignore[assignment]
        lay = getattr(self, "_lay", None)
        if lay is not None and self._fd >= 0:
            lay.ctl[self.slot][OWNER] = 0
        del lay
        self._lay = None  # type: ignore[assignment]
        self._c = self._x = self._y = None  # type: ignore[assignment]
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
        try:
            self._shm.close()
        except BufferError:
            pass

    def __enter__(self) -> "ShmClient":
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()
