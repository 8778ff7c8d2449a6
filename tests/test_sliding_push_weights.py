"""cpu.native's ``push_weights`` and ``push_gates`` options (hwb_plugins/cpu_native/push_weights.py),
through the public API: a sliding push with bf16, f16 or int8 input weights answers within its
precision family's fidelity tolerance of the fp32 full window (not bit for bit: that is the point
of it), while ``predict``, the prepare and the stream stay fp32; its kernels compute what their
arithmetic model says, in each form the ``-march`` picks (AVX-512, and AVX2 through
``isa=x86-64-v3``; every form, AVX-VNNI's included, at the kernel level under Hypothesis); an fp32
push with the fast gates stays within 1e-5 of the window over 10,000 ticks; a CPU or ``-march``
without the kernel's feature, a model or precision without an incremental push, a weight beyond
half's range and a push that misses its tolerance are refused with the reason. Tests that run a
kernel skip where this CPU lacks its feature."""
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
KINDS = ("bf16", "f16", "int8")
#: the x86-64 level without AVX-512 (AVX2 + FMA + F16C): the AVX2 forms
AVX2 = "x86-64-v3"


def _lacks(kind: str, isa: str = "native") -> list[str]:
    """What ``kind``'s kernel needs that this CPU (or, with ``isa``, that level too) lacks."""
    from hwb_plugins.cpu_native import build, push_weights

    if isa == "native":
        return push_weights.missing_features(kind, build.host_flags())
    if build.arch() != "x86_64":
        return [f"x86-64 (isa={isa})"]
    have = set(build.host_flags()) & set(build.required_flags(build.compiler_path(), isa))
    return push_weights.missing_features(kind, have)


def _need(kind: str, isa: str = "native") -> None:
    lacks = _lacks(kind, isa)
    if lacks:
        pytest.skip(f"push_weights={kind} (isa={isa}) needs CPU feature(s) {', '.join(lacks)}, which this CPU lacks")


def _compile(model, kind: str, store, gates: str | None = None, isa: str = "native", **kw):
    opts = {"push_weights": kind, **({"push_gates": gates} if gates else {}), **({"isa": isa} if isa != "native" else {})}
    return hwb.compile(model, "cpu.native", "fp32", store=store, fidelity=False, options=opts, **kw)


def _assert_avx2(cm, kind: str, gates: str = "fast") -> None:
    """An isa=x86-64-v3 artifact: nothing of AVX-512 required, and the push's AVX2 forms."""
    meta = cm.artifact.meta
    assert not [f for f in meta["requires"] if f.startswith("avx512")], meta["requires"]
    want = {kind: "avx2", **({"fast": "avx2"} if gates == "fast" else {})}
    assert meta["sliding"]["push_kernels"] == want
    if shutil.which("objdump"):  # and the library holds that form's code, no zmm anywhere
        import subprocess

        dis = subprocess.run(["objdump", "-d", cm.artifact.file("libhwb_model.so")], capture_output=True,
                             text=True, timeout=120).stdout
        op, reg = FORM_MARK[kind, "avx2"]
        assert any(op in line and f"%{reg}" in line for line in dis.splitlines()), (op, reg)
        assert "%zmm" not in dis


@pytest.fixture(scope="module")
def stack_model():
    """LSTM(12) → LSTM(9) → GRU(7) → GRU v1(6) after a per-step tanh, a Dense head: every cell
    form the reduced push has (the first layer's shared projection, a later LSTM's product
    and vector gates, both GRU forms' exact gates), partial vectors everywhere."""
    return recurrent_model(3, 7, 5, [("lstm", 12), ("lstm", 9), ("gru", 7), ("gru_v1", 6)], True, 5)


@pytest.fixture(scope="module")
def fp32_stack(stack_model, store_dir):
    return hwb.compile(stack_model, "cpu.native", store=store_dir, fidelity=False)


GATED_AT = {"bf16": "bf16", "f16": "fp16", "int8": "int8"}


