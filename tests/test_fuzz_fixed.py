"""cpu.native precision ``fixed`` bit-exact with fpga.hls4ml's C-simulation on random models:
random Keras (``Sequential`` and functional)
and torch (``nn.Sequential``) models drawn by tests/fuzz_models.py's :func:`specs`,
restricted to the layers both targets claim — Dense/Linear, BatchNormalization (Keras:
folded into a neighbouring Dense, see ``hwbackends/layer_ir/batchnorm.py``; torch: hls4ml's
fold or its own layer), the activations relu/tanh/sigmoid/softmax, over a flat input — each compiled on both targets at a drawn hls4ml precision (default, rounding and
saturation modes, narrow and wide types) through ``hwb.compile``, and the outputs compared
*exactly* on the same inputs (representative, scaled past the types' range and below one
step, batch-1 calls as both are compiled).

A refusal is allowed only where both targets refuse the same BatchNormalization by name (one
that folds into neither neighbour, e.g. two in a row), or where cpu.native alone refuses,
naming the user's layer, a type hls4ml inferred past its 64-bit emulation (:data:`LIMITS`;
the fuzz found them: three linear Dense layers at ap_fixed<18,8> give fixed<78,38>, and
Dense → Dense → tanh feeds the table a fixed<58,28>); any other refusal, build failure or
differing bit fails the test and prints the spec.

hls4ml's C-simulation build takes tens of seconds a model, so the default run (``make
test``) is three fixed models that reach every fold and table (:data:`EXAMPLES_FIXED`);
``HWB_FUZZ_EXAMPLES=N`` (``make fuzz``) adds N/20 drawn models (at least one), fresh each
run, and ``HWB_FUZZ_REPORT=path.json`` writes the counts
and each model's compile seconds there.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fuzz_models import L, Spec, build, load, specs
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import hwbackends as hwb
from hwbackends.errors import UnsupportedError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("g++") is None,
                                reason="needs a C compiler (cc) and g++ (hls4ml's C-simulation)")

EXAMPLES = int(os.environ.get("HWB_FUZZ_EXAMPLES", "0") or 0)
LONG = EXAMPLES > 0
#: The default run is the three :data:`EXAMPLES_FIXED` only: a model costs two hls4ml
#: conversions, hls4ml's g++ build and cpu.native's cc build, 25-85 s on the loaded 2-core
#: machine (informal; the first pays the compile worker's imports).
#: Precisions drawn: cpu.native's ``fixed`` (hls4ml's default, which fpga.hls4ml spells
#: ap_fixed<16,6>), rounding + saturation, narrow wrap-around, wide.
PRECISIONS = ("fixed", "ap_fixed<14,5,AP_RND,AP_SAT>", "ap_fixed<10,4,AP_RND_CONV,AP_WRAP>",
              "ap_fixed<18,8>")
HLS_SPELLING = {"fixed": "ap_fixed<16,6>"}
#: Activations cpu.native ``fixed`` claims (hwb_plugins/cpu_native/fixed.py ACTIVATIONS, softmax).
ACTS = {"relu", "tanh", "sigmoid", "softmax"}
#: cpu.native ``fixed``'s stated limits (its refusals' text, hwb_plugins/cpu_native/fixed.py and
#: hwb_plugins/_shared/fixed_point.py): what its 64-bit integer emulation cannot hold.
LIMITS = {"type over 63 bits": "the emulation holds values in 64-bit integers: W ≤ 63",
          "table index over 31 bits": "-entry table",
          "products over 63 bits": "products over 63 bits"}
SAMPLES = 2000  # both run ~20-30 µs a sample: well under a second
COUNTS: Counter = Counter()


def _l(layer_kind: str, **p: object) -> L:
    return L(layer_kind, tuple(sorted(p.items())))


#: Always run (Hypothesis' first draws are single Dense layers): a BN on the inputs (folded
#: into the Dense after it), one after a Dense (into it), tanh and softmax tables, rounding
#: and saturation; a BN after a ``keras.layers.ReLU`` (an odd seed: fuzz_models builds the
#: layer, which hls4ml makes a ThresholdedReLU at θ = 0; cpu.native refused it until the fuzz
#: found it), folded into the Dense after it, and sigmoid at the default; a torch
#: nn.Sequential whose BatchNorm1d layers hls4ml keeps as its own layer (on the inputs,
#: after a ReLU: hls4ml fuses one only into the Linear before it), which cpu.native refused
#: until the fuzz found it.
EXAMPLES_FIXED = (
    (Spec("keras_functional", (6,), (_l("bn"), _l("dense", units=8, act="linear"), _l("bn"),
                                     _l("act", kind="tanh", alpha=0.0),
                                     _l("dense", units=3, act="softmax")), seed=11),
     "ap_fixed<14,5,AP_RND,AP_SAT>"),
    (Spec("keras", (5,), (_l("dense", units=6, act="linear"), _l("act", kind="relu", alpha=0.0),
                          _l("bn"), _l("dense", units=4, act="sigmoid")), seed=13), "fixed"),
    (Spec("torch", (7,), (_l("bn"), _l("dense", units=5, act="linear"), _l("act", kind="relu", alpha=0.0),
                          _l("bn"), _l("dense", units=3, act="tanh")), seed=4),
     "ap_fixed<14,5,AP_RND,AP_SAT>"),
)
SECONDS: list[dict] = []


def claimed(spec: Spec) -> bool:
    """Whether both targets claim every layer of ``spec``: Dense, BatchNormalization and the
    :data:`ACTS` activations over a flat input."""
    return len(spec.input_shape) == 1 and all(
        lay.kind in ("dense", "bn") or (lay.kind == "act" and lay.get("kind") in ACTS)
        for lay in spec.layers)


def _specs() -> st.SearchStrategy[Spec]:
    return st.sampled_from(["keras", "keras_functional", "torch"]).flatmap(specs).filter(claimed)


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    path = os.environ.get("HWB_FUZZ_REPORT")
    if path:
        Path(path).write_text(json.dumps({"counts": dict(sorted(COUNTS.items())),
                                          "models": SECONDS}, indent=1) + "\n")


def _inputs(spec: Spec, seed: int) -> np.ndarray:
    """Normal inputs at scales 1, 6 (past the integer range: wrap/saturation) and 0.02
    (below a step: rounding)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SAMPLES, *spec.input_shape))
    x *= np.resize([1.0, 6.0, 0.02], SAMPLES)[:, None]
    return np.ascontiguousarray(x.astype(np.float32))


