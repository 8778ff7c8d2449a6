"""Shared-memory endpoint: in-process and cross-process round trips against a real compiled
model, batching across clients, a client killed mid-request, a server that dies."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from hwbackends.errors import ConfigError, InputError
from hwbackends.serve import Engine, EngineConfig, Unavailable
from hwbackends.serve.shm import ShmClient, ShmServer, _lock_dir

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    __import__("platform").machine().lower() not in ("x86_64", "amd64"),
    reason="the shared-memory endpoint relies on x86-64 store ordering (refuses other CPUs)")


@pytest.fixture(scope="module")
def litert(compiled):
    return compiled("signal", "cpu.litert")


@pytest.fixture(scope="module")
def xs(zoo_model):
    return np.ascontiguousarray(zoo_model("signal").validation_data[:64], dtype=np.float32)


@pytest.fixture
def server(litert):
    eng = Engine(litert, EngineConfig.preset("latency")).start()
    srv = ShmServer(eng, slots=2, reap_every_s=0.05)
    yield srv
    srv.close()
    eng.stop()
    assert not Path("/dev/shm", srv.name).exists() and not _lock_dir(srv.name).exists()


def _py(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_in_process_round_trip_and_errors(server, litert, xs):
    with ShmClient(server.name) as c:
        assert c.in_shape == (32,) and c.out_shape == (1,)
        out = np.empty(1, np.float32)
        for x in xs[:50]:
            assert c.predict_into(x, out) is True
            np.testing.assert_array_equal(out, litert.predict(x))
        with pytest.raises(InputError, match="NaN"):
            c.predict(np.full(32, np.nan, np.float32))
        with pytest.raises(InputError, match="shape"):
            c.predict(np.zeros(3, np.float32))
        r = c.predict(xs[0], deadline_us=1)
        assert isinstance(r, Unavailable) and r.reason == "deadline"
        np.testing.assert_array_equal(c.predict(xs[1]), litert.predict(xs[1]))  # still serving
        with ShmClient(server.name):
            with pytest.raises(ConfigError, match="slots .* are taken"):
                ShmClient(server.name)
    with pytest.raises(ConfigError, match="no shared-memory endpoint"):
        ShmClient("hwb-no-such-endpoint")


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
    while server.reaped < 1 and time.time() - t0 < 5:
        time.sleep(0.02)
    assert server.reaped == 1
    # both slots usable again, the server still serves
    with ShmClient(server.name) as a, ShmClient(server.name) as b:
        np.testing.assert_array_equal(a.predict(xs[0]), litert.predict(xs[0]))
        np.testing.assert_array_equal(b.predict(xs[1]), litert.predict(xs[1]))


SERVER = """
import sys, time, numpy as np
from hwbackends.serve import Engine, EngineConfig
from hwbackends.serve.shm import ShmServer
from hwbackends.specs import TensorSpec

class Linear:  # a numpy model: this test is about the transport, not a target
    input, output, batch_size = TensorSpec("x", (32,)), TensorSpec("y", (1,)), 1
    w = np.linspace(-1, 1, 32, dtype=np.float32)[:, None]
    def predict_into(self, x, out):
        np.matmul(x, self.w, out=out)

eng = Engine(Linear(), EngineConfig.preset("single")).start()
srv = ShmServer(eng, slots=1)
print(srv.name, flush=True)
time.sleep(60)
"""


def test_client_sees_a_dead_server_as_unavailable():
    p = _py(SERVER)
    name = p.stdout.readline().strip()
    try:
        with ShmClient(name, timeout_s=5.0) as c:
            x = np.ones(32, np.float32)
            np.testing.assert_allclose(c.predict(x), [np.linspace(-1, 1, 32).sum()], atol=1e-5)
            p.send_signal(signal.SIGKILL)
            p.wait(10)
            t0 = time.perf_counter()
            r = c.predict(x)
            assert isinstance(r, Unavailable) and r.reason == "server-gone"
            assert time.perf_counter() - t0 < 2.0
        # the dead server left its segment; a new server under the same name replaces it
        from hwbackends.serve.shm import _remove_stale
        _remove_stale(name)
        assert not Path("/dev/shm", name).exists() and not _lock_dir(name).exists()
    finally:
        if p.poll() is None:
            p.kill()
        import shutil
        from multiprocessing import shared_memory
        shutil.rmtree(_lock_dir(name), ignore_errors=True)
        try:
            s = shared_memory.SharedMemory(name)
            s.close()
            s.unlink()
        except FileNotFoundError:
            pass


def test_a_live_servers_name_is_refused(server, litert):
    eng = Engine(litert, EngineConfig.preset("single"))
    with pytest.raises(ConfigError, match="served by a live process"):
        ShmServer(eng, server.name)
    with ShmClient(server.name) as c:  # the live one is untouched
        assert c.in_shape == (32,)