@pytest.mark.parametrize("kind,isa", [(k, "native") for k in KINDS] + [("f16", AVX2), ("int8", AVX2)])
def test_reduced_push_is_within_its_family_tolerance_of_the_fp32_window(kind, isa, stack_model, fp32_stack,
                                                                         store_dir):
    _need(kind, isa)
    cm = _compile(stack_model, kind, store_dir, isa=isa)
    if isa == AVX2:
        _assert_avx2(cm, kind)
    sl = cm.artifact.meta["sliding"]
    assert sl["form"] == "incremental" and sl["push_weights"] == kind
    assert sl["push_gate"]["violations"] == [] and sl["push_gate"]["tolerance"] == GATED_AT[kind]
    assert cm.variant == f"cpu.native:fp32+push={kind}"  # its own variant, not the fp32 one
    kind = GATED_AT[kind]  # the precision whose family tolerance judges it
    xs = np.random.default_rng(4).normal(0, 1.5, (90, 5)).astype(np.float32)
    resets = {40}
    for auto, every in ((True, 0), (False, 2)):  # prepare inside push, and by hand every other tick
        got = push_all(cm.sliding(auto_prepare=auto), xs, (2,), resets, every)
        want = window_answers(cm, xs, resets)
        f = compare(want, got)
        assert gate_violations(kind, f) == [], f
        # reduced for real: not the fp32 push (which equals the window within 1e-5)
        assert np.abs(got - want).max() > 1e-4 * max(1.0, np.abs(want).max())
    # predict_into and the stream are the fp32 variant's (of the same isa), bit for bit
    fp32 = fp32_stack if isa == "native" else hwb.compile(stack_model, "cpu.native", store=store_dir,
                                                          fidelity=False, options={"isa": isa})
    win = np.random.default_rng(5).normal(size=(4, 7, 5)).astype(np.float32)
    assert cm.predict(win).tobytes() == fp32.predict(win).tobytes()
    a = push_all(cm.streaming(), xs, (2,))
    b = push_all(fp32.streaming(), xs, (2,))
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


@pytest.mark.parametrize("kind,gates,isa", [("bf16", "fast", "native"), ("f16", "fast", "native"),
                                            ("int8", "fast", "native"), ("int8", "exact", "native"),
                                            ("f16", "fast", AVX2), ("int8", "fast", AVX2), ("int8", "exact", AVX2)])
def test_reduced_kernels_compute_their_arithmetic_model(kind, gates, isa, store_dir):
    """Window 1, so each answer is one step from zero state: 37 features (bf16 pairs and int8
    groups of 4 padded) into LSTM(20) (80 gate outputs in 5 vectors, 10 of AVX2's; 20 units: a
    masked gate vector, a masked AVX2 half) and a Dense head; the push must equal the float64
    model of the kernel (the same rounded operands, exact gates) within 2e-5 of the answers'
    scale: a kernel that misplaced a pair, a group or a channel scale, or gates off by more
    than their error budget, fail. ``isa=x86-64-v3``: the AVX2 forms (and AVX2 fast gates)."""
    _need(kind, isa)
    km = recurrent_model(8, 1, 37, [("lstm", 20)], False, 0)
    cm = _compile(km, kind, store_dir, gates, isa)
    assert cm.artifact.meta["sliding"]["push_gates"] == gates
    if isa == AVX2:
        _assert_avx2(cm, kind, gates)
    xs = np.random.default_rng(6).normal(0, 1.0, (64, 37)).astype(np.float32)
    xs[3] *= 40.0  # one large tick: the int8 scale is per tick
    xs[5] = 0.0    # an all-zero tick: int8's scale 0 must not divide by zero
    got = push_all(cm.sliding(), xs, (2,))
    want = _lstm_reference(kind, km, xs)
    assert np.abs(got - want).max() <= 2e-5 * max(1.0, np.abs(want).max()), np.abs(got - want).max()
    fp32 = window_answers(cm, xs)
    assert np.abs(got - fp32).max() > 1e-4  # and it is not the fp32 product


#: every kernel form (push_weights.FORMS) and the cc flags that build it on x86-64
FORM_FLAGS = {("bf16", "avx512_bf16"): ("-march=x86-64-v4", "-mavx512bf16"),
              ("f16", "avx512f"): ("-march=x86-64-v4",), ("f16", "avx2"): ("-march=x86-64-v3",),
              ("int8", "avx512_vnni"): ("-march=x86-64-v4", "-mavx512vnni"),
              ("int8", "avx_vnni"): ("-march=x86-64-v3", "-mavxvnni"), ("int8", "avx2"): ("-march=x86-64-v3",)}
#: an instruction only that form's product uses, as objdump names it, with its register width
FORM_MARK = {("bf16", "avx512_bf16"): ("vdpbf16ps", "zmm"), ("f16", "avx512f"): ("vcvtph2ps", "zmm"),
             ("f16", "avx2"): ("vcvtph2ps", "ymm"), ("int8", "avx512_vnni"): ("vpdpbusd", "zmm"),
             ("int8", "avx_vnni"): ("vpdpbusd", "ymm"), ("int8", "avx2"): ("vpmaddubsw", "ymm")}


