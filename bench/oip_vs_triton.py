"""One ``perf_analyzer`` run against ``hwb serve`` and against a real Triton server serving
``hwb export`` of the same model variant: the same client, the same flags (gRPC, concurrency 1,
batch 1), p50/p99 side by side (the goal: hwb serve's gRPC p99 ≤ 0.5× Triton's).

Needs the two cached venvs the tests build: ``tritonclient`` 2.51 with ``perf_analyzer``
(tests/test_serve_oip_clients.py, ``$HWB_OIP_CLIENT_ENV``, default ``~/.cache/hwbackends-oip``)
and ``nvidia-pytriton`` 0.7 with ``tritonserver`` (tests/test_export_triton.py,
``$HWB_TRITON_ENV``, default ``~/.cache/hwbackends-triton``; its server has the python backend
only, so the export is the python-backend flavour running the same LiteRT/ONNX Runtime
variant inside Triton). Both servers listen on 127.0.0.1.

    python bench/oip_vs_triton.py                             # zoo:signal, cpu.litert:fp32
    python bench/oip_vs_triton.py --model zoo:two_head --target cpu.onnxruntime:fp32
    python bench/oip_vs_triton.py --serve-args "--config strategies.toml --strategy momentum"

Prints one JSON line: each server's p50/p90/p99 (µs) and inferences/s as perf_analyzer
reports them, and the ratio of the p99s. A figure on a loaded machine is informal.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from triton_tools import libb64, start_tritonserver, tritonserver_env  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _perf(pa: Path, env: dict, model: str, url: str, out: Path, requests: int) -> dict:
    r = subprocess.run([str(pa), "-m", model, "-u", url, "-i", "grpc", "-b", "1",
                        "--concurrency-range", "1", "--percentile", "99",
                        "--measurement-mode", "count_windows", "--measurement-request-count", str(requests),
                        "--stability-percentage", "1000", "--max-trials", "3", "-f", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode:
        raise SystemExit(f"perf_analyzer against {model} at {url} failed:\n{(r.stdout + r.stderr)[-2000:]}")
    row = next(csv.DictReader(out.open()))
    return {"p50_us": float(row["p50 latency"]), "p90_us": float(row["p90 latency"]),
            "p99_us": float(row["p99 latency"]), "inferences_per_s": float(row["Inferences/Second"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="zoo:signal")
    ap.add_argument("--target", default="cpu.litert:fp32", help="the variant both servers run")
    ap.add_argument("--serve-args", default="", help="instead of MODEL -t TARGET, e.g. a router strategy")
    ap.add_argument("--requests", type=int, default=2000, help="requests per perf_analyzer window")
    args = ap.parse_args()
    client = Path(os.environ.get("HWB_OIP_CLIENT_ENV", Path.home() / ".cache" / "hwbackends-oip"))
    triton = Path(os.environ.get("HWB_TRITON_ENV", Path.home() / ".cache" / "hwbackends-triton"))
    pa = client / "venv" / "bin" / "perf_analyzer"
    if not pa.exists():
        raise SystemExit(f"no perf_analyzer at {pa}: run tests/test_serve_oip_clients.py once to build it")
    try:
        tenv = tritonserver_env(triton / "venv")
    except LookupError as exc:
        raise SystemExit(f"{exc}: run tests/test_export_triton.py once (-m slow) to build it") from None
    site = next((client / "venv" / "lib").glob("python3*/site-packages"))
    libs = [str(site / "nvidia" / "cuda_runtime" / "lib")]
    b64 = libb64(client)
    if b64:
        libs.append(str(b64))
    pa_env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(libs))
    work = Path(tempfile.mkdtemp(prefix="hwb-oip-vs-triton-"))
    repo = work / "repo"
    r = subprocess.run([sys.executable, "-m", "hwbackends", "export", args.model, "-t", args.target,
                        "--format", "triton", "--flavour", "python", "--name", "m", "-o", str(repo)],
                       capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"hwb export failed:\n{r.stderr[-2000:]}")
    http, grpc = _free_port(), _free_port()
    ts = start_tritonserver(tenv, repo, work, http, grpc, ("m",))
    target, _, precision = args.target.partition(":")
    serve_cmd = (shlex.split(args.serve_args) if args.serve_args
                 else [args.model, "-t", target, *(["-p", precision] if precision else [])])
    hs = subprocess.Popen([sys.executable, "-m", "hwbackends", "serve", *serve_cmd, "--grpc-port", "0",
                           "--insecure-loopback"], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                          start_new_session=True)
    try:
        line = hs.stdout.readline()
        if not line:
            raise SystemExit(f"hwb serve {' '.join(serve_cmd)} exited ({hs.wait()}) before serving")
        info = json.loads(line)
        name = info["oip_models"][0]
        ours = _perf(pa, pa_env, name, info["grpc"], work / "hwb.csv", args.requests)
        theirs = _perf(pa, pa_env, "m", f"127.0.0.1:{grpc}", work / "triton.csv", args.requests)
        print(json.dumps({"model": args.model, "variant": info["variant"], "hwb_serve_grpc": ours,
                          "triton_grpc": theirs, "p99_ratio": round(ours["p99_us"] / theirs["p99_us"], 3),
                          "client": "perf_analyzer (tritonclient 2.51), gRPC, concurrency 1, batch 1",
                          "triton": "nvidia-pytriton 0.7 tritonserver, python backend (hwb export --flavour python)",
                          "cpu": os.uname().machine}))
        return 0
    finally:
        for p in (hs, ts):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)


if __name__ == "__main__":
    sys.exit(main())
