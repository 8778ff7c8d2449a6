"""The conformance kit itself: it passes a correct target, and catches each broken rule.

Targets come from tests/kit_samples.py (each breaks one rule), registered in a registry of
their own — the installed plugins are not involved. Compiles are real (worker process,
artifact store), on the mlp, in well under a second each once the worker is up.
"""
from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import kit_samples
import pytest

from hwbackends import hookimpl
from hwbackends.registry import build_registry
from hwbackends.testing import (
    TARGET_CHECKS,
    VARIANT_CHECKS,
    Conformance,
    ConformanceError,
    NotApplicable,
    Variant,
    names_layer,
    precision_family,
    run_target_check,
    run_variant_check,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def registry():
    reg = build_registry(entry_points=False)
    plugin = types.ModuleType("kit_samples_plugin")
    plugin.hwb_targets = hookimpl(lambda: [cls() for cls in kit_samples.ALL])
    reg.register(plugin, "kit_samples")
    assert not reg.problems, reg.problems
    return reg


@pytest.fixture(scope="module")
def ctx_for(registry, tmp_path_factory):
    root = tmp_path_factory.mktemp("kit")
    cache: dict[str, Conformance] = {}

    def get(cls, models=("mlp",)) -> Conformance:
        if cls.name not in cache:
            cache[cls.name] = Conformance(cls.name, root / cls.name, models=models, registry=registry)
        return cache[cls.name]
    return get


def test_a_correct_target_passes_every_check(ctx_for):
    ctx = ctx_for(kit_samples.Good, models=("mlp", "lstm"))
    assert ctx.variants() == [Variant("mlp", "fp32"), Variant("lstm", "fp32")]
    for check in TARGET_CHECKS:
        if check == "probe_is_light":  # needs an installed entry point: covered by the scaffold test
            with pytest.raises(NotApplicable, match="entry-point"):
                run_target_check(ctx, check)
            continue
        assert run_target_check(ctx, check)
    for check in VARIANT_CHECKS:
        assert run_variant_check(ctx, Variant("mlp", "fp32"), check)
    # the LSTM is refused with an error naming the layer: tolerated, reported as not applicable
    with pytest.raises(NotApplicable, match="layer 'lstm' is a LSTM"):
        run_variant_check(ctx, Variant("lstm", "fp32"), "compile")


@pytest.mark.parametrize("cls,check,expect", [
    (kit_samples.Leaky, "no_allocation", r"predict_into keeps memory.*allocated at \S*kit_samples\.py:\d+"),
    (kit_samples.Greedy, "no_allocation", "predict_into allocates per call: peak"),
    (kit_samples.Lax, "bad_inputs", "x float64: accepted"),
    (kit_samples.Lax, "bad_inputs", r"x with last dimension 1 \(broadcastable\): accepted"),
    (kit_samples.Sloppy, "fidelity", "rel_err"),
    (kit_samples.Mute, "compile", "without naming the layer or op"),
    (kit_samples.Reasonless, "probe", "unavailable without a reason"),
    (kit_samples.Slow, "probe", r"probe\(\) took"),
    (kit_samples.Bodiless, "store_roundtrip", "wrote no file"),
    (kit_samples.Unpicklable, "compile_isolated", "cannot be pickled"),
], ids=lambda v: getattr(v, "name", None) or str(v)[:24])
def test_the_kit_catches_a_broken_rule(ctx_for, cls, check, expect):
    ctx = ctx_for(cls)
    with pytest.raises(ConformanceError, match=expect):
        if check in TARGET_CHECKS:
            run_target_check(ctx, check)
        else:
            run_variant_check(ctx, Variant("mlp", "fp32"), check)


def test_the_kit_notices_a_compile_in_the_callers_process(ctx_for):
    ctx = ctx_for(kit_samples.InCaller)
    cm = ctx.compile_variant(Variant("mlp", "fp32"), ctx.store, fidelity=False, isolate_compile=False)
    assert not cm.artifact.cached
    with pytest.raises(ConformanceError, match="ran in the caller's process"):
        run_target_check(ctx, "compile_isolated")


def test_store_variant_is_the_one_round_tripped(registry, tmp_path):
    """``store_variant`` picks what the store checks build (a target whose default precision
    runs a search names an explicit one): here the mlp, where the selected models (the LSTM,
    refused by the sample target) would leave the round-trip nothing to build."""
    lstm_only = Conformance(kit_samples.Good.name, tmp_path / "a", models=("lstm",), registry=registry)
    with pytest.raises(NotApplicable, match="compiles none of the selected"):
        run_target_check(lstm_only, "store_roundtrip")
    ctx = Conformance(kit_samples.Good.name, tmp_path / "b", models=("lstm",), registry=registry,
                      store_variant=Variant("mlp", "fp32"))
    assert run_target_check(ctx, "store_roundtrip").startswith("mlp-fp32: cached load, corrupted")
    assert [b.split()[0] for b in ctx.fresh_builds] == ["mlp-fp32", "mlp-fp32"]  # first, rebuild
    assert "compile worker" in run_target_check(ctx, "compile_isolated")
    torch_one = Conformance(kit_samples.Good.name, tmp_path / "c", registry=registry,
                            store_variant=Variant("mlp_torch", "fp32"))
    with pytest.raises(ConformanceError, match="store_variant mlp_torch-fp32 names a model"):
        run_target_check(torch_one, "store_roundtrip")


def test_an_unavailable_target_skips_with_its_reason(ctx_for, registry):
    class Gone(kit_samples.Good):
        name = "cpu.kit_gone"

        def probe(self):
            from hwbackends.specs import Availability
            return Availability.unavailable("no frobnicator on PATH (install frobnicate)")
    registry.targets[Gone.name] = Gone()
    try:
        ctx = ctx_for(Gone)
        assert "unavailable" in run_target_check(ctx, "probe")
        with pytest.raises(NotApplicable, match="no frobnicator on PATH"):
            run_variant_check(ctx, Variant("mlp", "fp32"), "compile")
        with pytest.raises(NotApplicable, match="no frobnicator on PATH"):
            run_target_check(ctx, "store_roundtrip")
    finally:
        del registry.targets[Gone.name]


def test_precision_families():
    assert [precision_family(p) for p in ("fp32", "fp16", "bf16", "int8", "int8-dynamic",
                                           "ap_fixed<16,6>", "tf32")] == [
        "fp32", "half", "half", "quantized", "quantized", "quantized", "half"]


def test_unsupported_error_must_name_the_layer(zoo_model):
    m = zoo_model("lstm")
    assert names_layer(m, "layer 'lstm' (LSTM) is not supported")
    assert names_layer(m, "no kernel for LSTM")           # a layer class of the model
    assert names_layer(m, "op Foo has no lowering")        # says which op
    assert not names_layer(m, "cannot compile this model")


def test_pytest_one_liner_from_any_directory(tmp_path):
    """`pytest --hwb-target NAME` (the pytest11 plugin) runs the kit from an unrelated directory;
    unavailable targets' compile checks skip with the probe's reason."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--hwb-target", "ref", "--hwb-target",
                        "gpu.tensorrt", "-k", "metadata or probe or (tensorrt and compile)", "-q", "-rs",
                        "-p", "no:cacheprovider", "--hwb-models", "mlp"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, HWB_CACHE_DIR=str(tmp_path / "cache")))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert " passed" in out
    if "gpu.tensorrt" in build_registry().targets:
        assert "gpu.tensorrt is unavailable here" in out  # skip reason carried through


# -- the light-probe check, on real installed plugins ---------------------------------------
_PROBES_PLUGIN = '''\
"""Three targets whose probe() differs only in what it imports (for the kit's own tests)."""
from hwbackends import hookimpl
from hwbackends.testing.sample_target import NumpyDenseTarget


class LightProbe(NumpyDenseTarget):
    name = "cpu.kit_light_probe"


class SlowImportProbe(NumpyDenseTarget):
    name = "cpu.kit_slow_import_probe"

    def probe(self):
        from . import slow_sdk  # noqa: F401  (takes ~300 ms to import, like a vendor SDK)
        return super().probe()


class ForeignPackageProbe(NumpyDenseTarget):
    name = "cpu.kit_foreign_probe"

    def probe(self):
        import hwb_kit_vendor_runtime  # noqa: F401  (a package of its own, not a light one)
        return super().probe()


@hookimpl
def hwb_targets():
    return [LightProbe(), SlowImportProbe(), ForeignPackageProbe()]
'''


@pytest.fixture(scope="module")
def probes_registry(tmp_path_factory):
    """A real distribution on sys.path (dist-info + entry point), so a fresh interpreter finds
    the plugin exactly as it finds a pip-installed one."""
    site = tmp_path_factory.mktemp("site")
    pkg = site / "hwb_kit_probes"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(_PROBES_PLUGIN)
    (pkg / "slow_sdk.py").write_text(  # ~300 ms of CPU at import, like a vendor SDK's
        "import time\n\nt0 = time.process_time()\nwhile time.process_time() - t0 < 0.3:\n    pass\n")
    (site / "hwb_kit_vendor_runtime.py").write_text("VERSION = '1.0'\n")
    info = site / "hwb_kit_probes-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hwb-kit-probes\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hwbackends]\nkit_probes = hwb_kit_probes\n")
    sys.path.insert(0, str(site))
    try:
        import importlib

        reg = build_registry(entry_points=False)
        reg.register(importlib.import_module("hwb_kit_probes"), "kit_probes")
        assert not reg.problems, reg.problems
        yield reg
    finally:
        sys.path.remove(str(site))
        for m in [m for m in sys.modules if m.startswith(("hwb_kit_probes", "hwb_kit_vendor"))]:
            del sys.modules[m]


@pytest.mark.parametrize("target, expect", [
    ("cpu.kit_light_probe", None),
    ("cpu.kit_slow_import_probe", r"probe\(\) imports hwb_kit_probes.slow_sdk \(\d+ ms\): over the"),
    ("cpu.kit_foreign_probe", r"probe\(\) imports hwb_kit_vendor_runtime \(\d+ ms\): not a light package"),
])
def test_the_light_probe_check_measures_imports(probes_registry, tmp_path, target, expect):
    ctx = Conformance(target, tmp_path, models=("mlp",), registry=probes_registry)
    if expect is None:
        assert "slowest" in run_target_check(ctx, "probe_is_light")
    else:
        with pytest.raises(ConformanceError, match=expect):
            run_target_check(ctx, "probe_is_light")
