"""``hwb serve`` end to end: a real server process with TLS + token gRPC, shared memory and
metrics on 127.0.0.1; clients in this process; clean shutdown on SIGTERM."""
from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

pytest.importorskip("grpc", reason="the serve extra is not installed")

from hwbackends.serve.grpc_server import GrpcClient, free_port, self_signed_cert  # noqa: E402
from hwbackends.serve.shm import ShmClient, endpoint_dir  # noqa: E402


@pytest.mark.slow
def test_hwb_serve_end_to_end(tmp_path, store_dir, compiled, zoo_model):
    cm = compiled("signal", "cpu.litert")  # in the session store: the server only loads it
    xs = np.ascontiguousarray(zoo_model("signal").validation_data[:16], dtype=np.float32)
    tls = self_signed_cert()
    (tmp_path / "c.pem").write_bytes(tls.cert_pem)
    (tmp_path / "k.pem").write_bytes(tls.key_pem)
    token = secrets.token_urlsafe(24)
    (tmp_path / "tok").write_text(token)
    name = f"hwb-clitest-{secrets.token_hex(3)}"
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "hwbackends", "serve", "zoo:signal", "-t", "cpu.litert",
         "--cache-dir", str(store_dir), "--preset", "latency", "--shm", name, "--grpc-port",
         str(port), "--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem"),
         "--token-file", str(tmp_path / "tok"), "--metrics-port", "0", "--duration", "120", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        info = json.loads(line)
        assert info["grpc_tls"] is True and info["shm"] == name
        with ShmClient(name) as c:
            np.testing.assert_array_equal(c.predict(xs[0]), cm.predict(xs[0]))
        with GrpcClient(f"127.0.0.1:{port}", token=token, root_cert=tls.cert_pem) as g:
            np.testing.assert_array_equal(g.predict("", xs[1]), cm.predict(xs[1]))
        text = urllib.request.urlopen(info["metrics"], timeout=5).read().decode()
        assert 'hwb_serve_requests_total{outcome="ok",strategy="default"} 2.0' in text
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        stats = json.loads(out.strip().splitlines()[-1])
        assert stats["requests_ok"] == 2
        assert not endpoint_dir(name).exists()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_hwb_serve_config_errors_are_clear(capsys):
    from hwbackends.cli import main

    assert main(["serve", "zoo:signal"]) == 1  # no endpoint given: exit 1, nothing compiled
    assert "give --shm NAME and/or --grpc-port" in capsys.readouterr().err
    assert main(["serve", "--shm", "x"]) == 1
    assert "give a MODEL" in capsys.readouterr().err


