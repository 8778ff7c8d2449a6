"""scripts/gpu_check.py, the one script a GPU machine runs: its help names every GPU variant,
and without a GPU it says so and exits 2 (no traceback, nothing attempted)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
VARIANTS = ("gpu.tensorrt:fp32", "gpu.tensorrt:fp16", "gpu.tensorrt:int8", "gpu.torch:fp32",
            "gpu.torch:fp16")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120)


def test_help_lists_every_gpu_variant_and_model():
    r = _run("--help")
    assert r.returncode == 0, r.stderr
    for v in VARIANTS:
        line = next((ln for ln in r.stdout.splitlines() if ln.strip().startswith(v + " ")), None)
        assert line is not None, f"{v} missing from --help:\n{r.stdout}"
        assert all(m in line for m in ("mlp", "lstm", "signal")), line


def test_without_a_gpu_it_exits_2_with_a_clear_message():
    from hwb_plugins._nvidia import no_gpu_reason

    if no_gpu_reason() is None:
        pytest.skip("an NVIDIA GPU is present here: the script would run for real")
    r = _run("--skip-tests", "--out", "/nonexistent/never-written.json")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "no GPU" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


@pytest.mark.slow
def test_signal_torch_twin_is_the_keras_signal_model(store_dir):
    from hwb_plugins._util import importable

    if not importable("tensorflow"):
        pytest.skip("tensorflow not installed: the Keras signal model cannot be loaded")
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    from hwbackends import zoo

    twin, keras_model = gc.signal_torch(), zoo.get("signal")
    x = keras_model.validation_data[:64]
    np.testing.assert_allclose(twin.reference(x), keras_model.reference(x), atol=1e-5)
    assert twin.format == "torch" and twin.input.shape == keras_model.input.shape


def test_help_lists_the_multi_io_variants():
    r = _run("--help")
    assert r.returncode == 0, r.stderr
    tail = r.stdout.split("multi-IO:", 1)[1]
    for v in ("gpu.tensorrt:fp32", "gpu.tensorrt:fp16", "gpu.tensorrt:int8"):
        assert any(ln.strip().startswith(v + " ") and "two_head" in ln for ln in tail.splitlines()), tail


@pytest.mark.slow
def test_measure_takes_a_multi_io_variant(compiled):
    """The script's timing loop with tuples, on a CPU multi-IO variant (plumbing only: the
    numbers of record come from the GPU run)."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    res = gc.measure(compiled("two_head", "cpu.onnxruntime"), calls=20, warmup=2)
    assert res["predict_into"]["n"] == 20 and res["cuda_graph_captured"] is False
