"""The Open Inference Protocol endpoints (HTTP/REST and gRPC ``inference.GRPCInferenceService``)
and sequences, in process: answers equal to ``predict``, the binary-tensor extension, tensors
of a two-input model, Triton's config/statistics, sequence ticks equal to ``push_into`` on a
window of the same model, and hostile requests answered in the protocol's error form (HTTP
status + ``{"error": ...}``, gRPC status code) while the server keeps serving. The real
clients (tritonclient, perf_analyzer) against ``hwb serve`` are in test_serve_oip_clients.py."""
from __future__ import annotations

import http.client
import json
import shutil
import socket
import urllib.error
import urllib.request

import numpy as np
import pytest

from hwbackends.errors import ConfigError, InputError
from hwbackends.serve import Engine
from hwbackends.serve.grpc_server import GrpcServer
from hwbackends.serve.oip import OipModels
from hwbackends.serve.oip_http import OipHttpServer
from hwbackends.serve.sequences import SequenceError, Sequences

grpc = pytest.importorskip("grpc")
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="cpu.native needs a C compiler")
TOKEN = "t" * 24


@pytest.fixture(scope="module")
def lstm(compiled):
    return compiled("lstm", "cpu.native")


@pytest.fixture(scope="module")
def two_head(compiled):
    return compiled("two_head", "cpu.onnxruntime")


@pytest.fixture(scope="module")
def servers(lstm, two_head):
    eng = Engine(lstm).start()
    eng2 = Engine(two_head).start()
    seq = Sequences(lstm.sliding(streams=2), lstm)
    models = OipModels({"default": eng, "lstm": eng, "two_head": eng2},
                       {"lstm.window": (eng, seq)})
    h = OipHttpServer(models, insecure_loopback=True, max_request_bytes=256 << 10)
    g = GrpcServer(eng, insecure_loopback=True, oip=models)
    try:
        yield {"http": h, "grpc": g, "seq": seq, "models": models}
    finally:
        h.stop()
        g.stop()
        eng.stop()
        eng2.stop()


def _req(url: str, body: bytes | None = None, headers: dict | None = None,
         method: str | None = None) -> tuple[int, bytes, dict]:
    r = urllib.request.Request(url, body, headers or {}, method=method)
    try:
        with urllib.request.urlopen(r, timeout=30) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _infer_json(name: str, x: np.ndarray, **params) -> bytes:
    body = {"inputs": [{"name": name, "datatype": "FP32", "shape": list(x.shape),
                        "data": x.ravel().tolist()}]}
    if params:
        body["parameters"] = params
    return json.dumps(body).encode()


def _error(code_body) -> str:
    return json.loads(code_body[1])["error"]


def test_http_health_metadata_config_and_json_infer_equal_predict(servers, lstm):
    u = servers["http"].url
    assert _req(u + "/v2/health/live")[0] == 200
    assert _req(u + "/v2/health/ready")[0] == 200
    meta = json.loads(_req(u + "/v2")[1])
    assert meta["name"] == "hwbackends" and "sequence" in meta["extensions"]
    md = json.loads(_req(u + "/v2/models/lstm")[1])
    assert md["inputs"] == [{"name": lstm.input.name, "datatype": "FP32", "shape": [-1, 16, 8]}]
    assert _req(u + "/v2/models/lstm/ready")[0] == 200
    assert _req(u + "/v2/models/nope/ready")[0] == 400
    cfg = json.loads(_req(u + "/v2/models/lstm.window/config")[1])
    assert cfg["max_batch_size"] == 1 and cfg["input"][0]["dims"] == [8]
    assert "sequence_batching" in cfg
    x = np.random.default_rng(1).standard_normal((3, 16, 8)).astype(np.float32)
    for name in ("lstm", "default", "lstm/versions/1"):  # by model, by strategy, by version
        code, body, _ = _req(f"{u}/v2/models/{name}/infer", _infer_json(lstm.input.name, x))
        assert code == 200, body
        out = json.loads(body)["outputs"][0]
        assert out["shape"] == [3, 1] and out["datatype"] == "FP32"
        np.testing.assert_array_equal(np.asarray(out["data"], np.float32).reshape(3, 1), lstm.predict(x))
    stats = json.loads(_req(u + "/v2/models/lstm/stats")[1])["model_stats"][0]
    assert stats["inference_count"] >= 3 and stats["execution_count"] >= 1
    assert any(m["name"] == "lstm.window" for m in json.loads(_req(u + "/v2/repository/index", b"{}")[1]))


