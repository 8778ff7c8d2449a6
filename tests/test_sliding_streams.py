"""Many windows over one compiled model (``cm.sliding(streams=N)`` / ``cm.streaming(streams=N)``,
hwbackends/sliding.py), through the public API: Hypothesis draws interleaved ``push_into``,
``push_many``, ``reset`` and ``prepare`` calls over N windows, and every answer must equal
``predict_into`` on that window's own ticks (fp32 within 1e-5 of the answers' scale; the
recompute forms bit for bit), on every form: cpu.native's recurrent form (LSTM, with
push_many's blocked product, and GRU), its convolutional form, its recompute form, a reduced
push (int8 weights, within its gated tolerance), and the core's fallback on cpu.onnxruntime.
The streams are checked against one stream fed the same ticks. The C ABI's handles are
driven from examples/windows_push.cpp."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sliding_ref import seeded_weights

import hwbackends as hwb
from hwbackends.errors import InputError, UnsupportedError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
EXAMPLES = int(os.environ.get("HWB_SLIDING_EXAMPLES", "6"))
FP32_ERR = 1e-5


def gru_model(window: int = 6, features: int = 3):
    """A per-step activation, then a GRU (push_many's per-tick input products)."""
    import keras

    keras.utils.set_random_seed(4)
    km = keras.Sequential([keras.Input((window, features)), keras.layers.Activation("tanh"),
                           keras.layers.GRU(5, name="rec"), keras.layers.Dense(2, name="signal")],
                          name="streams_gru")
    return seeded_weights(km, 4)


@pytest.fixture(scope="module")
def variants(compiled, zoo_model, store_dir):
    """(name, CompiledModel, the form its windows take, bound over the answers' scale)."""
    out = [("lstm", compiled("lstm", "cpu.native"), "incremental", FP32_ERR),
           ("conv1d", compiled("conv1d", "cpu.native"), "incremental", FP32_ERR),
           ("mlp", compiled("mlp", "cpu.native"), "recompute", 0.0),
           ("lstm-ort", compiled("lstm", "cpu.onnxruntime"), "recompute", 0.0),
           ("gru", hwb.compile(gru_model(), "cpu.native", store=store_dir, fidelity=False), "incremental",
            FP32_ERR)]
    from hwb_plugins.cpu_native import build, push_weights

    if not push_weights.missing_features("int8", build.host_flags()):
        q = hwb.compile(zoo_model("lstm"), "cpu.native", store=store_dir, fidelity=False,
                        options={"push_weights": "int8"})
        out.append(("lstm-int8push", q, "incremental", 0.05))
    return out


def _window_of(cm, ticks: list[np.ndarray]) -> np.ndarray:
    t = cm.input.shape[0]
    win = np.zeros(cm.input.shape, np.float32)
    seen = ticks[-t:]
    if seen:
        win[t - len(seen):] = np.stack(seen)
    return win


def _want(cm, ticks: list[np.ndarray]) -> np.ndarray:
    x = np.zeros(cm.input.batched(cm.batch_size), np.float32)
    y = np.zeros(cm.output.batched(cm.batch_size), np.float32)
    x[0] = _window_of(cm, ticks)
    cm.predict_into(x, y)
    return y[0].copy()


ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(0, 4)),
    st.tuples(st.just("many"), st.sets(st.integers(0, 4), min_size=1, max_size=5)),
    st.tuples(st.just("reset"), st.one_of(st.none(), st.integers(0, 4))),
    st.tuples(st.just("prepare"), st.none())), min_size=1, max_size=40)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(which=st.integers(0, 5), streams=st.integers(1, 5), auto=st.booleans(), program=ops,
       seed=st.integers(0, 2**16))
def test_every_window_answers_its_own_ticks(variants, which, streams, auto, program, seed):
    name, cm, form, bound = variants[which % len(variants)]
    ws = cm.sliding(streams=streams, auto_prepare=auto)
    assert (ws.form, ws.streams, len(ws)) == (form, streams, streams)
    rng = np.random.default_rng(seed)
    hist: list[list[np.ndarray]] = [[] for _ in range(streams)]
    step, oshape = ws.step_shape, ws.output_shape
    out = np.zeros(oshape, np.float32)
    worst = 0.0
    for op, arg in program:
        if op == "push":
            i = arg % streams
            x = rng.normal(0, 1.5, step).astype(np.float32)
            ws.push_into(i, x, out)
            hist[i].append(x)
            got, want = [out.copy()], [_want(cm, hist[i])]
        elif op == "many":
            ids = np.array(sorted({a % streams for a in arg}), np.int64)
            rng.shuffle(ids)
            xs = rng.normal(0, 1.5, (len(ids), *step)).astype(np.float32)
            outs = np.zeros((len(ids), *oshape), np.float32)
            ws.push_many(ids, xs, outs)
            got, want = list(outs), []
            for j, i in enumerate(ids.tolist()):
                hist[i].append(xs[j])
                want.append(_want(cm, hist[i]))
        elif op == "reset":
            ws.reset(None if arg is None else arg % streams)
            for i in (range(streams) if arg is None else [arg % streams]):
                hist[i] = []
            continue
        else:
            ws.prepare()
            continue
        for g, w in zip(got, want, strict=True):
            err = float(np.abs(g - w).max()) / max(1.0, float(np.abs(w).max()))
            worst = max(worst, err)
    assert worst <= bound, (name, worst)


