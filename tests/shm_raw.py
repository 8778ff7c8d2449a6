"""Raw access to the shm protocol (hwb_shm.h), for tests that play a misbehaving client or a
planted server: no hwbackends client code involved, only the socket and the two memfds. The
constants and field offsets are the C extension's (offsetof on hwb_shm.h's structs), never
numbers of our own."""
from __future__ import annotations

import mmap
import os
import socket
import struct
import threading
from pathlib import Path

from hwbackends.serve import _shmloop

MAGIC, VERSION = _shmloop.MAGIC, _shmloop.VERSION
HDR, CTL = _shmloop.HEADER_BYTES, _shmloop.SLOT_CTL  # header bytes, slot control bytes
HELLO = struct.Struct("=QIiIIQ")  # magic, version, status, slot_index, slot_bytes, generation
assert HELLO.size == _shmloop.HELLO_BYTES
H, S = _shmloop.HEADER_OFFSETS, _shmloop.SLOT_OFFSETS
DEADLINE_AT = S["deadline_ns"]


def slot_bytes(fi: int, fo: int) -> int:
    return int(_shmloop.slot_bytes(fi, fo))


class RawClient:
    """Connects like hwb_shm.h does, but maps what it receives as an attacker would try to:
    the header writable if the kernel lets it, its own slot writable."""

    def __init__(self, endpoint_dir: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(str(endpoint_dir / "sock"))
        msg, fds, _, _ = socket.recv_fds(self.sock, HELLO.size, 2)
        self.magic, self.version, self.status, self.index, self.slot_bytes, _ = HELLO.unpack(msg)
        self.hdr_fd, self.slot_fd = fds
        self.header = mmap.mmap(self.hdr_fd, HDR, prot=mmap.PROT_READ)
        self.slot = mmap.mmap(self.slot_fd, self.slot_bytes)
        self.in_count, = struct.unpack_from("I", self.header, H["in_count"])
        self.out_count, = struct.unpack_from("I", self.header, H["out_count"])

    def request(self, values, count: int | None = None, timeout: float = 5.0) -> tuple[int, str, bytes]:
        """One request written by hand; (status, message, output bytes)."""
        import time
        raw = bytes(memoryview(values).cast("B"))
        self.slot[CTL:CTL + len(raw)] = raw
        struct.pack_into("I", self.slot, S["in_count"], self.in_count if count is None else count)
        struct.pack_into("q", self.slot, DEADLINE_AT, 0)
        seq = (struct.unpack_from("I", self.slot, S["req"])[0] + 1) & 0xFFFFFFFF
        struct.pack_into("I", self.slot, S["req"], seq)
        self.sock.send(b"\x01")  # the doorbell, whether or not the server sleeps
        t0 = time.time()
        while struct.unpack_from("I", self.slot, S["resp"])[0] != seq and time.time() - t0 < timeout:
            time.sleep(0.0005)
        status, = struct.unpack_from("I", self.slot, S["status"])
        n, = struct.unpack_from("I", self.slot, S["msg_len"])
        out = bytes(self.slot[CTL + 4 * self.in_count: CTL + 4 * (self.in_count + self.out_count)])
        msg = bytes(self.slot[S["msg"]:S["msg"] + min(n, CTL - S["msg"])])
        return status, msg.decode(errors="replace"), out

    def close(self) -> None:
        self.header.close()
        self.slot.close()
        os.close(self.hdr_fd)
        os.close(self.slot_fd)
        self.sock.close()


def fake_header(*, version: int = VERSION, dtype: int = 1, fi: int = 32, fo: int = 1,
                uid: int | None = None, pid: int | None = None) -> bytes:
    h = bytearray(HDR)
    for field, fmt, value in (("magic", "Q", MAGIC), ("version", "I", version), ("header_bytes", "I", HDR),
                              ("nslots", "I", 1), ("slot_bytes", "I", slot_bytes(fi, fo)),
                              ("dtype", "I", dtype), ("in_count", "I", fi), ("out_count", "I", fo),
                              ("in_ndim", "I", 1), ("out_ndim", "I", 1), ("in_shape", "I", fi),
                              ("out_shape", "I", fo),
                              ("owner_uid", "I", os.geteuid() if uid is None else uid),
                              ("server_pid", "i", os.getpid() if pid is None else pid),
                              ("state", "I", 1)):  # state 1: running
        struct.pack_into("=" + fmt, h, H[field], value)
    return bytes(h)


class FakeServer:
    """A planted endpoint: listens on DIR/sock and answers every connection with a hello and
    the given header (an impostor, or an endpoint speaking another version). Runs in a thread
    of the calling process, so its peer credentials are this process's."""

    def __init__(self, endpoint_dir: Path, *, hello_version: int = VERSION,
                 header: bytes | None = None):
        endpoint_dir.mkdir(parents=True, exist_ok=True)
        self.path = endpoint_dir / "sock"
        self.path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.hello_version, self.header = hello_version, header or fake_header()
        self.accepted = 0
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            h = os.memfd_create("fake-header")
            s = os.memfd_create("fake-slot")
            os.write(h, self.header)
            fi, = struct.unpack_from("I", self.header, H["in_count"])
            fo, = struct.unpack_from("I", self.header, H["out_count"])
            sb = slot_bytes(fi, fo)
            os.ftruncate(s, sb)
            socket.send_fds(conn, [HELLO.pack(MAGIC, self.hello_version, 0, 0, sb, 0)], [h, s])
            os.close(h)
            os.close(s)
            self._conns = getattr(self, "_conns", []) + [conn]

    def close(self) -> None:
        self._stop = True
        self._t.join(5)
        self.sock.close()
        self.path.unlink(missing_ok=True)
