"""``hwb serve --shm NAME --sliding --streams N``: one window per stream id, per client. Several
clients with several streams each, their ticks interleaved, every answer checked against the
model on that stream's own window (the C loop over ABI 3 window handles of a test entry with
real per-handle state, the Python path over ``cm.sliding(streams=N)``, and the real ``hwb
serve`` process); prepares run in the loop's idle time; an id out of range is refused with
its range; a detached client's windows are freed; a hostile client writing garbage stream ids
and sizes changes nothing in another client's answers."""
from __future__ import annotations

import json
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import native_entries
import numpy as np
import pytest
from shm_raw import RawClient

from hwbackends.errors import InputError
from hwbackends.serve import Engine, EngineConfig
from hwbackends.serve.request import Status
from hwbackends.serve.shm import SLOT_OFFSETS, ShmClient, ShmServer, endpoint_dir

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="cpu.native needs a C compiler")
WINDOW, STEP = 16, 8  # zoo:lstm's window: the test entry takes the same geometry


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    return native_entries.build(tmp_path_factory.mktemp("entries"))


@pytest.fixture
def summing_engine(compiled, entries, monkeypatch):
    """An engine over zoo:lstm whose native entry is the test's ABI 3 windowed sum."""
    cm = compiled("lstm", "cpu.native")
    cap = entries.windowed_sum(WINDOW, STEP, 1)
    monkeypatch.setattr(cm.executor, "native_entry", lambda: cap)
    eng = Engine(cm, EngineConfig.preset("single", warmup=1)).start()
    yield eng
    eng.stop()


def _int_ticks(n: int, seed: int) -> np.ndarray:
    """Small whole numbers: the windowed sum is exact in float32, so answers compare exactly."""
    return np.random.default_rng(seed).integers(-5, 6, (n, STEP)).astype(np.float32)


def _schedule(clients: int, streams: int, ticks_each: int, seed: int) -> list[tuple[int, int]]:
    """(client, stream) of every tick, shuffled: each stream's ticks interleaved with the others'."""
    order = [(c, s) for c in range(clients) for s in range(streams) for _ in range(ticks_each)]
    np.random.default_rng(seed).shuffle(order)
    return order


def _wait_for(cond, timeout: float = 5.0) -> bool:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.005)
    return True


def test_clients_and_streams_interleaved_on_native_window_handles(summing_engine, entries):
    clients, streams, each = 3, 4, 40
    order = _schedule(clients, streams, each, seed=1)
    xs = _int_ticks(len(order), seed=2)
    resets = {(1, 2): 17, (0, 0): 25}  # (client, stream) -> its tick index flagged reset
    before = entries.counts()
    with ShmServer(summing_engine, slots=clients + 1, sliding=True, streams=streams) as srv:
        assert srv.native and srv.stats()["sliding"] == {
            "window": WINDOW, "tick_shape": [STEP], "form": "incremental", "streams": streams,
            "loop": "native"}
        cs = [ShmClient(srv.name) for _ in range(clients)]
        assert all(c.streams == streams and c.window == WINDOW for c in cs)
        fed: dict[tuple[int, int], list[int]] = {}
        got: dict[tuple[int, int], list[float]] = {}
        for t, (ci, s) in enumerate(order):
            k = len(fed.setdefault((ci, s), []))
            out = cs[ci].push(s, xs[t], reset=resets.get((ci, s)) == k)
            fed[(ci, s)].append(t)
            got.setdefault((ci, s), []).append(float(out[0]))
        for key, ts in fed.items():
            r = {resets[key]} if key in resets else set()
            want = native_entries.windowed_sum_reference(WINDOW, xs[ts], r)
            np.testing.assert_array_equal(np.array(got[key], np.float32), want, err_msg=str(key))
        # a reset alone of one stream: that window starts again, the client's others go on
        assert cs[2].reset(stream=1) is True
        x = xs[0]
        np.testing.assert_array_equal(cs[2].push(1, x), native_entries.windowed_sum_reference(WINDOW, x[None]))
        # one window per (client, stream) used, made on its first tick; every push prepared
        # afterwards in the loop's idle time, without another request
        assert srv.stats()["windows"] == clients * streams
        assert entries.counts()["made"] - before["made"] == clients * streams
        assert _wait_for(lambda: entries.counts()["unprepared"] == 0), entries.counts()
        c = entries.counts()
        assert c["pushes"] - before["pushes"] == len(order) + 1
        assert c["prepares"] - before["prepares"] > c["late"] - before["late"]  # most in idle time
        # a detached client's windows are freed at once; the others' stay and go on
        cs[0].close()
        assert _wait_for(lambda: srv.stats()["windows"] == (clients - 1) * streams)
        assert entries.counts()["freed"] - before["freed"] == streams
        ts = fed[(1, 3)]
        more = _int_ticks(5, seed=3)
        tail = np.stack([cs[1].push(3, m)[0] for m in more])
        np.testing.assert_array_equal(
            tail, native_entries.windowed_sum_reference(WINDOW, np.vstack([xs[ts], more]))[-5:])
        for c_ in cs[1:]:
            c_.close()
        assert _wait_for(lambda: srv.stats()["windows"] == 0)
        st = srv.stats()
        assert st["errors"] == 0 and st["bad_payloads"] == 0 and st["detached"] == clients
    assert entries.counts()["freed"] - before["freed"] == clients * streams