def _run(cm, x: np.ndarray) -> np.ndarray:
    """Batch-1 calls, as both artifacts are compiled (batch 1)."""
    out = np.zeros((len(x), *cm.artifact.outputs[0].shape), np.float32)
    for i in range(len(x)):
        cm.predict_into(x[i:i + 1], out[i:i + 1])
    return out


def _compile(model, target: str, precision: str, store: Path):
    """The compiled model, or the UnsupportedError it was refused with."""
    try:
        return hwb.compile(model, target, precision, store=store, fidelity=False)
    except UnsupportedError as exc:
        return exc


@settings(max_examples=max(EXAMPLES // 20, 1), deadline=None, database=None, print_blob=True,
          # no shrinking (a model is tens of seconds); drawn models in the long run only
          phases=[Phase.explicit, Phase.generate] if LONG else [Phase.explicit],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.data_too_large])
@example(spec=EXAMPLES_FIXED[0][0], precision=EXAMPLES_FIXED[0][1])
@example(spec=EXAMPLES_FIXED[1][0], precision=EXAMPLES_FIXED[1][1])
@example(spec=EXAMPLES_FIXED[2][0], precision=EXAMPLES_FIXED[2][1])
@given(spec=_specs(), precision=st.sampled_from(PRECISIONS))
def test_fixed_is_bit_exact_with_hls4ml_csim(store_dir: Path, spec: Spec, precision: str) -> None:
    what = f"{spec.describe()} at {precision}"
    model = load(build(spec), spec)
    t0 = time.perf_counter()
    native = _compile(model, "cpu.native", precision, store_dir)
    t1 = time.perf_counter()
    csim = _compile(model, "fpga.hls4ml", HLS_SPELLING.get(precision, precision), store_dir)
    t2 = time.perf_counter()
    SECONDS.append({"spec": what, "cpu.native": round(t1 - t0, 1), "fpga.hls4ml": round(t2 - t1, 1)})
    if isinstance(native, UnsupportedError) and not isinstance(csim, UnsupportedError):
        # the emulation's stated limits, past its 64-bit integers: hls4ml's inferred types
        # widen along a chain of linear Dense layers (fixed<78,38> after three at
        # ap_fixed<18,8>; a fixed<58,28> input to a tanh table); the C-sim builds
        limit = next((k for k, text in LIMITS.items() if text in str(native)), None)
        assert limit, f"{what}: cpu.native refused, fpga.hls4ml built: {native}"
        assert "'hwb" not in str(native), f"{what}: the refusal names a generated layer: {native}"
        COUNTS[f"cpu.native refused ({limit})"] += 1
        return
    refused = [r for r in (native, csim) if isinstance(r, UnsupportedError)]
    if refused:
        # only a BatchNormalization that folds into neither neighbour, refused by both alike
        assert len(refused) == 2, f"{what}: one target refused, the other built: {refused[0]}"
        for exc in refused:
            assert "(BatchNormalization)" in str(exc) and "folded into" in str(exc), f"{what}: {exc}"
        COUNTS["refused (unfoldable BatchNormalization)"] += 1
        return
    x = _inputs(spec, spec.seed)
    yn, yc = _run(native, x), _run(csim, x)
    assert np.isfinite(yc).all(), what
    diff = np.flatnonzero(yn.ravel() != yc.ravel())
    assert diff.size == 0, (f"{what}: {diff.size}/{yn.size} outputs differ, first at flat index "
                            f"{diff[0]}: cpu.native {yn.ravel()[diff[0]]!r} vs C-sim "
                            f"{yc.ravel()[diff[0]]!r}")
    COUNTS["bit-exact"] += 1
    COUNTS["values compared"] += yn.size
