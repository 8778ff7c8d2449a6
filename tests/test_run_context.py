"""One context for a run and one variant label, through the API
a caller touches: ``bench_model(context=)``, ``Router``'s lanes, ``label``/``parse_label``.

The bench tests run a test plugin's instant target (``fpga.test_batchfree``) in a registry of
its own, so what they see can only have come through the context: the global registry does
not hold that target, and the global store is not the one given."""
from __future__ import annotations

import re
from pathlib import Path

from build_cost_targets import BatchFreeTarget, plugin

from hwbackends.bench import ProfileCache, SingleStream, bench_model
from hwbackends.config import RouterConfig
from hwbackends.context import RunContext
from hwbackends.labels import label, parse_label
from hwbackends.registry import build_registry, get_registry
from hwbackends.router import Lane
from hwbackends.store.artifacts import ArtifactStore

ROOT = Path(__file__).resolve().parents[1]
TARGET = "fpga.test_batchfree"


def _context(tmp_path: Path, said: list[str]) -> RunContext:
    reg = build_registry(entry_points=False)
    reg.register(plugin(BatchFreeTarget(str(tmp_path / "built"))), "ctx-test")
    return RunContext(store=ArtifactStore(tmp_path / "store"), registry=reg,
                      profiles=ProfileCache(tmp_path / "profiles"), progress=said.append)


def test_bench_model_uses_the_store_registry_cache_and_progress_it_is_given(tmp_path) -> None:
    said: list[str] = []
    ctx = _context(tmp_path, said)
    assert TARGET not in get_registry().targets  # only the context's registry has it
    res = bench_model("zoo:mlp", ["*"], ["fp32"], [SingleStream(n=30, warmup=2)], context=ctx,
                      bars=False)
    assert [a["target"] for a in res.availability] == [TARGET]
    (rec,) = res.variants
    assert rec.ok and rec.artifact_key in ctx.store.keys()  # built into the given store
    # the compile's own progress lines reached the same callback as the bench's
    assert any(f"{TARGET}:fp32 built in" in m for m in said), said
    assert any("fidelity" in m for m in said), said
    assert len(res.profiles) == 1 and not res.profiles[0].interrupted
    # the fresh profile was kept in the context's cache: a run that reuses profiles takes it
    said.clear()
    again = bench_model("zoo:mlp", ["*"], ["fp32"], [SingleStream(n=30, warmup=2)], context=ctx,
                        bars=False, reuse_profiles=True)
    assert any("profile from cache" in m for m in said), said
    assert again.profiles[0].created == res.profiles[0].created
    # without reuse it is measured again (and the cache refreshed), as `hwb bench` does
    said.clear()
    third = bench_model("zoo:mlp", ["*"], ["fp32"], [SingleStream(n=30, warmup=2)], context=ctx,
                        bars=False)
    assert not any("profile from cache" in m for m in said)
    assert third.profiles[0].created > res.profiles[0].created


def test_a_lane_takes_its_settings_from_the_router_config() -> None:
    """The lane has no defaults of its own: a lane built without settings samples as the
    config's ``[router]`` table does, and that default is the one docs/routing.md shows."""
    lane = Lane("s", [_Fake()], 1e9)
    default = RouterConfig()
    assert (lane.window, lane.sample_every, lane.switch_after, lane.switch_margin,
            lane.retry_after_s, lane.breaker_failures) == (
        default.window, default.sample_every, default.switch_after, default.switch_margin,
        default.retry_after_s, default.breaker_failures)
    doc = (ROOT / "docs" / "routing.md").read_text()
    shown = re.search(r"^sample_every = (\d+)", doc, re.M)
    assert shown and int(shown.group(1)) == default.sample_every == 4
    tuned = Lane("s", [_Fake()], 1e9, RouterConfig(window=50, sample_every=1, switch_after=5))
    assert (tuned.window, tuned.sample_every, tuned.switch_after) == (50, 1, 5)


class _Fake:
    """A candidate the lane can hold (it is never called here)."""

    variant, mode, p99_us = "a:fp32", "hardware", None

    class cm:  # noqa: N801 - the candidate's compiled model, as the lane reads it
        inputs = outputs = ()
        batch_size = 1

        @staticmethod
        def predict_into(x, out) -> None:
            out[...] = x


def test_label_and_parse_label_are_inverse() -> None:
    for target, precision in [("cpu.litert", "int8"), ("fpga.hls4ml", "ap_fixed<16,6>"),
                              ("cpu.native", "")]:
        text = label(target, precision)
        assert parse_label(text) == (target, precision, None)
    assert label("cpu.litert", "fp32") == "cpu.litert:fp32"
    assert label("tpu.xla", "") == "tpu.xla"  # a target never built has no precision
