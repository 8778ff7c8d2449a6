"""Resource bombs are refused from the model's declarations, early and small:
a graph declaring a million-step window, external data of 40 GB (a sparse file, or a length
the file does not hold), a compile job that allocates past the worker's memory limit.

The CLI cases run ``hwb compile`` in a child process and measure its peak RSS
(``RUSAGE_CHILDREN`` of a wrapper that runs only it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import hwbackends
from hwbackends.cost import CostError, Limits, limits_from_items, parse_limit
from hwbackends.errors import CompileError, ConfigError, ModelError
from hwbackends.isolate import Worker

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

HWB = [sys.executable, "-m", "hwbackends"]
GIB = 1 << 30
#: The wrapper: run the command, print its exit code and the peak RSS (bytes) of the child.
MEASURE = ("import resource, subprocess, sys, json; r = subprocess.run(sys.argv[1:], capture_output=True, "
           "text=True); print(json.dumps({'rc': r.returncode, 'out': r.stdout + r.stderr, 'rss': "
           "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))")


def _save(graph: object, path: Path, **kw: object) -> Path:
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path), **kw)
    return path


def conv_window(path: Path, steps: int, channels: int = 16) -> Path:
    """A Conv over ``steps`` time steps: a tiny file whose activations are ~8·steps·channels B."""
    w = numpy_helper.from_array(np.full((channels, channels, 3), 0.01, np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, steps])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, steps])
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1], name="conv")
    return _save(helper.make_graph([node], "g", [x], [y], [w]), path)


def external_gemm(dirpath: Path, rows: int, cols: int, data: bytes | None, length: int | None = None,
                  location: str = "w.bin") -> Path:
    """x (N, rows) @ w (rows, cols), ``w`` declared external in ``location``: the file is
    written with ``data``, or made sparse at the tensor's declared size when ``data`` is None."""
    dirpath.mkdir(parents=True, exist_ok=True)
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[rows, cols])
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": "0"}
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        w.external_data.add(key=k, value=v)
    target = dirpath / location
    if data is None:
        with open(target, "wb") as f:
            f.truncate(rows * cols * 4)
    else:
        target.write_bytes(data)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", rows])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", cols])
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    return _save(helper.make_graph([node], "g", [x], [y], [w]), dirpath / "model.onnx")


