"""Shared-memory endpoint for strategy processes on the same machine.

The protocol, the layouts and the client are C (``include/hwb_shm.h``); the server's poll
loop is C too (``_shmloop.c``). This module creates the files, runs the loop in a thread and
wraps the client for Python. One request:

client: write the features into its own slot, publish ``req`` (release), write a doorbell
byte to its connection only if the server sleeps; spin on ``resp`` for ``spin_us``, then
sleep on it (futex).
server: a thread scans the attached slots with the GIL released, busy-polls ``spin_us`` after
the last request, then sleeps in ``poll()``. A request is checked in C (size, deadline,
NaN/Inf: refused with a status and counted); a valid one runs in the polling thread itself
(``mode="direct"``: :meth:`Engine.run_direct`, the engine's executor lock held, no thread
hand-off) or through the engine's micro-batching (``mode="batch"``: all pending slots are
submitted together). Outputs, status, then ``resp`` (release); a futex wake only if the
client sleeps.

Native fast path (direct mode only): when the serving version's batch-1 backend is a compiled
model whose executor has a native entry (:meth:`hwbackends.target.Executor.native_entry`,
e.g. ``cpu.native``), the C loop calls that C function on the slot's own memory and never
takes the GIL; the checks before it, the statuses and the counters are the Python path's.
The server follows every swap and rollback (:meth:`Versions.watch`); anything else (a router
strategy, a static batch > 1, batch mode, an executor without one) keeps the Python path.

Sliding endpoints (``sliding=True``, ``hwb serve --shm NAME --sliding [--streams N]``): each
request carries one tick (``input.shape[1:]``) for one of the client's ``streams`` windows (the
slot's ``stream``: one per symbol), and the server keeps the windows (``cm.sliding()``'s
semantics: zero state at the window's start, zero-filled before it is full). Stream ids are per
client: each connection's windows are its own, made on their first tick and freed when it hangs
up, so any number of clients share the endpoint and none can reach another's windows. The C loop
pushes each request's tick, publishes the answer, and runs the prepares of the windows it pushed
in its idle time, one at a time, looking for new requests between them (the client's critical
path is the push alone). When the model's native entry has window handles (ABI 3 of
hwb_native.h: ``window_new`` / ``_push`` / ``_prepare`` / ``_reset`` / ``_free``) the loop calls
them itself, without the GIL; any other target is served through one Python
:class:`~hwbackends.sliding.Windows` per client (``cm.sliding(streams=N)``; the recompute form
where the target has no other: ``predict_into`` on the window each tick), with the GIL held for
the tick. A request flagged ``HWB_SHM_FLAG_RESET`` empties its stream's window.

Trust (docs/serving.md states it in full): each client's slot is a memfd the server made for
that connection alone; the header is sealed read-only for clients; the server keeps its own
copy of every geometry and state value; a client checks that the directory and the process
serving it belong to the expected user (SO_PEERCRED).

Files (owner-only unless a group is named): ``/dev/shm/hwb-<uid>/NAME/{sock,server.lock}``.
Only the server that created a file removes it (it checks the inode), and ``server.lock``
stays flock'ed by the live server, so a second server is refused and a stale one never
removes a newer one's files.
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
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError, StoreTrustError
from ..inputs import as_sample
from ..sliding import check_streams, step_shapes
from ..specs import TensorSpec
from ..store import trust
from . import _shmloop  # built with the package; request.py explains when it is missing
from .engine import Engine
from .request import DEADLINE, MIN_DEADLINE_US, Status, Unavailable

log = logging.getLogger("hwbackends.serve")

INCLUDE_DIR = Path(__file__).resolve().parent / "include"

#: Byte offsets of the slot's and the header's fields, from offsetof in the C extension (one
#: layout: hwb_shm.h's structs), for anything that reads the raw mappings.
SLOT_OFFSETS: dict[str, int] = _shmloop.SLOT_OFFSETS
HEADER_OFFSETS: dict[str, int] = _shmloop.HEADER_OFFSETS
_OK = int(Status.OK)  # a plain int for the hot path's one comparison


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


def _private_dir(path: Path, what: str, gid: int | None, mode: int, *,
                 closed: bool = False) -> None:
    """:func:`hwbackends.store.trust.private_dir` for an endpoint's directories: created
    ``mode`` (opened to group ``gid`` when one is named), or an existing one accepted only if
    it is this user's real directory that nobody else can write — as OpenSSH treats ~/.ssh.
    Refusals are :class:`ConfigError` naming the fix (``HWB_SHM_DIR`` points elsewhere)."""
    try:
        trust.private_dir(path, what, None, closed=closed, mode=mode if gid is not None else 0o700,
                          group=gid, elsewhere="HWB_SHM_DIR")
    except StoreTrustError as exc:
        raise ConfigError(f"refusing to serve: {exc}") from None


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
    """Serve an engine to co-located processes through shared memory.

    ``mode``: ``"direct"`` (the polling thread runs each request itself, batch 1),
    ``"batch"`` (requests go through the engine's micro-batching), ``"auto"`` (direct when the
    engine's policy is batch 1, else batch). ``slots``: how many clients may be attached at
    once. ``spin_us``: busy-poll after the last request before sleeping. ``reap_every_s``: the
    longest sleep between heartbeats (hang-ups and new clients wake the loop at once).
    ``pin_core``: pin the polling thread. ``group``: open the endpoint to this group (socket
    0660, dirs 0750/0710) instead of owner-only. ``native``: use the model's C entry when the
    serving version has one (the module docstring says when); False: always the Python path.
    ``sliding``: serve the model's sliding windows, one tick per request (the module docstring);
    direct mode only; ``streams``: windows per client (stream ids 0 … streams-1); ``native``
    then chooses between the model library's C window handles and the Python
    :class:`~hwbackends.sliding.Windows`."""

    def __init__(self, engine: Engine, name: str | None = None, slots: int = 8, *,
                 mode: str = "auto", spin_us: float = 50.0, reap_every_s: float = 0.25,
                 pin_core: int | None = None, group: str | int | None = None,
                 native: bool = True, sliding: bool = False, streams: int = 1):
        native_mod = _shmloop
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
        #: A sliding endpoint's window (None: each request is a whole input).
        self.window: SlidingWindow | None = None
        if sliding:
            self.window = SlidingWindow.of(engine, mode=mode, streams=streams, native=native)
            self.in_shape = self.window.step_shape
        gid = _group_id(group)
        # the per-user root is shared by endpoints: one opened to a group leaves it 0710 (its
        # group may traverse it), and an owner-only endpoint started later keeps it so
        _private_dir(runtime_root(), "shared-memory directory", gid, 0o710)
        self.dir = runtime_root() / self.name
        _private_dir(self.dir, "shared-memory endpoint", gid, 0o750, closed=gid is None)
        # pinned once: every later file operation goes through this descriptor
        self._dirfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._dir_ino = os.fstat(self._dirfd).st_ino
        _raise_nofile(2 * slots + 64)  # each client: its connection and the slot's mapping
        self._lock_fd, self._lock_ino = self._take_name()
        self._remove_stale()
        self._fi, self._fo = int(np.prod(self.in_shape)), int(np.prod(self.out_shape))
        self._slot_bytes = native_mod.slot_bytes(self._fi, self._fo)
        self._hdr_fd = os.memfd_create("hwb-header", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        native_mod.init_header(self._hdr_fd, slots, self.in_shape, self.out_shape, os.geteuid(),
                               os.getpid(), secrets.randbits(64),
                               *((self.window.length, self.window.streams)
                                 if self.window is not None else ()))
        self._mm = mmap.mmap(self._hdr_fd, native_mod.HEADER_BYTES)  # ours, writable: before the seal
        native_mod.seal_header(self._hdr_fd)  # from here on clients can only map it read-only
        self._sock, self._sock_ino = self._listen(0o600 if gid is None else 0o660, gid, slots)
        self._stop_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._spin_ns, self._reap_ns = int(spin_us * 1e3), int(reap_every_s * 1e9)
        self._pin = -1 if pin_core is None else int(pin_core)
        self._closed = False
        self._error: BaseException | None = None
        #: Why the native fast path is off ("" while it serves); see native_entry_of.
        self.native_reason = "batch mode: every request goes through the engine's batching"
        if mode == "direct" and not native:
            self.native_reason = "turned off (native=False)"
        use_gate = mode == "direct" and native and self.window is None
        self._gate = native_mod.NativeGate(self._fi, self._fo) if use_gate else None
        self._unwatch: Any = None
        if self._gate is not None:
            self._follow("start", engine.versions.active)
            self._unwatch = engine.versions.watch(self._follow)
        elif self.window is not None:
            self.native_reason = self.window.native_reason
            self._unwatch = engine.versions.watch(self._keep_window)
        self._thread = threading.Thread(target=self._loop, name=f"hwb-shm-{self.name}", daemon=True)
        self._thread.start()

    # -- the native fast path ---------------------------------------------------------------
    def _follow(self, kind: str, version: Any) -> None:
        """Point the C loop at the native entry of ``version`` (or at the Python path)."""
        assert self._gate is not None
        cap, why = native_entry_of(version.plan)
        try:
            self._gate.set(cap)
        except ValueError as exc:  # sizes or ABI the loop cannot call: the Python path serves
            self._gate.set(None)
            why = f"native entry refused: {exc}"
        self.native_reason = why
        log.info("shm %s: %s version %d: %s", self.name, kind, version.number,
                 "native fast path" if not why else f"Python path ({why})")

    def _keep_window(self, kind: str, version: Any) -> None:
        """A swap does not move a sliding endpoint: its windows are the starting model's."""
        assert self.window is not None
        log.warning("shm %s: %s to version %d: this sliding endpoint keeps serving the window of "
                    "%s (a window's state belongs to one model); restart it to serve the new one",
                    self.name, kind, version.number, self.window.variant)

    @property
    def native(self) -> bool:
        """Whether requests are now served by the model's C entry without the GIL."""
        if self.window is not None:
            return self.window.native
        return self._gate is not None and bool(self._gate.active())

    # -- files ------------------------------------------------------------------------------
    def _at(self, name: str) -> str:
        """A path through the pinned directory descriptor (short enough for a socket name)."""
        return f"/proc/self/fd/{self._dirfd}/{name}"

    def _take_name(self) -> tuple[int, int]:
        fd = os.open("server.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self._dirfd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"shared-memory endpoint {self.name!r} is served by a live process; "
                              f"pick another name") from None
        return fd, os.fstat(fd).st_ino

    def _remove_stale(self) -> None:
        """We hold server.lock, so whoever made the files left in the directory is dead."""
        for f in os.listdir(self._dirfd):
            if f != "server.lock":
                log.warning("shm %s: removing %s left by a dead server", self.name, f)
                try:
                    os.unlink(f, dir_fd=self._dirfd)
                except IsADirectoryError:
                    raise ConfigError(f"{self.dir / f} is a directory: the endpoint directory "
                                      f"holds only files hwb made; remove it") from None
                except FileNotFoundError:
                    pass

    def _listen(self, mode: int, gid: int | None, slots: int) -> tuple[socket.socket, int]:
        """Bind under a temporary name, open it to who may connect, listen, then rename into
        place: a client never finds a socket that is not ready."""
        tmp = f"sock.{os.getpid()}.tmp"
        sk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sk.bind(self._at(tmp))
            os.chmod(self._at(tmp), mode)
            if gid is not None:
                os.chown(self._at(tmp), -1, gid, follow_symlinks=False)
            sk.listen(min(slots + 16, socket.SOMAXCONN))
            sk.setblocking(False)
            os.rename(tmp, "sock", src_dir_fd=self._dirfd, dst_dir_fd=self._dirfd)
            return sk, os.stat("sock", dir_fd=self._dirfd, follow_symlinks=False).st_ino
        except BaseException:
            sk.close()
            raise

    def _unlink_if_ours(self, name: str, ino: int) -> None:
        try:
            if os.stat(name, dir_fd=self._dirfd, follow_symlinks=False).st_ino == ino:
                os.unlink(name, dir_fd=self._dirfd)
        except FileNotFoundError:
            pass

    # -- the poll thread --------------------------------------------------------------------
    def _make_slot(self, fd: int) -> tuple[mmap.mmap, tuple[np.ndarray, np.ndarray]]:
        """Views of a new client's slot for the model call (called by the loop, with the GIL)."""
        mm = mmap.mmap(fd, self._slot_bytes)
        ctl = _shmloop.SLOT_CTL
        one = () if self.window is not None else (1,)  # push_into takes one tick, no batch axis
        x = np.ndarray((*one, *self.in_shape), np.float32, mm, ctl)
        y = np.ndarray((*one, *self.out_shape), np.float32, mm, ctl + 4 * self._fi)
        return mm, (x, y)

    def _loop(self) -> None:
        native = _shmloop
        batch = self._batch if self.mode == "batch" else None
        run, sliding = self.engine.run_direct, None
        if self.window is not None:
            sliding = self.window.loop_args()
        try:
            native.serve(self._mm, self._hdr_fd, self._sock.fileno(), self._stop_fd, self.nslots,
                         run, self._make_slot, batch, InputError,
                         self._spin_ns, self._reap_ns, self._pin, self._gate, sliding)
        except BaseException as exc:  # a broken loop must be visible, not a silent hang
            self._error = exc
            log.error("shm %s: poll loop failed: %s", self.name, exc)

    def _batch(self, items: list[tuple[np.ndarray, np.ndarray, int]]) -> list[tuple[int, str] | None]:
        """Micro-batching mode: submit every pending request, then collect them. Each answer is
        ``None`` (outputs written) or ``(status, message)``, which the C loop replies with."""
        eng, now = self.engine, time.monotonic_ns()
        hs = []
        for x, _, dl in items:
            budget = (dl - now) / 1e3 if dl > 0 else None
            if budget is not None and budget < MIN_DEADLINE_US:
                # Passed, or under the engine's smallest deadline, between the C loop's check
                # and now: a deadline miss, never the client's bad input (submit refuses a
                # budget under MIN_DEADLINE_US as an InputError, which was answered BAD_INPUT).
                hs.append(DEADLINE)
                continue
            try:
                hs.append(eng.submit(x[0].copy(), budget))  # a copy: the engine keeps it
            except InputError as exc:  # the client's sample: refused and counted as such
                hs.append(Unavailable(str(exc), Status.BAD_INPUT))
        res: list[tuple[int, str] | None] = []
        for (_, y, _), h in zip(items, hs, strict=True):
            r = eng.wait(h, y[0])
            res.append((int(r.status), r.reason) if isinstance(r, Unavailable) else None)
        return res

    # -- reporting and shutdown -------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """served, bad_payloads, deadline_missed, detached (clients gone), errors (every
        path), windows (a sliding endpoint's windows alive now: the C loop's handles, or
        ``streams`` per client with a Python Windows), and ``native`` (the fast path serves
        now), ``native_served`` / ``native_failed`` (answers of the C entry; included in
        served / errors)."""
        gate = self._gate.counters() if self._gate is not None else {
            "native_served": 0, "native_failed": 0}
        extra = {} if self.window is None else {"sliding": self.window.describe()}
        return dict(_shmloop.counters(self._mm), mode=self.mode, slots=self.nslots,
                    native=self.native, **gate, **extra)

    @property
    def served(self) -> int:
        return int(self.stats()["served"])

    @property
    def detached(self) -> int:
        """Clients that hung up or died (their slots were freed at once)."""
        return int(self.stats()["detached"])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._unwatch is not None:
            self._unwatch()
        os.eventfd_write(self._stop_fd, 1)
        self._thread.join(10)
        # only what this server created: a newer server's files (other inodes) stay
        self._unlink_if_ours("sock", self._sock_ino)
        self._unlink_if_ours("server.lock", self._lock_ino)
        try:
            if os.lstat(self.dir).st_ino == self._dir_ino:
                os.rmdir(self.dir)
        except OSError:
            pass  # a newer server's files are there, or it is gone already
        self._sock.close()
        for fd in (self._stop_fd, self._hdr_fd, self._lock_fd, self._dirfd):
            os.close(fd)
        try:
            self._mm.close()
        except BufferError:  # a view still alive somewhere: the GC unmaps it later
            pass

    def __enter__(self) -> "ShmServer":
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()


def choose_loop_core(spec: int | str | None = "auto") -> tuple[int | None, str]:
    """Where to pin the shm serving loop, and the line saying so. ``"auto"`` (or None): the
    last core of this process's affinity mask when it holds two or more (the caller's core is
    unknown here; clients are told to pin elsewhere), else unpinned; ``"none"``: unpinned; a
    core number: that core (ConfigError if it is not allowed)."""
    allowed = sorted(os.sched_getaffinity(0))
    if spec == "none":
        return None, "serving loop not pinned (--pin none)"
    if spec is None or spec == "auto":
        if len(allowed) < 2:
            return None, (f"serving loop not pinned: only CPU {allowed[0]} is available, so a "
                          f"client shares its core")
        core = allowed[-1]
    else:
        core = int(spec)
        if core not in allowed:
            raise ConfigError(f"cannot pin the serving loop to CPU {core}: this process may run "
                              f"on {allowed} only")
    others = [c for c in allowed if c != core]
    hint = (f"; pin your client elsewhere, e.g. taskset -c {others[0]}" if others
            else "; no other CPU is available for the client")
    return core, f"serving loop pinned to CPU {core}{hint}"


def native_window_of(cm: Any) -> tuple[Any, str]:
    """``cm``'s native entry (:meth:`hwbackends.target.Executor.native_entry`) when the C loop
    can keep its windows as handles, one per stream (an ABI 3 entry with ``window_new`` …
    ``window_free`` of this window's sizes: hwbackends/serve/include/hwb_native.h), and ``""``;
    or ``None`` and why not."""
    get = getattr(getattr(cm, "executor", None), "native_entry", None)
    cap = get() if callable(get) else None
    if cap is None:
        return None, f"{getattr(cm, 'variant', cm)}: its executor has no native entry (not a C model library)"
    try:
        window, step, out = _shmloop.native_windows(cap)
    except ValueError as exc:
        return None, f"{cm.variant}: {exc}"
    want = (int(cm.input.shape[0]), int(np.prod(cm.input.shape[1:])), int(np.prod(cm.output.shape)))
    if (window, step, out) != want:
        return None, (f"{cm.variant}: its native window is {window} ticks of {step} -> {out} floats, "
                      f"the model's {want[0]} ticks of {want[1]} -> {want[2]}")
    return cap, ""


@dataclass
class SlidingWindow:
    """What a sliding endpoint serves: one compiled model's windows, ``streams`` per client.
    ``entry``: the model's native entry when the loop keeps its windows as C handles
    (``native``); else the loop makes one :class:`~hwbackends.sliding.Windows` per client
    (:meth:`make_windows`) and calls its methods. ``form``: the windows' form."""

    cm: Any
    streams: int
    length: int
    step_shape: tuple[int, ...]
    form: str
    entry: Any
    native_reason: str

    @classmethod
    def of(cls, engine: Engine, *, mode: str, streams: int, native: bool) -> "SlidingWindow":
        """The windows of ``engine``'s serving model, or an HwbError saying why it has none."""
        if mode != "direct":
            raise ConfigError("a sliding endpoint answers each tick in its polling thread: it "
                              "needs mode='direct' (hwb serve --preset single, --shm-mode direct)")
        n = check_streams(streams)
        cm = engine.versions.active.plan.slot_for(1).backend
        if not callable(getattr(cm, "sliding", None)):
            raise ConfigError("a sliding endpoint serves one compiled model (a router strategy "
                              "or a packed multi-IO model has no window); serve MODEL -t TARGET")
        length, step = step_shapes(cm)  # UnsupportedError (an HwbError) for a model without one
        entry, why = native_window_of(cm) if native else (None, "turned off (native=False)")
        # the windows' form, from one probe (a target that refuses its windows says so here)
        form = cm.sliding(streams=1, auto_prepare=False).form
        return cls(cm, n, length, tuple(step), form, entry, why)

    @property
    def native(self) -> bool:
        return self.entry is not None

    @property
    def variant(self) -> str:
        return str(getattr(self.cm, "variant", "the model"))

    def make_windows(self) -> Any:
        """One client's windows (the Python path; the loop calls it on the client's first tick)."""
        return self.cm.sliding(streams=self.streams, auto_prepare=False)

    def loop_args(self) -> tuple[Any, ...]:
        """``_shmloop.serve``'s ``sliding``: the native entry, or the Windows' maker."""
        if self.entry is not None:
            return (self.length, self.streams, self.entry)
        return (self.length, self.streams, None, self.make_windows)

    def describe(self) -> dict[str, Any]:
        return {"window": self.length, "tick_shape": list(self.step_shape), "form": self.form,
                "streams": self.streams, "loop": "native" if self.native else "python",
                **({"why_python": self.native_reason} if not self.native else {})}


def native_entry_of(plan: Any) -> tuple[Any, str]:
    """The native entry (capsule) the shm loop may call for one model version, and ``""``;
    or ``None`` and why not. Only a batch-1 slot whose backend is a compiled model (it has an
    ``executor``) whose executor offers one: a router strategy chooses per request, a static
    batch > 1 pads in Python, a multi-IO model is packed in Python."""
    slot = plan.slot_for(1)
    if slot.size != 1:
        return None, f"the serving backend runs batch {slot.size} (padded in Python)"
    get = getattr(getattr(slot.backend, "executor", None), "native_entry", None)
    if get is None:
        return None, "the serving backend is not a compiled model (a router strategy, a packed model)"
    cap = get()
    if cap is None:
        return None, f"{slot.variant}: its executor has no native entry"
    return cap, ""


def deny_same_user_inspection() -> bool:
    """Mark this process non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``, as ssh-agent does): other
    processes of the same user can then neither ptrace it nor open its ``/proc/PID/fd`` and
    ``/proc/PID/mem`` — the only ways a same-user client could reach other clients' slots.
    ``hwb serve --shm`` calls it; a library user serving from a process of their own decides.
    Returns whether it took effect. No core dumps afterwards."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        return False


def _raise_nofile(need: int) -> None:
    """Raise the soft descriptor limit towards the hard one when ``need`` more may be used."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = soft + need if hard == resource.RLIM_INFINITY else min(hard, soft + need)
    if soft != resource.RLIM_INFINITY and want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass


_ATTACH_ERRORS = {
    Status.E_NOENT: "no shared-memory endpoint {name!r} for uid {uid}; is the server running "
             "(hwb serve --shm {name}) as that user?",
    Status.E_ACCESS: "shared-memory endpoint {name!r}: permission denied — endpoints are owner-only "
              "unless the server names a group (--shm-group) you belong to",
    Status.E_SLOTS_FULL: "all slots of {name!r} are taken; start the server with more slots (--shm-slots)",
    Status.E_VERSION: "shared-memory endpoint {name!r} speaks another protocol version; use the "
               "hwbackends (and hwb_shm.h) of the server",
    Status.E_DTYPE: "shared-memory endpoint {name!r} does not serve float32",
    Status.E_SHAPE: "shared-memory endpoint {name!r} has other input/output sizes than expected",
    Status.E_NOT_HWB: "{name!r} is not an hwb shared-memory endpoint (what answered does not speak "
               "its protocol)",
    Status.E_OWNER: "shared-memory endpoint {name!r}: refused — its directory, or the process serving "
             "it, does not belong to uid {uid} (or the directory is writable by others). Someone "
             "else may have planted it: check `ls -ld {root} {root}/{name}`; remove it if it is "
             "not yours, or set HWB_SHM_DIR to a directory of your own",
    Status.E_NOT_RESPONDING: "shared-memory endpoint {name!r} accepted the connection but sent no "
                      "hello in time; is its server stuck?",
    Status.E_NAME: "bad shm endpoint name {name!r}: use [A-Za-z0-9._-]",
}


def _deadline_ns(deadline_us: float | None) -> int:
    """A call's relative deadline in ns (0: none); InputError for a bad one."""
    if deadline_us is None:
        return 0
    if deadline_us > 0 and math.isfinite(deadline_us):
        return max(1, int(deadline_us * 1e3))
    raise InputError(f"deadline_us must be a positive finite number of µs or None, "
                     f"got {deadline_us!r}")


def _stream_id(stream: Any) -> int:
    """A stream id the protocol can carry (the server checks its range), else InputError."""
    if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)) or not 0 <= stream < 2**32:
        raise InputError(f"stream must be a whole number 0 … 2**32-1 (the server says its range); "
                         f"got {type(stream).__name__} {stream!r}")
    return int(stream)


