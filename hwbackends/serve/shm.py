"""Shared-memory endpoint for strategy processes on the same machine.

The protocol, the segment layout and the client are C (``include/hwb_shm.h``); the server's
poll loop is C too (``_shmloop.c``). This module creates the files, runs the loop in a thread
and wraps the client for Python. One request:

client: write the features into its slot, publish ``req`` (release), ring the doorbell only
if the server sleeps; spin on ``resp`` for ``spin_us``, then sleep on it (futex).
server: a thread scans the slots with the GIL released, busy-polls ``spin_us`` after the last
request, then sleeps on the doorbell futex. A request is checked in C (size, deadline,
NaN/Inf: refused with a status and counted); a valid one runs in the polling thread itself
(``mode="direct"``: :meth:`Engine.run_direct`, the engine's executor lock held, no thread
hand-off) or through the engine's micro-batching (``mode="batch"``: all pending slots are
submitted together). Outputs, status, then ``resp`` (release); a futex wake only if the
client sleeps.

Files (owner-only unless a group is named): ``/dev/shm/hwb-<uid>/NAME/{seg,server.lock,
slots.lock}`` — plain files, not POSIX shm names, so ``multiprocessing.shared_memory`` can
neither attach them nor unlink them at exit. Only the server that created a file removes it
(it checks the inode), and ``server.lock`` stays flock'ed by the live server, so a second
server is refused and a stale one never removes a newer one's files.
"""
from __future__ import annotations

import fcntl
import grp
import logging
import math
import mmap
import os
import pwd
import secrets
import stat
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError
from ..inputs import as_sample
from ..specs import TensorSpec
from .engine import Engine, Unavailable

log = logging.getLogger("hwbackends.serve")

INCLUDE_DIR = Path(__file__).resolve().parent / "include"

# hwb_shm.h statuses
OK, UNAVAILABLE, BAD_INPUT, DEADLINE = 0, 1, 2, 3
E_TIMEOUT, E_SERVER_GONE, E_NOT_RESPONDING, E_SHAPE, E_VERSION, E_DTYPE = -1, -2, -3, -4, -5, -6
E_NOENT, E_ACCESS, E_SLOTS_FULL, E_SYS, E_CLOSED, E_NOT_HWB, E_NAME = -7, -8, -9, -10, -11, -12, -13


def _native() -> Any:
    try:
        from . import _shmloop
    except ImportError as exc:  # an install that skipped building the extension
        raise ConfigError(f"the shared-memory endpoint needs its C extension "
                          f"(hwbackends.serve._shmloop), which is not built: {exc}; reinstall "
                          f"with `pip install -e .` (needs a C compiler)") from None
    return _shmloop


def _uid_of(owner: int | str | None) -> int:
    if owner is None:
        return os.geteuid()
    if isinstance(owner, int):
        return owner
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise ConfigError(f"unknown user {owner!r} (owner of the shm endpoint)") from None


def runtime_root(uid: int | None = None) -> Path:
    """Where endpoints of user ``uid`` live: ``$HWB_SHM_DIR`` or ``/dev/shm/hwb-<uid>``."""
    env = os.environ.get("HWB_SHM_DIR")
    if env:
        return Path(env)
    return Path("/dev/shm") / f"hwb-{os.geteuid() if uid is None else uid}"


def endpoint_dir(name: str, uid: int | None = None) -> Path:
    _check_name(name)
    return runtime_root(uid) / name


def _check_name(name: str) -> None:
    ok = 0 < len(name) <= 100 and not name.startswith(".") and all(
        c.isascii() and (c.isalnum() or c in "._-") for c in name)
    if not ok:
        raise ConfigError(f"bad shm endpoint name {name!r}: use 1-100 characters from "
                          f"[A-Za-z0-9._-], not starting with '.'")


