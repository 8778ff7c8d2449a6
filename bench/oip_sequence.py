"""A long sequence over the Open Inference Protocol's gRPC service, checked tick by tick, and
what the protocol costs over the in-process call.

Starts ``hwb serve MODEL -t TARGET --grpc-port 0 --http 0 --sequences 2 --insecure-loopback``
and sends ``--ticks`` ticks (default 10,000) of one sequence to ``NAME.window`` over gRPC
(this package's generated stub of ``inference.GRPCInferenceService``, the wire format
tritonclient sends), START on the first and END on the last; every answer must equal
``push_into`` on a window of the same compiled model in this process (bit for bit), else the
script exits 1 naming the first tick that differs. Then, one tick at a time, it times:

* ``push_into`` in process (the window alone),
* ``ModelInfer`` over gRPC on the sequence model (a tick),
* ``ModelInfer`` over gRPC and ``POST /v2/models/NAME/infer`` over HTTP (binary tensors) on the
  whole-window model (a window per request),
* ``predict_into`` in process (the whole window),

and prints p50/p99 of each (µs, client-side, timer included) as one JSON line.

    python bench/oip_sequence.py                       # zoo:lstm on cpu.native, 10,000 ticks
    python bench/oip_sequence.py --ticks 2000 --timed 2000
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) / 1e3
    return {"p50_us": round(float(np.percentile(a, 50)), 1), "p99_us": round(float(np.percentile(a, 99)), 1),
            "n": len(xs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="zoo:lstm")
    ap.add_argument("--target", default="cpu.native")
    ap.add_argument("--ticks", type=int, default=10_000)
    ap.add_argument("--timed", type=int, default=3_000, help="calls timed per path")
    args = ap.parse_args()

    import grpc

    import hwbackends as hwb
    from hwbackends.serve.proto import grpc_service_pb2 as pb
    from hwbackends.serve.proto import grpc_service_pb2_grpc as pbg

    cm = hwb.compile(args.model, args.target)
    p = subprocess.Popen([sys.executable, "-m", "hwbackends", "serve", args.model, "-t", args.target,
                          "--grpc-port", "0", "--http", "0", "--sequences", "2", "--insecure-loopback"],
                         stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    try:
        info = json.loads(p.stdout.readline())
        name = info["oip_models"][1] if len(info["oip_models"]) > 1 else info["oip_models"][0]
        ch = grpc.insecure_channel(info["grpc"])
        stub = pbg.GRPCInferenceServiceStub(ch)
        rng = np.random.default_rng(47)
        step = cm.input.shape[1:]
        xs = rng.standard_normal((args.ticks, *step)).astype(np.float32)
        w = cm.sliding()
        want = np.empty(cm.output.shape, np.float32)

        def tick_req(i: int, x: np.ndarray, sid: int, start: bool, end: bool) -> object:
            req = pb.ModelInferRequest(model_name=f"{name}.window")
            req.inputs.add(name=cm.input.name, datatype="FP32", shape=[1, *step])
            req.raw_input_contents.append(x.tobytes())
            req.parameters["sequence_id"].int64_param = sid
            req.parameters["sequence_start"].bool_param = start
            req.parameters["sequence_end"].bool_param = end
            return req

        t_tick = []
        for i, x in enumerate(xs):
            req = tick_req(i, x, 7, i == 0, i == args.ticks - 1)
            t0 = time.perf_counter_ns()
            r = stub.ModelInfer(req)
            t_tick.append(time.perf_counter_ns() - t0)
            w.push_into(x, want)
            got = np.frombuffer(r.raw_output_contents[0], "<f4").reshape(want.shape)
            if not np.array_equal(got, want):
                print(f"tick {i}: gRPC answered {got.tolist()}, push_into {want.tolist()}", file=sys.stderr)
                return 1
        n = min(args.timed, args.ticks)
        w2 = cm.sliding()
        t_push = []
        for x in xs[:n]:
            t0 = time.perf_counter_ns()
            w2.push_into(x, want)
            t_push.append(time.perf_counter_ns() - t0)
        win = rng.standard_normal((1, *cm.input.shape)).astype(np.float32)
        out = np.empty((1, *cm.output.shape), np.float32)
        t_predict = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            cm.predict_into(win, out)
            t_predict.append(time.perf_counter_ns() - t0)
        req = pb.ModelInferRequest(model_name=name)
        req.inputs.add(name=cm.input.name, datatype="FP32", shape=list(win.shape))
        req.raw_input_contents.append(win.tobytes())
        t_grpc = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            stub.ModelInfer(req)
            t_grpc.append(time.perf_counter_ns() - t0)
        host, port = info["http"].removeprefix("http://").rsplit(":", 1)
        c = http.client.HTTPConnection(host, int(port))
        head = json.dumps({"inputs": [{"name": cm.input.name, "datatype": "FP32", "shape": list(win.shape),
                                       "parameters": {"binary_data_size": win.nbytes}}],
                           "outputs": [{"name": cm.output.name, "parameters": {"binary_data": True}}]}).encode()
        body = head + win.tobytes()
        hdr = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
        t_http = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            c.request("POST", f"/v2/models/{name}/infer", body, hdr)
            c.getresponse().read()
            t_http.append(time.perf_counter_ns() - t0)
        print(json.dumps({
            "model": args.model, "target": args.target, "variant": info["variant"],
            "ticks_checked": args.ticks, "all_equal_push_into": True,
            "sequence_form": info["sequences"]["form"],
            "push_into": _pct(t_push), "grpc_tick": _pct(t_tick),
            "predict_into": _pct(t_predict), "grpc_window": _pct(t_grpc), "http_window": _pct(t_http),
            "cpu": os.uname().machine, "note": "informal: client-side, timer included"}))
        ch.close()
        return 0
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)


if __name__ == "__main__":
    sys.exit(main())