def test_http_binary_tensor_extension_both_ways(servers, lstm):
    u = servers["http"].url
    x = np.random.default_rng(2).standard_normal((2, 16, 8)).astype(np.float32)
    head = json.dumps({"inputs": [{"name": lstm.input.name, "datatype": "FP32", "shape": [2, 16, 8],
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": lstm.output.name, "parameters": {"binary_data": True}}]}).encode()
    code, body, hdr = _req(u + "/v2/models/lstm/infer", head + x.tobytes(),
                           {"Inference-Header-Content-Length": str(len(head))})
    assert code == 200, body
    n = int(hdr["Inference-Header-Content-Length"])
    reply = json.loads(body[:n])
    assert reply["outputs"][0]["parameters"]["binary_data_size"] == 8
    np.testing.assert_array_equal(np.frombuffer(body[n:], "<f4").reshape(2, 1), lstm.predict(x))
    # a binary size that does not match the shape, and bytes nobody claims
    bad = head.replace(str(x.nbytes).encode(), str(x.nbytes - 4).encode())
    code, body, _ = _req(u + "/v2/models/lstm/infer", bad + x.tobytes(),
                         {"Inference-Header-Content-Length": str(len(bad))})
    assert code == 400 and "binary_data_size" in json.loads(body)["error"]


def test_two_input_model_by_tensor(servers, two_head):
    u = servers["http"].url
    rng = np.random.default_rng(3)
    xs = tuple(rng.standard_normal(s.batched(2)).astype(np.float32) for s in two_head.inputs)
    body = {"inputs": [{"name": s.name, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
                       for s, x in zip(two_head.inputs, xs, strict=True)][::-1]}  # any order
    code, reply, _ = _req(u + "/v2/models/two_head/infer", json.dumps(body).encode())
    assert code == 200, reply
    by = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in json.loads(reply)["outputs"]}
    for s, ref in zip(two_head.outputs, two_head.predict(xs), strict=True):
        np.testing.assert_allclose(by[s.name], ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("body, status, says", [
    (b"{not json", 400, "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    (b'{"inputs": 3}', 400, "non-empty list"),
    (json.dumps({"inputs": [{"name": "input", "datatype": "FP64", "shape": [1, 16, 8],
                             "data": [0.0] * 128}]}).encode(), 400, "takes FP32"),
    (json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8],
                             "data": [0.0] * 8}]}).encode(), 400, "has shape [1, 8]"),
    (json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16, 8],
                             "data": [0.0] * 5}]}).encode(), 400, "carries 5 values"),
    (json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16, 8],
                             "data": ["a"] * 128}]}).encode(), 400, "must be numbers"),
    (json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16, 8],
                             "data": [float("nan")] * 128}]}).encode(), 400, "NaN"),
    (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16, 8],
                             "data": [0.0] * 128}]}).encode(), 400, "has unknown ['x']"),
    (json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [300, 16, 8],
                             "data": [0] * 38_400}]}).encode(), 400, "[n (1 to 256), 16, 8]"),
])
def test_http_hostile_bodies_get_the_protocol_error(servers, body, status, says):
    u = servers["http"].url
    code, reply, _ = _req(u + "/v2/models/lstm/infer", body, {"Content-Type": "application/json"})
    assert code == status and says in json.loads(reply)["error"], reply[:300]
    assert _req(u + "/v2/health/ready")[0] == 200  # still serving


