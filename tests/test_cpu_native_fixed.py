"""cpu.native precision ``fixed`` / ``ap_fixed<W,I[,Q,O]>``: bit-exact with the real
fpga.hls4ml C-simulation (hls4ml 1.3 + g++) at the same precision string, compiled through the
public API. One compile per (target, precision), shared by the module."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import UnsupportedError
from hwbackends.registry import get_registry

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("g++") is None,
                                reason="needs a C compiler (cc) and g++ (hls4ml's C-simulation)")
#: Samples compared per precision: the C-simulation runs ~20-30 µs a sample, so 10,000 is < 1 s.
N = 10_000


def _samples(model, n: int = N) -> np.ndarray:
    """The model's own representative inputs, and the same scaled up (values past the
    types' integer range: wrap-around / saturation) and down (below one step: rounding)."""
    x = np.asarray(model.representative(n), np.float32)  # the bundled data may hold fewer
    rng = np.random.default_rng(3)
    blocks, k = [], 0
    while sum(len(b) for b in blocks) < n:
        scale = (1.0, 6.0, 0.02)[k % 3] * (1 + k // 3)
        blocks += [x * scale, rng.normal(0, 3, x.shape)]
        k += 1
    out = np.ascontiguousarray(np.concatenate(blocks).astype(np.float32)[:n])
    assert len(out) == n
    return out


def _run(cm, x: np.ndarray) -> np.ndarray:
    """Batch-1 calls, as both artifacts are compiled (batch 1)."""
    out = np.zeros((len(x), *cm.artifact.outputs[0].shape), np.float32)
    for i in range(len(x)):
        cm.predict_into(x[i:i + 1], out[i:i + 1])
    return out


@pytest.fixture(scope="module")
def pairs(store_dir, zoo_model):
    """``pairs(precision, model[, hls_precision])`` → (cpu.native, fpga.hls4ml) compiled
    models, memoised; fpga.hls4ml gets ``hls_precision`` (default: the same string)."""
    cache: dict = {}

    def get(precision: str, model, hls_precision: str | None = None):
        key = (precision, model.name)
        if key not in cache:
            cache[key] = (hwb.compile(model, "cpu.native", precision, store=store_dir, fidelity=False),
                          hwb.compile(model, "fpga.hls4ml", hls_precision or precision,
                                      store=store_dir, fidelity=False))
        return cache[key]
    return get


def test_accepts_hls4ml_precision_strings() -> None:
    t = get_registry().target("cpu.native")
    assert "fixed" not in t.precisions and "ap_fixed" in t.precision_rule  # accepted, not swept
    for ok in ("fixed", "ap_fixed<16,6>", "fixed<12,4>", "ap_fixed<10,4,AP_RND,AP_SAT>", "ap_ufixed<8,2>"):
        assert t.accepts(ok), ok
    for bad in ("ap_fixed<16>", "ap_fixed<4,9>", "ap_fixed<100,6>", "auto", "fp16"):
        assert not t.accepts(bad), bad


def test_emulated_casts_match_python(tmp_path) -> None:
    """The C casts (fx_cast, fx_from_float) against the exact rational reference, every
    quantisation × overflow mode, on values around the ties and the range ends."""
    import subprocess

    from hwb_plugins._shared.fixed_point import OVF_MODES, QUANT_MODES, FxType
    from hwb_plugins.cpu_native.fixed import FX_DIR, FX_INCLUDE

    raws = [v for base in (0, 5, 8, 11, 16, 40, 127, 128, 300) for v in (base, -base, base + 1, -base - 1)]
    floats = [0.0, 0.5, -0.5, 0.75, -0.75, 1.25, -1.25, 3.999, -4.0, 7.96875, -8.03125, 100.0, -1e30, 1e30]
    types = [FxType(6, 3, s, q, o) for s in (True, False) for q in QUANT_MODES for o in OVF_MODES]
    casts, conv, want = [], [], []  # rows of runtime arguments: one small C loop, fast to build
    for t in types:
        mode = f"{QUANT_MODES.index(t.quant)}, {t.width}, {int(t.signed)}, {OVF_MODES.index(t.ovf)}"
        for v in raws:
            for shift in (-2, 0, 3):
                casts.append(f"{{{v}, {shift}, {mode}}}")
                want.append(t.cast_raw(v, t.frac + shift))
    for t in types:
        mode = f"{QUANT_MODES.index(t.quant)}, {t.width}, {int(t.signed)}, {OVF_MODES.index(t.ovf)}"
        for f in floats:
            conv.append(f"{{{f!r}f, {float(2 ** t.frac).hex()}, {mode}}}")
            want.append(t.from_double(float(np.float32(f))))
    src = tmp_path / "casts.c"
    src.write_text(
        "#include <stdint.h>\n#include <stdio.h>\n" + FX_INCLUDE + "\n"
        "struct c { int64_t v; int s, q, w, sgn, o; } C[] = {" + ",".join(casts) + "};\n"
        "struct f { float x; double sc; int q, w, sgn, o; } F[] = {" + ",".join(conv) + "};\n"
        "int main(void) {\n"
        "for (unsigned i = 0; i < sizeof C / sizeof *C; i++) printf(\"%lld\\n\", (long long)"
        "fx_cast(C[i].v, C[i].s, C[i].q, C[i].w, C[i].sgn, C[i].o));\n"
        "for (unsigned i = 0; i < sizeof F / sizeof *F; i++) printf(\"%lld\\n\", (long long)"
        "fx_from_float(F[i].x, F[i].sc, F[i].q, F[i].w, F[i].sgn, F[i].o));\n"
        "return 0; }\n")
    subprocess.run(["cc", "-O1", f"-I{FX_DIR}", str(src), "-o", str(tmp_path / "casts")], check=True)
    got = [int(v) for v in subprocess.run([str(tmp_path / "casts")], check=True, capture_output=True,
                                          text=True).stdout.split()]
    assert got == want


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["ap_fixed<16,6>", "ap_fixed<10,4,AP_RND,AP_SAT>",
                                       "ap_fixed<8,3,AP_RND_CONV,AP_WRAP>"])