def hwb_compile(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> dict:
    """``hwb compile ARGS`` in a child: its exit code, output, peak RSS and wall time."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", MEASURE, *HWB, "compile", *args], capture_output=True,
                       text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    out = json.loads(r.stdout)
    out["seconds"] = time.monotonic() - t0
    return out


def test_million_step_window_is_refused_by_hwb_compile_fast_and_small(tmp_path):
    model = conv_window(tmp_path / "window.onnx", 1_000_000)
    assert model.stat().st_size < 10_000
    r = hwb_compile(str(model), "--target", "cpu.onnxruntime", "--cache-dir", str(tmp_path / "s"))
    assert r["rc"] != 0, r
    msg = r["out"]
    assert "CostError" in msg and "activation" in msg and "over the limit of 16.0 MiB" in msg, msg
    assert "HWB_MAX_ACTIVATIONS=128M" in msg and "--limit activations=128M" in msg, msg
    assert "Traceback" not in msg
    assert r["rss"] < 1 * GIB, f"peak RSS {r['rss'] / GIB:.2f} GiB"
    assert r["seconds"] < 30, r["seconds"]  # most of it is the interpreter's start and imports


def test_the_limit_is_raised_by_the_flag_and_the_environment(tmp_path):
    # 4,096 steps × 16 channels: 512 KiB per sample — under the default, over a lowered one.
    model = conv_window(tmp_path / "w.onnx", 4096)
    low = hwb_compile(str(model), "--target", "cpu.onnxruntime", "--cache-dir", str(tmp_path / "s"),
                      "--limit", "activations=64K")
    assert low["rc"] != 0 and "over the limit of 64.0 KiB" in low["out"], low["out"]
    with pytest.raises(CostError, match="HWB_MAX_ACTIVATIONS"):
        hwbackends.load_model(model, limits=Limits(activations=64 << 10))
    m = hwbackends.load_model(model, limits=Limits(activations=1 << 20))
    assert m.meta["cost"]["activation_bytes"] == 2 * 16 * 4096 * 4  # x and y of one sample
    assert m.meta["cost"]["macs"] == 16 * 4096 * 16 * 3
    os.environ["HWB_MAX_ACTIVATIONS"] = "64K"
    try:
        with pytest.raises(CostError, match="64.0 KiB"):
            hwbackends.load_model(model)
    finally:
        del os.environ["HWB_MAX_ACTIVATIONS"]


def test_forty_gigabytes_of_sparse_external_data_is_refused_without_reading_it(tmp_path):
    rows, cols = 100_000, 100_000  # 4e10 bytes declared, a sparse file of that size
    model = external_gemm(tmp_path / "sparse", rows, cols, None)
    assert (tmp_path / "sparse" / "w.bin").stat().st_size == rows * cols * 4
    r = hwb_compile(str(model), "--target", "cpu.onnxruntime", "--cache-dir", str(tmp_path / "s"))
    assert r["rc"] != 0, r
    assert "37.3 GiB of weight bytes" in r["out"] and "HWB_MAX_WEIGHTS" in r["out"], r["out"]
    assert "is the file complete" not in r["out"]
    assert r["rss"] < 1 * GIB, f"peak RSS {r['rss'] / GIB:.2f} GiB"


def test_a_declared_length_the_file_does_not_hold_is_refused_from_the_estimate(tmp_path):
    # 40 GB declared by dims and length; the file holds 1 KiB: named, and nothing read.
    model = external_gemm(tmp_path / "lying", 100_000, 100_000, b"\0" * 1024, length=40_000_000_000)
    with pytest.raises(ModelError, match="declares 37.3 GiB at offset 0 of 'w.bin', which holds 1.0 KiB"):
        hwbackends.load_model(model)
    # Within the limits, a file shorter than the tensor is named as incomplete before reading.
    small = external_gemm(tmp_path / "short", 64, 8, b"\0" * 100)
    with pytest.raises(ModelError, match="external data is missing or incomplete"):
        hwbackends.load_model(small)
    # A location outside the model's directory is refused, not read.
    outside = external_gemm(tmp_path / "out", 4, 2, b"\0" * 32, location="../w.bin")
    with pytest.raises(ModelError, match="outside the model's directory"):
        hwbackends.load_model(outside)


def test_external_data_within_the_limits_loads_and_compiles(tmp_path):
    w = np.arange(64 * 8, dtype=np.float32).reshape(64, 8) / 512
    model = external_gemm(tmp_path / "ok", 64, 8, w.tobytes())
    cm = hwbackends.compile(model, "cpu.onnxruntime", store=tmp_path / "s")
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_allclose(cm.predict(x), x @ w, rtol=1e-5, atol=1e-5)
    cost = hwbackends.load_model(model).meta["cost"]
    assert cost["external_bytes"] == 64 * 8 * 4 and cost["params"] == 64 * 8
    assert cost["macs"] == 64 * 8


def test_torch_window_is_refused_after_one_sample(tmp_path):
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Conv1d(4, 16, 3, padding=1), torch.nn.Flatten(0, -1))
    with pytest.raises(CostError, match="activation bytes per sample"):
        hwbackends.load_model(net, input_shape=(4, 1_000_000))
    m = hwbackends.load_model(torch.nn.Linear(16, 8), input_shape=(16,))
    assert m.meta["cost"]["params"] == 16 * 8 + 8 and m.meta["cost"]["macs"] == 16 * 8


def test_keras_conv1d_window_is_refused_before_it_runs(tmp_path):
    keras = pytest.importorskip("keras")
    inp = keras.Input((1_000_000, 4))
    y = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(keras.layers.Conv1D(16, 3)(inp)))
    t0 = time.monotonic()
    with pytest.raises(CostError, match="activation bytes per sample"):
        hwbackends.load_model(keras.Model(inp, y), name="window")
    assert time.monotonic() - t0 < 5
    inp = keras.Input((16,))
    small = hwbackends.load_model(keras.Model(inp, keras.layers.Dense(8)(inp)))
    assert small.meta["cost"]["params"] == 16 * 8 + 8
    assert small.meta["cost"]["macs"] >= 16 * 8


def _allocate(n: int) -> int:
    return int(np.ones(n, np.uint8).sum())


def _children_allocate(n: int, each: int) -> int:
    """Start ``n`` processes that each hold ``each`` bytes, and wait on them."""
    code = f"import time; b = bytearray({each}); b[::4096] = b'x' * len(b[::4096]); time.sleep(60)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    return sum(p.wait() for p in procs)


def test_a_worker_job_past_the_memory_limit_is_a_compile_error(monkeypatch):
    monkeypatch.setenv("HWB_WORKER_MEMORY", "512M")
    w = Worker()
    try:
        with pytest.raises(CompileError, match=r"out of memory under the compile worker's limit of "
                                               r"512.0 MiB.*HWB_WORKER_MEMORY"):
            w.run(_allocate, 2 * GIB, timeout=60, what="a greedy job")
        assert w.run(_allocate, 1 << 20, timeout=60, what="a small job") == 1 << 20
        # Processes the job starts, each under the limit, together over it: stopped.
        t0 = time.monotonic()
        with pytest.raises(CompileError, match=r"over the worker's limit of 512.0 MiB.*HWB_WORKER_MEMORY"):
            w.run(_children_allocate, 3, 250 << 20, timeout=60, what="a job with helpers")
        assert time.monotonic() - t0 < 30
        assert w.run(_allocate, 1 << 20, timeout=60, what="after the kill") == 1 << 20
    finally:
        w.kill()


def test_limit_values_are_checked():
    assert parse_limit("8G", "bytes", "x") == 8 * GIB and parse_limit("1e11", "count", "x") == 1e11
    for bad in ("9" * 309, "lots", "-1", "inf", "1" * 400):
        with pytest.raises(ConfigError, match="expected"):
            parse_limit(bad, "bytes", "HWB_MAX_WEIGHTS")
    with pytest.raises(ConfigError, match="HWB_MAX_MACS"):
        Limits.from_env({"HWB_MAX_MACS": "nan"})
    with pytest.raises(ConfigError, match="NAME one of weights, activations, macs"):
        limits_from_items(["flops=3"])
    assert limits_from_items(["weights=0"]).weights == 0
    assert Limits(activations="128M").activations == 128 << 20 and Limits(macs=1e11).macs == 1e11
    with pytest.raises(ConfigError, match="must be a number or a size"):
        Limits(weights=[1])