class ShmClient:
    """One slot of a :class:`ShmServer`'s segment, for one thread of a client process.
    ``owner``: the server's user (name or uid; default this user)."""

    def __init__(self, name: str, *, owner: int | str | None = None, timeout_s: float = 5.0,
                 spin_us: float = 50.0):
        native = _shmloop
        self.name = name
        uid = _uid_of(owner)
        try:
            self._c = native.Client(name, uid, 0, 0, int(spin_us * 1e3), int(timeout_s * 1e9))
        except OSError as exc:
            rc = exc.args[0] if exc.args and isinstance(exc.args[0], int) else Status.E_SYS
            tmpl = _ATTACH_ERRORS.get(rc, "cannot attach to shared-memory endpoint {name!r}: {err}")
            raise ConfigError(tmpl.format(name=name, uid=uid, err=exc,
                                           root=runtime_root(uid))) from None
        info = self._c.info()
        self.slot: int = info["slot"]
        self.in_shape: tuple[int, ...] = info["in_shape"]
        self.out_shape: tuple[int, ...] = info["out_shape"]
        self.server_pid: int = info["server_pid"]
        #: A sliding endpoint's window length in ticks (each request is then one tick, of
        #: ``in_shape``); 0 for an endpoint that takes whole inputs.
        self.window: int = info["window"] if info["sliding"] else 0
        #: A sliding endpoint's windows for this client (stream ids 0 … streams-1: this
        #: client's own, never another's); 0 for an endpoint that takes whole inputs.
        self.streams: int = info["streams"]
        self._in_spec = TensorSpec("x", self.in_shape)
        self._call = self._c.call

    def try_predict_into(self, x: np.ndarray, out: np.ndarray,
                         deadline_us: float | None = None, *, reset: bool = False) -> bool | Unavailable:
        """One sample (float32, C-contiguous, the endpoint's element count; for a sliding
        endpoint one tick) → ``out``; ``True`` or :class:`Unavailable` (deadline, server gone,
        …). A sample the server refuses (NaN/Inf) or a wrong-size array raises
        :class:`InputError`. ``reset``: a sliding endpoint empties its window before this
        tick (a new session)."""
        dl = _deadline_ns(deadline_us)
        rc = self._call(x, out, dl, _shmloop.FLAG_RESET) if reset else self._call(x, out, dl)
        return True if rc == _OK else self._failed(rc, x, out)

    def try_push_into(self, stream: int, x_t: np.ndarray, out: np.ndarray,
                      deadline_us: float | None = None, *, reset: bool = False) -> bool | Unavailable:
        """A sliding endpoint: one tick ``x_t`` (float32, C-contiguous, ``in_shape``) into this
        client's window ``stream`` (0 … :attr:`streams` - 1), its answer into ``out``;
        ``True`` or :class:`Unavailable` (``hwb_shm_push``). ``reset``: empty that window
        before the tick. A stream id out of range, like a bad tick, raises
        :class:`InputError` with the server's message."""
        rc = self._call(x_t, out, _deadline_ns(deadline_us), _shmloop.FLAG_RESET if reset else 0,
                        _stream_id(stream))
        return True if rc == _OK else self._failed(rc, x_t, out)

    def push(self, stream: int, x_t: Any, deadline_us: float | None = None, *,
             reset: bool = False) -> np.ndarray | Unavailable:
        """:meth:`try_push_into` with a new output array: the answer, or :class:`Unavailable`."""
        x = as_sample(x_t, self._in_spec, "pass", where=f"shm endpoint {self.name!r} (stream {stream})")
        out = np.empty(self.out_shape, np.float32)
        r = self.try_push_into(stream, np.ascontiguousarray(x, np.float32), out, deadline_us,
                               reset=reset)
        return out if r is True else r

    def reset(self, deadline_us: float | None = None, *, stream: int = 0) -> bool | Unavailable:
        """Empty one of a sliding endpoint's windows (this client's ``stream``; zero-filled, as
        at the start): ``True`` or :class:`Unavailable`; InputError from an endpoint that
        keeps no window, or for a stream id out of range."""
        rc = self._c.reset(_deadline_ns(deadline_us), _stream_id(stream))
        return True if rc == _OK else self._failed(rc, None, None)

    def _failed(self, rc: int, x: Any, out: Any) -> Unavailable:
        native = _shmloop
        if rc in (native.RC_BAD_BUFFER, native.RC_BAD_BUFFER - 1):
            which, a = ("x", x) if rc == native.RC_BAD_BUFFER else ("out", out)
            shape = self.in_shape if which == "x" else self.out_shape
            tick = ""
            if which == "x" and self.window:
                tick = (f" — this endpoint is sliding: send one tick (it keeps the window of "
                        f"{self.window} ticks)")
            raise InputError(f"shm endpoint {self.name!r}: {which} must be a float32 C-contiguous "
                             f"array with {int(np.prod(shape))} elements (shape {shape}), got "
                             f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}"
                             f"{tick}")
        if rc == native.RC_BUSY:
            raise ConfigError(f"ShmClient {self.name!r} is in use by another thread: a client is "
                              f"one slot for one thread; give each thread its own ShmClient")
        try:
            st = Status(rc)
        except ValueError:  # a server newer than this client: not OK, so no answer this tick
            return Unavailable(f"shm status {rc}: {_shmloop.strerror(rc)}")
        if st is Status.BAD_INPUT:
            raise InputError(f"shm endpoint {self.name!r}: {self._c.message()}")
        if st is Status.E_CLOSED:
            raise ConfigError("this ShmClient is closed")
        if st in (Status.DEADLINE, Status.E_TIMEOUT):  # the server's miss or the client's wait
            return DEADLINE
        if st is Status.UNAVAILABLE:
            return Unavailable(self._c.message() or st.reason, st)
        return Unavailable.of(st)  # breaker-open, engine-stopped, server-gone, ...

    def predict(self, x: Any, deadline_us: float | None = None, *,
                reset: bool = False) -> np.ndarray | Unavailable:
        """Outputs for one sample (for a sliding endpoint: one tick; ``reset`` empties its
        window first) as a new array, or :class:`Unavailable`."""
        where = f"shm endpoint {self.name!r}" + (" (sliding: one tick)" if self.window else "")
        x = as_sample(x, self._in_spec, "pass", where=where)
        out = np.empty(self.out_shape, np.float32)
        r = self.try_predict_into(np.ascontiguousarray(x, np.float32), out, deadline_us, reset=reset)
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