def test_http_size_caps_and_framing(servers):
    srv = servers["http"]
    assert _req(srv.url + "/v2/models/nope")[0] == 404
    assert "unknown model 'nope'" in _error(_req(srv.url + "/v2/models/nope"))
    assert _req(srv.url + "/v3")[0] == 404
    # Content-Length over the cap: 413 before a byte of the body is read
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
    c.putrequest("POST", "/v2/models/lstm/infer")
    c.putheader("Content-Length", str(10 << 20))
    c.endheaders()
    r = c.getresponse()
    assert r.status == 413 and "at most 262144" in json.loads(r.read())["error"]
    c.close()
    # chunked: refused (411); no Content-Length: refused
    with socket.create_connection((srv.host, srv.port), timeout=10) as s:
        s.sendall(b"POST /v2/models/lstm/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert s.recv(200).startswith(b"HTTP/1.1 411")
    with socket.create_connection((srv.host, srv.port), timeout=10) as s:
        s.sendall(b"POST /v2/models/lstm/infer HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"Content-Length" in s.recv(500)


def test_http_token_and_tls_rules(lstm):
    eng = Engine(lstm).start()
    try:
        models = OipModels({"lstm": eng})
        with pytest.raises(ConfigError, match="needs TLS certificate/key and token"):
            OipHttpServer(models)
        with pytest.raises(ConfigError, match="not a loopback address"):
            OipHttpServer(models, host="0.0.0.0", insecure_loopback=True)
        import ssl

        from hwbackends.serve.grpc_server import self_signed_cert
        tls = self_signed_cert()
        with OipHttpServer(models, tls=tls, token=TOKEN) as h:
            ctx = ssl.create_default_context(cadata=tls.cert_pem.decode())
            def get(headers):
                try:
                    with urllib.request.urlopen(urllib.request.Request(h.url + "/v2", headers=headers),
                                                context=ctx, timeout=10) as r:
                        return r.status, r.read()
                except urllib.error.HTTPError as e:
                    return e.code, e.read()
            code, body = get({})
            assert code == 401 and "Bearer" in json.loads(body)["error"]
            assert get({"Authorization": "Bearer wrong-token-xxxxxxxxxxx"})[0] == 401
            assert get({"Authorization": f"bearer {TOKEN}"})[0] == 200
    finally:
        eng.stop()


def _stub(servers):
    from hwbackends.serve.proto import grpc_service_pb2 as pb
    from hwbackends.serve.proto import grpc_service_pb2_grpc as pbg
    ch = grpc.insecure_channel(servers["grpc"].address)
    return pb, pbg.GRPCInferenceServiceStub(ch), ch


def test_grpc_inference_service_equal_predict_and_errors(servers, lstm):
    pb, stub, ch = _stub(servers)
    try:
        assert stub.ServerLive(pb.ServerLiveRequest()).live
        assert stub.ServerReady(pb.ServerReadyRequest()).ready
        assert stub.ModelReady(pb.ModelReadyRequest(name="lstm")).ready
        assert not stub.ModelReady(pb.ModelReadyRequest(name="nope")).ready
        md = stub.ModelMetadata(pb.ModelMetadataRequest(name="lstm"))
        assert list(md.inputs[0].shape) == [-1, 16, 8] and md.inputs[0].datatype == "FP32"
        cfg = stub.ModelConfig(pb.ModelConfigRequest(name="lstm.window")).config
        assert cfg.max_batch_size == 1 and cfg.WhichOneof("scheduling_choice") == "sequence_batching"
        x = np.random.default_rng(4).standard_normal((2, 16, 8)).astype(np.float32)
        req = pb.ModelInferRequest(model_name="lstm", id="r1")
        req.inputs.add(name=lstm.input.name, datatype="FP32", shape=[2, 16, 8])
        req.raw_input_contents.append(x.tobytes())
        resp = stub.ModelInfer(req)
        assert resp.id == "r1" and list(resp.outputs[0].shape) == [2, 1]
        np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], "<f4").reshape(2, 1),
                                      lstm.predict(x))
        req2 = pb.ModelInferRequest(model_name="default")  # fp32_contents instead of raw bytes
        t = req2.inputs.add(name=lstm.input.name, datatype="FP32", shape=[1, 16, 8])
        t.contents.fp32_contents.extend(x[0].ravel().tolist())
        got = np.frombuffer(stub.ModelInfer(req2).raw_output_contents[0], "<f4")
        np.testing.assert_array_equal(got, lstm.predict(x[:1]).ravel())
        stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name="lstm")).model_stats[0]
        assert stats.inference_count >= 2
        for bad, code, says in [
            (pb.ModelInferRequest(model_name="nope"), grpc.StatusCode.NOT_FOUND, "unknown model"),
            (req2.__class__(model_name="lstm", inputs=[dict(name="input", datatype="FP32", shape=[1, 4])],
                            raw_input_contents=[b"\0" * 16]), grpc.StatusCode.INVALID_ARGUMENT, "has shape"),
            (req2.__class__(model_name="lstm", inputs=[dict(name="input", datatype="FP32", shape=[1, 16, 8])],
                            raw_input_contents=[b"\0" * 3]), grpc.StatusCode.INVALID_ARGUMENT, "whole number"),
        ]:
            with pytest.raises(grpc.RpcError) as ei:
                stub.ModelInfer(bad)
            assert ei.value.code() == code and says in ei.value.details()
        # bytes that are no ModelInferRequest: INVALID_ARGUMENT naming the proto
        raw = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as ei:
            raw(b"\xff\xff\xff")
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "grpc_service.proto" in ei.value.details()
    finally:
        ch.close()