@pytest.mark.slow
def test_hwb_serve_multi_io_prints_the_layout_a_c_client_needs(store_dir, compiled, zoo_model):
    cm = compiled("two_head", "cpu.onnxruntime", "fp32", batch_size=1)
    xs = zoo_model("two_head").representative(3, seed=5)
    name = f"hwb-clitest-{secrets.token_hex(3)}"
    p = subprocess.Popen(
        [sys.executable, "-m", "hwbackends", "serve", "zoo:two_head", "-t", "cpu.onnxruntime",
         "--batch-size", "1", "--cache-dir", str(store_dir), "--preset", "single", "--shm", name,
         "--duration", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        info = json.loads(line)
        assert (info["input_size"], info["output_size"]) == (20, 2)
        lay = info["layout"]
        assert [(f["name"], f["offset"], f["size"]) for f in lay["inputs"]] == \
            [("features", 0, 16), ("state", 16, 4)]
        with ShmClient(name) as c:
            for i in range(3):
                rec = np.zeros(info["input_size"], np.float32)  # filled from the printed layout
                for f, x in zip(lay["inputs"], xs, strict=True):
                    rec[f["offset"]:f["offset"] + f["size"]] = x[i].ravel()
                y = c.predict(rec)
                want = cm.predict((xs[0][i], xs[1][i]))
                for f, w in zip(lay["outputs"], want, strict=True):
                    np.testing.assert_allclose(y[f["offset"]:f["offset"] + f["size"]], w, atol=1e-6)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        assert p.returncode == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


class _OneB1:
    """One program at batch 1 (what `hwb serve MODEL -t T` compiles), without a compile."""

    batch_size = 1
    variant = "fake:fp32"

    def __init__(self) -> None:
        from hwbackends.specs import TensorSpec
        self.input, self.output = TensorSpec("x", (4,)), TensorSpec("y", (1,))

    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None:
        out[:, 0] = x.sum(axis=1)


def _serve_info(monkeypatch, capsys, *extra: str) -> tuple[dict, str]:
    from hwbackends.cli import main
    from hwbackends.cli import serve as serve_cli
    from hwbackends.serve import shm

    monkeypatch.setattr(serve_cli, "_backends", lambda args, cls: _OneB1())
    # prctl(PR_SET_DUMPABLE, 0) would outlive this test in the pytest process
    monkeypatch.setattr(shm, "deny_same_user_inspection", lambda: False)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    name = f"hwb-clitest-{secrets.token_hex(3)}"
    assert main(["serve", "zoo:signal", "--shm", name, "--duration", "0.05", *extra]) == 0
    out = capsys.readouterr()
    return json.loads(out.out.splitlines()[0]), out.err


def test_hwb_serve_default_for_one_batch1_program_is_direct_shm(monkeypatch, capsys):
    # the default preset was 'latency' (batch mode): p50 191 µs vs 2 µs direct
    info, err = _serve_info(monkeypatch, capsys)
    assert info["preset"] == "single" and info["shm_mode"] == "direct"
    assert "warning" not in err


def test_hwb_serve_batching_preset_over_one_batch1_program_warns(monkeypatch, capsys):
    info, err = _serve_info(monkeypatch, capsys, "--preset", "latency")
    assert info["preset"] == "latency" and info["shm_mode"] == "batch"  # as asked
    assert "--preset latency over one batch-1 program batches nothing" in err
    assert "--preset single" in err


def test_hwb_serve_default_preset_batches_with_batch_sizes():
    import argparse

    from hwbackends.cli.serve import _preset

    args = argparse.Namespace(preset=None, shm="x", shm_mode="auto")
    assert _preset(args, {1: _OneB1(), 2: _OneB1(), 4: _OneB1()}) == "latency"
    assert _preset(args, _OneB1()) == "single"


def test_hwb_serve_config_compiles_into_the_cache_dir(monkeypatch, capsys, tmp_path, store_dir):
    """``hwb serve --config``: the router's variants are compiled into ``--cache-dir``'s store,
    as ``hwb route``'s are, not into the default one."""
    from hwbackends.cli import main
    from hwbackends.serve import shm
    from hwbackends.store.artifacts import ArtifactStore

    cfg = tmp_path / "s.toml"
    cfg.write_text('[tiers.any]\np99_us = 1e9\n[router]\nisolate_compile = false\n'
                   '[router.bench]\nn = 50\nwarmup = 5\n[strategies.a]\nmodel = "zoo:signal"\n'
                   'tier = "any"\ntargets = ["ref"]\n')
    monkeypatch.setattr(shm, "deny_same_user_inspection", lambda: False)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    name = f"hwb-clitest-{secrets.token_hex(3)}"
    assert main(["serve", "--config", str(cfg), "--strategy", "a", "--cache-dir",
                 str(tmp_path / "store"), "--shm", name, "--duration", "0.05"]) == 0
    info = json.loads(capsys.readouterr().out.splitlines()[0])
    assert info["strategy"] == "a"
    (key,) = ArtifactStore(tmp_path / "store").keys()  # the router's ref variant, built there
    assert ArtifactStore(tmp_path / "store").get(key)["target"] == "ref"
