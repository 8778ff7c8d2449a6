"""Fast unit tests of the core: no framework compile here (see test_cpu_targets.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import ModelError, UnknownTargetError
from hwbackends.fidelity import Tolerance, compare
from hwbackends.registry import build_registry
from hwbackends.store.artifacts import ArtifactStore

HEAVY = ("tensorflow", "torch", "jax", "hls4ml", "keras", "onnxruntime")


def test_import_and_targets_stay_light():
    code = ("import sys, hwbackends; from hwbackends.registry import get_registry; "
            "r = get_registry(); [t.probe() for t in r.targets.values()]; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"heavy modules imported by hwb targets: {out.stdout}"


def test_cli_targets_json_lists_every_target_with_availability():
    out = subprocess.run([sys.executable, "-m", "hwbackends.cli", "targets", "--json"],
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    names = {t["name"] for t in data["targets"]}
    assert {"ref", "cpu.litert", "cpu.onnxruntime"} <= names
    for t in data["targets"]:
        assert t["availability"]["mode"] in ("hardware", "emulated", "unavailable")
        if t["availability"]["mode"] == "unavailable":
            assert t["availability"]["reason"], f"{t['name']} unavailable without a reason"


class _Good(hwb.Target):
    name, family, formats = "test.good", "cpu", ("onnx",)

    def probe(self):
        return hwb.Availability.emulated("nowhere", "test target")


class _Dup(_Good):
    pass


class _OldContract(_Good):
    name = "test.old"
    contract_version = 0


def _plugin(**hooks):
    mod = types.ModuleType("p")
    for k, v in hooks.items():
        setattr(mod, k, hwb.hookimpl(v))
    return mod


def test_registry_isolates_a_plugin_that_raises_and_refuses_duplicates():
    reg = build_registry(entry_points=False)

    def boom():
        raise RuntimeError("driver exploded")
    reg.register(_plugin(hwb_targets=boom), "broken")
    reg.register(_plugin(hwb_targets=lambda: [_Good()]), "good")
    reg.register(_plugin(hwb_targets=lambda: [_Dup(), _OldContract()]), "dup")
    assert list(reg.targets) == ["test.good"]
    problems = {(p.plugin, p.stage): p.error for p in reg.problems}
    assert "driver exploded" in problems[("broken", "hwb_targets")]
    dup = [p.error for p in reg.problems if p.plugin == "dup"]
    assert any("already provided by plugin 'good'" in e and "'dup'" in e for e in dup)
    assert any("contract version 0" in e for e in dup)
    with pytest.raises(UnknownTargetError, match="registered targets: test.good.*broken"):
        reg.target("cpu.nope")


def test_unknown_target_precision_and_option_list_the_valid_ones(zoo_model):
    m = zoo_model("mlp")
    with pytest.raises(UnknownTargetError, match="cpu.litert"):
        hwb.compile(m, "cpu.nope")
    with pytest.raises(hwb.UnsupportedError, match="fp32, fp16, int8-dynamic, int8"):
        hwb.compile(m, "cpu.litert", "int4")
    with pytest.raises(hwb.UnsupportedError, match="recurrent"):
        hwb.compile(m, "cpu.litert", "fp32", options={"turbo": True})


def test_torch_model_to_litert_names_the_missing_conversion(zoo_model):
    with pytest.raises(hwb.UnsupportedError, match="cpu.litert takes keras models.*from torch"):
        hwb.compile(zoo_model("mlp_torch"), "cpu.litert")


def test_fidelity_metrics():
    ref = np.array([[0.1, 0.9], [0.8, 0.2], [-0.5, 0.4]], np.float32)
    got = ref + np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]], np.float32)
    f = compare(ref, got)
    assert f.n == 3 and f.max_abs == pytest.approx(1.0)
    assert f.rel_err == pytest.approx(1.0 / 1.4)
    assert f.argmax_agree == pytest.approx(2 / 3)
    assert f.sign_agree == pytest.approx(5 / 6)
    assert compare(ref, ref).corr == pytest.approx(1.0)
    tol = Tolerance(corr_min=0.99, max_abs=0.1)
    assert not tol.passes(f) and any("max_abs" in v for v in tol.violations(f))
    assert tol.passes(compare(ref, ref))


def test_store_detects_corruption_and_never_shows_half_written_entries(tmp_path: Path):
    st = ArtifactStore(tmp_path)
    staged = st.stage()
    (staged / "model.bin").write_bytes(b"x" * 100)
    st.commit(staged, "ab" * 32, {"target": "t"})
    rec = st.get("ab" * 32)
    assert rec and rec["files"] == {"model.bin": rec["files"]["model.bin"]}
    assert not any((tmp_path / "tmp").iterdir()), "staging left behind"
    # truncate the file: detected, entry removed, caller rebuilds
    (st.path_for("ab" * 32) / "model.bin").write_bytes(b"x" * 10)
    assert st.get("ab" * 32) is None
    assert not st.path_for("ab" * 32).exists()
    # a corrupt manifest too
    staged = st.stage()
    (staged / "f").write_text("1")
    st.commit(staged, "cd" * 32, {})
    (st.path_for("cd" * 32) / "manifest.json").write_text("{not json")
    assert st.get("cd" * 32) is None


def test_model_loading_errors(tmp_path: Path):
    with pytest.raises(ModelError, match="not found"):
        hwb.load_model(tmp_path / "missing.keras")
    bad = tmp_path / "corrupt.keras"
    bad.write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(ModelError, match="could not load .*corrupt.keras"):
        hwb.load_model(bad)
    bad_onnx = tmp_path / "corrupt.onnx"
    bad_onnx.write_bytes(b"\x08\x07garbage")
    with pytest.raises(ModelError, match="corrupt.onnx"):
        hwb.load_model(bad_onnx)
    odd = tmp_path / "m.xyz"
    odd.write_text("")
    with pytest.raises(ModelError, match="unknown model file type"):
        hwb.load_model(odd)
    with pytest.raises(ModelError, match="no zoo model"):
        hwb.load_model("zoo:nope")


def test_torch_model_needs_an_input_spec():
    torch = pytest.importorskip("torch")
    with pytest.raises(ModelError, match="example_input"):
        hwb.load_model(torch.nn.Linear(4, 1))


def test_fingerprint_is_stable_across_processes(zoo_model):
    here = zoo_model("lstm").fingerprint
    code = "from hwbackends import zoo; print(zoo.get('lstm', deferred=False).fingerprint)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == here
    assert zoo_model("mlp").fingerprint != here


def test_the_executor_found_at_load_decides_the_mode(zoo_model, tmp_path):
    """A target whose probe says emulated but whose load found the device reports hardware."""
    from hwb_plugins._shared.litert import LiteRTExecutor
    from hwb_plugins.cpu_litert.target import LiteRTTarget

    class BoardFound(LiteRTTarget):
        name = "test.loadmode"

        def probe(self):
            return hwb.Availability.emulated("stand-in", "probe cannot see the board")

        def load(self, artifact, options):
            ex = super().load(artifact, options)
            ex.availability = hwb.Availability.hardware("the board", "bitstream matched")
            return ex

    reg = build_registry(entry_points=True)
    reg.register(_plugin(hwb_targets=lambda: [BoardFound()]), "loadmode")
    cm = hwb.compile(zoo_model("signal"), "test.loadmode", store=tmp_path, registry=reg,
                     isolate_compile=False, fidelity=False)
    assert isinstance(cm.executor, LiteRTExecutor)
    assert cm.mode is hwb.Mode.HARDWARE and cm.availability.device == "the board"


def test_machine_isa_names_the_host_instruction_set_for_toolchain_keys():
    """A native-code plugin keys its artifacts on the host ISA."""
    import platform

    from hwbackends import machine
    isa = machine.isa()
    arch, _, flags = isa.partition(":")
    assert arch == platform.machine()
    have = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                break
    assert set(filter(None, flags.split(","))) == {x for x in machine.ISA_FLAGS if x in have}
    assert ("avx2" in flags.split(",")) == ("avx2" in have)


def test_fidelity_round_trips_through_json_for_one_output_and_several():
    """A results file or a fleet node's answer rebuilds the same Fidelity,
    a multi-output model's too (`hwb route --fleet-results` reads them)."""
    import json

    from hwbackends.fidelity import Fidelity, compare
    r = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    one = compare(r, r + 0.01)
    assert Fidelity.from_dict(json.loads(json.dumps(one.to_dict()))) == one
    assert one.outputs is None and "outputs" not in one.to_dict()  # one output: as before
    assert compare((r,), (r + 0.01,)) == one  # a tuple of one is the same output
    many = compare((r, r[:, :1]), (r + 0.01, r[:, :1] * 1.1), names=["a", "b"])
    back = Fidelity.from_dict(json.loads(json.dumps(many.to_dict())))
    assert back == many and back.output == many.output and set(back.outputs or {}) == {"a", "b"}
    assert back.outputs["b"] == compare(r[:, :1], r[:, :1] * 1.1)
    assert Fidelity.from_dict({**one.to_dict(), "from_a_newer_writer": 1}) == one


def test_the_sample_target_and_scaffold_pin_the_current_contract_version():
    """A plugin must state the contract it was written for, so a later incompatible core
    refuses it by name instead of calling its _run with the wrong shapes."""
    from hwbackends import scaffold
    from hwbackends.target import CONTRACT_VERSION
    from hwbackends.testing.sample_target import NumpyDenseTarget
    assert "contract_version" in vars(NumpyDenseTarget)
    assert NumpyDenseTarget.contract_version == CONTRACT_VERSION
    assert f"    contract_version = {CONTRACT_VERSION}\n" in scaffold.target_source("mynpu", "cpu")
