"""The executor template (hwbackends.target.Executor): one guard, one error path, the
contiguity and dynamic-batch rules, and the threads option as targets read it."""
from __future__ import annotations

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import ConfigError, InputError
from hwbackends.specs import TensorSpec
from hwbackends.target import CompileOptions, Executor

IN, OUT = TensorSpec("x", (4,)), TensorSpec("y", (2,))
W = np.arange(8, dtype=np.float32).reshape(4, 2)


class MatMul(Executor):
    """x @ W into out, through numpy's out= (no allocation); counts calls of _run."""

    def __init__(self, batch: int | None = 3, fail: Exception | None = None):
        self._init_io(IN, OUT, batch)
        self.runs = 0
        self.fail = fail

    def _run(self, xs: tuple[np.ndarray, ...], outs: tuple[np.ndarray, ...]) -> None:
        (x,), (out,) = xs, outs  # one tensor each way
        self.runs += 1
        if self.fail is not None:
            raise self.fail
        np.matmul(x, W, out=out)


class RawPointer(MatMul):
    contiguous = True


def _xy(b: int = 3) -> tuple[np.ndarray, np.ndarray]:
    return np.ones((b, 4), np.float32), np.zeros((b, 2), np.float32)


@pytest.mark.parametrize("x, out, expect", [
    (np.ones((3, 5), np.float32), np.zeros((3, 2), np.float32), r"shape \(3, 5\)"),
    (np.ones((3, 1), np.float32), np.zeros((3, 2), np.float32), r"shape \(3, 1\)"),  # broadcastable
    (np.ones((3, 4), np.float64), np.zeros((3, 2), np.float32), "dtype float64"),
    ([[1.0] * 4] * 3, np.zeros((3, 2), np.float32), "numpy.ndarray"),
    (np.ones((3, 4), np.float32), np.zeros((2, 2), np.float32), r"out has shape \(2, 2\)"),
])
def test_the_guard_refuses_a_wrong_array_before_the_model_runs(x, out, expect):
    ex = MatMul()
    with pytest.raises(InputError, match=expect):
        ex.predict_into(x, out)
    assert ex.runs == 0


def test_a_right_call_writes_out_and_returns_none():
    ex, (x, out) = MatMul(), _xy()
    assert ex.predict_into(x, out) is None
    assert np.array_equal(out, x @ W)


def test_the_error_path_names_a_wrong_array_and_passes_a_real_failure_through():
    x, out = _xy()
    out.flags.writeable = False  # passes the cheap guard; numpy refuses the write in _run
    with pytest.raises(InputError, match="read-only"):
        MatMul().predict_into(x, out)
    boom = RuntimeError("device lost")
    with pytest.raises(RuntimeError, match="device lost"):  # right arrays: not an InputError
        MatMul(fail=boom).predict_into(*_xy())


def test_strided_arrays_are_served_correctly_unless_the_executor_takes_raw_pointers():
    x = np.ones((3, 8), np.float32)[:, ::2]
    out = np.zeros((3, 4), np.float32)[:, ::2]
    MatMul().predict_into(x, out)
    assert np.array_equal(out, np.ascontiguousarray(x) @ W)
    with pytest.raises(InputError, match="C-contiguous"):
        RawPointer().predict_into(x, np.zeros((3, 2), np.float32))
    RawPointer().predict_into(*_xy())


def test_a_dynamic_batch_executor_takes_any_rows_but_x_and_out_must_agree():
    ex = MatMul(batch=None)
    for b in (1, 5):
        x, out = _xy(b)
        ex.predict_into(x, out)
        assert np.array_equal(out, x @ W)
    with pytest.raises(InputError):
        ex.predict_into(np.ones((5, 4), np.float32), np.zeros((4, 2), np.float32))


def test_threads_none_means_one_and_nonsense_is_refused():
    assert CompileOptions("fp32").runtime_threads() == 1
    assert CompileOptions("fp32", threads=4).runtime_threads() == 4
    for bad in (0, -1, 1.5):
        with pytest.raises(ConfigError, match="threads"):
            CompileOptions("fp32", threads=bad)


def test_onnxruntime_honours_threads(zoo_model, store_dir):
    m = zoo_model("mlp")
    for threads, want in ((None, 1), (2, 2)):
        cm = hwb.compile(m, "cpu.onnxruntime", "fp32", threads=threads, store=store_dir, fidelity=False)
        assert cm.executor.session.get_session_options().intra_op_num_threads == want