def test_streams_are_one_stream_each(compiled):
    """streaming(streams=N): each stream's answers are those of one stream fed its own ticks
    (push_many and resets included), bit for bit."""
    cm = compiled("lstm", "cpu.native")
    n, step = 4, tuple(cm.input.shape[1:])
    ss = cm.streaming(streams=n)
    rng = np.random.default_rng(2)
    log: list[list[tuple[str, np.ndarray | None, np.ndarray | None]]] = [[] for _ in range(n)]
    out = np.zeros(cm.output.shape, np.float32)
    for t in range(60):
        if t % 7 == 3:
            ids = np.array([3, 0, 2], np.int64)
            xs = rng.normal(size=(3, *step)).astype(np.float32)
            outs = np.zeros((3, *cm.output.shape), np.float32)
            ss.push_many(ids, xs, outs)
            for j, i in enumerate(ids.tolist()):
                log[i].append(("push", xs[j], outs[j].copy()))
        elif t == 40:
            ss.reset(1)
            log[1].append(("reset", None, None))
        else:
            i = t % n
            x = rng.normal(size=step).astype(np.float32)
            ss.push_into(i, x, out)
            log[i].append(("push", x, out.copy()))
    one = cm.streaming()
    for i in range(n):
        one.reset()
        for op, x, y in log[i]:
            if op == "reset":
                one.reset()
                continue
            one.push_into(x, out)
            assert out.tobytes() == y.tobytes(), (i, out, y)


def test_two_sets_share_no_state(compiled):
    """Two sliding(streams=…) sets and the single window are independent: nothing one is
    pushed changes another's answers (the state is in handles, not the library)."""
    cm = compiled("lstm", "cpu.native")
    step = tuple(cm.input.shape[1:])
    a, b, single = cm.sliding(streams=2), cm.sliding(streams=2), cm.sliding()
    rng = np.random.default_rng(9)
    xs = rng.normal(size=(30, *step)).astype(np.float32)
    noise = rng.normal(size=(30, *step)).astype(np.float32)
    ya, ys, junk = (np.zeros(cm.output.shape, np.float32) for _ in range(3))
    for t in range(30):
        a.push_into(0, xs[t], ya)        # a's window 0 and the single window see xs only
        b.push_into(0, noise[t], junk)   # everything else sees noise
        b.push_into(1, noise[t], junk)
        a.push_into(1, noise[t], junk)
        single.push_into(xs[t], ys)
        assert ya.tobytes() == ys.tobytes(), t


def test_wrong_arguments_are_input_errors(compiled):
    cm = compiled("lstm", "cpu.native")
    ws = cm.sliding(streams=3)
    step = tuple(cm.input.shape[1:])
    x, out = np.zeros(step, np.float32), np.zeros(cm.output.shape, np.float32)
    with pytest.raises(InputError, match="stream id 3"):
        ws.push_into(3, x, out)
    with pytest.raises(InputError, match="stream id True"):
        ws.push_into(True, x, out)
    with pytest.raises(InputError, match="stream id -1"):
        ws.push_into(-1, x, out)
    with pytest.raises(InputError, match="float32"):
        ws.push_into(0, x.astype(np.float64), out)
    ids = np.array([0, 0], np.int64)
    with pytest.raises(InputError, match="distinct"):
        ws.push_many(ids, np.zeros((2, *step), np.float32), np.zeros((2, *cm.output.shape), np.float32))
    with pytest.raises(InputError, match="int64"):
        ws.push_many(np.array([0, 1], np.int32), np.zeros((2, *step), np.float32),
                     np.zeros((2, *cm.output.shape), np.float32))
    with pytest.raises(InputError, match="shape"):
        ws.push_many(np.array([0, 1], np.int64), np.zeros((3, *step), np.float32),
                     np.zeros((2, *cm.output.shape), np.float32))
    with pytest.raises(InputError, match="0 to 2"):
        ws.push_many(np.array([0, 5], np.int64), np.zeros((2, *step), np.float32),
                     np.zeros((2, *cm.output.shape), np.float32))
    with pytest.raises(InputError, match="stream id 7"):
        ws.reset(7)
    for bad in (0, -2, 1 << 30, 2.5, "8", True):
        with pytest.raises(InputError, match="streams"):
            cm.sliding(streams=bad)
    # the set still answers after every refusal
    ws.push_into(2, x, out)
    assert np.isfinite(out).all()


