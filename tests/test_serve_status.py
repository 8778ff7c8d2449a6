"""Serving outcomes travel as one ``Status`` enum whose values are hwb_shm.h's
codes, read from the C extension; the field offsets Python uses are the header's offsetof.

The C side is checked independently of the extension: a small program compiled here against
include/hwb_shm.h prints every status and offset, and the Python values must equal them.
Then the statuses themselves: an engine's failures carry theirs, and the shm poll loop (C)
sends each one as its own code (a backend error, the breaker, a refused sample), which the
Python client turns back into the same Status."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from hwbackends.errors import InputError
from hwbackends.serve import (
    BREAKER_OPEN,
    DEADLINE,
    STOPPED,
    Engine,
    EngineConfig,
    Status,
    Unavailable,
    _shmloop,
)
from hwbackends.serve.shm import HEADER_OFFSETS, INCLUDE_DIR, SLOT_OFFSETS, ShmClient, ShmServer
from hwbackends.specs import TensorSpec

sys.path.insert(0, str(Path(__file__).parent))
from shm_raw import CTL, DEADLINE_AT, HDR  # noqa: E402

PROBE = r"""
#include <stdio.h>
#include "hwb_shm.h"
#define S(name, value, text) printf("%s\"%s\": %d", first ? "" : ", ", #name, (int)HWB_SHM_##name), first = 0;
#define O(t, f) printf("%s\"%s\": %zu", first ? "" : ", ", #f, offsetof(t, f)), first = 0;
int main(void) {
    int first = 1;
    printf("{\"status\": {");
    HWB_SHM_STATUSES(S)
    printf("}, \"text\": {");
    first = 1;
#define T(name, value, text) printf("%s\"%s\": \"%s\"", first ? "" : ", ", #name, hwb_shm_strerror(HWB_SHM_##name)), first = 0;
    HWB_SHM_STATUSES(T)
    printf("}, \"slot\": {");
    first = 1;
    O(hwb_shm_slot, req) O(hwb_shm_slot, resp) O(hwb_shm_slot, status) O(hwb_shm_slot, client_waiting)
    O(hwb_shm_slot, in_count) O(hwb_shm_slot, deadline_ns) O(hwb_shm_slot, msg_len) O(hwb_shm_slot, msg)
    printf("}, \"header\": {");
    first = 1;
    O(hwb_shm_header, in_count) O(hwb_shm_header, out_count) O(hwb_shm_header, nslots)
    O(hwb_shm_header, slot_bytes) O(hwb_shm_header, state) O(hwb_shm_header, served)
    O(hwb_shm_header, deadline_missed) O(hwb_shm_header, owner_uid) O(hwb_shm_header, server_pid)
    printf("}, \"slot_ctl\": %u}\n", HWB_SHM_SLOT_CTL);
    return 0;
}
"""


@pytest.fixture(scope="module")
def from_c(tmp_path_factory) -> dict:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on PATH (cc/gcc): cannot compile the header probe")
    d = tmp_path_factory.mktemp("probe")
    (d / "probe.c").write_text(PROBE)
    subprocess.run([cc, "-std=gnu11", "-Wall", "-Werror", f"-I{INCLUDE_DIR}", "-o", str(d / "probe"),
                    str(d / "probe.c")], check=True, capture_output=True, text=True)
    return json.loads(subprocess.run([str(d / "probe")], check=True, capture_output=True,
                                     text=True).stdout)


def test_python_status_values_equal_the_c_codes(from_c):
    assert {s.name: int(s) for s in Status} == from_c["status"] == _shmloop.STATUS
    assert {s.name: s.reason for s in Status} == from_c["text"]
    assert (DEADLINE.status, BREAKER_OPEN.status, STOPPED.status) == (
        Status.DEADLINE, Status.BREAKER_OPEN, Status.STOPPED)
    assert (DEADLINE.reason, BREAKER_OPEN.reason, STOPPED.reason) == (
        "deadline", "breaker-open", "engine-stopped")


def test_python_offsets_equal_the_c_layout(from_c):
    assert {k: SLOT_OFFSETS[k] for k in from_c["slot"]} == from_c["slot"]
    assert SLOT_OFFSETS["in"] == from_c["slot_ctl"] == _shmloop.SLOT_CTL
    assert {k: HEADER_OFFSETS[k] for k in from_c["header"]} == from_c["header"]
    # the test helper playing a raw client reads the same numbers
    assert (DEADLINE_AT, CTL, HDR) == (from_c["slot"]["deadline_ns"], from_c["slot_ctl"],
                                       _shmloop.HEADER_BYTES)


class Flaky:
    """An exact numpy model that raises while ``fail`` is set (a backend error)."""
    input, output, batch_size = TensorSpec("x", (8,)), TensorSpec("y", (1,)), 1
    w = np.linspace(-1, 1, 8, dtype=np.float32)[:, None]
    fail = False

    def predict_into(self, x, out):
        if self.fail:
            raise RuntimeError("accelerator fell off the bus")
        np.matmul(x, self.w, out=out)


def test_engine_results_carry_their_status():
    m = Flaky()
    cfg = EngineConfig.preset("single", breaker_failures=2, breaker_reset_s=30, warmup=1)
    eng = Engine(m, cfg).start()
    x = np.ones(8, np.float32)
    try:
        assert eng.predict(x, deadline_us=1).status is Status.DEADLINE
        m.fail = True
        r = eng.predict(x)
        assert r.status is Status.UNAVAILABLE and "fell off the bus" in r.reason
        eng.predict(x)
        assert eng.predict(x) is BREAKER_OPEN
    finally:
        eng.stop()
    assert eng.predict(x).status is Status.STOPPED


def test_shm_loop_sends_each_status_as_its_own_code():
    """Batch mode: the engine's Unavailable goes to the C loop as (status, message) and comes
    back to the client as the same Status, the counters following the code."""
    m = Flaky()
    cfg = EngineConfig.preset("latency", breaker_failures=2, breaker_reset_s=30, warmup=1)
    eng = Engine(m, cfg).start()
    srv = ShmServer(eng, slots=2, reap_every_s=0.05)
    x, out = np.ones(8, np.float32), np.empty(1, np.float32)
    try:
        assert srv.mode == "batch"
        with ShmClient(srv.name) as c:
            assert c.try_predict_into(x, out) is True
            np.testing.assert_allclose(out, x @ Flaky.w, rtol=1e-6)
            m.fail = True
            r = c.try_predict_into(x, out)
            assert isinstance(r, Unavailable) and r.status is Status.UNAVAILABLE
            assert "fell off the bus" in r.reason
            c.try_predict_into(x, out)
            r = c.try_predict_into(x, out)
            assert r.status is Status.BREAKER_OPEN and r.reason == "breaker-open"
            with pytest.raises(InputError, match="NaN"):  # refused in C: BAD_INPUT
                c.try_predict_into(np.full(8, np.nan, np.float32), out)
            r = c.try_predict_into(x, out, deadline_us=1)  # over before the server reads it
            assert r is DEADLINE
            # the client gave up at its deadline; the server counts the miss when it reads the
            # request, which a loaded machine delays: wait while the slot is still attached
            # (a slot released first takes its request with it, never read, never counted)
            deadline = time.time() + 30
            while srv.stats()["deadline_missed"] < 1 and time.time() < deadline:
                time.sleep(0.01)
        st = srv.stats()
        assert st["served"] == 1 and st["bad_payloads"] == 1 and st["errors"] == 3
        assert st["deadline_missed"] == 1
    finally:
        srv.close()
        eng.stop()


def test_a_deadline_under_a_microsecond_away_when_batch_mode_reads_it_is_a_miss(monkeypatch):
    """The C loop checks a request's deadline, then batch mode hands the rest of it to the
    engine, whose smallest deadline is MIN_DEADLINE_US: a request read with 0.5 µs left was
    refused as the client's bad input (BAD_INPUT, counted in bad_payloads; seen once in a
    full run of the test above). It is a deadline miss."""
    import hwbackends.serve.shm as shm

    eng = Engine(Flaky(), EngineConfig.preset("latency", warmup=1)).start()
    srv = ShmServer(eng, slots=2)
    try:
        assert srv.mode == "batch"
        now = 10**15
        monkeypatch.setattr(shm, "time", types.SimpleNamespace(monotonic_ns=lambda: now))
        x, y = np.ones((1, 8), np.float32), np.empty((1, 1), np.float32)
        res = srv._batch([(x, y, now + 500), (x, y, now - 1), (x, y, 0)])
        monkeypatch.undo()
        assert res[0] == res[1] == (int(Status.DEADLINE), DEADLINE.reason), res
        assert res[2] is None and np.allclose(y, x @ Flaky.w)  # no deadline: answered
    finally:
        srv.close()
        eng.stop()