def _reference_ticks(cm, xs, resets=()):
    w = cm.sliding()
    out = np.empty((len(xs), *cm.output.shape), np.float32)
    for i, x in enumerate(xs):
        if i in resets:
            w.reset()
        w.push_into(x, out[i])
    return out


def _tick_req(pb, cm, cid, x, start=False, end=False):
    req = pb.ModelInferRequest(model_name="lstm.window")
    req.inputs.add(name=cm.input.name, datatype="FP32", shape=[1, *x.shape])
    req.raw_input_contents.append(x.tobytes())
    req.parameters["sequence_id"].int64_param = cid
    req.parameters["sequence_start"].bool_param = start
    req.parameters["sequence_end"].bool_param = end
    return req


def test_grpc_sequences_equal_push_into_and_interleave_independently(servers, lstm):
    pb, stub, ch = _stub(servers)
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal((60, 8)).astype(np.float32) for _ in range(2))
    got = {1: [], 2: []}
    try:
        for i in range(60):  # two sequences, interleaved tick by tick
            for cid, xs in ((1, a), (2, b)):
                r = stub.ModelInfer(_tick_req(pb, lstm, cid, xs[i], start=i == 0, end=i == 59))
                got[cid].append(np.frombuffer(r.raw_output_contents[0], "<f4"))
        np.testing.assert_array_equal(np.stack(got[1]), _reference_ticks(lstm, a))
        np.testing.assert_array_equal(np.stack(got[2]), _reference_ticks(lstm, b))
        # ended: the id is unknown now
        with pytest.raises(grpc.RpcError) as ei:
            stub.ModelInfer(_tick_req(pb, lstm, 1, a[0]))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "sequence_start" in ei.value.details()
        # two windows: a third live sequence is refused, and nothing was pushed
        for cid in (10, 11):
            stub.ModelInfer(_tick_req(pb, lstm, cid, a[0], start=True))
        with pytest.raises(grpc.RpcError) as ei:
            stub.ModelInfer(_tick_req(pb, lstm, 12, a[0], start=True))
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "all 2 sequence windows" in ei.value.details()
        # a START on a live id starts its window again
        r = stub.ModelInfer(_tick_req(pb, lstm, 10, a[5], start=True))
        np.testing.assert_array_equal(np.frombuffer(r.raw_output_contents[0], "<f4"),
                                      _reference_ticks(lstm, a[5:6])[0])
        for cid in (10, 11):
            stub.ModelInfer(_tick_req(pb, lstm, cid, a[1], end=True))
        assert servers["seq"].live == 0
        # a whole window to the sequence model, or a tick without an id
        req = pb.ModelInferRequest(model_name="lstm.window")
        req.inputs.add(name="input", datatype="FP32", shape=[1, 16, 8])
        req.raw_input_contents.append(np.zeros(128, np.float32).tobytes())
        with pytest.raises(grpc.RpcError, match="one tick per request"):
            stub.ModelInfer(req)
        with pytest.raises(grpc.RpcError, match="give the request a sequence_id"):
            stub.ModelInfer(_tick_req(pb, lstm, 0, a[0], start=True))
    finally:
        ch.close()


def test_http_sequence_with_string_ids(servers, lstm):
    u = servers["http"].url
    xs = np.random.default_rng(7).standard_normal((20, 8)).astype(np.float32)
    got = []
    for i, x in enumerate(xs):
        code, body, _ = _req(u + "/v2/models/lstm.window/infer",
                             _infer_json(lstm.input.name, x[None], sequence_id="AAPL",
                                         sequence_start=i == 0, sequence_end=i == 19))
        assert code == 200, body
        got.append(json.loads(body)["outputs"][0]["data"])
    np.testing.assert_array_equal(np.asarray(got, np.float32), _reference_ticks(lstm, xs))
    code, body, _ = _req(u + "/v2/models/lstm.window/infer",
                         _infer_json(lstm.input.name, xs[:1], sequence_id="AAPL"))
    assert code == 400 and "not live" in json.loads(body)["error"]
    code, body, _ = _req(u + "/v2/models/lstm/infer",
                         _infer_json(lstm.input.name, np.zeros((1, 16, 8), np.float32), sequence_id=5))
    assert code == 400 and "NAME.window" in json.loads(body)["error"]


