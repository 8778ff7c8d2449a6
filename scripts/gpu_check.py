#!/usr/bin/env python3
"""GPU check: on a machine with an NVIDIA GPU and only PyTorch and JAX (TensorFlow not needed),
run the GPU tests, then measure batch-1 latency of ``gpu.torch`` and ``tpu.xla`` (on the GPU
XLA backend) for the zoo MLP and LSTM (``mlp_torch``, ``lstm_torch``); write JSON.

    python scripts/gpu_check.py [--out gpu_check.json] [--calls 2000] [--budget 280]

Latency, per variant: wall-clock p50/p99 of ``cm.predict_into(x, out)`` (numpy in, numpy out:
what a caller pays), and device-side time:
  gpu.torch  CUDA events around the whole call (H2D copy, graph replay, D2H copy) and around
             the bare ``CUDAGraph.replay()``;
  tpu.xla    JAX exposes no CUDA events: the wall clock of the bare compiled executable on a
             device-resident input (``block_until_ready``), which bounds the device time.

Needs: numpy, pluggy, torch (CUDA build), jax (CUDA plugin), onnx (the XLA path reads ONNX);
pytest for the test step (skipped, and said so, without it). Without an installed hwbackends
the script makes the repository importable itself (a temporary ``hwb_plugins`` link and entry
points), so a checkout is enough. The whole run stays under ``--budget`` seconds (default 280):
a variant that would end past it (judged by the slowest variant so far) is recorded as
skipped, and a test run past its share is killed with its compile workers.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
T0 = time.monotonic()
MODELS = ("mlp_torch", "lstm_torch")
VARIANTS = (("gpu.torch", "fp32"), ("gpu.torch", "fp16"), ("tpu.xla", "fp32"), ("tpu.xla", "bf16"))


def elapsed() -> float:
    return time.monotonic() - T0


def say(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


def bootstrap() -> dict[str, Any]:
    """Make hwbackends and its plugins importable here and in child processes, without pip."""
    info: dict[str, Any] = {"installed": True}
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    eps = importlib.metadata.entry_points(group="hwbackends")
    if any(ep.name == "tpu_xla" for ep in eps) and importlib.util.find_spec("hwb_plugins"):
        return info
    # Not installed: link plugins/ as hwb_plugins and declare the entry points in a tiny
    # dist-info, both on sys.path and PYTHONPATH (the compile worker is a fresh interpreter).
    site = Path(tempfile.mkdtemp(prefix="hwb-gpucheck-site-"))
    (site / "hwb_plugins").symlink_to(REPO / "plugins", target_is_directory=True)
    dist = site / "hwbackends_checkout-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hwbackends-checkout\nVersion: 0.0\n")
    section, lines = False, ["[hwbackends]"]
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.strip().startswith("["):
            section = line.strip() == "[project.entry-points.hwbackends]"
            continue
        if section and "=" in line:
            lines.append(line.replace('"', "").strip())
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    sys.path[:0] = [str(site)]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p)
    importlib.invalidate_caches()
    info.update(installed=False, site=str(site))
    return info


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    for mod in ("numpy", "pluggy", "torch", "jax", "jaxlib", "onnx", "pytest", "tensorflow", "tensorrt"):
        try:
            env[mod] = importlib.metadata.version(mod) if importlib.util.find_spec(mod) else None
        except Exception:
            env[mod] = None
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
                            "--format=csv,noheader", "-i", "0"], capture_output=True, text=True, timeout=20)
        env["nvidia_smi"] = r.stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        env["nvidia_smi"] = f"unavailable: {exc}"
    return env


def run_tests(store: Path, timeout: float) -> dict[str, Any]:
    if importlib.util.find_spec("pytest") is None:
        return {"ran": False, "reason": "pytest not installed (carry its wheel to run the GPU tests)"}
    cmd = [sys.executable, "-m", "pytest", str(REPO / "tests" / "test_accelerators.py"), "-q",
           "-p", "no:cacheprovider", "-rs", "-k",
           "gpu or without_tensorflow or code_path or mlp_torch or lstm_torch"]
    say("GPU tests: " + " ".join(cmd[2:]))
    # Own session: on timeout the whole group goes (pytest and its compile workers), so no
    # orphaned worker keeps the GPU and CPUs busy during the latency runs that follow.
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ, HWB_TEST_STORE=str(store)),
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return {"ran": True, "rc": None, "summary": f"timed out after {timeout:.0f} s",
                "tail": (out or "")[-3000:]}
    r = subprocess.CompletedProcess(cmd, proc.returncode, out or "", "")
    tail = (r.stdout + r.stderr).strip().splitlines()
    summary = next((ln for ln in reversed(tail) if " passed" in ln or " failed" in ln or " error" in ln), "")
    say(f"GPU tests: rc={r.returncode} {summary}")
    return {"ran": True, "rc": r.returncode, "summary": summary, "tail": "\n".join(tail[-40:])}


def percentiles(values_us: list[float]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(values_us)
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "mean_us": float(a.mean()), "n": int(a.size)}


def measure(cm: Any, calls: int, warmup: int) -> dict[str, Any]:
    import numpy as np

    x = np.random.default_rng(0).standard_normal(cm.input.batched(1)).astype(np.float32)
    out = np.zeros(cm.output.batched(1), np.float32)
    fn = cm.predict_into
    for _ in range(warmup):
        fn(x, out)
    clock = time.perf_counter_ns
    wall = []
    for _ in range(calls):
        t = clock()
        fn(x, out)
        wall.append((clock() - t) / 1e3)
    res: dict[str, Any] = {"wall": percentiles(wall)}
    ex = cm.executor
    if cm.target == "gpu.torch":
        import torch

        stream = torch.cuda.current_stream()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        for s, e in zip(starts, ends, strict=True):
            s.record(stream)
            fn(x, out)
            e.record(stream)
        torch.cuda.synchronize()
        res["cuda_event_call"] = percentiles([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)])
        if ex.graph is not None:
            for s, e in zip(starts, ends, strict=True):
                s.record(stream)
                ex.graph.replay()
                e.record(stream)
            torch.cuda.synchronize()
            res["cuda_event_graph_replay"] = percentiles([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)])
    elif cm.target == "tpu.xla":
        import jax

        compiled, xd = ex.compiled, jax.device_put(x, ex.device)
        for _ in range(warmup):
            compiled(xd).block_until_ready()
        bare = []
        for _ in range(calls):
            t = clock()
            compiled(xd).block_until_ready()
            bare.append((clock() - t) / 1e3)
        res["bare_executable_wall"] = percentiles(bare)
        res["cuda_event_call"] = None
        res["note"] = "JAX has no CUDA-event API; bare_executable_wall bounds the device time"
    return res


def latency(store: Path, calls: int, warmup: int, budget: float,
            torch_mode: str | None = None) -> list[dict[str, Any]]:
    import hwbackends as hwb
    from hwbackends import zoo

    rows = []
    worst = 0.0  # the slowest variant so far: one that would end past the budget is skipped
    for name in MODELS:
        model = zoo.get(name)
        for target, prec in VARIANTS:
            row: dict[str, Any] = {"model": name, "target": target, "precision": prec}
            if elapsed() + worst > budget:
                row["skipped"] = (f"time budget ({budget:.0f} s): {elapsed():.0f} s spent, the "
                                  f"slowest variant so far took {worst:.0f} s")
                rows.append(row)
                continue
            t = time.monotonic()
            try:
                opts = {"mode": torch_mode} if (torch_mode and target == "gpu.torch") else None
                cm = hwb.compile(model, target, prec, store=store, options=opts)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:600]}"
                say(f"{name} {target}:{prec}: {row['error']}")
                rows.append(row)
                worst = max(worst, time.monotonic() - t)
                continue
            row.update(mode=cm.mode.value, device=cm.availability.device,
                       compile_and_load_s=round(time.monotonic() - t, 2),
                       fidelity=cm.fidelity.to_dict() if cm.fidelity else None)
            row.update(measure(cm, calls, warmup))
            w = row["wall"]
            ev = row.get("cuda_event_call") or row.get("bare_executable_wall") or {}
            say(f"{name:<10} {target}:{prec:<5} {row['mode']:<9} wall p50 {w['p50_us']:7.1f} "
                f"p99 {w['p99_us']:7.1f} µs | device p50 {ev.get('p50_us', float('nan')):7.1f} µs "
                f"[{row['device']}]")
            rows.append(row)
            cm.close()
            worst = max(worst, time.monotonic() - t)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--budget", type=float, default=280.0, help="seconds for the whole run")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--torch-mode", default=None,
                    help="gpu.torch compile mode for the latency runs (default: the target's, "
                         "max-autotune-no-cudagraphs; 'default' compiles faster)")
    a = ap.parse_args()

    report: dict[str, Any] = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                              "bootstrap": bootstrap(), "environment": environment()}
    say(f"GPU: {report['environment']['nvidia_smi'] or 'none visible'}")
    store = Path(tempfile.mkdtemp(prefix="hwb-gpucheck-store-"))
    os.environ.setdefault("HWB_CACHE_DIR", str(store))
    report["tests"] = ({"ran": False, "reason": "--skip-tests"} if a.skip_tests
                       else run_tests(store, timeout=max(30.0, a.budget * 0.45)))
    try:
        report["latency"] = latency(store, a.calls, a.warmup, a.budget, a.torch_mode)
    except Exception as exc:  # e.g. pluggy/onnx missing: say so in the JSON
        report["latency_error"] = f"{type(exc).__name__}: {exc}"
        say(report["latency_error"])
    report["seconds"] = round(elapsed(), 1)
    Path(a.out).write_text(json.dumps(report, indent=2, default=str))
    say(f"wrote {a.out}")
    tests_ok = not report["tests"].get("ran") or report["tests"].get("rc") == 0
    ok = tests_ok and "latency_error" not in report
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
