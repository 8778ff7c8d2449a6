#!/usr/bin/env python3
"""GPU check: every GPU variant on the zoo models, on a machine with an NVIDIA GPU; one JSON out.

    python scripts/gpu_check.py [--out gpu_check.json] [--calls 10000] [--budget 540]

Variants (target:precision × model; the model each target takes in brackets):
{variants}

Multi-IO (several inputs and outputs, tuples through ``predict_into(xs, outs)``):
{multi_io}

Per variant and for CUDA-graph replay on and off: p50/p99/p99.9 of ``cm.predict_into(x, out)``
at batch 1 (numpy in, numpy out: what a caller pays), compile+load seconds, the fidelity
against the fp32 reference (and whether it meets the router's default gate), the mode and
device. The JSON also holds the versions (TensorRT, CUDA runtime, cuda-python, driver, torch)
and, unless ``--skip-tests``, the result of the GPU tests. It is printed on stdout (progress
goes to stderr) and written to ``--out``.

Exit codes: 0 every variant built and ran; 1 some variant failed to build or run (or the GPU
tests failed); 2 no usable NVIDIA GPU here (nothing is attempted; the reason is printed).

Needs: numpy, pluggy, onnx, torch (CUDA build) for gpu.torch; tensorrt + cuda-python (the
``gpu`` extra) for gpu.tensorrt; tensorflow + tf2onnx to take the Keras models to TensorRT
(without them gpu.tensorrt builds the torch twins of mlp and lstm, and signal is reported as
not runnable). Without an installed hwbackends the script makes the checkout importable
itself. The run stays under ``--budget`` seconds: a variant that would end past it (judged by
the slowest so far) is recorded as skipped, which also exits 1.
"""
from __future__ import annotations

import argparse
import atexit
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
T0 = time.monotonic()
VARIANTS = (("gpu.tensorrt", "fp32"), ("gpu.tensorrt", "fp16"), ("gpu.tensorrt", "int8"),
            ("gpu.torch", "fp32"), ("gpu.torch", "fp16"))
MODELS = ("mlp", "lstm", "signal")
#: Models with several inputs/outputs and the variants that take them (gpu.torch is single-IO).
MULTI_IO_VARIANTS = (("gpu.tensorrt", "fp32"), ("gpu.tensorrt", "fp16"), ("gpu.tensorrt", "int8"))
MULTI_IO_MODELS = ("two_head",)
#: The zoo model each target is given for a model: TensorRT takes ONNX (from Keras through
#: tf2onnx, or from torch), gpu.torch takes torch models only; signal is a Keras model, so
#: gpu.torch gets its torch twin (signal_torch below, the same trained weights).
SOURCES = {"gpu.tensorrt": {"mlp": ("mlp", "mlp_torch"), "lstm": ("lstm", "lstm_torch"),
                            "signal": ("signal",), "two_head": ("two_head",)},
           "gpu.torch": {"mlp": ("mlp_torch",), "lstm": ("lstm_torch",),
                         "signal": ("signal_torch",)}}
KERAS_ONLY = {"mlp", "lstm", "signal", "signal_torch", "two_head"}  # need tensorflow (+ tf2onnx)
EXIT_NO_GPU = 2


def variant_lines() -> str:
    out = []
    for target, prec in VARIANTS:
        models = ", ".join(f"{m} [{' or '.join(SOURCES[target][m])}]" for m in MODELS)
        out.append(f"  {target}:{prec:<5} on {models}")
    return "\n".join(out)


def multi_io_lines() -> str:
    return "\n".join(f"  {t}:{p:<5} on {m} [{' or '.join(SOURCES[t][m])}] (features + state → "
                     f"signal + confidence)" for t, p in MULTI_IO_VARIANTS for m in MULTI_IO_MODELS)


__doc__ = __doc__.format(variants=variant_lines(), multi_io=multi_io_lines())


def elapsed() -> float:
    return time.monotonic() - T0


def say(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)


def bootstrap() -> dict[str, Any]:
    """Make hwbackends and its plugins importable here and in child processes, without pip."""
    info: dict[str, Any] = {"installed": True}
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    eps = importlib.metadata.entry_points(group="hwbackends")
    if any(ep.name == "tpu_xla" for ep in eps) and importlib.util.find_spec("hwb_plugins"):
        return info
    # Not installed: link hwb_plugins/ as hwb_plugins and declare the entry points in a tiny
    # dist-info, both on sys.path and PYTHONPATH (the compile worker is a fresh interpreter).
    site = Path(tempfile.mkdtemp(prefix="hwb-gpucheck-site-"))
    atexit.register(shutil.rmtree, site, True)  # used by this run's child processes only
    (site / "hwb_plugins").symlink_to(REPO / "hwb_plugins", target_is_directory=True)
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
    from hwb_plugins._nvidia import cuda_stack, gpu_info

    env: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    from hwb_plugins._util import version

    for dist in ("numpy", "pluggy", "torch", "onnx", "onnxruntime", "onnxconverter-common",
                 "tensorflow", "tf2onnx", "pytest"):
        env[dist] = version(dist) or (version("tensorflow-cpu") if dist == "tensorflow" else "") or None
    info = gpu_info()
    env["gpu"] = info.as_dict() if info else None
    env["cuda_stack"] = cuda_stack().as_dict()
    try:
        from hwb_plugins._nvidia import torch_cuda_build
        env["torch_cuda"] = torch_cuda_build()
    except Exception as exc:  # informative only
        env["torch_cuda"] = f"unknown: {exc}"
    return env


