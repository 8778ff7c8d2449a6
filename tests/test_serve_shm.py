"""Shared-memory endpoint: in-process and cross-process round trips against a real compiled
model, batching across clients, a client killed mid-request, a server that dies, stale
servers, owner-only files, another user refused, stray writes, rogue payloads. The attacks
on the header, other slots and planted endpoints are in test_shm_trust.py."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hwbackends.errors import ConfigError, InputError
from hwbackends.serve import Engine, EngineConfig, Unavailable
from hwbackends.serve.shm import ShmClient, ShmServer, endpoint_dir, runtime_root
from hwbackends.specs import TensorSpec

sys.path.insert(0, str(Path(__file__).parent))
from as_user import AsUser  # noqa: E402
from shm_raw import FakeServer, RawClient, S, fake_header  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def litert(compiled):
    return compiled("signal", "cpu.litert")


@pytest.fixture(scope="module")
def xs(zoo_model):
    return np.ascontiguousarray(zoo_model("signal").validation_data[:64], dtype=np.float32)


class Linear:
    """A numpy model for transport tests: exact, cheap, its own reference."""
    input, output, batch_size = TensorSpec("x", (32,)), TensorSpec("y", (1,)), 1
    w = np.linspace(-1, 1, 32, dtype=np.float32)[:, None]

    def predict_into(self, x, out):
        np.matmul(x, self.w, out=out)


@pytest.fixture
def server(litert):
    eng = Engine(litert, EngineConfig.preset("latency")).start()
    srv = ShmServer(eng, slots=2, reap_every_s=0.05)
    yield srv
    srv.close()
    eng.stop()
    assert not srv.dir.exists()


@pytest.fixture
def linear_server():
    eng = Engine(Linear(), EngineConfig.preset("single")).start()
    srv = ShmServer(eng, slots=4, reap_every_s=0.05)
    yield srv
    srv.close()
    eng.stop()


def _py(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _poke(addr: int, fmt: str, value: int) -> None:
    """A stray write into this process's own memory (as a buggy strategy could do)."""
    ctypes.memmove(addr, struct.pack(fmt, value), struct.calcsize(fmt))


def test_in_process_round_trip_and_errors(server, litert, xs):
    assert server.mode == "batch"  # the latency preset micro-batches
    with ShmClient(server.name) as c:
        assert c.in_shape == (32,) and c.out_shape == (1,)
        out = np.empty(1, np.float32)
        for x in xs[:50]:
            assert c.try_predict_into(x, out) is True
            np.testing.assert_array_equal(out, litert.predict(x))
        with pytest.raises(InputError, match="NaN"):
            c.predict(np.full(32, np.nan, np.float32))
        with pytest.raises(InputError, match="shape"):
            c.predict(np.zeros(3, np.float32))
        with pytest.raises(InputError, match="float32 C-contiguous"):
            c.try_predict_into(np.zeros(32), out)  # float64: refused locally, nothing sent
        with pytest.raises(InputError, match="deadline_us"):
            c.try_predict_into(xs[0], out, deadline_us=float("nan"))
        r = c.predict(xs[0], deadline_us=0.001)
        assert isinstance(r, Unavailable) and r.reason == "deadline"
        np.testing.assert_array_equal(c.predict(xs[1]), litert.predict(xs[1]))  # still serving
        with ShmClient(server.name):
            with pytest.raises(ConfigError, match="slots .* are taken"):
                ShmClient(server.name)
    st = server.stats()
    # the 1 ns call gave up at once; the server counts it only if it saw it before the next
    # call superseded it (protocol 3: a call publishes one past what stands in req)
    assert st["bad_payloads"] == 1 and st["deadline_missed"] <= 1 and st["served"] >= 51
    with pytest.raises(ConfigError, match="no shared-memory endpoint"):
        ShmClient("hwb-no-such-endpoint")


def test_direct_mode_runs_in_the_polling_thread(litert, xs):
    eng = Engine(litert, EngineConfig.preset("single")).start()
    try:
        with ShmServer(eng, slots=1) as srv, ShmClient(srv.name) as c:
            assert srv.mode == "direct"
            out = np.empty(1, np.float32)
            for x in xs:
                assert c.try_predict_into(x, out) is True
                np.testing.assert_array_equal(out, litert.predict(x))
            assert eng.metrics.snapshot()["batches"] == 0  # nothing crossed the engine's queue
            assert srv.served == len(xs)
    finally:
        eng.stop()


