"""The store's build cache (hwbackends.store.build_cache): a product built before from the same
sources is reused, and a cached product that is not what its signed record says is never
handed out."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.registry import get_registry
from hwbackends.store import trust
from hwbackends.store.artifacts import file_sha256
from hwbackends.store.build_cache import BuildCache, digest


def test_digest_separates_its_parts() -> None:
    assert digest("ab", "c") != digest("a", "bc") != digest("abc")
    assert digest(b"x", "y") == digest("x", b"y")


def test_a_put_product_comes_back_and_a_tampered_one_never_does(tmp_path) -> None:
    cache = BuildCache(tmp_path / "build-cache")
    src = tmp_path / "lib.so"
    src.write_bytes(b"\x7fELF" + bytes(range(256)) * 40)
    name = digest("sources", "flags")
    assert not cache.fetch(name, tmp_path / "out.so")
    cache.put(name, src)
    assert cache.fetch(name, tmp_path / "out.so")
    assert (tmp_path / "out.so").read_bytes() == src.read_bytes()
    entry = tmp_path / "build-cache" / name[:2] / name
    assert (entry.stat().st_mode & 0o777) == 0o700 and ((entry / "blob").stat().st_mode & 0o777) == 0o600
    # a flipped byte in the blob: refused and removed, the caller rebuilds
    blob = bytearray((entry / "blob").read_bytes())
    blob[100] ^= 0xFF
    (entry / "blob").write_bytes(bytes(blob))
    assert not cache.fetch(name, tmp_path / "other.so")
    assert not entry.exists() and not (tmp_path / "other.so").exists()
    # a record re-signed with another key (or edited to match a swapped blob): refused too
    cache.put(name, src)
    rec = json.loads((entry / "record.json").read_text())
    (entry / "blob").write_bytes(b"evil")
    rec["files"]["blob"] = file_sha256(entry / "blob")
    rec["hmac"] = trust.sign(b"k" * 32, rec)
    (entry / "record.json").write_text(json.dumps(rec))
    assert not cache.fetch(name, tmp_path / "other.so") and not entry.exists()
    with pytest.raises(ValueError, match="not a build-cache digest"):
        cache.fetch("../" + "a" * 61, tmp_path / "x")
    # one its user found unusable (a valid file the tool refuses): discarded, then a miss
    cache.put(name, src)
    cache.discard(name)
    cache.discard(name)  # already gone: nothing to do
    assert not entry.exists() and not cache.fetch(name, tmp_path / "again.so")


def _hls4ml_or_skip() -> None:
    if not get_registry().target("fpga.hls4ml").probe().usable:
        pytest.skip("fpga.hls4ml unavailable here")


@pytest.mark.slow
def test_a_retrained_model_reuses_the_csim_library_and_stays_bit_exact(store_dir, zoo_model) -> None:
    """hls4ml reads weights at run time, so the zoo signal model with new weights at the same
    precision is a cache hit for its C-simulation library (no g++), and its answers are
    bit-exact with cpu.native's ``fixed`` arithmetic for the *new* weights: the reused library
    really runs the new model."""
    import keras

    _hls4ml_or_skip()
    m = zoo_model("signal")
    first = hwb.compile(m, "fpga.hls4ml", "ap_fixed<16,6>", store=store_dir, fidelity=False)
    km = keras.models.clone_model(m.obj)
    km.set_weights([w * 0.75 + 0.01 * np.sign(w) for w in m.obj.get_weights()])
    m2 = hwb.load_model(km, name="signal-retrained", validation_data=m.validation_data)
    again = hwb.compile(m2, "fpga.hls4ml", "ap_fixed<16,6>", store=store_dir, fidelity=False)
    assert again.artifact.key != first.artifact.key and not again.artifact.cached
    assert again.artifact.meta["builds_cached"] == again.artifact.meta["builds"] == 1
    native = hwb.compile(m2, "cpu.native", "ap_fixed<16,6>", store=store_dir, fidelity=False)
    x = np.ascontiguousarray(m.representative(2000), np.float32)
    y_csim, y_native, y_first = (np.concatenate([cm.predict(x[i:i + 1]) for i in range(len(x))])
                                 for cm in (again, native, first))
    np.testing.assert_array_equal(y_csim, y_native)
    assert not np.array_equal(y_csim, y_first)  # not the old model's answers


@pytest.mark.slow
def test_a_rebuilt_rtl_design_takes_its_verilator_model_from_the_cache(tmp_path) -> None:
    """fpga.da4ml: the same design built again (here: a rebuild after the artifact was
    evicted) verilates nothing and still passes its own bit-exact check against da4ml; another
    design builds only its own model (Verilator's runtime and a precompiled verilated.h are
    the cached ones), and a cached header g++ refuses costs a rebuild, never the compile."""
    if not get_registry().target("fpga.da4ml").probe().usable:
        pytest.skip("fpga.da4ml unavailable here")
    import keras

    # large enough for Verilator to split the model into files with precompiled headers
    keras.utils.set_random_seed(6)
    km = keras.Sequential([keras.Input((24,)), keras.layers.Dense(24, activation="relu"),
                           keras.layers.Dense(1)])
    m = hwb.load_model(km, name="mid")
    opts = {"synth": False}
    a = hwb.compile(m, "fpga.da4ml", "fixed<12,4>", store=tmp_path, options=opts, fidelity=False)
    assert a.artifact.meta["verilator_cached"] is False
    assert a.artifact.meta["verilator_reused"] == []  # the store's first design builds all
    shutil.rmtree(a.artifact.path)
    b = hwb.compile(m, "fpga.da4ml", "fixed<12,4>", store=tmp_path, options=opts, fidelity=False)
    assert b.artifact.meta["verilator_cached"] is True and not b.artifact.cached
    assert b.artifact.meta["bit_exact"]["bit_exact"] and b.artifact.meta["seconds"]["verilator"] < 5
    x = np.random.default_rng(1).standard_normal((64, 24)).astype(np.float32)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    # Other designs verilate and build only their own model.
    built = {}
    for prec in ("fixed<10,4>", "fixed<11,4>"):
        if prec == "fixed<11,4>":  # a cached header g++ will not take (a compiler changed in place)
            cache = BuildCache(tmp_path / "build-cache")
            for rec in list((tmp_path / "build-cache").glob("*/*/record.json")):
                if json.loads(rec.read_text())["from"].endswith(".gch"):
                    (tmp_path / "garbage.gch").write_bytes(b"not a precompiled header")
                    cache.discard(rec.parent.name)
                    cache.put(rec.parent.name, tmp_path / "garbage.gch")
        cm = hwb.compile(m, "fpga.da4ml", prec, store=tmp_path, options=opts, fidelity=False)
        meta = cm.artifact.meta
        assert meta["verilator_cached"] is False and meta["bit_exact"]["bit_exact"], meta["bit_exact"]
        built[prec] = meta["verilator_reused"]
    assert built == {"fixed<10,4>": ["verilated.h.gch", "libverilated.a"],
                     # refused: the bad entry removed, the header built again and cached
                     "fixed<11,4>": ["libverilated.a"]}, built
    blobs = [r.parent / "blob" for r in (tmp_path / "build-cache").glob("*/*/record.json")
             if json.loads(r.read_text())["from"].endswith(".gch")]
    assert len(blobs) == 1 and blobs[0].read_bytes() != b"not a precompiled header"
