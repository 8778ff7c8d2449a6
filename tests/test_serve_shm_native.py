"""The shm server's native fast path: a cpu.native variant served in direct mode is
run by the C poll loop through the executor's native entry, without the GIL. Its answers,
statuses and counters are the Python path's; a swap to a variant without an entry (LiteRT)
and the rollback switch paths; a C entry that fails gives an error status, never an answer;
an ABI 1 entry (predict only) is still served natively, a newer ABI or a struct shorter than
its ABI is refused (hwb_native.h); the C++ client (examples/shm_strategy.cpp) gets the
model's own bits."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import native_entries
import numpy as np
import pytest

from hwbackends.errors import InputError
from hwbackends.serve import Engine, EngineConfig
from hwbackends.serve.request import Status
from hwbackends.serve.shm import ShmClient, ShmServer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="cpu.native needs a C compiler")


@pytest.fixture(scope="module")
def native_cm(compiled):
    return compiled("signal", "cpu.native")


@pytest.fixture(scope="module")
def xs(zoo_model) -> np.ndarray:
    return np.ascontiguousarray(zoo_model("signal").validation_data[:300], dtype=np.float32)


@pytest.fixture
def engine(native_cm):
    eng = Engine(native_cm, EngineConfig.preset("single", warmup=2)).start()
    yield eng
    eng.stop()


def _answers(c: ShmClient, xs: np.ndarray) -> np.ndarray:
    return np.stack([c.predict(x) for x in xs])


def test_native_entry_is_offered_by_cpu_native_only(native_cm, compiled):
    cap = native_cm.executor.native_entry()
    assert type(cap).__name__ == "PyCapsule" and "hwbackends.native_entry" in repr(cap)
    assert compiled("signal", "cpu.litert").executor.native_entry() is None  # the default


def test_native_path_answers_are_the_python_paths_bit_for_bit(engine, native_cm, xs):
    with ShmServer(engine, slots=2) as fast, ShmServer(engine, slots=2, native=False) as slow:
        assert fast.native and fast.native_reason == ""
        assert not slow.native and "native=False" in slow.native_reason
        with ShmClient(fast.name) as a, ShmClient(slow.name) as b:
            ya, yb = _answers(a, xs), _answers(b, xs)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(ya, native_cm.predict(xs).reshape(ya.shape))
        sa, sb = fast.stats(), slow.stats()
    assert sa["native_served"] == sa["served"] == len(xs) and sa["errors"] == 0
    assert sb["native_served"] == 0 and sb["served"] == len(xs)


def test_bad_input_and_deadline_statuses_are_the_same_both_ways(engine, xs):
    bad = []
    for v in (np.nan, np.inf, -np.inf):
        x = xs[0].copy()
        x[5] = v
        bad.append(x)
    with ShmServer(engine, slots=2) as fast, ShmServer(engine, slots=2, native=False) as slow:
        assert fast.native and not slow.native
        msgs = {}
        for srv in (fast, slow):
            with ShmClient(srv.name) as c:
                got = []
                for x in bad:
                    with pytest.raises(InputError) as ei:
                        c.predict(x)
                    got.append(str(ei.value).split(": ", 1)[1])  # past the endpoint's name
                # a budget no server meets: the deadline status (the server's or the wait's)
                r = c.predict(xs[1], deadline_us=0.001)
                assert not isinstance(r, np.ndarray) and r.status is Status.DEADLINE
                assert isinstance(c.predict(xs[1]), np.ndarray)  # the slot still serves
                msgs[srv.name] = got
        assert msgs[fast.name] == msgs[slow.name]
        assert "NaN or Inf (feature 5)" in msgs[fast.name][0]
        sa, sb = fast.stats(), slow.stats()
    for k in ("served", "bad_payloads", "errors"):
        assert sa[k] == sb[k], (k, sa, sb)
    assert sa["bad_payloads"] == 3 and sa["native_served"] == sa["served"] >= 1


def test_swap_and_rollback_switch_between_native_and_python_paths(engine, native_cm, compiled, xs):
    litert = compiled("signal", "cpu.litert")
    with ShmServer(engine, slots=2) as srv, ShmClient(srv.name) as c:
        assert srv.native
        engine.swap(litert, tolerance=None)
        assert not srv.native and "no native entry" in srv.native_reason
        y = _answers(c, xs[:50])
        np.testing.assert_array_equal(y, litert.predict(xs[:50]).reshape(y.shape))
        n_native = srv.stats()["native_served"]
        engine.rollback()
        assert srv.native
        y = _answers(c, xs[:50])
        np.testing.assert_array_equal(y, native_cm.predict(xs[:50]).reshape(y.shape))
        st = srv.stats()
        assert st["native_served"] == n_native + 50 and st["served"] == n_native + 100


# Entries of our own (tests/native_entries.py, C over hwb_native.h): one that fails (returns 7
# after scribbling on the outputs), ones the loop must refuse, an ABI 1 copy of the real one.
@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> Any:
    return native_entries.build(tmp_path_factory.mktemp("entries"))


def test_a_failing_entry_answers_unavailable_never_its_output(engine, native_cm, faulty, xs,
                                                             monkeypatch):
    monkeypatch.setattr(native_cm.executor, "native_entry", lambda: faulty.fails)
    with ShmServer(engine, slots=2) as srv, ShmClient(srv.name) as c:
        assert srv.native
        out = np.full(c.out_shape, -1.0, np.float32)
        r = c.try_predict_into(xs[0], out)
        assert r is not True and r.status is Status.UNAVAILABLE
        assert "native entry returned 7" in r.reason
        assert out[0] == -1.0  # the scribble never reached the client
        st = srv.stats()
    assert st["native_failed"] == 1 and st["errors"] == 1 and st["served"] == 0


@pytest.mark.parametrize("which, why", [
    ("wrong_size", "31 -> 1"), ("newer_abi", "native entry of ABI 4 (128 bytes)"),
    ("short_struct", "native entry of ABI 2 (32 bytes)")])
def test_an_entry_the_loop_cannot_call_keeps_the_python_path(engine, native_cm, faulty, xs,
                                                             monkeypatch, which, why):
    monkeypatch.setattr(native_cm.executor, "native_entry", lambda: getattr(faulty, which))
    with ShmServer(engine, slots=2) as srv, ShmClient(srv.name) as c:
        assert not srv.native and why in srv.native_reason, srv.native_reason
        y = _answers(c, xs[:20])
        np.testing.assert_array_equal(y, native_cm.predict(xs[:20]).reshape(y.shape))
        assert srv.stats()["native_served"] == 0


def test_an_abi1_entry_is_still_served_natively(engine, native_cm, faulty, xs, monkeypatch):
    # an artifact built before ABI 2 offers predict only: the whole-input loop still calls it
    real = native_cm.executor.native_entry()
    old = faulty.abi1_of(real)
    assert faulty.fields(old)["abi"] == 1 and faulty.fields(real)["abi"] >= 2
    monkeypatch.setattr(native_cm.executor, "native_entry", lambda: old)
    with ShmServer(engine, slots=2) as srv, ShmClient(srv.name) as c:
        assert srv.native, srv.native_reason
        y = _answers(c, xs[:40])
        assert srv.stats()["native_served"] == 40
    np.testing.assert_array_equal(y, native_cm.predict(xs[:40]).reshape(y.shape))


def test_batch_mode_and_routers_keep_the_python_path(native_cm):
    eng = Engine(native_cm, EngineConfig.preset("latency", warmup=2)).start()
    try:
        with ShmServer(eng, slots=2) as srv:
            assert srv.mode == "batch" and not srv.native and "batch mode" in srv.native_reason
    finally:
        eng.stop()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the C++ example")
def test_cpp_client_against_the_native_variant(engine, native_cm, xs, tmp_path):
    from hwbackends.serve.shm import INCLUDE_DIR

    exe = tmp_path / "shm_strategy"
    subprocess.run(["g++", "-O2", "-std=c++17", "-Wall", "-Werror", f"-I{INCLUDE_DIR}",
                    str(ROOT / "examples" / "shm_strategy.cpp"), "-o", str(exe)],
                   check=True, timeout=120)
    xs.tofile(tmp_path / "in.f32")
    with ShmServer(engine, slots=2) as srv:
        assert srv.native
        r = subprocess.run([str(exe), srv.name, "predict", str(tmp_path / "in.f32"),
                            str(tmp_path / "out.f32")], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        cpp = np.fromfile(tmp_path / "out.f32", np.float32).reshape(len(xs), 1)
        np.testing.assert_array_equal(cpp, native_cm.predict(xs).reshape(cpp.shape))
        r = subprocess.run([str(exe), srv.name, "bench", "2000"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        stats = json.loads(r.stdout)
        assert stats["errors"] == 0 and stats["n"] == 1900
        st = srv.stats()
    assert st["native_served"] == st["served"] == len(xs) + 2000 and st["errors"] == 0


_TIMED_CLIENT = """
import sys, time
import numpy as np
from hwbackends.serve.shm import ShmClient
with ShmClient(sys.argv[1]) as c:
    x, o = np.zeros(c.in_shape, np.float32), np.empty(c.out_shape, np.float32)
    assert c.try_predict_into(x, o) is True
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    for _ in range(100):
        assert c.try_predict_into(x, o) is True
    print(time.perf_counter() - t0, flush=True)