def _private_dir(path: Path, mode: int, gid: int | None, *, exact: bool = True) -> None:
    """Create ``path`` with ``mode`` (and group ``gid``), or check an existing one is ours,
    a real directory and not writable by others — as OpenSSH treats ~/.ssh. ``exact``: set
    the mode; else (the per-user root, shared by endpoints) only add what ``mode`` needs and
    take away write access of group and others, so one endpoint's group stays able to
    traverse it when another endpoint starts owner-only."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path} exists and is not a directory (a symlink?); remove it")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{path} belongs to uid {st.st_uid}, not to this user "
                          f"({os.geteuid()}): refusing to serve from it; remove it or set "
                          f"HWB_SHM_DIR to a directory of your own")
    if gid is not None and st.st_gid != gid:
        os.chown(path, -1, gid)
    want = mode if exact else (stat.S_IMODE(st.st_mode) | mode) & ~0o022 & ~0o005
    if stat.S_IMODE(st.st_mode) != want:
        os.chmod(path, want)  # ours: tighten (or open to the named group) rather than refuse


def _group_id(group: str | int | None) -> int | None:
    if group is None:
        return None
    if isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"unknown group {group!r} (--shm-group)") from None


class ShmServer:
    """Serve an engine to co-located processes through a shared-memory segment.

    ``mode``: ``"direct"`` (the polling thread runs each request itself, batch 1),
    ``"batch"`` (requests go through the engine's micro-batching), ``"auto"`` (direct when the
    engine's policy is batch 1, else batch). ``spin_us``: busy-poll after the last request
    before sleeping on a futex. ``pin_core``: pin the polling thread. ``group``: open the
    endpoint to this group (files 0660, dirs 0750/0710) instead of owner-only."""

    def __init__(self, engine: Engine, name: str | None = None, slots: int = 8, *,
                 mode: str = "auto", spin_us: float = 50.0, reap_every_s: float = 0.25,
                 pin_core: int | None = None, group: str | int | None = None):
        native = _native()
        if not 1 <= slots <= 1024:
            raise ConfigError(f"slots must be 1..1024, got {slots}")
        if mode == "auto":
            mode = "direct" if engine.config.policy.max_batch_size == 1 else "batch"
        if mode not in ("direct", "batch"):
            raise ConfigError(f"shm mode must be 'direct', 'batch' or 'auto', got {mode!r}")
        if not (math.isfinite(spin_us) and spin_us >= 0) or not reap_every_s > 0:
            raise ConfigError(f"spin_us must be ≥ 0 and reap_every_s > 0 "
                              f"(got {spin_us}, {reap_every_s})")
        if pin_core is not None and pin_core not in os.sched_getaffinity(0):
            raise ConfigError(f"pin_core {pin_core} is not available to this process "
                              f"(allowed: {sorted(os.sched_getaffinity(0))})")
        self.engine, self.mode, self.nslots = engine, mode, slots
        self.name = name or f"hwb-{os.getpid()}-{secrets.token_hex(4)}"
        _check_name(self.name)
        self.in_shape, self.out_shape = tuple(engine.input_shape), tuple(engine.output_shape)
        gid = _group_id(group)
        fmode = 0o600 if gid is None else 0o660
        _private_dir(runtime_root(), 0o700 if gid is None else 0o710, gid, exact=False)
        self.dir = runtime_root() / self.name
        _private_dir(self.dir, 0o700 if gid is None else 0o750, gid)
        self._lock_fd = self._take_name()
        self._remove_stale()
        fi, fo = int(np.prod(self.in_shape)), int(np.prod(self.out_shape))
        size = native.HEADER_BYTES + slots * native.slot_bytes(fi, fo)
        self._slots_fd, self._slots_ino = self._create(self.dir / "slots.lock", fmode, gid, slots)
        tmp = self.dir / f"seg.{os.getpid()}.tmp"
        fd, _ = self._create(tmp, fmode, gid, size)
        try:
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        native.init_segment(self._mm, slots, self.in_shape, self.out_shape, os.geteuid(),
                            os.getpid(), secrets.randbits(64))
        os.rename(tmp, self.dir / "seg")  # complete before any client can open it
        self._seg_ino = os.lstat(self.dir / "seg").st_ino
        sb, hb, ctl = native.slot_bytes(fi, fo), native.HEADER_BYTES, native.SLOT_CTL
        self._xs = [np.ndarray((1, *self.in_shape), np.float32, self._mm, hb + i * sb + ctl)
                    for i in range(slots)]
        self._ys = [np.ndarray((1, *self.out_shape), np.float32, self._mm, hb + i * sb + ctl + 4 * fi)
                    for i in range(slots)]
        self._deadlines = [np.ndarray((), np.int64, self._mm, hb + i * sb + 24) for i in range(slots)]
        self._spin_ns, self._reap_ns = int(spin_us * 1e3), int(reap_every_s * 1e9)
        self._pin = -1 if pin_core is None else int(pin_core)
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"hwb-shm-{self.name}", daemon=True)
        self._thread.start()

    # -- files ------------------------------------------------------------------------------
    def _take_name(self) -> int:
        fd = os.open(self.dir / "server.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"shared-memory endpoint {self.name!r} is served by a live process; "
                              f"pick another name") from None
        return fd

    def _remove_stale(self) -> None:
        """We hold server.lock, so whoever made the files left in the directory is dead."""
        for f in self.dir.iterdir():
            if f.name != "server.lock":
                log.warning("shm %s: removing %s left by a dead server", self.name, f.name)
                f.unlink(missing_ok=True)

    @staticmethod
    def _create(path: Path, mode: int, gid: int | None, size: int) -> tuple[int, int]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        os.fchmod(fd, mode)  # the umask must not loosen or tighten it
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.ftruncate(fd, size)
        return fd, os.fstat(fd).st_ino

    def _unlink_if_ours(self, name: str, ino: int) -> None:
        p = self.dir / name
        try:
            if os.lstat(p).st_ino == ino:
                p.unlink()
        except FileNotFoundError:
            pass

    # -- the poll thread --------------------------------------------------------------------
    def _loop(self) -> None:
        native = _native()
        args = tuple((x, y) for x, y in zip(self._xs, self._ys, strict=True))
        batch = self._batch if self.mode == "batch" else None
        try:
            native.serve(self._mm, self._slots_fd, self.engine.run_direct, args, batch, InputError,
                         self._spin_ns, self._reap_ns, self._pin)
        except BaseException as exc:  # a broken loop must be visible, not a silent hang
            self._error = exc
            log.error("shm %s: poll loop failed: %s", self.name, exc)
            native.stop(self._mm)

    def _batch(self, idx: list[int]) -> list[str | None]:
        """Micro-batching mode: submit every pending request, then collect them."""
        eng, now = self.engine, __import__("time").monotonic_ns()
        hs = []
        for i in idx:
            dl = int(self._deadlines[i])
            budget = (dl - now) / 1e3 if dl > 0 else None
            try:
                hs.append(eng.submit(self._xs[i][0].copy(), budget))  # a copy: the engine keeps it
            except InputError as exc:
                hs.append(Unavailable(str(exc)))
        res: list[str | None] = []
        for i, h in zip(idx, hs, strict=True):
            r = eng.wait(h, self._ys[i][0])
            res.append(r.reason if isinstance(r, Unavailable) else None)
        return res

    # -- reporting and shutdown -------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """served, bad_payloads, deadline_missed, reaped, errors (counted in the segment)."""
        return dict(_native().counters(self._mm), mode=self.mode, slots=self.nslots)

    @property
    def served(self) -> int:
        return int(self.stats()["served"])

    @property
    def reaped(self) -> int:
        return int(self.stats()["reaped"])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        native = _native()
        native.stop(self._mm)
        self._thread.join(10)
        # only what this server created: a newer server's files (other inodes) stay
        self._unlink_if_ours("seg", self._seg_ino)
        self._unlink_if_ours("slots.lock", self._slots_ino)
        try:
            os.unlink(self.dir / "server.lock")  # still flock'ed by us: nobody else owns it
            os.rmdir(self.dir)
        except OSError:
            pass  # a newer server's files are there
        os.close(self._slots_fd)
        os.close(self._lock_fd)
        self._xs = self._ys = self._deadlines = []
        try:
            self._mm.close()
        except BufferError:  # a view still alive somewhere: the GC unmaps it later
            pass

    def __enter__(self) -> "ShmServer":
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()


_ATTACH_ERRORS = {
    E_NOENT: "no shared-memory endpoint {name!r} for uid {uid}; is the server running "
             "(hwb serve --shm {name}) as that user?",
    E_ACCESS: "shared-memory endpoint {name!r}: permission denied — endpoints are owner-only "
              "unless the server names a group (--shm-group) you belong to",
    E_SLOTS_FULL: "all slots of {name!r} are taken; start the server with more slots (--shm-slots)",
    E_VERSION: "shared-memory endpoint {name!r} speaks another protocol version; use the "
               "hwbackends (and hwb_shm.h) of the server",
    E_DTYPE: "shared-memory endpoint {name!r} does not serve float32",
    E_SHAPE: "shared-memory endpoint {name!r} has other input/output sizes than expected",
    E_NOT_HWB: "{name!r} is not an hwb shared-memory segment",
    E_NAME: "bad shm endpoint name {name!r}: use [A-Za-z0-9._-]",
}


class ShmClient:
    """One slot of a :class:`ShmServer`'s segment, for one thread of a client process.
    ``owner``: the server's user (name or uid; default this user)."""

    def __init__(self, name: str, *, owner: int | str | None = None, timeout_s: float = 5.0,
                 spin_us: float = 50.0):
        native = _native()
        self.name = name
        uid = _uid_of(owner)
        try:
            self._c = native.Client(name, uid, 0, 0, int(spin_us * 1e3), int(timeout_s * 1e9))
        except OSError as exc:
            rc = exc.args[0] if exc.args and isinstance(exc.args[0], int) else E_SYS
            tmpl = _ATTACH_ERRORS.get(rc, "cannot attach to shared-memory endpoint {name!r}: {err}")
            raise ConfigError(tmpl.format(name=name, uid=uid, err=exc)) from None
        info = self._c.info()
        self.slot: int = info["slot"]
        self.in_shape: tuple[int, ...] = info["in_shape"]
        self.out_shape: tuple[int, ...] = info["out_shape"]
        self.server_pid: int = info["server_pid"]
        self._in_spec = TensorSpec("x", self.in_shape)
        self._call = self._c.call

    def try_predict_into(self, x: np.ndarray, out: np.ndarray,
                         deadline_us: float | None = None) -> bool | Unavailable:
        """One sample (float32, C-contiguous, the endpoint's element count) → ``out``;
        ``True`` or :class:`Unavailable` (deadline, server gone, …). A sample the server
        refuses (NaN/Inf) or a wrong-size array raises :class:`InputError`."""
        if deadline_us is None:
            dl = 0
        elif deadline_us > 0 and math.isfinite(deadline_us):
            dl = max(1, int(deadline_us * 1e3))
        else:
            raise InputError(f"deadline_us must be a positive finite number of µs or None, "
                             f"got {deadline_us!r}")
        rc = self._call(x, out, dl)
        return True if rc == OK else self._failed(rc, x, out)

    def _failed(self, rc: int, x: Any, out: Any) -> Unavailable:
        native = _native()
        if rc in (native.RC_BAD_BUFFER, native.RC_BAD_BUFFER - 1):
            which, a = ("x", x) if rc == native.RC_BAD_BUFFER else ("out", out)
            shape = self.in_shape if which == "x" else self.out_shape
            raise InputError(f"shm endpoint {self.name!r}: {which} must be a float32 C-contiguous "
                             f"array with {int(np.prod(shape))} elements (shape {shape}), got "
                             f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")
        if rc == native.RC_BUSY:
            raise ConfigError(f"ShmClient {self.name!r} is in use by another thread: a client is "
                              f"one slot for one thread; give each thread its own ShmClient")
        if rc == BAD_INPUT:
            raise InputError(f"shm endpoint {self.name!r}: {self._c.message()}")
        if rc == UNAVAILABLE:
            return Unavailable(self._c.message())
        if rc in (DEADLINE, E_TIMEOUT):
            return Unavailable("deadline")
        if rc == E_SERVER_GONE:
            return Unavailable("server-gone")
        if rc == E_NOT_RESPONDING:
            return Unavailable("server-not-responding")
        if rc == E_CLOSED:
            raise ConfigError("this ShmClient is closed")
        return Unavailable(f"shm status {rc}")

    def predict(self, x: Any, deadline_us: float | None = None) -> np.ndarray | Unavailable:
        """Outputs for one sample (a new array), or :class:`Unavailable`."""
        x = as_sample(x, self._in_spec, "pass", where=f"shm endpoint {self.name!r}")
        out = np.empty(self.out_shape, np.float32)
        r = self.try_predict_into(np.ascontiguousarray(x, np.float32), out, deadline_us)
        return out if r is True else r

    def close(self) -> None:
        try:
            self._c.detach()
        except RuntimeError as exc:
            raise ConfigError(f"ShmClient {self.name!r}: cannot close: {exc}") from None

    def __enter__(self) -> "ShmClient":
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()