def run_tests(store: Path, timeout: float) -> dict[str, Any]:
    if importlib.util.find_spec("pytest") is None:
        return {"ran": False, "reason": "pytest not installed (carry its wheel to run the GPU tests)"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
           str(REPO / "tests" / "test_gpu_torch_path.py"),
           str(REPO / "tests" / "test_gpu_prepare.py"),
           str(REPO / "tests" / "test_gpu_multi_io.py"),
           str(REPO / "tests" / "test_accelerators.py"), "-k",
           "gpu or tensorrt or torch or without_tensorflow or code_path"]
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
            "p99_9_us": float(np.percentile(a, 99.9)), "mean_us": float(a.mean()),
            "n": int(a.size)}


def measure(cm: Any, calls: int, warmup: int) -> dict[str, Any]:
    """Wall-clock percentiles of predict_into at the compiled batch."""
    import numpy as np

    rng = np.random.default_rng(0)
    if cm.multi_io:  # one array per input, one buffer per output
        x: Any = tuple(rng.standard_normal(s.batched(1)).astype(np.float32) for s in cm.inputs)
        out: Any = tuple(np.zeros(s.batched(1), np.float32) for s in cm.outputs)
    else:
        x = rng.standard_normal(cm.input.batched(1)).astype(np.float32)
        out = np.zeros(cm.output.batched(1), np.float32)
    fn = cm.predict_into
    for _ in range(warmup):
        fn(x, out)
    clock = time.perf_counter_ns
    wall = [0.0] * calls
    for i in range(calls):
        t = clock()
        fn(x, out)
        wall[i] = (clock() - t) / 1e3
    ex = cm.executor
    graph = getattr(ex, "graph_exec", getattr(ex, "graph", None)) is not None
    return {"predict_into": percentiles(wall), "cuda_graph_captured": graph}


def source_model(target: str, model: str) -> str | None:
    """The zoo model ``target`` is given for ``model`` here, or None when none can be."""
    from hwb_plugins._util import importable

    keras_ok = importable("tensorflow") and importable("tf2onnx")
    for name in SOURCES[target][model]:
        if name not in KERAS_ONLY or keras_ok:
            return name
    return None


def signal_torch() -> Any:
    """The zoo signal model's torch twin: its trained Keras Dense weights in torch Linear layers
    (the same function: x @ W + b, relu, relu, tanh), with its validation data."""
    import torch
    from torch import nn

    import hwbackends as hwb
    from hwbackends import zoo

    keras_model = zoo.get("signal")
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
    layers: list[Any] = []
    for layer in keras_model.obj.layers:
        w, b = layer.get_weights()
        lin = nn.Linear(*w.shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.T.copy()))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        act = layer.get_config().get("activation", "linear")
        if act != "linear":
            layers.append(acts[act]())
    return hwb.load_model(nn.Sequential(*layers).eval(), name="signal_torch",
                          input_shape=keras_model.input.shape,
                          validation_data=keras_model.validation_data)


def zoo_model(name: str) -> Any:
    from hwbackends import zoo

    return signal_torch() if name == "signal_torch" else zoo.get(name)


def run_variant(store: Path, target: str, prec: str, model: str, calls: int,
                warmup: int) -> dict[str, Any]:
    import hwbackends as hwb
    from hwbackends.config import FidelityConfig

    row: dict[str, Any] = {"model": model, "target": target, "precision": prec}
    src = source_model(target, model)
    if src is None:
        row["error"] = (f"cannot build: {target} is given {' or '.join(SOURCES[target][model])} "
                        f"for {model}, which needs tensorflow and tf2onnx (not installed)")
        return row
    row["source"] = src
    for graph in (True, False):
        key = "cuda_graph" if graph else "no_cuda_graph"
        t = time.monotonic()
        try:
            cm = hwb.compile(zoo_model(src), target, prec, store=store, gate=False,
                             options={"cuda_graph": graph})  # it reports the violations itself
        except Exception as exc:
            row["error"] = f"{key}: build failed: {type(exc).__name__}: {str(exc)[:800]}"
            return row
        try:
            res = {"compile_and_load_s": round(time.monotonic() - t, 2)}
            res.update(measure(cm, calls, warmup))
            row[key] = res
            if graph:  # fidelity and device once: the graph does not change the numbers
                f = cm.fidelity
                row.update(mode=cm.mode.value, device=cm.availability.device,
                           fidelity=f.to_dict() if f else None,
                           fidelity_violations=FidelityConfig().tolerance().violations(f) if f else
                           ["no fidelity measured"])
                if target == "gpu.tensorrt":
                    meta = cm.artifact.meta
                    row.update(qdq_nodes=meta.get("qdq_nodes"), build_plan=meta.get("build_plan"))
        except Exception as exc:
            row["error"] = f"{key}: run failed: {type(exc).__name__}: {str(exc)[:800]}"
            return row
        finally:
            cm.close()
        p = res["predict_into"]
        say(f"{model:<7} {target}:{prec:<5} {key:<13} p50 {p['p50_us']:8.1f} p99 {p['p99_us']:8.1f} "
            f"p99.9 {p['p99_9_us']:8.1f} µs (graph captured: {res['cuda_graph_captured']})")
    return row