def test_a_new_tick_is_answered_before_the_remaining_prepares(summing_engine, entries):
    # six raw clients publish a tick at once: one poll round, six prepares queued (each slowed
    # to 40 ms). A tick arriving meanwhile waits for at most the prepare running (the loop
    # looks for requests between prepares), not for all six (240 ms).
    slow = 40e-3
    with ShmServer(summing_engine, slots=8, sliding=True, streams=2) as srv:
        raws = [RawClient(srv.dir) for _ in range(6)]
        honest = ShmClient(srv.name)
        try:
            x = _int_ticks(1, seed=11)[0]
            assert isinstance(honest.push(1, x), np.ndarray)  # its window exists: no first-use cost
            assert _wait_for(lambda: entries.counts()["unprepared"] == 0)
            entries.slow_prepare(int(slow * 1e9))
            raw_x = x.tobytes()
            for r in raws:  # publish without waiting, then one doorbell
                r.slot[SLOT_OFFSETS["in"]:SLOT_OFFSETS["in"] + len(raw_x)] = raw_x
                struct.pack_into("I", r.slot, SLOT_OFFSETS["in_count"], STEP)
                struct.pack_into("I", r.slot, SLOT_OFFSETS["req"], 1)
            raws[0].sock.send(b"\x01")
            assert _wait_for(lambda: all(struct.unpack_from("I", r.slot, SLOT_OFFSETS["resp"])[0] == 1
                                         for r in raws))
            t0 = time.monotonic()
            assert isinstance(honest.push(1, x), np.ndarray)
            waited = time.monotonic() - t0
            assert waited < 3 * slow, f"waited {waited * 1e3:.0f} ms behind the queued prepares"
            assert _wait_for(lambda: entries.counts()["unprepared"] == 0)  # the rest ran after
        finally:
            entries.slow_prepare(0)
            honest.close()
            for r in raws:
                r.close()


def test_a_stream_id_out_of_range_is_refused_with_its_range(summing_engine):
    with ShmServer(summing_engine, slots=2, sliding=True, streams=3) as srv, ShmClient(srv.name) as c:
        x = _int_ticks(1, seed=4)[0]
        for bad in (3, 2**32 - 1):
            with pytest.raises(InputError, match=r"stream id \d+ out of range: this endpoint keeps 3 "
                                                 r"windows per client \(stream ids 0 to 2\)"):
                c.push(bad, x)
        with pytest.raises(InputError, match="stream id 7 out of range"):
            c.reset(stream=7)
        with pytest.raises(InputError, match="stream must be a whole number"):
            c.push(-1, x)
        assert isinstance(c.push(2, x), np.ndarray)  # the client serves on
        assert srv.stats()["bad_payloads"] == 3 and srv.stats()["windows"] == 1


def _raw_request(raw: RawClient, x: np.ndarray, *, stream: int, count: int | None = None):
    struct.pack_into("I", raw.slot, SLOT_OFFSETS["stream"], stream)
    return raw.request(x, count=count)


def test_a_hostile_client_cannot_change_another_clients_answers(summing_engine):
    streams = 2
    xs = _int_ticks(60, seed=5)
    junk = _int_ticks(60, seed=6)
    with ShmServer(summing_engine, slots=3, sliding=True, streams=streams) as srv:
        honest = ShmClient(srv.name)
        raw = RawClient(srv.dir)
        try:
            got = []
            for i, x in enumerate(xs):
                # garbage before every honest tick: wild stream ids and sizes, stream 0 (its own)
                bad = [(0xFFFFFFFF, None), (streams, None), (i % streams, 3), (i % streams, 10**9)]
                st, msg, _ = _raw_request(raw, junk[i], stream=bad[i % 4][0], count=bad[i % 4][1])
                assert st == Status.BAD_INPUT, msg
                st, msg, _ = _raw_request(raw, junk[i], stream=0)  # into its own stream 0
                assert st == Status.OK, msg
                got.append(honest.push(i % streams, x)[0])
            got = np.array(got, np.float32)
            for s in range(streams):
                np.testing.assert_array_equal(
                    got[s::streams], native_entries.windowed_sum_reference(WINDOW, xs[s::streams]))
            # the hostile client's stream 0 is its own window: the model on its own ticks only
            st, _, out = _raw_request(raw, junk[0], stream=0)
            want = native_entries.windowed_sum_reference(WINDOW, np.vstack([junk, junk[:1]]))[-1]
            assert st == Status.OK and np.frombuffer(out, np.float32)[0] == want
            assert srv.stats()["bad_payloads"] == len(xs) and srv.stats()["errors"] == 0
        finally:
            raw.close()
            honest.close()


