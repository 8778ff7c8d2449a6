"""The store's manifest and the compile's reading of the target contract: an
entry of an older store format is rebuilt, never read with the old key names; the
key follows ``Target.version`` read from the class; an executor is closed through one path."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from registry_helpers import registry_with

import hwbackends as hwb
from hwbackends.specs import TensorSpec
from hwbackends.store import trust
from hwbackends.store.artifacts import MANIFEST, STORE_FORMAT, ArtifactStore
from hwbackends.store.manifest import Manifest
from hwbackends.target import close_executor
from hwbackends.testing.sample_target import NumpyDenseExecutor, NumpyDenseTarget


class Sample(NumpyDenseTarget):
    """The sample target under its own name, so class attributes can be patched per test."""

    name = "cpu.manifest_sample"


def _registry():
    return registry_with(Sample(), name="manifest_sample")


def _compile(model, st, **kw):
    return hwb.compile(model, Sample.name, store=st, registry=_registry(), isolate_compile=False,
                       fidelity=False, **kw)


def _rewrite(st: ArtifactStore, key: str, change) -> None:
    """Edit an entry's manifest and sign it again with the store's key: what an older
    version of hwbackends (same key, older schema) left on disk."""
    path = st.path_for(key) / MANIFEST
    rec = json.loads(path.read_text())
    change(rec)
    rec["hmac"] = trust.sign(st.key, rec)
    path.write_text(json.dumps(rec))


def _old_schema(rec: dict) -> None:
    """The store format 3 record: the reload check named ``probe``, one input as ``x``."""
    rec["store_format"] = 3
    check = rec.pop("reload_check")
    check["x"] = check.pop("xs")[0]
    rec["probe"] = check


def test_an_entry_of_an_older_store_format_is_rebuilt_not_read(zoo_model, tmp_path, caplog):
    st = ArtifactStore(tmp_path / "store")
    m = zoo_model("mlp")
    first = _compile(m, st)
    key = first.artifact.key
    _rewrite(st, key, _old_schema)
    assert st.get(key) is None  # refused (format 3 != 4) and removed, not misread
    assert not st.path_for(key).exists()
    again = _compile(m, st)
    assert not again.artifact.cached and again.artifact.key == key
    rec = st.get(key)
    assert rec["store_format"] == STORE_FORMAT and "probe" not in rec
    assert len(rec["reload_check"]["xs"]) == 1
    assert _compile(m, st).artifact.cached  # the rebuilt entry is served from now on


def test_a_current_format_entry_with_the_old_reload_check_key_is_rebuilt(zoo_model, tmp_path):
    """The schema has one name for the reload check; a record holding it under the old
    ``probe``/``x`` names (signed, right format) has none and is rebuilt."""
    st = ArtifactStore(tmp_path / "store")
    m = zoo_model("mlp")
    key = _compile(m, st).artifact.key

    def renamed(rec: dict) -> None:
        _old_schema(rec)
        rec["store_format"] = STORE_FORMAT

    _rewrite(st, key, renamed)
    assert Manifest.from_dict(st.get(key, touch=False)).reload_check is None
    again = _compile(m, st)
    assert not again.artifact.cached
    assert "xs" in st.get(key)["reload_check"]


def test_the_store_key_follows_the_targets_declared_version(zoo_model, tmp_path, monkeypatch):
    st = ArtifactStore(tmp_path / "store")
    m = zoo_model("mlp")
    v1 = _compile(m, st)
    assert _compile(m, st).artifact.cached
    monkeypatch.setattr(Sample, "version", "2")
    v2 = _compile(m, st)
    assert not v2.artifact.cached and v2.artifact.key != v1.artifact.key
    assert st.get(v2.artifact.key)["key_parts"]["target_version"] == "2"


def test_check_options_runs_before_a_build_through_the_base_class(zoo_model, tmp_path,
                                                                  monkeypatch):
    """``Target.check_options`` is called plainly (the base class declares it): an override
    that refuses stops the compile before anything is stored."""
    from hwbackends.errors import UnsupportedError

    def refuse(self, options):
        raise UnsupportedError("no, by test")

    monkeypatch.setattr(Sample, "check_options", refuse)
    st = ArtifactStore(tmp_path / "store")
    with pytest.raises(UnsupportedError, match="no, by test"):
        _compile(zoo_model("mlp"), st)
    assert not st.objects.exists() or not any(st.objects.rglob(MANIFEST))


def test_the_manifest_schema_ignores_what_the_store_adds():
    man = Manifest(target="cpu.x", precision="fp32", fingerprint="f" * 16, batch_size=2,
                   inputs=[TensorSpec("a", (3,))], outputs=[TensorSpec("y", (1,))],
                   key_parts={"core": 2}, reload_check={"xs": [], "tol": 0.1}, key="k" * 64)
    d = json.loads(json.dumps(man.to_dict()))
    assert Manifest.from_dict(d) == man
    assert Manifest.from_dict({**d, "files": {}, "hmac": "x", "store_format": 4}) == man
    assert Manifest.from_dict({**d, "reload_check": None, "probe": {"tol": 1}}).reload_check is None


class _Closing(NumpyDenseExecutor):
    closed = 0

    def close(self) -> None:
        type(self).closed += 1


def test_an_executor_is_closed_through_one_path(zoo_model, tmp_path, monkeypatch):
    """``CompiledModel.close()`` and the compile's own drops close through
    :func:`close_executor`: an executor's ``close()``, the base class's no-op, or nothing for
    a duck-typed executor without one."""
    monkeypatch.setattr(_Closing, "closed", 0)
    orig = Sample.load

    def load(self, artifact, options):
        ex = orig(self, artifact, options)
        ex.__class__ = _Closing
        return ex

    monkeypatch.setattr(Sample, "load", load)
    st = ArtifactStore(tmp_path / "store")
    m = zoo_model("mlp")
    cm = _compile(m, st)
    cm.close()
    assert _Closing.closed == 1
    # a reload whose outputs differ from the stored ones: the compile closes what it loaded
    key = cm.artifact.key

    def wrong_outputs(rec: dict) -> None:
        out = rec["reload_check"]["out"]
        a = np.frombuffer(base64.b64decode(out["f32"]), np.float32) + 100.0
        out["f32"] = base64.b64encode(a.astype(np.float32).tobytes()).decode()

    _rewrite(st, key, wrong_outputs)
    again = _compile(m, st)
    assert not again.artifact.cached and _Closing.closed == 2
    close_executor(object())  # no close(): nothing to do, no error
    close_executor(NumpyDenseExecutor.__new__(NumpyDenseExecutor))  # the base's no-op
