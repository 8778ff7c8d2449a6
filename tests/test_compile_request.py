"""compile()'s orchestration: the caller's Model is never changed, the manifest
has one schema (hwbackends.store.manifest.Manifest) and a request is one object."""
from __future__ import annotations

import copy
import dataclasses
import json
import types

import numpy as np

import hwbackends as hwb
from hwbackends.compiler.request import CompileRequest, resolve
from hwbackends.hookspecs import hookimpl
from hwbackends.registry import build_registry
from hwbackends.specs import TensorSpec
from hwbackends.store.artifacts import ArtifactStore
from hwbackends.store.manifest import Manifest
from hwbackends.testing.sample_target import NumpyDenseTarget


class Meddler(NumpyDenseTarget):
    """The sample target, whose compile writes into the model it receives: what a careless
    in-process target (or converter) may do."""

    name = "cpu.meddler"

    def compile(self, model, options, workdir):
        meta = super().compile(model, options, workdir)
        model.meta["touched_by"] = self.name
        model.name = "renamed"
        model.validation_data = np.zeros((1, *model.input.shape), np.float32)
        return meta


def _registry():
    reg = build_registry(entry_points=False)
    plugin = types.ModuleType("meddler_plugin")
    plugin.hwb_targets = hookimpl(lambda: [Meddler()])
    reg.register(plugin, "meddler")
    assert not reg.problems, reg.problems
    return reg


def test_compile_leaves_the_callers_model_as_it_was(zoo_model, tmp_path):
    m = zoo_model("mlp")
    fields = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
    meta = copy.deepcopy(m.meta)
    val = np.random.default_rng(0).standard_normal((64, *m.input.shape)).astype(np.float32)
    cm = hwb.compile(m, "cpu.meddler", store=tmp_path, registry=_registry(),
                     isolate_compile=False, validation_data=val)
    assert cm.fidelity is not None and cm.fidelity.corr > 0.999  # it did build and run
    assert m.meta == meta and "touched_by" not in m.meta
    for name, before in fields.items():
        assert getattr(m, name) is before, f"compile() replaced the caller's Model.{name}"


def test_a_request_is_one_object_resolved_once(zoo_model):
    m = zoo_model("mlp")
    req = resolve(CompileRequest(m, "cpu.meddler"), _registry())
    assert req.m is not m and req.m.fingerprint == m.fingerprint  # the compile's own copy
    assert req.opts.precision == "fp32" and req.opts.batch_size == 1
    assert "cpu.meddler:fp32" in req.what
    again = resolve(CompileRequest(m, "cpu.meddler"), _registry())
    assert again.key == req.key and again.parts == req.parts


def test_the_manifest_round_trips_and_is_what_the_store_signs(zoo_model, tmp_path):
    man = Manifest(target="cpu.x", precision="fp32", fingerprint="f" * 16, batch_size=2,
                   inputs=[TensorSpec("a", (3,)), TensorSpec("b", (2,))],
                   outputs=[TensorSpec("y", (1,))], model="two", meta={"ops": ["Add"]},
                   chain=["keras→onnx"], key_parts={"core": 1}, reload_check={"tol": 0.1}, key="k" * 64)
    d = json.loads(json.dumps(man.to_dict()))
    assert Manifest.from_dict(d) == man
    assert Manifest.from_dict({**d, "files": {}, "hmac": "x", "from_later": 1}) == man
    art = man.artifact(tmp_path, cached=True)
    assert (art.key, art.batch_size, art.cached, art.multi_io) == (man.key, 2, True, True)
    assert [s.name for s in art.inputs] == ["a", "b"]
    # a real build: the store's record parses into the same schema, with its reload check
    st = ArtifactStore(tmp_path / "store")
    cm = hwb.compile(zoo_model("mlp"), "cpu.meddler", store=st, registry=_registry(),
                     isolate_compile=False, fidelity=False)
    rec = Manifest.from_dict(st.get(cm.artifact.key))
    assert rec.target == "cpu.meddler" and rec.reload_check and "xs" in rec.reload_check
    assert rec.artifact(cm.artifact.path).inputs == cm.inputs