def _window_reference(cm, xs: np.ndarray, resets: frozenset[int] = frozenset()) -> np.ndarray:
    """cm.predict on the zero-filled window ending at each tick (emptied before the ticks in
    ``resets``): what each stream's answers must be."""
    t = cm.input.shape[0]
    wins = np.zeros((len(xs), *cm.input.shape), np.float32)
    start = 0
    for i in range(len(xs)):
        if i in resets:
            start = i
        seen = xs[max(start, i - t + 1):i + 1]
        wins[i, t - len(seen):] = seen
    return np.stack([cm.predict(w) for w in wins]).reshape(len(xs), *cm.output.shape)


@pytest.mark.parametrize("native", [True, False])
def test_zoo_lstm_streams_on_the_c_handles_and_the_python_windows(compiled, native):
    # native: the loop keeps cpu.native's own window handles (ABI 3); native=False: it calls
    # each client's Windows (cm.sliding(streams=N)) with the GIL
    cm = compiled("lstm", "cpu.native")
    eng = Engine(cm, EngineConfig.preset("single", warmup=1)).start()
    clients, streams, each = 2, 3, 25
    order = _schedule(clients, streams, each, seed=7)
    xs = np.random.default_rng(8).normal(0, 1, (len(order), STEP)).astype(np.float32)
    try:
        with ShmServer(eng, slots=clients, sliding=True, streams=streams, native=native) as srv:
            assert srv.stats()["sliding"]["loop"] == ("native" if native else "python")
            cs = [ShmClient(srv.name) for _ in range(clients)]
            fed: dict[tuple[int, int], list[int]] = {}
            got: dict[tuple[int, int], list[np.ndarray]] = {}
            for t, (ci, s) in enumerate(order):
                fed.setdefault((ci, s), []).append(t)
                got.setdefault((ci, s), []).append(cs[ci].push(s, xs[t]))
            assert srv.stats()["windows"] == clients * streams
            cs[1].close()
            assert _wait_for(lambda: srv.stats()["windows"] == streams)
            cs[0].close()
            assert srv.stats()["errors"] == 0
    finally:
        eng.stop()
    mine = cm.sliding(streams=clients * streams)  # the same windows in this process
    for (ci, s), ts in fed.items():
        np.testing.assert_allclose(np.stack(got[(ci, s)]), _window_reference(cm, xs[ts]),
                                   rtol=1e-5, atol=1e-6, err_msg=str((ci, s)))
        want = np.empty((len(ts), *cm.output.shape), np.float32)
        for j, t in enumerate(ts):
            mine.push_into(ci * streams + s, xs[t], want[j])
        np.testing.assert_array_equal(np.stack(got[(ci, s)]), want)  # bit for bit


@pytest.mark.slow
def test_hwb_serve_streams_answers_each_clients_streams(store_dir, compiled):
    cm = compiled("lstm", "cpu.native")  # in the session store: the server only loads it
    name = f"hwb-sltest-{secrets.token_hex(3)}"
    p = subprocess.Popen(
        [sys.executable, "-m", "hwbackends", "serve", "zoo:lstm", "-t", "cpu.native",
         "--cache-dir", str(store_dir), "--shm", name, "--sliding", "--streams", "3",
         "--duration", "300", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        info = json.loads(line)
        assert info["shm_sliding"]["streams"] == 3 and info["tick_size"] == STEP
        order = _schedule(2, 3, 30, seed=9)
        xs = np.random.default_rng(10).normal(0, 1, (len(order), STEP)).astype(np.float32)
        fed: dict[tuple[int, int], list[int]] = {}
        got: dict[tuple[int, int], list[np.ndarray]] = {}
        with ShmClient(name) as a, ShmClient(name) as b:
            cs = (a, b)
            for t, (ci, s) in enumerate(order):
                fed.setdefault((ci, s), []).append(t)
                got.setdefault((ci, s), []).append(cs[ci].push(s, xs[t]))
            with pytest.raises(InputError, match="stream id 3 out of range"):
                a.push(3, xs[0])
        for key, ts in fed.items():
            np.testing.assert_allclose(np.stack(got[key]), _window_reference(cm, xs[ts]),
                                       rtol=1e-5, atol=1e-6, err_msg=str(key))
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert "3 per client" in err
        assert json.loads(out.strip().splitlines()[-1])["requests_ok"] == 0  # the C loop answered
        assert not endpoint_dir(name).exists()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