def _form_library(kind: str, form: str, w: np.ndarray, b: np.ndarray, path):
    """One product of ``w`` (+ ``b``) as push_weights.Kernels emits it, built with ``form``'s
    flags into a library exposing it as ``run(x, y)`` (ctypes)."""
    import ctypes
    import subprocess

    from hwb_plugins.cpu_native import build, push_weights

    kern = push_weights.Kernels(kind, fast_gates=False)
    name = kern.product(w, b)
    stem = f"{kind}_{form}_{len(list(path.iterdir()))}"  # a new path each: dlopen keeps a loaded one
    src = path / f"{stem}.c"
    src.write_text("\n".join(["#include <stdint.h>", "#define HWB_INLINE static inline __attribute__((always_inline))",
                              "#define A64 __attribute__((aligned(64)))", *kern.c(),
                              f"void run(const float *x, float *y) {{ {name}(x, y); }}", ""]))
    lib = path / f"{stem}.so"
    subprocess.run([build.compiler_path(), "-O2", "-shared", "-fPIC", *FORM_FLAGS[kind, form], f"-I{build.RUNTIME_DIR}",
                    "-o", str(lib), str(src)], check=True, capture_output=True, text=True, timeout=120)
    return ctypes.CDLL(str(lib)).run, lib


def _aligned(n: int) -> np.ndarray:
    """n float32 zeros, 64-byte aligned (the kernels store whole aligned vectors)."""
    raw = np.zeros(n + 16, np.float32)
    off = (-raw.ctypes.data % 64) // 4
    return raw[off:off + n]


