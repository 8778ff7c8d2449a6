"""A zoo model after its first build is deferred: fingerprint, specs and meta come from a
signed memo, the framework object loads on first use, and a cached artifact of it is served
without importing TensorFlow (``hwb serve zoo:signal`` started in ~6 s here, ~5 of them
importing Keras only to fingerprint the model)."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends import zoo
from hwbackends.errors import ModelError


@pytest.fixture
def own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store (and so a zoo directory and memos) of this test's own."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("HWB_CACHE_DIR", str(root))
    return root


def _deferred(m: hwb.Model) -> bool:
    return "obj" not in vars(m)


def test_the_second_get_is_deferred_and_is_the_same_model(own_store: Path) -> None:
    first = zoo.get("mlp")
    assert not _deferred(first)  # no memo yet: built, and the memo written
    assert (own_store / "zoo" / "mlp.model.json").exists()
    m = zoo.get("mlp")
    assert _deferred(m)
    assert (m.fingerprint, m.inputs, m.outputs, m.meta, m.format, m.name) == (
        first.fingerprint, first.inputs, first.outputs, first.meta, first.format, first.name)
    x = first.representative(16)
    np.testing.assert_array_equal(m.reference(x), first.reference(x))  # the reference loads it
    assert not _deferred(m) and type(m.obj) is type(first.obj)
    # a copy (what every compile works on) stays deferred, and shares the one load
    d = zoo.get("mlp")
    c = copy.copy(d)
    assert _deferred(c) and _deferred(d)
    assert c.obj is d.obj
    # what a compile worker gets: the model saved as files (Model.save), the framework's own
    assert hwb.models.load_saved(zoo.get("mlp").save(own_store / "sent")).fingerprint == \
        first.fingerprint


def test_the_signal_memo_is_keyed_by_the_trained_file(own_store: Path) -> None:
    first = zoo.get("signal")  # trains it, then writes the memo keyed by the signed file
    m = zoo.get("signal")
    assert _deferred(m) and m.fingerprint == first.fingerprint and m.source == first.source
    np.testing.assert_array_equal(m.validation_data, first.validation_data)
    assert m.meta["validation_source"] == first.meta["validation_source"]
    # a retrained file (here: edited, so it is retrained) is another model: no memo for it
    path = zoo.signal_path()
    path.write_bytes(path.read_bytes() + b"\0")
    assert not _deferred(zoo.get("signal"))


def test_a_memo_that_is_not_ours_or_not_for_this_code_is_not_used(own_store: Path) -> None:
    real = zoo.get("mlp")
    memo = own_store / "zoo" / "mlp.model.json"
    body = json.loads(memo.read_text())
    # edited (its signature no longer matches): built, and the memo written again
    memo.write_text(json.dumps(body | {"fingerprint": "0" * 32}))
    m = zoo.get("mlp")
    assert not _deferred(m) and m.fingerprint == real.fingerprint
    assert json.loads(memo.read_text())["fingerprint"] == real.fingerprint
    # signed, but for other code or another framework version (another key): built
    zoo._write_signed(memo, json.dumps(body | {"key": "other"}).encode())
    assert not _deferred(zoo.get("mlp"))


def test_a_signed_memo_with_a_wrong_fingerprint_fails_clearly_once(own_store: Path) -> None:
    """A memo can only be wrong if the code that made it was: the load says so, removes it,
    and the next get builds."""
    zoo.get("mlp")
    memo = own_store / "zoo" / "mlp.model.json"
    body = json.loads(memo.read_text())
    zoo._write_signed(memo, json.dumps(body | {"fingerprint": "f" * 32}).encode())
    m = zoo.get("mlp")
    assert _deferred(m) and m.fingerprint == "f" * 32
    with pytest.raises(ModelError, match="memo said f{32}.*removed: load the model again"):
        m.obj  # noqa: B018
    assert not memo.exists()
    assert not _deferred(zoo.get("mlp"))


@pytest.mark.slow
def test_a_cached_artifact_of_a_zoo_model_is_served_without_tensorflow(own_store: Path) -> None:
    hwb.compile("zoo:signal", "cpu.litert", "fp32", fidelity=False)  # trains, builds, caches
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import hwbackends as hwb
        cm = hwb.compile("zoo:signal", "cpu.litert", "fp32", fidelity=False)
        assert cm.artifact.cached
        y = cm.predict(np.zeros((3, 32), np.float32))
        heavy = sorted({k.split(".")[0] for k in sys.modules} & {"tensorflow", "keras", "torch"})
        print("OK", y.shape, heavy)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "OK (3, 1) []" in r.stdout, r.stdout