CLIENT = """
import json, sys, numpy as np
from hwbackends.serve.shm import ShmClient
xs = np.load(sys.argv[2])
with ShmClient(sys.argv[1]) as c:
    out = [c.predict(x).tolist() for x in xs]
print(json.dumps(out))
"""


def test_cross_process_clients_are_batched_together(server, litert, xs, tmp_path):
    np.save(tmp_path / "xs.npy", xs)
    procs = [_py(CLIENT, server.name, str(tmp_path / "xs.npy")) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        np.testing.assert_allclose(np.array(json.loads(out)), litert.predict(xs), atol=1e-6)
    assert server.served >= 128


ORDER = """
import sys, numpy as np
from hwbackends.serve.shm import ShmClient
rng = np.random.default_rng(int(sys.argv[2]))
w = np.linspace(-1, 1, 32, dtype=np.float32)[:, None]
bad = 0
out = np.empty(1, np.float32)
with ShmClient(sys.argv[1]) as c:
    for i in range(int(sys.argv[3])):
        x = rng.standard_normal(32).astype(np.float32)
        assert c.try_predict_into(x, out) is True
        bad += not np.array_equal(out, x @ w)
print(bad)
"""


def test_every_answer_is_its_own_requests_across_processes(linear_server):
    """The payload/sequence ordering (release/acquire in hwb_shm.h): 3 processes, every output
    checked against its own input. The protocol does not rely on x86 store order (it no longer
    refuses other CPUs); on x86 this cannot show a missing fence, it shows no lost or crossed
    answer."""
    procs = [_py(ORDER, linear_server.name, str(seed), "3000") for seed in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.strip() == "0"


def test_files_are_owner_only(linear_server):
    d = linear_server.dir
    assert d.parent == runtime_root()
    assert os.stat(d.parent).st_mode & 0o077 in (0, 0o010)  # 0710 once a group endpoint ran
    assert oct(os.stat(d).st_mode & 0o777) == "0o700"
    assert sorted(os.listdir(d)) == ["server.lock", "sock"]
    for f in ("sock", "server.lock"):
        st = os.lstat(d / f)
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid(), f


def test_a_named_group_opens_the_endpoint_to_it():
    eng = Engine(Linear(), EngineConfig.preset("single")).start()
    try:
        with ShmServer(eng, slots=1, group=os.getegid()) as srv:
            assert os.stat(srv.dir.parent).st_mode & 0o777 == 0o710  # group may traverse only
            assert os.stat(srv.dir).st_mode & 0o777 == 0o750
            assert os.lstat(srv.dir / "sock").st_mode & 0o777 == 0o660
            assert os.lstat(srv.dir / "sock").st_gid == os.getegid()
    finally:
        eng.stop()
        os.chmod(runtime_root(), 0o700)


def test_directories_others_can_write_are_refused_not_chmodded(tmp_path, monkeypatch):
    """The endpoint's directories follow the store's trust rules (trust.private_dir): a
    per-user root its group can write, or an owner-only endpoint's leftover directory that
    others can read, is refused with the fix; nothing is chmod'ed behind the user's back."""
    root = tmp_path / "root"
    monkeypatch.setenv("HWB_SHM_DIR", str(root))
    root.mkdir(mode=0o700)
    os.chmod(root, 0o770)
    eng = Engine(Linear(), EngineConfig.preset("single"))
    with pytest.raises(ConfigError, match=r"writable by its group.*chmod 700 .*HWB_SHM_DIR"):
        ShmServer(eng, "ep", slots=1)
    assert os.stat(root).st_mode & 0o777 == 0o770  # left as it was
    os.chmod(root, 0o700)
    (root / "ep").mkdir(mode=0o700)
    os.chmod(root / "ep", 0o750)
    with pytest.raises(ConfigError, match=r"open to others.*chmod 700"):
        ShmServer(eng, "ep", slots=1)
    os.chmod(root / "ep", 0o700)
    (root / "sub").mkdir(mode=0o700)
    monkeypatch.setenv("HWB_SHM_DIR", str(root / "sub" / "a" / "b"))  # missing parents: 0700
    eng.start()
    try:
        with ShmServer(eng, "ep", slots=1) as srv:
            assert os.stat(root / "sub" / "a").st_mode & 0o777 == 0o700
            assert os.stat(srv.dir).st_mode & 0o777 == 0o700
    finally:
        eng.stop()


def _attach_as_another_user(send, name: str) -> None:
    """As uid 65534 (tests/as_user.py): attach to root's endpoint, then connect by path."""
    try:
        ShmClient(name, owner=0)
        msg = "attached"
    except ConfigError as exc:
        msg = str(exc)
    try:  # by path, bypassing the client
        socket.socket(socket.AF_UNIX).connect(str(endpoint_dir(name, 0) / "sock"))
        msg += "|connected"
    except PermissionError:
        msg += "|EACCES"
    send(msg.replace("\n", " "))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become a second uid (os.setuid)")
def test_another_users_client_is_refused(linear_server):
    child = AsUser(65534, _attach_as_another_user, linear_server.name, dumpable=False)
    msg = child.line()
    assert child.finish() == 0, msg
    assert "permission denied" in msg and msg.endswith("|EACCES"), msg


HANG = """
import sys, numpy as np
from hwbackends.serve.shm import ShmClient
c = ShmClient(sys.argv[1])
print(c.slot, flush=True)
x = np.zeros(32, np.float32)
while True:
    c.predict(x)
"""


def test_a_client_killed_mid_request_frees_its_slot(server, litert, xs):
    p = _py(HANG, server.name)
    assert p.stdout.readline().strip() in ("0", "1")
    time.sleep(0.3)  # mid-stream of requests
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    t0 = time.time()
    while server.detached < 1 and time.time() - t0 < 5:
        time.sleep(0.02)
    assert server.detached == 1 and time.time() - t0 < 1  # the hang-up frees it at once
    # both slots usable again, the server still serves
    with ShmClient(server.name) as a, ShmClient(server.name) as b:
        np.testing.assert_array_equal(a.predict(xs[0]), litert.predict(xs[0]))
        np.testing.assert_array_equal(b.predict(xs[1]), litert.predict(xs[1]))


SERVER = """
import sys, time, numpy as np
sys.path.insert(0, sys.argv[1])
from test_serve_shm import Linear
from hwbackends.serve import Engine, EngineConfig
from hwbackends.serve.shm import ShmServer
eng = Engine(Linear(), EngineConfig.preset("single")).start()
srv = ShmServer(eng, slots=1)
print(srv.name, flush=True)
time.sleep(60)
"""


def test_client_sees_a_dead_server_and_a_new_server_replaces_its_files():
    p = _py(SERVER, str(Path(__file__).parent))
    name = p.stdout.readline().strip()
    assert name, p.stderr.read()
    try:
        with ShmClient(name, timeout_s=5.0) as c:
            x = np.ones(32, np.float32)
            np.testing.assert_allclose(c.predict(x), [np.linspace(-1, 1, 32).sum()], atol=1e-5)
            p.send_signal(signal.SIGKILL)
            p.wait(10)
            t0 = time.perf_counter()
            r = c.predict(x)
            assert isinstance(r, Unavailable) and r.reason == "server-gone"
            assert time.perf_counter() - t0 < 0.5  # ~10 ms futex steps between liveness checks
        assert (endpoint_dir(name) / "sock").exists()  # the dead server left its files
        eng = Engine(Linear(), EngineConfig.preset("single")).start()
        with ShmServer(eng, name, slots=1), ShmClient(name) as c:  # replaces them
            np.testing.assert_allclose(c.predict(x), [np.linspace(-1, 1, 32).sum()], atol=1e-5)
        eng.stop()
        assert not endpoint_dir(name).exists()
    finally:
        if p.poll() is None:
            p.kill()


def test_a_live_servers_name_is_refused(server, litert):
    eng = Engine(litert, EngineConfig.preset("single"))
    with pytest.raises(ConfigError, match="served by a live process"):
        ShmServer(eng, server.name)
    with ShmClient(server.name) as c:  # the live one is untouched
        assert c.in_shape == (32,)


def test_a_stale_server_never_removes_a_newer_servers_files(linear_server):
    """The old server's close() once removed a newer server's segment."""
    import shutil
    name = linear_server.name
    shutil.rmtree(linear_server.dir)  # someone wipes the directory under a live server
    eng = Engine(Linear(), EngineConfig.preset("single")).start()
    try:
        with ShmServer(eng, name, slots=1) as newer:
            linear_server.close()  # the stale one shuts down: its inodes are gone
            with ShmClient(name) as c:
                np.testing.assert_allclose(c.predict(np.ones(32, np.float32)),
                                           [np.linspace(-1, 1, 32).sum()], atol=1e-5)
            assert (newer.dir / "sock").exists()
            # the stale close() left the newer server's server.lock, so a third
            # server is still refused beside the live one
            assert (newer.dir / "server.lock").exists()
            with pytest.raises(ConfigError, match="served by a live process"):
                ShmServer(eng, name, slots=1)
    finally:
        eng.stop()


ATTACH_PLAIN = """
import sys
from multiprocessing import shared_memory
try:
    shared_memory.SharedMemory(sys.argv[1])
    print("attached")
except Exception as exc:
    print(type(exc).__name__)
"""

CRASH_IN_CLIENT = """
import sys
from hwbackends.serve import shm
class Boom(Exception): pass
real = shm.ShmClient.__init__
def init(self, *a, **k):
    real(self, *a, **k)
    raise Boom("crash inside ShmClient()")
shm.ShmClient.__init__ = init
shm.ShmClient(sys.argv[1])
"""


def test_plain_shared_memory_attach_or_a_crashing_client_leaves_the_segment(linear_server):
    """Python's resource tracker unlinked the server's segment when a process that
    attached with SharedMemory(name), or crashed inside ShmClient(), exited."""
    p = _py(ATTACH_PLAIN, linear_server.name)
    out, err = p.communicate(timeout=60)
    assert out.strip() == "FileNotFoundError", (out, err)  # not a POSIX shm name: can't attach
    p = _py(CRASH_IN_CLIENT, linear_server.name)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "crash inside ShmClient()" in err
    time.sleep(0.3)  # the resource tracker (if any) has run
    assert (linear_server.dir / "sock").exists()
    with ShmClient(linear_server.name) as c:
        assert c.predict(np.ones(32, np.float32)) is not None


def test_a_stray_write_to_the_request_counter_does_not_wedge_the_client(linear_server):
    """The client resynchronises its sequence after a timeout."""
    x = np.ones(32, np.float32)
    want = x[None] @ Linear.w
    with ShmClient(linear_server.name, timeout_s=0.5) as c:
        np.testing.assert_allclose(c.predict(x), want[0], atol=1e-5)
        addr = c._c.info()["slot_addr"]
        for word in (S["req"], S["resp"]):
            _poke(addr + word, "I", 0xDEADBEEF + word)
            results = [c.predict(x) for _ in range(3)]
            assert not isinstance(results[-1], Unavailable), results  # resynchronised
            assert sum(isinstance(r, Unavailable) for r in results) <= 1
            for r in results:
                if not isinstance(r, Unavailable):
                    np.testing.assert_allclose(r, want[0], atol=1e-5)


def test_rogue_payloads_are_refused_with_a_status_and_counted(linear_server):
    """A client writing its slot by hand (as a buggy C client could): wrong size, NaN, Inf."""
    raw = RawClient(linear_server.dir)
    try:
        before = linear_server.stats()["bad_payloads"]
        assert raw.request(np.ones(32, np.float32), 31)[1].startswith("wrong payload size")
        assert raw.request(np.ones(32, np.float32), 2**31)[1].startswith("wrong payload size")
        bad = np.ones(32, np.float32)
        bad[7] = np.inf
        st, msg, _ = raw.request(bad)
        assert st == 2 and "feature 7" in msg
        bad[7] = np.nan
        assert raw.request(bad)[0] == 2
        st, msg, out = raw.request(np.ones(32, np.float32))
        assert (st, msg) == (0, "")
        np.testing.assert_allclose(np.frombuffer(out, np.float32), np.ones(32) @ Linear.w, atol=1e-5)
        assert linear_server.stats()["bad_payloads"] == before + 4
    finally:
        raw.close()


def test_protocol_mismatches_are_refused_at_attach(tmp_path, monkeypatch):
    """Another protocol version (in the hello or the header) or dtype: refused at attach."""
    monkeypatch.setenv("HWB_SHM_DIR", str(tmp_path / "root"))
    (tmp_path / "root").mkdir(mode=0o700)
    cases = [(dict(hello_version=99), "protocol version"),
             (dict(header=fake_header(version=99)), "protocol version"),
             (dict(header=fake_header(dtype=7)), "float32")]
    for kw, match in cases:
        fake = FakeServer(tmp_path / "root" / "ep", **kw)
        try:
            with pytest.raises(ConfigError, match=match):
                ShmClient("ep")
        finally:
            fake.close()
    fake = FakeServer(tmp_path / "root" / "ep")  # a consistent one attaches
    try:
        with ShmClient("ep") as c:
            assert c.in_shape == (32,)
    finally:
        fake.close()


def test_same_process_clients_on_many_threads(linear_server):
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        out = np.empty(1, np.float32)
        with ShmClient(linear_server.name) as c:
            for _ in range(500):
                x = rng.standard_normal(32).astype(np.float32)
                if c.try_predict_into(x, out) is not True or not np.array_equal(out, x @ Linear.w):
                    errors.append(f"thread {seed}")
    ts = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert errors == []


class Probe(Linear):
    """Records whether two threads were ever inside the executor at once."""

    def __init__(self):
        self.inside = 0
        self.overlaps = 0
        self.threads: set[str] = set()

    def predict_into(self, x, out):
        self.inside += 1
        if self.inside > 1:
            self.overlaps += 1
        self.threads.add(threading.current_thread().name)
        time.sleep(20e-6)  # widen the window a second thread would need
        super().predict_into(x, out)
        self.inside -= 1


def test_direct_mode_never_runs_the_executor_beside_the_serving_thread():
    """The shm path: the polling thread and the engine's serving thread take
    turns on one executor (Engine.run_direct holds the engine's executor lock)."""
    probe = Probe()
    eng = Engine(probe, EngineConfig.preset("single", warmup=1)).start()
    stop = time.monotonic() + 1.5
    x = np.ones(32, np.float32)

    def engine_caller():
        while time.monotonic() < stop:
            assert not isinstance(eng.predict(x), Unavailable)
    try:
        with ShmServer(eng, slots=2) as srv:
            ts = [threading.Thread(target=engine_caller) for _ in range(2)]
            for t in ts:
                t.start()
            n = 0
            with ShmClient(srv.name) as c:
                while time.monotonic() < stop:
                    assert not isinstance(c.predict(x), Unavailable)
                    n += 1
            for t in ts:
                t.join(10)
        assert n > 10 and any(t.startswith("hwb-shm-") for t in probe.threads)
        assert any(t.startswith("hwb-serve-") for t in probe.threads)
        assert probe.overlaps == 0
    finally:
        eng.stop()


def test_one_client_used_from_two_threads_is_refused_not_crossed(linear_server):
    """A client is one slot: a second thread calling it while a call is in flight gets a clear
    error instead of sharing the slot (which could swap answers), and close() under a running
    call is refused instead of unmapping it."""
    gate = threading.Event()

    class Slow(Linear):
        def predict_into(self, x, out):
            gate.wait(5)
            super().predict_into(x, out)
    eng = Engine(Slow(), EngineConfig.preset("single", warmup=0)).start()
    gate.set()
    try:
        with ShmServer(eng, slots=1) as srv, ShmClient(srv.name) as c:
            gate.clear()
            x = np.ones(32, np.float32)
            first: list = []
            t = threading.Thread(target=lambda: first.append(c.predict(x)))
            t.start()
            time.sleep(0.2)  # the first call now waits inside the server
            with pytest.raises(ConfigError, match="another thread"):
                c.predict(x)
            with pytest.raises(ConfigError, match="cannot close"):
                c.close()
            gate.set()
            t.join(10)
            np.testing.assert_allclose(first[0], x @ Linear.w, atol=1e-5)
    finally:
        gate.set()
        eng.stop()
