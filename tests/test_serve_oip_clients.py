"""Triton's own clients against ``hwb serve --http --grpc-port --sequences``: ``tritonclient``
(HTTP and gRPC) gets answers equal to ``predict`` (by model name and by strategy name, JSON
and binary tensors), two interleaved sequences of ticks equal to ``push_into`` on their own
windows, and the protocol's errors (unknown model, ended sequence, no token); ``perf_analyzer``
measures the server over gRPC, over HTTP and on the sequence model (its own sequence ids).

tritonclient pins protobuf < 7 (this project's gRPC modules need 7), so the clients live in a
venv of their own, built once and cached (``HWB_OIP_CLIENT_ENV``, default
``~/.cache/hwbackends-oip``), and run as a subprocess (tests/oip_client_script.py); where pip
cannot install them the tests skip with the reason. The server listens on 127.0.0.1 only."""
from __future__ import annotations

import csv
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from triton_tools import libb64

ROOT = Path(__file__).resolve().parents[1]
PINS = ("tritonclient[grpc,http]==2.51.0", "numpy<2", "nvidia-cuda-runtime-cu12")
TICKS = 200  # the zoo lstm's window is 16 ticks: every ring position, many times
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="cpu.native needs a C compiler")


def _env_dir() -> Path:
    return Path(os.environ.get("HWB_OIP_CLIENT_ENV", Path.home() / ".cache" / "hwbackends-oip"))


@pytest.fixture(scope="module")
def client_env() -> dict[str, Path]:
    """The cached venv holding tritonclient (and perf_analyzer, which its 2.51 wheel ships)."""
    d = _env_dir()
    venv = d / "venv"
    stamp = d / "installed.txt"
    want = " ".join(PINS)
    if not stamp.exists() or stamp.read_text() != want:
        shutil.rmtree(venv, ignore_errors=True)
        d.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if r.returncode == 0:
            r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *PINS],
                               capture_output=True, text=True, timeout=600)
        if r.returncode:
            pytest.skip(f"cannot install {', '.join(PINS)} into {venv}: {r.stderr.strip()[-400:]}")
        stamp.write_text(want)
    site = next((venv / "lib").glob("python3*/site-packages"))
    return {"dir": d, "python": venv / "bin" / "python", "perf_analyzer": venv / "bin" / "perf_analyzer",
            "site": site}