@pytest.mark.parametrize("kind,form", list(FORM_FLAGS))
def test_every_kernel_form_computes_the_reference_products(kind, form, tmp_path_factory):
    """Hypothesis draws LSTM-shaped products (inputs 1..130, 4 × units gate outputs; sizes off
    every multiple of 8 and 16 among them) and input vectors (a large one, an all-zero one
    among them); each form of each kind, built with its flags (the AVX-VNNI form too, which
    no isa option selects) and checked to be that form (its instruction in the library), must
    equal push_weights.reference_products of the rounded operands within fp32 summation
    rounding of Σ|x·w|: the AVX2 int8 forms' int32 sums equal VNNI's exactly, so one model
    serves all three."""
    import shutil as sh
    import subprocess

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from hwb_plugins.cpu_native import build, push_weights

    if build.arch() != "x86_64":
        pytest.skip("the kernel forms are x86-64")
    needs = dict(push_weights.FORMS[kind])[form]
    lacks = push_weights.missing_features_of(needs, build.host_flags())
    if lacks:
        pytest.skip(f"{kind} form {form} needs {', '.join(lacks)}, which this CPU lacks")
    path = tmp_path_factory.mktemp(f"{kind}_{form}")

    @settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(n_in=st.integers(1, 130), units=st.integers(1, 40), seed=st.integers(0, 2**31 - 1),
           scale=st.sampled_from([1.0, 1e-3, 30.0]))
    def check(n_in, units, seed, scale):
        rng = np.random.default_rng(seed)
        n_out = 4 * units
        w = rng.normal(0, 0.5, (n_in, n_out)).astype(np.float32)
        b = rng.normal(0, 0.2, n_out).astype(np.float32)
        xs = (rng.normal(0, 1.0, (5, n_in)) * scale).astype(np.float32)
        xs[1] *= 50.0
        xs[2] = 0.0
        run, lib = _form_library(kind, form, w, b, path)
        if sh.which("objdump"):
            dis = subprocess.run(["objdump", "-d", str(lib)], capture_output=True, text=True, timeout=60).stdout
            op, reg = FORM_MARK[kind, form]
            assert any(op in line and f"%{reg}" in line for line in dis.splitlines()), (kind, form, op, reg)
        import ctypes

        fp = ctypes.POINTER(ctypes.c_float)
        want = push_weights.reference_products(kind, w, xs) + b
        if kind == "int8":
            q, chs = push_weights.int8_weights(w)
            amax = np.abs(xs).max(axis=1, keepdims=True).astype(np.float64)
            mag = np.abs(np.rint(xs * np.divide(127.0, amax, out=np.zeros_like(amax), where=amax > 0))) \
                @ np.abs(q.astype(np.float64)) * (amax / 127.0) * chs
        else:
            wr = push_weights.bf16_values(w) if kind == "bf16" else w.astype(np.float16)
            xr = push_weights.bf16_values(xs) if kind == "bf16" else xs
            mag = np.abs(xr.astype(np.float64)) @ np.abs(wr.astype(np.float64))
        bound = (n_in + 4) * 2.0 ** -23 * (mag + np.abs(b)) + 1e-30
        y = _aligned(-(-n_out // 16) * 16)
        for i in range(len(xs)):
            x = np.ascontiguousarray(xs[i])
            run(x.ctypes.data_as(fp), y.ctypes.data_as(fp))
            assert np.all(np.abs(y[:n_out] - want[i]) <= bound[i]), (i, np.abs(y[:n_out] - want[i]).max())
            assert np.all(y[n_out:] == 0)  # the padding lanes: 0 + 0

    check()


@pytest.mark.slow  # two LSTM_A compiles (~15 s each on a loaded 2-core box); stack_model covers the code
@pytest.mark.parametrize("kind,isa", [(k, "native") for k in KINDS] + [("f16", AVX2), ("int8", AVX2)])
def test_lstm_a_reduced_push_is_gated_and_close_to_the_fp32_window(kind, isa, zoo_model, store_dir):
    """The LSTM_A shape (window 50 × 100 features, LSTM(100) → LSTM(100) → Dense(1)): its push
    with reduced weights over 300 ticks (every window slot retired and restarted) within its
    family's tolerance of predict_into on each window (fp32); on AVX2 (isa=x86-64-v3) too."""
    _need(kind, isa)
    cm = _compile(zoo_model("lstm_a"), kind, store_dir, isa=isa)
    if isa == AVX2:
        _assert_avx2(cm, kind)
    gate = cm.artifact.meta["sliding"]["push_gate"]
    assert gate["violations"] == [] and gate["ticks"] >= 300
    xs = np.random.default_rng(7).normal(size=(300, 100)).astype(np.float32)
    got = push_all(cm.sliding(), xs, (1,))
    want = window_answers(cm, xs)
    f = compare(want, got)
    assert gate_violations(GATED_AT[kind], f) == [], f
    assert f.rel_err > 0  # reduced: not predict_into bit for bit


@pytest.mark.parametrize("isa", ["native", AVX2])
def test_fast_gates_keep_an_fp32_push_within_1e_5_over_10000_ticks(isa, zoo_model, store_dir):
    """push_gates='fast' on the zoo LSTM (window 16): 10,000 ticks within 1e-5 of the answers'
    scale of predict_into on each window (and not bit-equal: the fast gates are in use), the
    compile's gate recorded; predict_into is the fp32 variant's bit for bit. At
    isa=x86-64-v3: the AVX2 gates (vrcpps + Newton, exponent-bit 2^n)."""
    _need("fast", isa)
    opts = {"push_gates": "fast", **({"isa": isa} if isa != "native" else {})}
    cm = hwb.compile(zoo_model("lstm"), "cpu.native", store=store_dir, fidelity=False, options=opts)
    sl = cm.artifact.meta["sliding"]
    assert (sl["push_weights"], sl["push_gates"], sl["push_gate"]["violations"]) == ("fp32", "fast", [])
    assert sl["push_kernels"]["fast"] == ("avx2" if isa == AVX2 else push_weights_kernel("fast"))
    xs = np.random.default_rng(12).normal(size=(10_000, 8)).astype(np.float32)
    got = push_all(cm.sliding(), xs, (1,))
    want = window_answers(cm, xs)
    err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
    assert 0 < err <= 1e-5, err
    exact = hwb.compile(zoo_model("lstm"), "cpu.native", store=store_dir, fidelity=False,
                        options={k: v for k, v in opts.items() if k == "isa"})
    win = np.random.default_rng(13).normal(size=(3, 16, 8)).astype(np.float32)
    assert cm.predict(win).tobytes() == exact.predict(win).tobytes()


def push_weights_kernel(kind: str) -> str | None:
    """The form of ``kind`` an isa='native' build picks on this CPU."""
    from hwb_plugins.cpu_native import build, push_weights

    return push_weights.kernel(kind, build.required_flags(build.compiler_path(), "native"))


def test_push_weights_refusals_say_what_to_do(store_dir, stack_model):
    """A value it does not know, a precision without an incremental push, a -march without the
    kernel's feature, a model whose push is not incremental: UnsupportedError before any work
    it cannot finish, each naming the way out."""
    with pytest.raises(UnsupportedError, match=r"push_weights='fp16': expected one of fp32, bf16, f16, int8"):
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
        with pytest.raises(UnsupportedError, match=r"avx512f, avx512_bf16, which -march=x86-64-v3.*'f16' / 'int8'"):
            hwb.compile(stack_model, "cpu.native", store=store_dir, fidelity=False,
                        options={"push_weights": "bf16", "isa": "x86-64-v3"})
    if not _lacks("int8"):
        with pytest.raises(HwbError, match=r"incremental form.*recompute form.*drop push_weights"):
            _compile("zoo:mlp", "int8", store_dir)


def test_a_cpu_without_the_feature_is_told_which_one(stack_model, tmp_path, monkeypatch):
    """The feature check reads this CPU's flags (build.CPUINFO): pointed at a CPU with AVX-512
    but no BF16, bf16 names avx512_bf16 (and the AVX2 kinds to use instead); at a CPU without
    AVX2 (SSE4 only), f16 and int8 name what their AVX2 forms need, and the fast gates too;
    each before a build."""
    from hwb_plugins.cpu_native import build

    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(build, "CPUINFO", str(cpuinfo))
    for flags, kind, said in (
            ("fpu sse sse2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512dq", "bf16",
             r"avx512_bf16, which this CPU .*lacks: use push_weights='fp32', or 'f16' / 'int8'"),
            ("fpu sse sse2 sse4_1 sse4_2 avx", "f16", r"avx2, fma, f16c, which this CPU .*push_gates='exact'"),
            ("fpu sse sse2 sse4_1 sse4_2 avx f16c", "int8", r"avx2, fma, which this CPU .*push_gates='exact'")):
        cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Old CPU\nflags\t\t: {flags}\n")
        with pytest.raises(UnsupportedError, match=rf"push_weights='{kind}' needs CPU feature\(s\) {said}"):
            _compile(stack_model, kind, tmp_path / "store")  # an empty store: nothing cached to load


def test_a_weight_beyond_half_range_is_refused_by_f16_naming_it(tmp_path):
    """One input weight of 1e5 (half's largest is 65504): push_weights='f16' refuses the model
    naming the weight's place and value and what to use; bf16, fp32's range, keeps it."""
    _need("f16")
    km = recurrent_model(8, 3, 5, [("lstm", 6)], False, 0)
    k, r, b = km.get_layer("rec0").get_weights()
    k[2, 7] = 1e5
    km.get_layer("rec0").set_weights([k, r, b])
    with pytest.raises(UnsupportedError, match=r"push_weights='f16': weight \[2, 7\] = 100000 of the kernel of "
                                               r"recurrent layer 1.*beyond half's range.*push_weights='fp32' or 'bf16'"):
        _compile(km, "f16", tmp_path / "store")


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
    """Through `hwb compile -O push_weights=...`: the summary names the push's weights and gates
    and the forms the -march built (int8 and the fast gates in AVX2 at isa=x86-64-v3), its
    gate's figures and that it is not bit-equal; a -march without bf16's feature is a clear
    error (exit status 1 or 2, the feature named), not a traceback."""
    from hwbackends.cli import main

    _need("int8", AVX2)
    rc = main(["compile", "zoo:lstm", "-t", "cpu.native", "-O", "push_weights=int8", "-O", f"isa={AVX2}",
               "--cache-dir", str(store_dir)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "push     int8 input weights, fast LSTM gates (int8 avx2, fast avx2): within the int8 tolerance" in out
    assert "not bit-equal to predict_into" in out
    rc = main(["compile", "zoo:lstm", "-t", "cpu.native", "-O", "push_weights=bf16", "-O", f"isa={AVX2}",
               "--cache-dir", str(store_dir)])
    cap = capsys.readouterr()
    assert rc != 0 and "Traceback" not in cap.err + cap.out
    assert "avx512_bf16" in cap.err + cap.out and "isa='native'" in cap.err + cap.out


@pytest.mark.parametrize("kind", KINDS)
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
    assert push_precision(cm) == GATED_AT[kind]
    # The same push judged at the fp32 bound (what the kit did before) is refused: the
    # tolerance above is what let it pass.
    cm.artifact.meta["sliding"]["push_gate"]["tolerance"] = "fp32 sliding bound 1e-05"
    with pytest.raises(ConformanceError, match="differs from predict_into"):
        check_sliding(ctx, v)
