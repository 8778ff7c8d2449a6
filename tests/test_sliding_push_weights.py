"""cpu.native's ``push_weights`` and ``push_gates`` options (hwb_plugins/cpu_native/push_weights.py),
through the public API: a sliding push with bf16 or int8 input weights answers within its
precision family's fidelity tolerance of the fp32 full window (not bit for bit: that is the point
of it), while ``predict``, the prepare and the stream stay fp32; its kernels compute what their
arithmetic model says; an fp32 push with the fast gates stays within 1e-5 of the window over
10,000 ticks; a CPU or ``-march`` without the kernel's feature, a model or precision without an
incremental push, and a push that misses its tolerance are refused with the reason. Tests that
run a kernel skip where this CPU lacks its feature."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from sliding_ref import push_all, window_answers
from test_sliding_native import recurrent_model

import hwbackends as hwb
from hwbackends.errors import HwbError, UnsupportedError
from hwbackends.fidelity import compare, gate_violations

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
KINDS = ("bf16", "int8")


def _lacks(kind: str) -> list[str]:
    from hwb_plugins.cpu_native import build, push_weights

    return push_weights.missing_features(kind, build.host_flags())


def _need(kind: str) -> None:
    lacks = _lacks(kind)
    if lacks:
        pytest.skip(f"push_weights={kind} needs CPU feature(s) {', '.join(lacks)}, which this CPU lacks")


def _compile(model, kind: str, store, gates: str | None = None, **kw):
    opts = {"push_weights": kind, **({"push_gates": gates} if gates else {})}
    return hwb.compile(model, "cpu.native", "fp32", store=store, fidelity=False, options=opts, **kw)


@pytest.fixture(scope="module")
def stack_model():
    """LSTM(12) → LSTM(9) → GRU(7) → GRU v1(6) after a per-step tanh, a Dense head: every cell
    form the reduced push has (the first layer's shared projection, a later LSTM's product
    and vector gates, both GRU forms' exact gates), partial vectors everywhere."""
    return recurrent_model(3, 7, 5, [("lstm", 12), ("lstm", 9), ("gru", 7), ("gru_v1", 6)], True, 5)


@pytest.fixture(scope="module")
def fp32_stack(stack_model, store_dir):
    return hwb.compile(stack_model, "cpu.native", store=store_dir, fidelity=False)


@pytest.mark.parametrize("kind", KINDS)
def test_reduced_push_is_within_its_family_tolerance_of_the_fp32_window(kind, stack_model, fp32_stack, store_dir):
    _need(kind)
    cm = _compile(stack_model, kind, store_dir)
    sl = cm.artifact.meta["sliding"]
    assert sl["form"] == "incremental" and sl["push_weights"] == kind
    assert sl["push_gate"]["violations"] == [] and sl["push_gate"]["tolerance"] == kind
    xs = np.random.default_rng(4).normal(0, 1.5, (90, 5)).astype(np.float32)
    resets = {40}
    for auto, every in ((True, 0), (False, 2)):  # prepare inside push, and by hand every other tick
        got = push_all(cm.sliding(auto_prepare=auto), xs, (2,), resets, every)
        want = window_answers(cm, xs, resets)
        f = compare(want, got)
        assert gate_violations(kind, f) == [], f
        # reduced for real: not the fp32 push (which equals the window within 1e-5)
        assert np.abs(got - want).max() > 1e-4 * max(1.0, np.abs(want).max())
    # predict_into and the stream are the fp32 variant's, bit for bit
    win = np.random.default_rng(5).normal(size=(4, 7, 5)).astype(np.float32)
    assert cm.predict(win).tobytes() == fp32_stack.predict(win).tobytes()
    a = push_all(cm.streaming(), xs, (2,))
    b = push_all(fp32_stack.streaming(), xs, (2,))
    assert a.tobytes() == b.tobytes()


def _lstm_reference(kind: str, km, xs: np.ndarray) -> np.ndarray:
    """One LSTM step from zero state (window 1) then the Dense head, in float64, with the input
    product computed as the ``kind`` kernel computes it (push_weights.reference_products)."""
    from hwb_plugins.cpu_native.push_weights import reference_products

    k, _r, b = (np.asarray(w, np.float64) for w in km.get_layer("rec0").get_weights())
    wd, bd = (np.asarray(w, np.float64) for w in km.get_layer("signal").get_weights())
    u = k.shape[1] // 4
    z = reference_products(kind, k.astype(np.float32), xs) + b

    def sig(v):
        return 1.0 / (1.0 + np.exp(-v))
    c = sig(z[:, :u]) * np.tanh(z[:, 2 * u:3 * u])
    h = sig(z[:, 3 * u:]) * np.tanh(c)
    return h @ wd + bd


@pytest.mark.parametrize("kind,gates", [("bf16", "fast"), ("int8", "fast"), ("int8", "exact")])
def test_reduced_kernels_compute_their_arithmetic_model(kind, gates, store_dir):
    """Window 1, so each answer is one step from zero state: 37 features (bf16 pairs and int8
    groups of 4 padded) into LSTM(20) (80 gate outputs in 5 vectors; 20 units: a masked gate
    vector) and a Dense head; the push must equal the float64 model of the kernel (the same
    rounded operands, exact gates) within 2e-5 of the answers' scale: a kernel that misplaced a
    pair, a group or a channel scale, or gates off by more than their error budget, fail."""
    _need(kind)
    km = recurrent_model(8, 1, 37, [("lstm", 20)], False, 0)
    cm = _compile(km, kind, store_dir, gates)
    assert cm.artifact.meta["sliding"]["push_gates"] == gates
    xs = np.random.default_rng(6).normal(0, 1.0, (64, 37)).astype(np.float32)
    xs[3] *= 40.0  # one large tick: the int8 scale is per tick
    xs[5] = 0.0    # an all-zero tick: int8's scale 0 must not divide by zero
    got = push_all(cm.sliding(), xs, (2,))
    want = _lstm_reference(kind, km, xs)
    assert np.abs(got - want).max() <= 2e-5 * max(1.0, np.abs(want).max()), np.abs(got - want).max()
    fp32 = window_answers(cm, xs)
    assert np.abs(got - fp32).max() > 1e-4  # and it is not the fp32 product


@pytest.mark.slow  # two LSTM_A compiles (~15 s each on a loaded 2-core box); stack_model covers the code
@pytest.mark.parametrize("kind", KINDS)
def test_lstm_a_reduced_push_is_gated_and_close_to_the_fp32_window(kind, zoo_model, store_dir):
    """The LSTM_A shape (window 50 × 100 features, LSTM(100) → LSTM(100) → Dense(1)): its push
    with reduced weights over 300 ticks (every window slot retired and restarted) within its
    family's tolerance of predict_into on each window (fp32)."""
    _need(kind)
    cm = _compile(zoo_model("lstm_a"), kind, store_dir)
    gate = cm.artifact.meta["sliding"]["push_gate"]
    assert gate["violations"] == [] and gate["ticks"] >= 300
    xs = np.random.default_rng(7).normal(size=(300, 100)).astype(np.float32)
    got = push_all(cm.sliding(), xs, (1,))
    want = window_answers(cm, xs)
    f = compare(want, got)
    assert gate_violations(kind, f) == [], f
    assert f.rel_err > 0  # reduced: not predict_into bit for bit


def test_fast_gates_keep_an_fp32_push_within_1e_5_over_10000_ticks(zoo_model, store_dir):
    """push_gates='fast' on the zoo LSTM (window 16): 10,000 ticks within 1e-5 of the answers'
    scale of predict_into on each window (and not bit-equal: the fast gates are in use), the
    compile's gate recorded; predict_into is the fp32 variant's bit for bit."""
    _need("fast")
    cm = hwb.compile(zoo_model("lstm"), "cpu.native", store=store_dir, fidelity=False,
                     options={"push_gates": "fast"})
    sl = cm.artifact.meta["sliding"]
    assert (sl["push_weights"], sl["push_gates"], sl["push_gate"]["violations"]) == ("fp32", "fast", [])
    xs = np.random.default_rng(12).normal(size=(10_000, 8)).astype(np.float32)
    got = push_all(cm.sliding(), xs, (1,))
    want = window_answers(cm, xs)
    err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
    assert 0 < err <= 1e-5, err
    exact = hwb.compile(zoo_model("lstm"), "cpu.native", store=store_dir, fidelity=False)
    win = np.random.default_rng(13).normal(size=(3, 16, 8)).astype(np.float32)
    assert cm.predict(win).tobytes() == exact.predict(win).tobytes()


def test_push_weights_refusals_say_what_to_do(store_dir, stack_model):
    """A value it does not know, a precision without an incremental push, a -march without the
    kernel's feature, a model whose push is not incremental: UnsupportedError before any work
    it cannot finish, each naming the way out."""
    with pytest.raises(UnsupportedError, match=r"push_weights='fp16': expected one of fp32, bf16, int8"):
        _compile(stack_model, "fp16", store_dir)
    with pytest.raises(UnsupportedError, match=r"push_gates='quick': expected one of exact, fast"):
        _compile(stack_model, "fp32", store_dir, "quick")
    with pytest.raises(UnsupportedError, match=r"push_gates='fast' applies to precision 'fp32'.*drop push_gates"):
        hwb.compile(stack_model, "cpu.native", "int8", store=store_dir, fidelity=False,
                    options={"push_gates": "fast"})
    with pytest.raises(UnsupportedError, match=r"applies to precision 'fp32'.*drop push_weights"):
        hwb.compile(stack_model, "cpu.native", "int8", store=store_dir, fidelity=False,
                    options={"push_weights": "bf16"})
    from hwb_plugins.cpu_native import build

    if build.arch() == "x86_64" and not _lacks("bf16"):
        with pytest.raises(UnsupportedError, match=r"avx512_bf16, which -march=x86-64-v4.*isa='native'"):
            hwb.compile(stack_model, "cpu.native", store=store_dir, fidelity=False,
                        options={"push_weights": "bf16", "isa": "x86-64-v4"})
    if not _lacks("int8"):
        with pytest.raises(HwbError, match=r"incremental form.*recompute form.*drop push_weights"):
            _compile("zoo:mlp", "int8", store_dir)


def test_a_cpu_without_the_feature_is_told_which_one(stack_model, tmp_path, monkeypatch):
    """The feature check reads this CPU's flags (build.CPUINFO): pointed at a CPU with AVX-512
    but neither BF16 nor VNNI, each kind names the feature it lacks, before a build."""
    from hwb_plugins.cpu_native import build

    flags = "fpu sse sse2 avx avx2 fma avx512f avx512bw avx512vl avx512dq"
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Old Xeon\nflags\t\t: {flags}\n")
    monkeypatch.setattr(build, "CPUINFO", str(cpuinfo))
    for kind, feature in (("bf16", "avx512_bf16"), ("int8", "avx512_vnni")):
        with pytest.raises(UnsupportedError, match=rf"needs CPU feature\(s\) {feature}, which this CPU .*lacks"):
            _compile(stack_model, kind, tmp_path / "store")  # an empty store: nothing cached to load


def test_a_push_that_misses_its_tolerance_is_refused(store_dir):
    """int8's scale is per tick over the whole input vector: a model whose first feature is
    scaled up 10,000× before the LSTM (and weighted down as much) leaves the other features a
    few hundredths of one int8 step, so the int8 push loses the signal; the compile's gate
    refuses it with the measured violation (and bf16, relative to each value, passes)."""
    _need("int8")
    import keras

    keras.utils.set_random_seed(1)
    km = keras.Sequential([keras.Input((6, 4), name="window"),
                           keras.layers.BatchNormalization(name="scale"),
                           keras.layers.LSTM(8, name="rec0"), keras.layers.Dense(1, name="signal")])
    rng = np.random.default_rng(2)
    k = rng.normal(0, 0.7, (4, 32)).astype(np.float32)
    k[0] *= 1e-4
    km.get_layer("scale").set_weights([np.array([1e4, 1, 1, 1], np.float32), np.zeros(4, np.float32),
                                       np.zeros(4, np.float32), np.ones(4, np.float32)])
    km.get_layer("rec0").set_weights([k, rng.normal(0, 0.5, (8, 32)).astype(np.float32),
                                      rng.normal(0, 0.2, 32).astype(np.float32)])
    km.get_layer("signal").set_weights([rng.normal(0, 1, (8, 1)).astype(np.float32), np.zeros(1, np.float32)])
    with pytest.raises(HwbError, match=r"push_weights='int8'.*miss the int8 tolerance.*push_weights='fp32'"):
        _compile(km, "int8", store_dir)
    if not _lacks("bf16"):
        assert _compile(km, "bf16", store_dir).artifact.meta["sliding"]["push_gate"]["violations"] == []


def test_hwb_compile_says_what_the_push_reads_and_refuses_a_march_without_it(store_dir, capsys):
    """Through `hwb compile -O push_weights=...`: the summary names the push's weights and gates,
    its gate's figures and that it is not bit-equal; a -march without the feature is a clear
    error (exit status 1 or 2, the feature named), not a traceback."""
    from hwbackends.cli import main

    _need("int8")
    rc = main(["compile", "zoo:lstm", "-t", "cpu.native", "-O", "push_weights=int8", "--cache-dir", str(store_dir)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "push     int8 input weights, fast LSTM gates: within the int8 tolerance" in out
    assert "not bit-equal to predict_into" in out
    rc = main(["compile", "zoo:lstm", "-t", "cpu.native", "-O", "push_weights=int8", "-O", "isa=x86-64-v3",
               "--cache-dir", str(store_dir)])
    cap = capsys.readouterr()
    assert rc != 0 and "Traceback" not in cap.err + cap.out
    assert "avx512_vnni" in cap.err + cap.out and "isa='native'" in cap.err + cap.out


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_the_kit_judges_a_reduced_push_at_its_gated_family(kind, tmp_path):
    """The conformance kit's sliding check on an fp32 variant whose push reads reduced
    weights: judged at the family its compile gated it at (``push_gate``), not at the fp32
    incremental bound it would miss, and still judged (a push off by more fails)."""
    from hwbackends.testing.check_sliding import check_sliding, push_precision
    from hwbackends.testing.context import Conformance, ConformanceError, Variant

    _need(kind)
    ctx = Conformance("cpu.native", tmp_path / "kit", models=("lstm",),
                      options={"push_weights": kind})
    v = Variant("lstm", "fp32")
    assert "incremental" in check_sliding(ctx, v)
    cm = ctx.compiled(v)
    assert push_precision(cm) == kind
    # The same push judged at the fp32 bound (what the kit did before) is refused: the
    # tolerance above is what let it pass.
    cm.artifact.meta["sliding"]["push_gate"]["tolerance"] = "fp32 sliding bound 1e-05"
    with pytest.raises(ConformanceError, match="differs from predict_into"):
        check_sliding(ctx, v)