@pytest.fixture(scope="module")
def server(store_dir, compiled, tmp_path_factory):
    """``hwb serve zoo:lstm -t cpu.native`` with HTTP, gRPC (both protocols), 4 sequence
    windows and a token, on loopback."""
    compiled("lstm", "cpu.native")  # into the session store: the server only loads it
    d = tmp_path_factory.mktemp("oip-server")
    token = secrets.token_urlsafe(24)
    (d / "token").write_text(token)
    p = subprocess.Popen(
        [sys.executable, "-m", "hwbackends", "serve", "zoo:lstm", "-t", "cpu.native",
         "--cache-dir", str(store_dir), "--http", "0", "--grpc-port", "0", "--sequences", "4",
         "--insecure-loopback", "--token-file", str(d / "token"), "--duration", "900"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        info = json.loads(line)
        yield {"info": info, "token": token, "http": info["http"].removeprefix("http://"),
               "grpc": info["grpc"], "proc": p}
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def _reference_ticks(cm, xs):
    w = cm.sliding()
    out = np.empty((len(xs), *cm.output.shape), np.float32)
    for i, x in enumerate(xs):
        w.push_into(x, out[i])
    return out


def test_tritonclient_http_and_grpc_against_hwb_serve(client_env, server, compiled, tmp_path):
    cm = compiled("lstm", "cpu.native")
    info = server["info"]
    assert info["oip_models"] == ["default", "lstm", "default.window", "lstm.window"]
    rng = np.random.default_rng(11)
    batch = rng.standard_normal((3, 16, 8)).astype(np.float32)
    seq_a, seq_b = (rng.standard_normal((TICKS, 8)).astype(np.float32) for _ in range(2))
    np.savez(tmp_path / "in.npz", batch=batch, seq_a=seq_a, seq_b=seq_b)
    r = subprocess.run([str(client_env["python"]), str(ROOT / "tests" / "oip_client_script.py"),
                        str(tmp_path), server["http"], server["grpc"], server["token"]],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    out = np.load(tmp_path / "out.npz")
    rep = json.loads((tmp_path / "errors.json").read_text())
    want = cm.predict(batch)
    for key in ("http_lstm_1", "http_lstm_0", "http_default_1", "grpc_lstm_1", "grpc_default_1"):
        np.testing.assert_array_equal(out[key], want, err_msg=key)
    for proto in ("http", "grpc"):
        np.testing.assert_array_equal(out[f"{proto}_seq_1"], _reference_ticks(cm, seq_a))
        np.testing.assert_array_equal(out[f"{proto}_seq_2"], _reference_ticks(cm, seq_b))
        assert rep["meta"][proto]["config"] == {"max_batch_size": 1, "sequence": True}
        assert rep["meta"][proto]["inference_count"] >= 6
    errs = rep["errors"]
    assert errs["http_unknown_model"].startswith("400") or "unknown model 'nope'" in errs["http_unknown_model"]
    assert "unknown model 'nope'" in errs["http_unknown_model"]
    assert "StatusCode.NOT_FOUND" in errs["grpc_unknown_model"] and "unknown model" in errs["grpc_unknown_model"]
    for proto in ("http", "grpc"):
        assert "is not live" in errs[f"{proto}_ended_sequence"], errs
        assert "token" in errs[f"{proto}_no_token"], errs
    assert "StatusCode.UNAUTHENTICATED" in errs["grpc_no_token"]


def _perf_analyzer(client_env, args: list[str], out: Path) -> dict[str, str]:
    pa = client_env["perf_analyzer"]
    if not pa.exists():
        pytest.skip(f"no perf_analyzer in {pa.parent} (tritonclient 2.51's wheel ships it)")
    libs = [str(client_env["site"] / "nvidia" / "cuda_runtime" / "lib")]
    b64 = libb64(client_env["dir"])
    if b64:
        libs.append(str(b64))
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(libs))
    # a shared 2-core machine is too noisy for perf_analyzer's stability rule: fixed windows of
    # requests, any variation taken (the figure is reported, not gated)
    r = subprocess.run([str(pa), *args, "-b", "1", "--concurrency-range", "1", "--percentile", "99",
                        "--measurement-mode", "count_windows", "--measurement-request-count", "300",
                        "--stability-percentage", "1000", "--max-trials", "3", "-f", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2500:]
    return next(csv.DictReader(out.open()))


@pytest.mark.slow
def test_perf_analyzer_measures_hwb_serve(client_env, server, tmp_path, record_property):
    tok = ["-H", f"authorization:Bearer {server['token']}"]  # gRPC keys are lower case
    rows = {}
    for label, args in (("grpc", ["-m", "lstm", "-u", server["grpc"], "-i", "grpc"]),
                        ("http", ["-m", "lstm", "-u", server["http"], "-i", "http"]),
                        ("grpc sequence", ["-m", "lstm.window", "-u", server["grpc"], "-i", "grpc",
                                           "--sequence-length", "50"])):
        t0 = time.monotonic()
        rows[label] = _perf_analyzer(client_env, [*args, *tok], tmp_path / f"{label}.csv")
        rows[label]["wall_s"] = f"{time.monotonic() - t0:.1f}"
    line = "; ".join(f"{k}: p99 {float(v['p99 latency']):.0f} µs, {float(v['Inferences/Second']):.0f}/s"
                     for k, v in rows.items())
    print(f"perf_analyzer (tritonclient 2.51) against hwb serve zoo:lstm cpu.native, "
          f"concurrency 1, batch 1 (informal, loaded machine): {line}")
    record_property("perf_analyzer_hwb_serve", line)
    assert all(float(v["Inferences/Second"]) > 0 for v in rows.values())