def latency(store: Path, calls: int, warmup: int, budget: float) -> list[dict[str, Any]]:
    rows = []
    worst = 0.0  # the slowest variant so far: one that would end past the budget is skipped
    plan = [(m, v) for m in MODELS for v in VARIANTS]
    plan += [(m, v) for m in MULTI_IO_MODELS for v in MULTI_IO_VARIANTS]
    for model, (target, prec) in plan:
        if elapsed() + worst > budget:
            rows.append({"model": model, "target": target, "precision": prec,
                         "skipped": f"time budget ({budget:.0f} s): {elapsed():.0f} s spent, "
                                    f"the slowest variant so far took {worst:.0f} s"})
            continue
        t = time.monotonic()
        row = run_variant(store, target, prec, model, calls, warmup)
        if "error" in row:
            say(f"{model} {target}:{prec}: {row['error']}")
        rows.append(row)
        worst = max(worst, time.monotonic() - t)
    return rows


def failures(rows: list[dict[str, Any]]) -> list[str]:
    """The variants that failed to build or run (or were not run)."""
    bad = []
    for r in rows:
        name = f"{r['model']} {r['target']}:{r['precision']}"
        if "skipped" in r:
            bad.append(f"{name}: {r['skipped']}")
        elif "error" in r:
            bad.append(f"{name}: {r['error']}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="variants:\n" + variant_lines() + "\nmulti-IO:\n"
                                 + multi_io_lines(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json", help="where the JSON is written too")
    ap.add_argument("--calls", type=int, default=10000, help="timed calls per variant and mode")
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run")
    ap.add_argument("--skip-tests", action="store_true", help="do not run the GPU tests first")
    a = ap.parse_args(argv)

    boot = bootstrap()
    from hwb_plugins._nvidia import no_gpu_reason

    why = no_gpu_reason()
    if why:
        print(f"gpu_check: no GPU: {why}. Run this on a machine with an NVIDIA GPU and its "
              f"driver (nvidia-smi must list it); nothing was measured.", file=sys.stderr)
        return EXIT_NO_GPU
    report: dict[str, Any] = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                              "bootstrap": boot, "environment": environment(),
                              "variants": [f"{t}:{p}" for t, p in VARIANTS], "models": list(MODELS),
                              "multi_io": {"variants": [f"{t}:{p}" for t, p in MULTI_IO_VARIANTS],
                                           "models": list(MULTI_IO_MODELS)}}
    say(f"GPU: {report['environment']['gpu']}; stack {report['environment']['cuda_stack']}")
    store = Path(tempfile.mkdtemp(prefix="hwb-gpucheck-store-"))
    atexit.register(shutil.rmtree, store, True)  # this run's compiles; the JSON keeps the results
    os.environ.setdefault("HWB_CACHE_DIR", str(store))
    report["tests"] = ({"ran": False, "reason": "--skip-tests"} if a.skip_tests
                       else run_tests(store, timeout=max(30.0, a.budget * 0.3)))
    try:
        report["latency"] = latency(store, a.calls, a.warmup, a.budget)
        report["failures"] = failures(report["latency"])
        report["fidelity_failures"] = [f"{r['model']} {r['target']}:{r['precision']}: "
                                       + ", ".join(r["fidelity_violations"])
                                       for r in report["latency"] if r.get("fidelity_violations")]
    except Exception as exc:  # e.g. pluggy/onnx missing: say so in the JSON
        report["latency_error"] = f"{type(exc).__name__}: {exc}"
        report["failures"] = [report["latency_error"]]
    report["seconds"] = round(elapsed(), 1)
    text = json.dumps(report, indent=2, default=str)
    Path(a.out).write_text(text)
    print(text, flush=True)
    tests_ok = not report["tests"].get("ran") or report["tests"].get("rc") == 0
    for f in report["failures"]:
        say(f"FAILED {f}")
    return 0 if tests_ok and not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
