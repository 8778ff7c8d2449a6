"""``hwb serve --shm NAME --sliding``: a sliding endpoint takes one tick per request and keeps
the window; its answers are ``cm.sliding()``'s, bit for bit, over many ticks and across
resets (a flagged tick, a reset alone, a new connection); a hostile client sending a whole
window (or a tick to a whole-window endpoint, or a reset or a stream id to it) gets a clear
BAD_INPUT and the server keeps serving; the C loop keeps its windows as the model's native
window handles (ABI 3), and an entry without them, or a target without a C window, is served
through the Python Windows; the serving loop is pinned to a core the client is told to avoid.
Several clients and streams: test_serve_sliding_streams.py."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import native_entries
import numpy as np
import pytest
from shm_raw import RawClient

from hwbackends.errors import ConfigError, InputError
from hwbackends.serve import Engine, EngineConfig
from hwbackends.serve.request import Status
from hwbackends.serve.shm import (
    SLOT_OFFSETS,
    ShmClient,
    ShmServer,
    choose_loop_core,
    endpoint_dir,
)

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="cpu.native needs a C compiler")
TICKS = 400  # the zoo lstm's window is 16 ticks: 25 windows, every ring position many times


def _ticks(cm, n: int, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(0, 1, (n, *cm.input.shape[1:])).astype(np.float32)


def _reference(cm, xs: np.ndarray, resets: frozenset[int] = frozenset()) -> np.ndarray:
    """cm.sliding() in this process over the same ticks (reset before the ticks in resets)."""
    w = cm.sliding()
    out = np.empty((len(xs), *cm.output.shape), np.float32)
    for i, x in enumerate(xs):
        if i in resets:
            w.reset()
        w.push_into(x, out[i])
    return out


def _cpus_of_threads(pid: int) -> list[str]:
    got = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                got.append(line.split(":", 1)[1].strip())
    return got


@pytest.mark.slow
def test_hwb_serve_sliding_answers_are_cm_sliding_bit_for_bit(store_dir, compiled):
    cm = compiled("lstm", "cpu.native")  # in the session store: the server only loads it
    xs = _ticks(cm, TICKS)
    name = f"hwb-sltest-{secrets.token_hex(3)}"
    p = subprocess.Popen(
        [sys.executable, "-m", "hwbackends", "serve", "zoo:lstm", "-t", "cpu.native",
         "--cache-dir", str(store_dir), "--shm", name, "--sliding", "--duration", "300", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        info = json.loads(line)
        # the C loop keeps cpu.native's window handles (ABI 3)
        assert info["shm_sliding"] == {"window": 16, "tick_shape": [8], "form": "incremental",
                                       "streams": 1, "loop": "native"}
        assert info["tick_size"] == 8
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) >= 2:  # the loop's thread is pinned to the last core, and says so
            assert info["shm_pin"] == allowed[-1]
            assert str(allowed[-1]) in _cpus_of_threads(p.pid)
        with ShmClient(name) as c:
            assert c.window == 16 and c.in_shape == (8,)
            got = np.stack([c.predict(x) for x in xs])
            np.testing.assert_array_equal(got, _reference(cm, xs))
            # a new session: the first tick flagged reset, then a reset alone mid-stream
            again = [c.predict(xs[0], reset=True)] + [c.predict(x) for x in xs[1:50]]
            assert c.reset() is True
            again += [c.predict(x) for x in xs[50:90]]
            np.testing.assert_array_equal(np.stack(again), _reference(cm, xs[:90], frozenset({50})))
            with pytest.raises(InputError, match="sliding: one tick"):  # a whole window, refused here
                c.predict(np.zeros(cm.input.shape, np.float32))
        # hostile: a raw client writes a whole window's size into its request
        raw = RawClient(endpoint_dir(name))
        try:
            st, msg, _ = raw.request(np.zeros(16 * 8, np.float32)[:8], count=16 * 8)
            assert st == Status.BAD_INPUT and "one tick of 8 float32" in msg and "a whole window" in msg
            st, msg, out = raw.request(xs[7])  # still serving; the new connection's window is empty
            assert st == Status.OK, msg
            np.testing.assert_array_equal(np.frombuffer(out, np.float32),
                                          _reference(cm, xs[7:8])[0])
        finally:
            raw.close()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        if len(allowed) >= 2:
            others = [c for c in allowed if c != allowed[-1]]
            assert (f"serving loop pinned to CPU {allowed[-1]}; pin your client elsewhere, e.g. "
                    f"taskset -c {others[0]}") in err
        stats = json.loads(out.strip().splitlines()[-1])
        assert stats["requests_ok"] == 0  # every tick was answered by the C loop, not the engine
        assert not endpoint_dir(name).exists()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


@pytest.fixture(scope="module")
def lstm_engine(compiled):
    eng = Engine(compiled("lstm", "cpu.native"), EngineConfig.preset("single", warmup=2)).start()
    yield eng
    eng.stop()


def test_the_python_window_path_equals_the_c_loop(lstm_engine, compiled):
    # native=False: the loop calls the Window's push_into/prepare/reset (with the GIL)
    cm = compiled("lstm", "cpu.native")
    xs = _ticks(cm, 120, seed=9)
    with ShmServer(lstm_engine, slots=1, sliding=True, native=False) as srv:
        assert not srv.native and srv.stats()["sliding"]["loop"] == "python"
        with ShmClient(srv.name) as c:
            got = [c.predict(x) for x in xs[:60]] + [c.predict(xs[60], reset=True)]
            got += [c.predict(x) for x in xs[61:]]
        assert srv.stats()["served"] == 120 and srv.stats()["errors"] == 0
    np.testing.assert_array_equal(np.stack(got), _reference(cm, xs, frozenset({60})))


def test_the_c_loop_takes_the_windows_from_an_abi3_entry(lstm_engine, compiled, tmp_path,
                                                        monkeypatch):
    # the loop keeps ABI 3 window handles; an ABI 1 entry, an ABI 2 one (a single window in
    # the library, no handles: an artifact built before them) or a newer ABI leaves the Python
    # Windows serving, with the reason
    cm = compiled("lstm", "cpu.native")
    xs = _ticks(cm, 80, seed=13)
    entries = native_entries.build(tmp_path)
    summing = entries.windowed_sum(16, 8, 1)
    monkeypatch.setattr(cm.executor, "native_entry", lambda: summing)
    ints = np.round(xs * 2)  # whole numbers: the windowed sum is exact
    with ShmServer(lstm_engine, slots=1, sliding=True) as srv, ShmClient(srv.name) as c:
        assert srv.native and srv.stats()["sliding"]["loop"] == "native"
        got = np.stack([c.predict(x)[0] for x in ints])
    np.testing.assert_array_equal(got, native_entries.windowed_sum_reference(16, ints))
    real = cm.executor.__class__.native_entry(cm.executor)
    for entry, why in ((entries.abi1_of(real), "native entry of ABI 1 has no window handles"),
                       (entries.no_push, "came with ABI 3: rebuild the artifact"),
                       (entries.newer_abi, "native entry of ABI 4")):
        monkeypatch.setattr(cm.executor, "native_entry", lambda e=entry: e)
        with ShmServer(lstm_engine, slots=1, sliding=True) as srv, ShmClient(srv.name) as c:
            assert not srv.native and why in srv.native_reason, srv.native_reason
            assert srv.stats()["sliding"]["why_python"] == srv.native_reason
            got = np.stack([c.predict(x) for x in xs[:40]])
        np.testing.assert_array_equal(got, _reference(cm, xs[:40]))


def test_a_target_without_the_c_window_is_served_by_its_recompute_window(compiled):
    cm = compiled("lstm", "cpu.onnxruntime")
    xs = _ticks(cm, 60, seed=3)
    eng = Engine(cm, EngineConfig.preset("single", warmup=1)).start()
    try:
        with ShmServer(eng, slots=1, sliding=True) as srv:
            assert not srv.native and "not a C model library" in srv.native_reason
            assert srv.stats()["sliding"]["form"] == "recompute"
            with ShmClient(srv.name) as c:
                got = np.stack([c.predict(x) for x in xs])
    finally:
        eng.stop()
    np.testing.assert_array_equal(got, _reference(cm, xs))
    window = np.zeros(cm.input.shape, np.float32)  # the recompute form is predict_into on it
    window[-1] = xs[0]
    np.testing.assert_array_equal(got[0], cm.predict(window).reshape(got[0].shape))


def test_a_whole_window_endpoint_refuses_ticks_and_resets_clearly(lstm_engine):
    with ShmServer(lstm_engine, slots=2) as srv:
        raw = RawClient(srv.dir)
        try:
            st, msg, _ = raw.request(np.zeros(8, np.float32), count=8)
            assert st == Status.BAD_INPUT and "one tick?" in msg and "--sliding" in msg
            struct.pack_into("I", raw.slot, SLOT_OFFSETS["stream"], 5)
            st, msg, _ = raw.request(np.zeros(16 * 8, np.float32))
            assert st == Status.BAD_INPUT and "stream id 5 sent to an endpoint that keeps no " \
                "windows" in msg, msg
        finally:
            raw.close()
        with ShmClient(srv.name) as c:
            assert c.window == 0
            with pytest.raises(InputError, match="keeps no window"):
                c.reset()
            assert isinstance(c.predict(np.zeros((16, 8), np.float32)), np.ndarray)  # serves on
        assert srv.stats()["bad_payloads"] == 3


def test_sliding_needs_direct_mode_and_a_count_of_streams(lstm_engine):
    with pytest.raises(ConfigError, match="mode='direct'"):
        ShmServer(lstm_engine, slots=1, sliding=True, mode="batch")
    for bad in (0, 1 << 17, 2.5):
        with pytest.raises(InputError, match="streams"):
            ShmServer(lstm_engine, slots=2, sliding=True, streams=bad)


def test_hwb_serve_sliding_refuses_what_it_cannot_serve(hwb_cli):
    rc, _, err = hwb_cli("serve", "zoo:lstm", "--sliding", "--grpc-port", "0")
    assert rc != 0 and "--shm NAME" in err
    rc, _, err = hwb_cli("serve", "zoo:lstm", "--sliding", "--shm", "x", "--grpc-port", "0")
    assert rc != 0 and "drop --grpc-port" in err
    rc, _, err = hwb_cli("serve", "zoo:lstm", "--sliding", "--shm", "x", "--shm-mode", "batch")
    assert rc != 0 and "--shm-mode" in err
    rc, _, err = hwb_cli("serve", "zoo:lstm", "--shm", "x", "--streams", "4")
    assert rc != 0 and "add --sliding" in err
    rc, _, err = hwb_cli("serve", "zoo:lstm", "--sliding", "--shm", "x", "--streams", "0")
    assert rc != 0 and "streams=0: expected 1 to 65536 windows" in err


def test_loop_core_choice():
    allowed = sorted(os.sched_getaffinity(0))
    core, line = choose_loop_core("auto")
    if len(allowed) >= 2:
        assert core == allowed[-1] and f"pinned to CPU {core}" in line and "taskset -c" in line
    else:
        assert core is None and "not pinned" in line
    assert choose_loop_core("none") == (None, "serving loop not pinned (--pin none)")
    assert choose_loop_core(allowed[0])[0] == allowed[0]
    with pytest.raises(ConfigError, match="may run on"):
        choose_loop_core(max(allowed) + 1000)


@pytest.mark.parametrize("flags, want", [((), "auto"), (("--pin", "auto"), "auto"), (("--pin", "none"), None),
                                         (("--shm-pin", "0"), 0), (("--pin", "0"), 0)])
def test_hwb_serve_prints_where_its_loop_is_pinned(monkeypatch, capsys, compiled, flags, want):
    from hwbackends.cli import main
    from hwbackends.cli import serve as serve_cli
    from hwbackends.serve import shm

    cm = compiled("signal", "cpu.native")
    monkeypatch.setattr(serve_cli, "_backends", lambda args, cls: cm)  # no compile in the CLI
    # prctl(PR_SET_DUMPABLE, 0) would outlive this test in the pytest process
    monkeypatch.setattr(shm, "deny_same_user_inspection", lambda: False)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    name = f"hwb-sltest-{secrets.token_hex(3)}"
    assert main(["serve", "zoo:signal", "--shm", name, "--duration", "0.05", *flags]) == 0
    out = capsys.readouterr()
    info = json.loads(out.out.splitlines()[0])
    if want == "auto":
        want = choose_loop_core("auto")[0]
    assert info["shm_pin"] == want
    if want is None:
        assert "serving loop not pinned" in out.err
    else:
        assert f"hwb serve: serving loop pinned to CPU {want}" in out.err


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_cpp_client_sends_ticks_and_gets_the_windows_answers(lstm_engine, compiled, tmp_path):
    from hwbackends.serve.shm import INCLUDE_DIR

    cm = compiled("lstm", "cpu.native")
    exe = tmp_path / "shm_strategy"
    subprocess.run(["g++", "-O2", "-std=c++17", "-Wall", "-Werror", f"-I{INCLUDE_DIR}",
                    str(ROOT / "examples" / "shm_strategy.cpp"), "-o", str(exe)], check=True)
    xs = _ticks(cm, 100, seed=11)
    xs.tofile(tmp_path / "in.f32")
    with ShmServer(lstm_engine, slots=2, sliding=True, streams=3) as srv:
        r = subprocess.run([str(exe), srv.name, "predict", str(tmp_path / "in.f32"),
                            str(tmp_path / "out.f32")], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "sliding endpoint, one tick of 8 floats per call (window of 16, 3 streams)" in r.stderr
        # row r to stream r % 3 (hwb_shm_push): each stream's answers are its own window's
        r3 = subprocess.run([str(exe), srv.name, "streams", "3", str(tmp_path / "in.f32"),
                             str(tmp_path / "out3.f32")], capture_output=True, text=True, timeout=60)
        assert r3.returncode == 0, r3.stderr
        r4 = subprocess.run([str(exe), srv.name, "streams", "4", str(tmp_path / "in.f32"),
                             str(tmp_path / "out4.f32")], capture_output=True, text=True, timeout=60)
        assert r4.returncode == 4 and "row 3 (stream 3): bad input" in r4.stderr, r4.stderr
        assert "stream id 3 out of range" in r4.stderr
        r2 = subprocess.run([str(exe), srv.name, "bench", "200", "5"], capture_output=True,
                            text=True, timeout=60)
        assert r2.returncode == 0 and json.loads(r2.stdout)["errors"] == 0, r2.stderr
    got = np.fromfile(tmp_path / "out.f32", np.float32).reshape(100, *cm.output.shape)
    np.testing.assert_array_equal(got, _reference(cm, xs))
    got3 = np.fromfile(tmp_path / "out3.f32", np.float32).reshape(100, *cm.output.shape)
    for s in range(3):
        np.testing.assert_array_equal(got3[s::3], _reference(cm, xs[s::3]))
