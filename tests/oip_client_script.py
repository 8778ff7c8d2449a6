"""Run inside the tritonclient venv (test_serve_oip_clients.py): Triton's own Python clients,
HTTP and gRPC, against ``hwb serve``. Reads ``in.npz`` from the work directory given as
argv[1] with the server's addresses and token in argv[2:5]; writes every answer to
``out.npz`` and the errors the server sent to ``errors.json``; the test compares them with
``predict`` and ``push_into`` in its own process."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def main() -> None:
    # a fresh headers dict per call: tritonclient's infer writes Inference-Header-Content-Length
    # into the dict it is given
    work, http_url, grpc_addr, token = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    data = np.load(work / "in.npz")
    auth = {"authorization": f"Bearer {token}"}  # gRPC metadata keys are lower case
    out: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    h = httpclient.InferenceServerClient(http_url)
    g = grpcclient.InferenceServerClient(grpc_addr)
    meta: dict = {}
    for proto, c, mod in (("http", h, httpclient), ("grpc", g, grpcclient)):
        assert c.is_server_live(headers=dict(auth)) and c.is_server_ready(headers=dict(auth))
        assert c.is_model_ready("lstm", headers=dict(auth))
        md = c.get_model_metadata("lstm", headers=dict(auth))
        cfg = c.get_model_config("lstm.window", headers=dict(auth))
        if proto == "grpc":
            md = {"inputs": [{"name": i.name, "shape": list(i.shape)} for i in md.inputs]}
            cfg = {"max_batch_size": cfg.config.max_batch_size,
                   "sequence": cfg.config.HasField("sequence_batching")}
        else:
            cfg = {"max_batch_size": cfg["max_batch_size"], "sequence": "sequence_batching" in cfg}
        meta[proto] = {"inputs": md["inputs"] if isinstance(md, dict) else None, "config": cfg}
        x = data["batch"]
        for binary in ((True, False) if proto == "http" else (True,)):
            inp = mod.InferInput("input", list(x.shape), "FP32")
            if proto == "http":
                inp.set_data_from_numpy(x, binary_data=binary)
                req_out = [mod.InferRequestedOutput("output", binary_data=binary)]
            else:
                inp.set_data_from_numpy(x)
                req_out = [mod.InferRequestedOutput("output")]
            for name in ("lstm", "default"):  # by model and by strategy
                r = c.infer(name, [inp], outputs=req_out, headers=dict(auth))
                out[f"{proto}_{name}_{int(binary)}"] = r.as_numpy("output")
        # two sequences, interleaved tick by tick, each equal to its own window
        ticks = {1: data["seq_a"], 2: data["seq_b"]}
        got = {k: [] for k in ticks}
        n = len(ticks[1])
        for i in range(n):
            for sid, xs in ticks.items():
                inp = mod.InferInput("input", [1, xs.shape[1]], "FP32")
                inp.set_data_from_numpy(xs[i:i + 1])
                r = c.infer("lstm.window", [inp], sequence_id=sid + (100 if proto == "http" else 0),
                            sequence_start=i == 0, sequence_end=i == n - 1, headers=dict(auth))
                got[sid].append(r.as_numpy("output")[0])
        for sid in ticks:
            out[f"{proto}_seq_{sid}"] = np.stack(got[sid])
        # errors, as the clients raise them
        for what, model, kw in (("unknown_model", "nope", {"headers": dict(auth)}),
                                ("ended_sequence", "lstm.window", {"sequence_id": 1, "headers": dict(auth)}),
                                ("no_token", "lstm", {})):
            try:
                c.infer(model, [inp], **kw)
                errors[f"{proto}_{what}"] = "no error"
            except InferenceServerException as exc:
                errors[f"{proto}_{what}"] = f"{exc.status()} {exc.message()}"
        stats = c.get_inference_statistics("lstm", headers=dict(auth))
        meta[proto]["inference_count"] = int(
            stats.model_stats[0].inference_count if proto == "grpc" else stats["model_stats"][0]["inference_count"])
    np.savez(work / "out.npz", **out)
    (work / "errors.json").write_text(json.dumps({"errors": errors, "meta": meta}))


if __name__ == "__main__":
    main()
