"""The executor template (hwbackends.target.Executor): one guard, one error path, the
contiguity and dynamic-batch rules, and the threads option as targets read it."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import ConfigError, ExecutionError, InputError
from hwbackends.specs import TensorSpec
from hwbackends.target import CompileOptions, Executor, check_io

IN, OUT = TensorSpec("x", (4,)), TensorSpec("y", (2,))
W = np.arange(8, dtype=np.float32).reshape(4, 2)


class MatMul(Executor):
    """x @ W into out, through numpy's out= (no allocation); counts calls of _run."""

    def __init__(self, batch: int | None = 3, fail: Exception | None = None):
        self._init_io(IN, OUT, batch)
        self.runs = 0
        self.fail = fail

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
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
    with pytest.raises(ExecutionError, match="device lost") as err:  # right arrays: not an InputError
        MatMul(fail=boom).predict_into(*_xy())
    assert err.value.__cause__ is boom and not isinstance(err.value, InputError)


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


class TwoByTwo(Executor):
    """Several tensors through the same Executor: a = x @ W, b = 2 * s (no allocation)."""

    def __init__(self, batch: int | None = 3):
        self._init_io([IN, TensorSpec("s", (3,))], [OUT, TensorSpec("b", (3,))], batch)
        self.runs = 0

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        self.runs += 1
        np.matmul(xs[0], W, out=outs[0])
        np.multiply(xs[1], 2.0, out=outs[1])


def test_one_executor_serves_one_tensor_with_arrays_and_several_with_tuples():
    one, two = MatMul(), TwoByTwo()
    assert one.single and not two.single
    # the single-array call is bound once: no dispatch on the hot path
    assert one.predict_into.__func__ is Executor._predict_one
    assert two.predict_into.__func__ is Executor._predict_many
    xs = (np.ones((3, 4), np.float32), np.arange(9, dtype=np.float32).reshape(3, 3))
    outs = (np.zeros((3, 2), np.float32), np.zeros((3, 3), np.float32))
    assert two.predict_into(xs, outs) is None
    assert np.array_equal(outs[0], xs[0] @ W) and np.array_equal(outs[1], 2 * xs[1])
    # the class's own predict_into (what a subclass's super() reaches) dispatches alike
    Executor.predict_into(two, xs, outs)
    x, out = _xy()
    Executor.predict_into(one, x, out)
    assert np.array_equal(out, x @ W)


@pytest.mark.parametrize("xs, outs, expect", [
    ("one array", None, "several inputs/outputs: inputs must be a tuple"),
    ((np.ones((3, 4), np.float32),), None, r"got 1 inputs; this variant takes 2 \(x, s\)"),
    ((np.ones((3, 4), np.float32), np.ones((3, 2), np.float32)), None, r"input 's' has shape \(3, 2\)"),
    (None, (np.zeros((3, 2), np.float32), np.zeros((3, 3), np.float64)), "out 'b' has dtype float64"),
])
def test_the_tuple_guard_names_the_wrong_tensor(xs, outs, expect):
    ex = TwoByTwo()
    good_x = (np.ones((3, 4), np.float32), np.ones((3, 3), np.float32))
    good_o = (np.zeros((3, 2), np.float32), np.zeros((3, 3), np.float32))
    xs = np.ones((3, 4), np.float32) if xs == "one array" else (xs or good_x)
    with pytest.raises(InputError, match=expect):
        ex.predict_into(xs, outs or good_o)
    assert ex.runs == 0


def test_a_single_tensor_executor_refuses_a_tuple_and_check_io_takes_both_forms():
    x, out = _xy()
    with pytest.raises(InputError, match=r"^input must be a numpy.ndarray.*got tuple"):
        MatMul().predict_into((x,), out)
    check_io(x, out, IN, OUT, 3)  # one array with one spec each way: the tuple of one
    check_io((x,), (out,), [IN], [OUT], 3)
    with pytest.raises(InputError, match=r"^out has shape"):
        check_io(x, np.zeros((3, 3), np.float32), IN, OUT, 3)


def test_a_subclass_that_overrides_predict_into_keeps_it():
    class Counting(MatMul):
        calls = 0

        def predict_into(self, x, out):
            Counting.calls += 1
            super().predict_into(x, out)

    ex = Counting()
    assert "predict_into" not in vars(ex)
    ex.predict_into(*_xy())
    assert Counting.calls == 1 and ex.runs == 1


def test_the_single_array_call_allocates_nothing():
    """What the kit measures (hwbackends/testing/alloc.py): the base class's single-array path
    peaks no higher than the bare model call (no tuple per call: two would be 96 bytes), and
    the tuple path stays inside the kit's bound."""
    from hwbackends.testing.alloc import PEAK_BOUND_BYTES, measure

    bare = measure(lambda x, out: np.matmul(x, W, out=out), *_xy(), calls=1000, peak_calls=200)
    p = measure(MatMul().predict_into, *_xy(), calls=1000, peak_calls=200)
    assert p.peak <= bare.peak + 32 and p.net <= 2048, (p, bare)
    two = TwoByTwo()
    xs = (np.ones((3, 4), np.float32), np.ones((3, 3), np.float32))
    outs = (np.zeros((3, 2), np.float32), np.zeros((3, 3), np.float32))
    q = measure(two.predict_into, xs, outs, calls=1000, peak_calls=200)
    assert q.peak <= PEAK_BOUND_BYTES and q.net <= 2048, q


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