def test_signal_bit_exact_with_hls4ml_csim(pairs, zoo_model, precision) -> None:
    m = zoo_model("signal")
    native, csim = pairs(precision, m)
    assert native.artifact.meta["hls4ml_precision"] == precision.removeprefix("ap_")
    x = _samples(m)
    yn, yc = _run(native, x), _run(csim, x)
    assert len(np.unique(yc)) > 50  # a real signal, not a saturated constant
    diff = np.flatnonzero(yn.ravel() != yc.ravel())
    assert diff.size == 0, (f"{diff.size}/{yn.size} outputs differ, first at sample {diff[0]}: "
                            f"native {yn.ravel()[diff[0]]!r} vs C-sim {yc.ravel()[diff[0]]!r}")
    # the types are hls4ml's own, as fpga.hls4ml records them
    types = csim.artifact.meta["types"]
    for name, t in native.artifact.meta["types"].items():
        if name in types and "weight" in t:
            assert t["weight"].split(",")[:2] == types[name]["weight"].split(",")[:2]


@pytest.mark.slow
def test_softmax_bit_exact_and_fixed_is_hls4ml_default(pairs, zoo_model) -> None:
    """The zoo mlp (Dense relu ×2 → softmax) at ``fixed``, which is hls4ml's default
    ap_fixed<16,6>. hls4ml's softmax_stable indexes its exp table with the top 10 bits of a
    ufixed<37,17> there (steps of 128), so its output is 1/3 for these inputs: bit-exact
    includes that (the varied softmax is in test_softmax_varied_bit_exact)."""
    m = zoo_model("mlp")
    native, csim = pairs("fixed", m, "ap_fixed<16,6>")
    assert native.artifact.meta["hls4ml_precision"] == "fixed<16,6>"
    x = _samples(m, 4000)
    np.testing.assert_array_equal(_run(native, x), _run(csim, x))