"""


def _calls_while_the_gil_is_held(srv: ShmServer, hold_s: float) -> float:
    """Seconds a client process takes for 100 calls while this process holds the GIL for
    ``hold_s`` (a libc sleep through ctypes.PyDLL, which keeps the GIL)."""
    import ctypes
    import os

    p = subprocess.Popen([sys.executable, "-c", _TIMED_CLIENT, srv.name], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    libc = ctypes.PyDLL(None)  # its calls keep the GIL
    try:
        assert p.stdout.readline().strip() == "ready"
        # "go" is written with the GIL already taken and kept until the sleep ends: no switch
        # interval elapses between the two calls, so the Python path's handler cannot answer
        # in between (on a fast machine it had answered all 100 calls there: 0.3 ms)
        switch = sys.getswitchinterval()
        sys.setswitchinterval(60.0)
        try:
            assert libc.write(p.stdin.fileno(), b"go\n", 3) == 3
            libc.usleep(int(hold_s * 1e6))
        finally:
            sys.setswitchinterval(switch)
        out, _ = p.communicate(timeout=60)
    finally:
        p.kill()
    return float(out.strip())


def test_the_native_path_serves_while_python_holds_the_gil(engine):
    hold = 1.0
    with ShmServer(engine, slots=2) as fast, ShmServer(engine, slots=2, native=False) as slow:
        t_fast = _calls_while_the_gil_is_held(fast, hold)
        t_slow = _calls_while_the_gil_is_held(slow, hold)
        assert fast.stats()["native_served"] == 101 and slow.stats()["native_served"] == 0
    # the fast path answered while the GIL was held (its loop never asked for it); the Python
    # path's first call waited for it (the margins leave room for a loaded machine)
    assert t_fast < 0.3 < t_slow, (t_fast, t_slow)
