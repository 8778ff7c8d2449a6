"""fpga.hls4ml: real hls4ml 1.3.0 + g++ C-simulation end to end; bitstream store; reports.

The slow tests build four designs in all (mlp auto, mlp ap_fixed<16,6>, lstm auto, one
search inside each auto), shared through the session store. Everything that needs Vitis HLS
or an FPGA board skips with the reason.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import CacheError, UnsupportedError
from hwbackends.registry import get_registry
from hwbackends.specs import Mode
from hwbackends.target import CompileOptions

TARGET = "fpga.hls4ml"
DATA = Path(__file__).parent / "data"


def _target():
    return get_registry().target(TARGET)


# -- registration, options, precisions (fast) ------------------------------------------------
def test_registered_and_emulated_with_reasons(hwb_cli):
    t = _target()
    av = t.probe()
    assert av.mode is Mode.EMULATED, av
    assert "C-simulation" in av.reason
    if shutil.which("vitis_hls") is None:
        assert "vitis_hls not on PATH" in av.reason and av.details["synthesis"] is False
    rc, out, _ = hwb_cli("targets")  # in this process: only the listing is checked
    assert rc == 0 and TARGET in out


def test_missing_compiler_makes_the_target_unavailable(monkeypatch, zoo_model):
    from hwbackends.errors import UnavailableError

    monkeypatch.setenv("HWB_CXX", "/nonexistent/g++")
    av = _target().probe()
    assert av.mode is Mode.UNAVAILABLE and "g++ not on PATH" in av.reason
    with pytest.raises(UnavailableError, match="g\\+\\+"):
        hwb.compile(zoo_model("mlp"), TARGET)


def test_precisions_accept_explicit_fixed_point_only(zoo_model):
    t = _target()
    assert t.precisions[0] == "auto"
    for ok in ("auto", "ap_fixed<16,6>", "ap_fixed<18,8>", "fixed<12,4>", "ap_fixed<16,6,AP_RND,AP_SAT>"):
        assert t.accepts(ok), ok
    for bad in ("fp32", "int8", "ap_fixed<16>", "ap_fixed<4,9>", "ap_fixed<100,6>", ""):
        assert not t.accepts(bad), bad
    # Listed = what a sweep builds; the family is accepted, never listed (a tuple whose `in`
    # disagreed with its iteration would make bench/strategies refuse ap_fixed).
    assert t.precisions == ("auto",) and "ap_fixed" in t.precision_rule
    with pytest.raises(UnsupportedError, match="ap_fixed<W,I>.*got 'fp16'"):
        hwb.compile(zoo_model("mlp"), TARGET, "fp16")


def test_bad_options_are_refused_with_the_choices(zoo_model):
    from hwb_plugins.fpga_hls4ml.convert import HlsOptions
    from hwb_plugins.fpga_hls4ml.precision import FidelityTarget

    with pytest.raises(UnsupportedError, match="io_parallel"):
        HlsOptions.from_extra({"io_type": "io_serial"})
    with pytest.raises(UnsupportedError, match="Vitis"):
        HlsOptions.from_extra({"backend": "Quartus"})
    with pytest.raises(UnsupportedError, match="reuse_factor"):
        HlsOptions.from_extra({"reuse_factor": 0})
    with pytest.raises(UnsupportedError, match="corr_min"):
        FidelityTarget.from_option({"corr": 0.9})
    with pytest.raises(UnsupportedError, match="no option"):
        hwb.compile(zoo_model("mlp"), TARGET, options={"reuse": 2})


def test_unsupported_layer_names_the_layer_and_hls4mls_list(tmp_path):
    import keras

    from hwbackends.models import load_model

    km = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="d"),
                           keras.layers.UnitNormalization(name="unit_norm")])
    m = load_model(km, name="odd")
    with pytest.raises(UnsupportedError) as ei:
        _target().compile(m, CompileOptions("auto", calibration=m.representative(8)), tmp_path)
    msg = str(ei.value)
    assert "'unit_norm' (UnitNormalization)" in msg
    assert "Dense" in msg and "LSTM" in msg  # hls4ml's supported list is quoted


# -- automatic precision: pure functions (fast) ---------------------------------------------
def test_integer_bits_and_search_logic():
    from hwb_plugins.fpga_hls4ml import precision as P
    from hwbackends.fidelity import Fidelity

    assert P.int_bits(0.9) == 1 and P.int_bits(1.0) == 2 and P.int_bits(3.01) == 3
    assert P.int_bits(3.01, signed=False) == 2 and P.int_bits(3.01, headroom=1) == 4
    assert P.int_bits(0.0) == 1
    # Monotone oracles whose error falls by 2^-(slope·f): the search must find the smallest
    # passing f (rel_err ≤ 0.01 × 0.5, the search margin), probing each f once and few in all.
    for slope, want in ((1.0, 13), (0.7, 19), (1.4, 10)):
        for start in (4, 11, 13, 16, 22):
            calls = []

            def evaluate(f, slope=slope, calls=calls):
                calls.append(f)
                err = 2.0 ** (-f * slope) * 40
                return Fidelity(100, err, err / 2, err, 1 - err / 100, 1.0, None), 0.0

            best, trials = P.search(evaluate, P.FidelityTarget(), start)
            assert best == want, (slope, start, calls)
            assert len(calls) == len(set(calls)) <= 5, (slope, start, calls)
            assert [p.frac_bits for p in trials] == sorted(calls)
    target = P.FidelityTarget()
    best, trials = P.search(lambda f: (Fidelity(1, 1, 1, 1, 0, 0, None), 0.0), target, 10)
    assert best is None and trials

    # The weights' phase: f-4 then f-2 without a guess; the guess, then one bit more, with one;
    # no build at all when the guess is f itself.
    def weights(passing_from):
        calls = []

        def evaluate(fw):
            calls.append(fw)
            err = 0.001 if fw >= passing_from else 0.5
            return Fidelity(100, err, err / 2, err, 1 - err / 100, 1.0, None), 0.0
        return evaluate, calls
    for first, passing_from, want, tried in ((None, 0, 10, [10]), (None, 12, 12, [10, 12]),
                                             (None, 13, 14, [10, 12]),
                                             (11, 12, 12, [11, 12]), (11, 11, 11, [11]),
                                             (14, 0, 14, []), (13, 20, 14, [13])):
        evaluate, calls = weights(passing_from)
        got, wtrials = P.narrow_weights(evaluate, target, 14, first=first)
        assert (got, calls) == (want, tried), (first, passing_from, got, calls)
        assert [t.frac_bits for t in wtrials] == tried


def test_ranges_come_from_the_traced_c_sim_where_the_graph_is_not_the_chain(tmp_path):
    """float_trace answers only for a graph that is the layer IR's chain one for one; here
    hls4ml turns Flatten into a Reshape the IR does not have, so the search would trace the
    C-simulation instead (hls4ml conversion only, no build)."""
    import keras

    from hwb_plugins.fpga_hls4ml import convert, emulate
    from hwbackends.models import load_model

    keras.utils.set_random_seed(1)
    m = convert.for_hls4ml(load_model(keras.Sequential(
        [keras.Input((4, 2)), keras.layers.Flatten(name="flat"), keras.layers.Dense(3, name="d")]),
        name="flat"))
    opts = convert.HlsOptions.from_extra({})
    x = m.representative(16)
    hm = convert.convert(m, convert.hls_config(m, opts, "fixed<16,6>"), opts, tmp_path / "p")
    assert [layer.class_name for layer in hm.get_layers()][1:] != ["Dense"]
    assert emulate.float_trace(emulate.network(m), hm, x) is None
    plain = convert.for_hls4ml(load_model(keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(3, activation="relu", name="d")]), name="plain"))
    hm = convert.convert(plain, convert.hls_config(plain, opts, "fixed<16,6>"), opts, tmp_path / "q")
    got = emulate.float_trace(emulate.network(plain), hm, plain.representative(16))
    # hls4ml sees generated names; they map back to the user's
    assert got is not None and sorted(convert.renaming(plain).user_keys(got)) == ["d", "d_relu"]


def test_the_first_guess_is_the_fewest_bits_the_rounded_model_meets():
    from hwb_plugins._shared import fixed_point as FP
    from hwbackends.layer_ir import Act, Dense, Network

    rng = np.random.default_rng(0)
    net = Network("t", (8,), [Dense("d", w=rng.normal(0, 0.4, (8, 4)), b=rng.normal(0, 0.1, 4)),
                              Act("a", kind="tanh")])
    x = rng.normal(0, 1, (256, 8))
    ref = np.tanh(x @ net.layers[0].w + net.layers[0].b).astype(np.float32)
    target = FP.FidelityTarget()
    f, fw = FP.predict_bits(net, x, ref, target)
    tol = target.tolerance(FP.SEARCH_MARGIN)

    def ok(f, fw):
        y = FP.rounded_forward(net, x, f, fw).astype(np.float32)
        return not tol.violations(hwb.fidelity.compare(ref, y))
    assert ok(f, f) and not ok(f - 1, f - 1)  # the fewest data bits
    assert fw <= f and ok(f, fw) and (fw == max(FP.F_MIN, f - 4) or not ok(f, fw - 1))
    assert np.array_equal(FP.round_to([0.3, -0.3, 0.125, -0.125], 2), [0.25, -0.25, 0.25, 0.0])


# -- end to end: real hls4ml + g++ ------------------------------------------------------------
@pytest.mark.slow
def test_mlp_auto_meets_the_target_where_hls4ml_default_fails(compiled):
    from hwb_plugins.fpga_hls4ml.precision import FidelityTarget

    tol = FidelityTarget().tolerance()
    default = compiled("mlp", TARGET, "ap_fixed<16,6>", gate=False)  # it fails its gate: the point
    auto = compiled("mlp", TARGET, "auto")
    assert default.mode is Mode.EMULATED and auto.mode is Mode.EMULATED
    # hls4ml's default: Dense results inferred as fixed<38,18> feed the softmax, whose table
    # index is the top bits of that wide type → outputs collapse towards 1/3.
    assert tol.violations(default.fidelity), default.fidelity
    assert not tol.violations(auto.fidelity), auto.fidelity  # on validation data, unseen
    meta = auto.artifact.meta
    assert meta["meets_target"] and meta["builds"] >= 2 and meta["search"]["trials"]
    assert meta["bits"]["total_bits"] < default.artifact.meta["bits"]["total_bits"]
    widths = meta["bits"]["result_widths"]
    assert max(widths.values()) <= 24, widths  # narrow, not a blanket wide type
    json.dumps(auto.describe(), default=str)
    # The softmax's tables are the types the search assigned, as hls4ml built them: hls4ml
    # 1.3 reads them only as `*_t` layer-config keys, and had kept its fixed<18,8> default
    # (an inverse-table index step of 1/16: f=14 was needed instead of 10).
    sm = meta["types"]["probs_softmax"]
    f = meta["search"]["frac_bits"]
    for key in ("exp_table", "inv_table"):
        assert sm[key].startswith(f"ufixed<{f + 1},1"), sm
    assert sm["inv_inp"].startswith("ufixed<") and sm["inv_inp"] == sm["accum"], sm
    # The float model of the design (emulate.py) predicted the answer: two builds, the
    # answer and one bit less, and no weight build (fewer weight bits failed in the model).
    s = meta["search"]
    assert s["predicted"]["frac_bits"] == f == s["start"], s["predicted"]
    assert [t["frac_bits"] for t in s["trials"]] == [f - 1, f], s["trials"]
    # and its layer outputs gave the ranges: no C-simulation build of a traced design
    assert s["ranges_from"] == "float model (layer IR)" and meta["builds"] == 2, s


@pytest.mark.slow
def test_lstm_auto_end_to_end(compiled, zoo_model):
    from hwb_plugins.fpga_hls4ml.precision import FidelityTarget

    cm = compiled("lstm", TARGET, "auto")
    assert not FidelityTarget().tolerance().violations(cm.fidelity), cm.fidelity
    m = zoo_model("lstm")
    x = m.representative(64, seed=5)
    y = cm.predict(x)
    ref = m.reference(x)
    assert np.corrcoef(y.ravel(), ref.ravel())[0, 1] > 0.999
    # the hot path gives the same numbers as the batch path, sample by sample
    out = np.empty(cm.output.batched(1), np.float32)
    for i in (0, 17, 63):
        cm.predict_into(np.ascontiguousarray(x[i:i + 1]), out)
        np.testing.assert_array_equal(out[0], y[i])
    types = cm.artifact.meta["types"]
    assert types["lstm"]["result"] == types["window"]["result"]  # hls4ml's LSTM needs one type
    assert types["lstm"]["table"].split(",")[1] == "2", types["lstm"]  # ours, not fixed<18,8>
    # The float model of hls4ml's LSTM (emulate.py: products, gates, state rounded every
    # step) predicted the answer, data and weights: three builds (f, f-1 failing, fw), and
    # its layer outputs gave the ranges (hls4ml's graph is Input, LSTM, Dense).
    s = cm.artifact.meta["search"]
    f, fw = s["frac_bits"], s["weight_frac_bits"]
    assert (s["predicted"]["frac_bits"], s["predicted"]["weight_frac_bits"]) == (f, fw) and fw < f, s
    assert [t["frac_bits"] for t in s["trials"]] == [f - 1, f], s["trials"]
    assert [t["frac_bits"] for t in s["weight_trials"]] == [fw], s["weight_trials"]
    assert s["ranges_from"] == "float model (layer IR)" and cm.artifact.meta["builds"] == 3, s
    # and it is hls4ml's arithmetic, not an approximation: on the calibration data, the
    # model's error at every trial is the C-simulation's (they agree to ~1e-7 relative)
    from hwb_plugins._shared.fixed_point import rounded_forward
    from hwb_plugins.fpga_hls4ml import emulate
    calib = m.representative(256)
    net, ref_c = emulate.network(m), m.reference(calib)
    for t in s["trials"] + [{**w, "weights": w["frac_bits"]} for w in s["weight_trials"]]:
        fd, fwd = (f, t["weights"]) if "weights" in t else (t["frac_bits"], t["frac_bits"])
        y = rounded_forward(net, calib, fd, fwd, emulate.layer_model).astype(np.float32)
        got = hwb.fidelity.compare(ref_c, y.reshape(ref_c.shape)).rel_err
        assert got == pytest.approx(t["fidelity"]["rel_err"], rel=1e-4), (fd, fwd, got, t)


# A second identical compile is a cached load with identical outputs, a corrupted artifact file
# is detected and rebuilt, and every wrong x/out is refused with InputError while the process
# survives: the conformance kit checks these (tests/test_conformance.py): store_roundtrip on
# the mlp ap_fixed<16,6> build (one g++ build to redo, not a search) and bad_inputs on the mlp
# auto build, the very builds used here. What follows is what the kit cannot know about this
# target.
@pytest.mark.slow
def test_a_fresh_dlopen_of_a_stored_library_is_fast(compiled, zoo_model, tmp_path):
    first = compiled("mlp", TARGET, "auto")
    x = zoo_model("mlp").representative(8, seed=2)
    # A fresh dlopen (new path, so not the handle already open) in well under a second.
    copy = tmp_path / "art"
    shutil.copytree(first.artifact.path, copy)
    art = type(first.artifact)(**{**first.artifact.__dict__, "path": copy})
    t0 = time.perf_counter()
    ex = _target().load(art, CompileOptions("auto"))
    y = np.empty((1, 3), np.float32)
    ex.predict_into(np.ascontiguousarray(x[:1]), y)
    assert time.perf_counter() - t0 < 1.0
    np.testing.assert_array_equal(y[0], first.predict(x[:1])[0])


@pytest.mark.slow
def test_a_library_that_cannot_be_opened_is_refused_by_load(compiled, tmp_path):
    """A truncated C-sim library (its hashes are not checked here: load() alone) makes load()
    raise CacheError naming dlopen, which makes hwb.compile evict the entry and rebuild."""
    first = compiled("mlp", TARGET, "auto")
    copy = tmp_path / "art"
    shutil.copytree(first.artifact.path, copy)
    (copy / "csim" / "libmyproject.so").write_bytes(b"\x7fELF truncated")
    art = type(first.artifact)(**{**first.artifact.__dict__, "path": copy})
    with pytest.raises(CacheError, match="dlopen"):
        _target().load(art, CompileOptions("auto"))


@pytest.mark.slow
def test_synthesis_fields_absent_without_the_tool(compiled):
    syn = compiled("mlp", TARGET, "auto").artifact.meta["synthesis"]
    if shutil.which("vitis_hls"):
        pytest.skip("vitis_hls is on PATH: the absent-tool path does not apply")
    assert syn["available"] is False and "vitis_hls not on PATH" in syn["reason"]
    assert "report" not in syn


def test_synthesis_runs_with_vitis_hls():
    if shutil.which("vitis_hls") is None:
        pytest.skip("vitis_hls not on PATH: C-synthesis needs AMD Vitis HLS installed")
    cm = hwb.compile("zoo:signal", TARGET, "auto", options={"synth": True})
    rep = cm.artifact.meta["synthesis"]["report"]
    assert rep["latency_max_cycles"] >= rep["latency_min_cycles"] > 0 and rep["lut"] > 0


# -- synthesis report parsing (checked-in sample) --------------------------------------------
def test_csynth_report_parsing():
    from hwb_plugins.fpga_hls4ml.synth import parse_csynth_report

    text = (DATA / "vitis_hls_csynth_sample.xml").read_text()
    assert "NOT a measurement" in text
    r = parse_csynth_report(text)
    assert (r.latency_min_cycles, r.latency_max_cycles) == (9, 11)
    assert (r.latency_min_ns, r.latency_max_ns) == (45.0, 55.0)
    assert (r.interval_min, r.interval_max) == (1, 1)
    assert (r.lut, r.ff, r.dsp, r.bram_18k, r.uram) == (49318, 15420, 1062, 4, 0)
    assert r.clock_target_ns == 5.0 and r.clock_estimated_ns == 3.65
    assert r.part == "xcvu13p-flga2577-2-e" and r.available["DSP"] == 12288
    # Vivado HLS spelling (DSP48E), cycles only (ns from the target clock), unbounded latency
    old = text.replace("<DSP>1062</DSP>", "<DSP48E>7</DSP48E>").replace(
        "<Best-caseRealTimeLatency>45.000 ns</Best-caseRealTimeLatency>", "").replace(
        "<Worst-caseLatency>11</Worst-caseLatency>", "<Worst-caseLatency>undef</Worst-caseLatency>")
    r2 = parse_csynth_report(old)
    assert r2.dsp == 7 and r2.latency_min_ns == 45.0 and r2.latency_max_cycles is None
    assert "latency_max_cycles" not in r2.to_dict()  # absent, never invented
    with pytest.raises(ValueError, match="profile"):
        parse_csynth_report("<report/>")


# -- bitstream store ------------------------------------------------------------------------
@pytest.fixture
def bitstore(tmp_path):
    from hwb_plugins.fpga_hls4ml.bitstreams import BitstreamStore

    bit, hwh = tmp_path / "x.bit", tmp_path / "x.hwh"
    bit.write_bytes(b"\x00\x09\x0f\xf0" + bytes(range(256)) * 4)  # store content, not a design
    hwh.write_text("<MODULES/>")
    st = BitstreamStore(tmp_path / "bitstreams")
    st.add("Pynq-Z2", "f" * 32, bit, hwh, part="xc7z020clg400-1",
           hls4ml_config={"Model": {"Precision": "fixed<16,6>"}},
           io={"input_type": "float", "output_type": "float", "n_in": 64, "n_out": 3})
    return st


def test_bitstream_manifest_validates(bitstore):
    e = bitstore.find("Pynq-Z2", "f" * 32)
    m = e.manifest
    assert e.bit.exists() and e.hwh.exists()
    for k in ("board", "part", "fingerprint", "hls4ml_config", "files", "build_date"):
        assert k in m
    assert len(m["files"]["design.bit"]) == 64
    assert bitstore.find("Pynq-Z2", "0" * 32) is None  # nothing stored for that model


def test_bitstream_tamper_and_mismatch_refused(bitstore):
    from hwb_plugins.fpga_hls4ml.bitstreams import BitstreamRefused, validate

    d = bitstore.root / "Pynq-Z2" / ("f" * 32)
    with pytest.raises(BitstreamRefused, match="board"):
        validate(d, board="ZCU102", fingerprint="f" * 32)
    with pytest.raises(BitstreamRefused, match="implements model"):
        validate(d, board="Pynq-Z2", fingerprint="e" * 32)
    bit = d / "design.bit"
    blob = bytearray(bit.read_bytes())
    blob[10] ^= 1
    bit.write_bytes(bytes(blob))
    with pytest.raises(BitstreamRefused, match="sha256"):
        bitstore.find("Pynq-Z2", "f" * 32)
    man = json.loads((d / "manifest.json").read_text())
    del man["part"]
    (d / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(BitstreamRefused, match="lacks part"):
        bitstore.find("Pynq-Z2", "f" * 32)
    with pytest.raises(BitstreamRefused):
        bitstore.find("../etc", "f" * 32)


def test_bitstream_entries_follow_the_store_trust_rules(bitstore, tmp_path):
    """The one store whose loads reconfigure hardware is held to the artifact store's rules:
    a linked file or directory, or one others can write, is refused before it is read (and
    left in place), whatever its sha256 says."""
    from hwb_plugins.fpga_hls4ml.bitstreams import BitstreamRefused

    d = bitstore.root / "Pynq-Z2" / ("f" * 32)
    assert bitstore.find("Pynq-Z2", "f" * 32).path == d.resolve()
    hwh = d / "design.hwh"
    os.chmod(hwh, 0o666)
    with pytest.raises(BitstreamRefused, match=r"design.hwh is writable by others.*chmod 600"):
        bitstore.find("Pynq-Z2", "f" * 32)
    os.chmod(hwh, 0o644)
    os.chmod(d, 0o777)
    with pytest.raises(BitstreamRefused, match="bitstream entry .* is writable by others"):
        bitstore.find("Pynq-Z2", "f" * 32)
    os.chmod(d, 0o700)
    os.chmod(bitstore.root, 0o770)
    with pytest.raises(BitstreamRefused, match="bitstream store .* is writable by its group"):
        bitstore.find("Pynq-Z2", "f" * 32)
    os.chmod(bitstore.root, 0o700)
    real = tmp_path / "elsewhere.hwh"
    hwh.rename(real)
    hwh.symlink_to(real)  # same bytes, same sha256: still refused
    with pytest.raises(BitstreamRefused, match="design.hwh is a symlink"):
        bitstore.find("Pynq-Z2", "f" * 32)
    assert hwh.is_symlink()  # left in place
    hwh.unlink()
    real.rename(hwh)
    linked = bitstore.root / "Pynq-Z2" / ("e" * 32)
    linked.symlink_to(d)
    with pytest.raises(BitstreamRefused, match="is a symlink"):
        bitstore.find("Pynq-Z2", "e" * 32)
    assert bitstore.find("Pynq-Z2", "f" * 32) is not None  # the real one still loads


def test_an_unsigned_bitstream_is_refused_until_adopted(bitstore, tmp_path, hwb_cli, monkeypatch):
    """An entry hwb did not write (checked in, copied from elsewhere: its manifest has no
    signature, or one made with another key) is refused with the command that adopts it;
    `hwb fpga-adopt` checks it as a load does and signs it; an edit after that is refused."""
    from hwb_plugins.fpga_hls4ml.bitstreams import BitstreamRefused

    src = bitstore.root / "Pynq-Z2" / ("f" * 32)
    copied = tmp_path / "shipped"
    shutil.copytree(bitstore.root, copied)
    d = copied / "Pynq-Z2" / ("f" * 32)
    man = json.loads((d / "manifest.json").read_text())
    del man["hmac"]  # as a manifest written elsewhere comes
    (d / "manifest.json").write_text(json.dumps(man))
    monkeypatch.setenv("HWB_BITSTREAMS", str(copied))
    from hwb_plugins.fpga_hls4ml.bitstreams import BitstreamStore

    store = BitstreamStore()
    with pytest.raises(BitstreamRefused, match=rf"not signed by you.*HWB_BITSTREAMS={copied} "
                                               rf"hwb fpga-adopt Pynq-Z2 {'f' * 32}"):
        store.find("Pynq-Z2", "f" * 32)
    (d / "design.bit").write_bytes(b"not the design")  # adopt checks the sha256 first
    rc, out, err = hwb_cli("fpga-adopt", "Pynq-Z2", "f" * 32)
    assert rc == 1 and "sha256" in err and "Traceback" not in err, err
    shutil.copy(src / "design.bit", d / "design.bit")
    rc, out, err = hwb_cli("fpga-adopt", "Pynq-Z2", "f" * 32)
    assert rc == 0 and "adopted" in out, err
    assert store.find("Pynq-Z2", "f" * 32).manifest["part"] == "xc7z020clg400-1"
    man = json.loads((d / "manifest.json").read_text())
    man["io"]["n_in"] = 65  # an edit of the signed manifest
    (d / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(BitstreamRefused, match="edited since it was signed"):
        store.find("Pynq-Z2", "f" * 32)
    rc, out, err = hwb_cli("fpga-adopt", "Pynq-Z2", "0" * 32)
    assert rc == 1 and "no bitstream entry" in err and "Traceback" not in err, err


def test_pynq_overlay_on_a_board():
    from hwb_plugins._util import importable

    if not importable("pynq"):
        pytest.skip("pynq not importable: no PYNQ board (mode hardware needs a board image)")
    from hwb_plugins.fpga_hls4ml.bitstreams import BitstreamStore, detect_board

    board = detect_board()
    if board is None:
        pytest.skip("pynq importable but BOARD is not set: not running on a PYNQ image")
    manifests = sorted((BitstreamStore().root / board).glob("*/manifest.json"))
    if not manifests:
        pytest.skip(f"no bitstream for board {board} in bitstreams/")
    from hwb_plugins.fpga_hls4ml.pynq_exec import PynqExecutor
    from hwbackends.specs import TensorSpec

    entry = BitstreamStore().find(board, manifests[0].parent.name)
    io = entry.manifest["io"]
    ex = PynqExecutor(entry, 1, TensorSpec("input", (io["n_in"],)), TensorSpec("output", (io["n_out"],)))
    out = np.full((1, io["n_out"]), np.nan, np.float32)
    ex.predict_into(np.zeros((1, io["n_in"]), np.float32), out)
    assert np.isfinite(out).all()
    ex.close()


@pytest.mark.slow
def test_layer_trace_shows_where_precision_is_lost(compiled, zoo_model):
    from hwb_plugins.fpga_hls4ml.trace import trace_layers

    m = zoo_model("mlp")
    rows = {r.layer: r for r in trace_layers(m, compiled("mlp", TARGET, "ap_fixed<16,6>", gate=False),
                                             m.representative(64, seed=4))}
    assert {"dense_1", "dense_1_relu", "probs", "probs_softmax"} <= set(rows)
    # Every Dense/ReLU layer is fine at fixed<16,6>; the softmax is where the signal dies.
    assert all(rows[k].corr > 0.999 for k in ("dense_1", "dense_2_relu", "probs"))
    assert rows["probs_softmax"].rel_err > 0.3
    assert rows["probs"].type.startswith("fixed<38,18")  # the wide inferred type behind it


def _compilers_under(store: Path, marker: str = ".hwb-build") -> set[int]:
    """PIDs of live processes whose working directory is a build directory (``marker``) in
    *this* store (our g++ runs in the design's directory inside the staged artifact,
    ``<store>/tmp/…/.hwb-build/…``); builds of other tests or users are not ours to judge."""
    root = str(store.resolve()) + os.sep
    pids = set()
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cwd = os.readlink(d / "cwd")
            if cwd.startswith(root) and marker in cwd:
                pids.add(int(d.name))
        except OSError:
            continue
    return pids


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed child whose parent died waits for PID 1 to reap it;
    in a container PID 1 may never do that)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _import_hls4ml() -> None:
    """Warm-up job: what an hls4ml compile job imports before it starts g++."""
    import hls4ml  # noqa: F401
    import keras  # noqa: F401

    import hwbackends.models  # noqa: F401


@pytest.mark.slow
def test_timeout_stops_the_build_and_every_g_plus_plus(zoo_model, tmp_path, private_worker):
    """The timeout kills this test's own compile worker (the session's keeps its imports),
    warmed first as the shared one would be, so g++ starts well inside the 8 s."""
    import threading

    from hwbackends.errors import CompileError

    if not Path("/proc/self/cwd").exists():
        pytest.skip("needs /proc to see the compiler processes")
    private_worker.run(_import_hls4ml, timeout=600, what="warm-up")
    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(_compilers_under(tmp_path))
            time.sleep(0.05)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    try:
        with pytest.raises(CompileError, match="timed out"):
            hwb.compile(zoo_model("signal"), TARGET, "auto", store=tmp_path, timeout=8,
                        options={"reuse_factor": 2}, fidelity=False)
    finally:
        stop.set()
        w.join()
    time.sleep(0.5)
    alive = {p for p in seen if _running(p)}
    assert not alive, f"g++ processes survived the timeout: {alive}"
    assert not list(tmp_path.glob("tmp/*/.hwb-build")), "staged build left behind"
    if not seen:
        pytest.skip("the compile timed out before g++ started (slow worker start); nothing to reap")