def test_sequences_reclaim_idle_windows_and_check_ids(lstm, monkeypatch):
    seq = Sequences(lstm.sliding(streams=1), lstm, idle_s=5.0)
    x, out = np.zeros(8, np.float32), np.empty(1, np.float32)
    seq.tick(1, x, out, start=True)
    with pytest.raises(SequenceError, match="all 1 sequence windows"):
        seq.tick(2, x, out, start=True)
    import time
    t = time.monotonic()
    monkeypatch.setattr("hwbackends.serve.sequences.time.monotonic", lambda: t + 10)
    seq.tick(2, x, out, start=True)  # 1 was silent for 10 s > 5 s: reclaimed
    assert seq.reclaimed == 1
    with pytest.raises(SequenceError, match="not live"):
        seq.tick(1, x, out)
    for bad in (0, -3, True, "", "x" * 300, 1.5, 1 << 64):
        with pytest.raises(SequenceError, match="sequence_id"):
            seq.tick(bad, x, out, start=True)
    with pytest.raises(InputError):
        Sequences(lstm.sliding(streams=1), lstm, idle_s=-1)


def test_http_connection_cap_and_idle_timeout(lstm):
    import time

    eng = Engine(lstm).start()
    try:
        with OipHttpServer(OipModels({"lstm": eng}), insecure_loopback=True, max_connections=2,
                           timeout_s=0.5) as h:
            held = [socket.create_connection((h.host, h.port), timeout=5) for _ in range(2)]
            time.sleep(0.2)
            # a third connection is closed at once, unanswered
            with socket.create_connection((h.host, h.port), timeout=5) as s:
                s.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
                assert s.recv(100) == b""
            # the silent ones are closed after the timeout, and the server serves again
            for s in held:
                s.settimeout(5)
                assert s.recv(100) == b""
                s.close()
            time.sleep(0.2)
            assert _req(h.url + "/v2/health/live")[0] == 200
    finally:
        eng.stop()


def test_hwb_serve_protocol_flags_are_checked(capsys):
    from hwbackends.cli import main

    assert main(["serve", "zoo:lstm", "-t", "cpu.native", "--shm", "x", "--sequences", "4"]) == 1
    assert "--sequences serves over the Open Inference Protocol" in capsys.readouterr().err
    assert main(["serve", "zoo:lstm", "-t", "cpu.native", "--shm", "x", "--sliding",
                 "--http", "0"]) == 1
    assert "--sequences N serves a window per sequence id" in capsys.readouterr().err


def test_http_other_methods_and_a_get_with_a_body_close_the_connection(servers):
    srv = servers["http"]
    for raw in (b"PUT /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nGET ",
                b"GET /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nGET "):
        with socket.create_connection((srv.host, srv.port), timeout=10) as s:
            s.sendall(raw)
            got = b""
            while chunk := s.recv(4096):  # the server closes: the 4 bytes never become a request
                got += chunk
            status = got.split(b" ", 2)[1]
            assert status in (b"404", b"400") and got.count(b"HTTP/1.1 ") == 1, got
            assert b'"error"' in got


def test_sequences_against_a_model_of_windows_per_id(lstm):
    """Any interleaving of START / ticks / END over a few ids: each answer is push_into on a
    window of that id's own (emptied at its START), and the refusals are exactly the ones the
    rules give (not live without START; START with every window live)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ops = st.lists(st.tuples(st.integers(1, 5), st.booleans(), st.booleans(),
                             st.integers(0, 2 ** 31)), min_size=1, max_size=60)

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(ops)
    def run(steps):
        seq = Sequences(lstm.sliding(streams=3), lstm, idle_s=1e6)
        windows = lstm.sliding(streams=6)  # the reference: window cid for id cid
        ref: set[int] = set()  # the ids live in the reference
        out, want = np.empty(1, np.float32), np.empty(1, np.float32)
        for cid, start, end, seed in steps:
            x = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
            if not start and cid not in ref:
                with pytest.raises(SequenceError, match="not live"):
                    seq.tick(cid, x, out, start=start, end=end)
                continue
            if start and cid not in ref and len(ref) == 3:
                with pytest.raises(SequenceError, match="all 3 sequence windows"):
                    seq.tick(cid, x, out, start=start, end=end)
                continue
            if start:
                ref.add(cid)
                windows.reset(cid)
            seq.tick(cid, x, out, start=start, end=end)
            windows.push_into(cid, x, want)
            np.testing.assert_array_equal(out, want)
            if end:
                ref.discard(cid)
            assert seq.live == len(ref)
    run()