def test_fallback_refuses_wrong_ids_and_has_no_streams(compiled):
    cm = compiled("lstm", "cpu.onnxruntime")
    ws = cm.sliding(streams=2)
    assert ws.form == "recompute"
    x, out = np.zeros(tuple(cm.input.shape[1:]), np.float32), np.zeros(cm.output.shape, np.float32)
    with pytest.raises(InputError, match="stream id 2"):
        ws.push_into(2, x, out)
    with pytest.raises(UnsupportedError, match="no streaming form"):
        cm.streaming(streams=2)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler (g++)")
def test_cpp_windows_answer_as_python(compiled, tmp_path):
    """examples/windows_push.cpp on the exported library: N handles
    (hwb_model_window_new), ticks round-robin and push_many, each handle's answers equal
    Python's sliding(streams=N) bit for bit; the handles are freed."""
    from hwbackends.registry import get_registry

    cm = compiled("lstm", "cpu.native")
    lib = tmp_path / "lib"
    get_registry().target("cpu.native").export(cm.artifact, "c", lib)
    header = (lib / "hwb_model.h").read_text()
    assert "hwb_window *hwb_model_window_new(void);" in header
    exe = tmp_path / "windows_push"
    src = Path(__file__).resolve().parents[1] / "examples" / "windows_push.cpp"
    subprocess.run(["g++", "-O2", "-std=c++17", "-Wall", "-Werror", f"-I{lib}", str(src),
                    str(lib / "libhwb_model.so"), f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True,
                   timeout=120)
    n, rounds = 5, 40
    step = int(np.prod(cm.input.shape[1:]))
    xs = np.random.default_rng(13).normal(size=(rounds, n, step)).astype(np.float32)
    xs.tofile(tmp_path / "x.f32")
    subprocess.run([str(exe), str(n), str(tmp_path / "x.f32"), str(tmp_path / "y.f32")], check=True,
                   timeout=60)
    got = np.fromfile(tmp_path / "y.f32", np.float32).reshape(rounds, n, -1)
    # the example pushes even rounds one window at a time, odd rounds with push_many
    ws = cm.sliding(streams=n)
    want = np.zeros_like(got)
    for r in range(rounds):
        if r % 2:
            ws.push_many(np.arange(n, dtype=np.int64), xs[r].reshape(n, *cm.input.shape[1:]), want[r])
        else:
            for i in range(n):
                ws.push_into(i, xs[r, i].reshape(cm.input.shape[1:]), want[r, i])
    assert got.tobytes() == want.tobytes()
    bench = subprocess.run([str(exe), "--bench", "24", "200"], capture_output=True, text=True, check=True,
                           timeout=120)
    assert "push p50" in bench.stdout and "push_many" in bench.stdout


def test_push_validates_and_refuses_a_nan_tick_under_reject(compiled):
    """push() is push_into's validating form, as predict() is predict_into's: the compiled
    model's nan_policy ('reject' by default) refuses a NaN tick before it enters the window,
    which then answers as if it never came; push_into (the hot path) does not check."""
    cm = compiled("lstm", "cpu.native")
    assert cm.nan_policy == "reject"
    ws, one = cm.sliding(streams=2), cm.sliding()
    step = ws.step_shape
    rng = np.random.default_rng(4)
    xs = rng.normal(size=(5, *step)).astype(np.float32)
    bad = xs[0].copy()
    bad[0] = np.nan
    for t in range(5):
        got = ws.push(0, xs[t].tolist())      # any array-like of one step's shape
        with pytest.raises(InputError, match="NaN"):
            ws.push(0, bad)
        with pytest.raises(InputError, match="NaN"):
            one.push(bad)
        want = one.push(xs[t])
        assert got.tobytes() == want.tobytes()
    with pytest.raises(InputError, match="shape"):
        ws.push(1, np.zeros(3, np.float32))
    out = np.zeros(ws.output_shape, np.float32)
    ws.push_into(1, bad, out)                 # the hot path lets it through: NaN answers
    assert np.isnan(out).all()