@pytest.mark.slow
def test_softmax_varied_bit_exact(pairs) -> None:
    """softmax_stable where its tables resolve the inputs (a ReLU's 14-bit result feeds it):
    exp and inverse tables, RND/SAT accumulator tree, inputs that vary the output."""
    import keras

    from hwbackends.models import load_model

    keras.utils.set_random_seed(12)
    km = keras.Sequential([
        keras.Input((12,), name="x"),
        keras.layers.Dense(10, activation="sigmoid", name="gate"),
        keras.layers.Dense(5, activation="relu", name="logits"),
        keras.layers.Softmax(name="probs"),
    ], name="fixed_softmax")
    m = load_model(km)
    native, csim = pairs("ap_fixed<14,5>", m)
    x = np.random.default_rng(4).normal(0, 3, (4000, 12)).astype(np.float32)
    yn, yc = _run(native, x), _run(csim, x)
    assert len(np.unique(yc)) > 50
    np.testing.assert_array_equal(yn, yc)


@pytest.mark.slow
def test_sigmoid_and_linear_bit_exact(pairs, store_dir) -> None:
    """sigmoid (its table, hls4ml's init_sigmoid_table) as an Activation layer after a
    BatchNormalization folded into its Dense (as fpga.hls4ml folds it), and a linear output
    layer, with round-half-to-zero and saturation."""
    import keras

    from hwbackends.models import load_model

    keras.utils.set_random_seed(11)
    km = keras.Sequential([
        keras.Input((12,), name="x"),
        keras.layers.Dense(10, name="gate"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.Activation("sigmoid", name="sig"),
        keras.layers.Dense(4, name="out"),
    ], name="fixed_sigmoid")
    rng = np.random.default_rng(1)  # non-trivial statistics, so the fold changes the weights
    km.get_layer("bn").set_weights([rng.uniform(0.5, 1.5, 10), rng.normal(0, 0.3, 10),
                                    rng.normal(0, 0.3, 10), rng.uniform(0.5, 2.0, 10)])
    m = load_model(km)
    native, csim = pairs("ap_fixed<14,5,AP_RND_ZERO,AP_SAT>", m)
    x = np.random.default_rng(2).normal(0, 4, (4000, 12)).astype(np.float32)
    np.testing.assert_array_equal(_run(native, x), _run(csim, x))


@pytest.mark.slow
def test_unsupported_layer_under_fixed_names_it(zoo_model, store_dir) -> None:
    with pytest.raises(UnsupportedError, match=r"layer 'lstm' \(LSTM.*fp32 or int8"):
        hwb.compile(zoo_model("lstm"), "cpu.native", "fixed", store=store_dir, fidelity=False)


def test_emulation_limit_names_the_users_layer(store_dir) -> None:
    """Dense → BN → Dense(sigmoid) at ap_fixed<14,5,AP_RND,AP_SAT>: hls4ml infers a
    fixed<50,23> result for the second Dense, too wide to index the sigmoid table in the
    emulation's 32-bit index (fpga.hls4ml builds it). The refusal names the user's layer
    ('out' and hls4ml's ``_sigmoid``), not hls4ml's generated ``hwb…`` name (the fuzz in
    tests/test_fuzz_fixed.py found ``'hwb2_tanh'``)."""
    import keras

    from hwbackends.models import load_model

    keras.utils.set_random_seed(3)
    km = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="fc"),
                           keras.layers.BatchNormalization(name="bn"),
                           keras.layers.Dense(2, activation="sigmoid", name="out")], name="wide")
    rng = np.random.default_rng(3)
    km.get_layer("bn").set_weights([rng.uniform(0.5, 2, 5), rng.normal(0, 0.5, 5),
                                    rng.normal(0, 0.5, 5), rng.uniform(0.2, 3, 5)])
    with pytest.raises(UnsupportedError) as err:
        hwb.compile(load_model(km), "cpu.native", "ap_fixed<14,5,AP_RND,AP_SAT>",
                    store=store_dir, fidelity=False)
    msg = str(err.value)
    assert "layer 'out_sigmoid' (Activation, sigmoid): a fixed<" in msg and "-entry table" in msg, msg
    assert "hwb" not in msg.replace("hwbackends", ""), msg
