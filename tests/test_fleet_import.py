"""What a fleet node imports from a peer (no Ray: the receive function itself).

The receiver computes the key from what it asks for, takes only plainly named files its
manifest lists, and checks the artifact against its own reference before signing it."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from test_store_races import _other_signal

import hwbackends as hwb
from hwbackends.errors import CacheError
from hwbackends.fleet.artifacts import Packed, import_packed, pack
from hwbackends.store.artifacts import MANIFEST, ArtifactStore

#: The receiving node's plugins (its task passes its own registry, as here).
REG = hwb.get_registry()


def _package(model, tmp_path: Path, name: str) -> tuple[Packed, str]:
    """``model`` compiled for ``ref`` in a sender's store, packed; and its key."""
    st = ArtifactStore(tmp_path / name)
    cm = hwb.compile(model, "ref", store=st, isolate_compile=False, fidelity=False)
    p = pack(st, cm.artifact.key)
    assert p is not None
    return p, cm.artifact.key


def _repack(p: Packed, manifest: Callable[[Any], Any] | None = None,
            extra: dict[str, bytes] | None = None, flip: str | None = None) -> Packed:
    """``p`` with its manifest rewritten, files added, or one byte of a file flipped."""
    src = tarfile.open(fileobj=io.BytesIO(p.blob))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name.endswith(MANIFEST) and manifest:
                data = json.dumps(manifest(json.loads(data))).encode()
                m.size = len(data)
            if flip and m.name.endswith(flip):
                data = bytes([data[0] ^ 1]) + data[1:]
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    return dataclasses.replace(p, blob=out.getvalue())


def _nothing_left(st: ArtifactStore) -> None:
    assert not any(st.objects.glob("*/*")), "an entry was left in the store"
    tmp = st.root / "tmp"
    assert not tmp.exists() or not any(tmp.iterdir()), "a staging directory was left behind"


def test_an_honest_package_is_imported_verified_and_served(zoo_model, tmp_path: Path) -> None:
    m = zoo_model("signal")
    p, key = _package(m, tmp_path, "sender")
    b = ArtifactStore(tmp_path / "receiver")
    assert import_packed(b, p, m, "ref", "fp32", registry=REG) == "imported"
    assert import_packed(b, p, m, "ref", "fp32", registry=REG) == "present"
    cm = hwb.compile(m, "ref", store=b, isolate_compile=False)
    assert cm.artifact.cached and cm.artifact.key == key and cm.fidelity.corr > 0.9999


def test_another_models_package_is_refused(zoo_model, tmp_path: Path) -> None:
    """Another model's consistent entry, sent under the key it came with to a node asking for
    zoo:signal: the receiver's own key differs, so it is refused and nothing kept."""
    m, other = zoo_model("signal"), _other_signal()
    p_other, _ = _package(other, tmp_path, "sender")
    b = ArtifactStore(tmp_path / "receiver")
    with pytest.raises(CacheError, match="built for another request.*fingerprint"):
        import_packed(b, p_other, m, "ref", "fp32", registry=REG)
    _nothing_left(b)


def test_a_package_forged_with_this_models_key_is_refused(zoo_model, tmp_path: Path) -> None:
    """Another model's entry carrying zoo:signal's key (and key parts, and fingerprint): its
    outputs are checked against the receiver's own reference before it is signed: refused, and the
    compile builds its own."""
    m, other = zoo_model("signal"), _other_signal()
    p_mine, key = _package(m, tmp_path, "mine")
    p_other, _ = _package(other, tmp_path, "sender")
    b = ArtifactStore(tmp_path / "receiver")
    mine = json.loads(tarfile.open(fileobj=io.BytesIO(p_mine.blob)).extractfile(f"./{MANIFEST}").read())

    def forge(rec: dict) -> dict:
        return dict(rec, key=key, key_parts=mine.get("key_parts"), fingerprint=m.fingerprint)
    forged = dataclasses.replace(_repack(p_other, forge), key=key)
    with pytest.raises(CacheError, match="does not match this node's reference model.*corr"):
        import_packed(b, forged, m, "ref", "fp32", registry=REG)
    _nothing_left(b)
    x = m.representative(64, seed=3)
    cm = hwb.compile(m, "ref", store=b, isolate_compile=False, fidelity=False)
    assert not cm.artifact.cached
    np.testing.assert_allclose(cm.predict(x), m.reference(x), atol=1e-5)


def test_a_key_with_dotdot_touches_nothing_outside_the_store(zoo_model, tmp_path: Path) -> None:
    """A key containing ``../`` deletes and writes nothing outside the store."""
    m = zoo_model("signal")
    p, _ = _package(m, tmp_path, "sender")
    b = ArtifactStore(tmp_path / "a" / "b" / "receiver")
    evil = "../../../victim"
    victim = Path(os.path.normpath(b.objects / evil[:2] / evil))
    assert victim.is_relative_to(tmp_path) and not victim.is_relative_to(b.root)
    victim.mkdir(mode=0o700)
    (victim / "precious").write_text("keep me")
    outside = sorted(str(q) for q in tmp_path.rglob("*") if not q.is_relative_to(b.root))
    bad = dataclasses.replace(_repack(p, lambda rec: dict(rec, key=evil)), key=evil)
    with pytest.raises(CacheError) as refused:
        import_packed(b, bad, m, "ref", "fp32", registry=REG)
    assert (victim / "precious").read_text() == "keep me"
    assert sorted(str(q) for q in tmp_path.rglob("*") if not q.is_relative_to(b.root)) == outside
    _nothing_left(b)
    assert "not a store key" in str(refused.value)


@pytest.mark.parametrize("manifest, match", [
    ([], "JSON list, not a manifest"),
    ({"key": "x"}, "without a file list"),
    ({"files": {"../../escape": "0" * 64}}, "not a plain relative path"),
    ({"files": {"/etc/cron.d/x": "0" * 64}}, "not a plain relative path"),
], ids=["list", "no-files", "dotdot-name", "absolute-name"])
def test_a_malformed_manifest_is_refused_and_leaves_nothing(
        zoo_model, tmp_path: Path, manifest: Any, match: str) -> None:
    """A manifest that is a list is refused with an HwbError and leaves no staging directory.
    The other cases guard the name checks (refused by name, before any file is
    hashed or loaded)."""
    m = zoo_model("signal")
    p, _ = _package(m, tmp_path, "sender")
    b = ArtifactStore(tmp_path / "receiver")
    with pytest.raises(CacheError, match=match):
        import_packed(b, _repack(p, lambda rec: manifest), m, "ref", "fp32", registry=REG)
    _nothing_left(b)
    assert not (tmp_path / "escape").exists()


def test_a_file_altered_on_the_way_is_refused(zoo_model, tmp_path: Path) -> None:
    m = zoo_model("signal")
    p, _ = _package(m, tmp_path, "sender")
    b = ArtifactStore(tmp_path / "receiver")
    name = next(n for n in tarfile.open(fileobj=io.BytesIO(p.blob)).getnames()
                if n.endswith(".keras"))
    with pytest.raises(CacheError, match="sha256"):
        import_packed(b, _repack(p, flip=name), m, "ref", "fp32", registry=REG)
    _nothing_left(b)
    with pytest.raises(CacheError, match="malformed"):
        import_packed(b, dataclasses.replace(p, blob=b"not a tar"), m, "ref", "fp32", registry=REG)
    _nothing_left(b)


def test_only_files_the_manifest_lists_are_taken(zoo_model, tmp_path: Path) -> None:
    m = zoo_model("signal")
    p, key = _package(m, tmp_path, "sender")
    b = ArtifactStore(tmp_path / "receiver")
    smuggled = _repack(p, extra={"./extra.sig": b"not in the manifest", "../outside": b"x"})
    assert import_packed(b, smuggled, m, "ref", "fp32", registry=REG) == "imported"
    assert not (b.path_for(key) / "extra.sig").exists() and not (tmp_path / "outside").exists()
    assert b.get(key) is not None


def test_a_node_imports_a_peers_artifact_instead_of_compiling(
        zoo_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench_on_node`` (what a Ray task runs; identity faked, no Ray): the second node
    imports the first one's artifact, a forged one is compiled locally with the reason noted."""
    from hwbackends.fleet import node

    zoo_model("signal")  # trained once into the session store
    monkeypatch.setattr(node, "identity", lambda: {
        "node_id": "n" * 8, "hostname": "h", "label": "h·nnnnnn", "fingerprint": {}})

    def run(store: str, artifact: Packed | None) -> tuple[dict, Packed | None]:
        return node.bench_on_node("zoo:signal", None, "ref", "fp32", ["single-stream:n=20"],
                                  None, None, False, artifact, str(tmp_path / store))
    out, packed = run("first", None)
    assert packed is not None and out["imported"] is None and not out["variants"][0]["cached"]
    out2, again = run("second", packed)
    assert out2["imported"] == "imported" and out2["variants"][0]["cached"] and again is None
    forged = _repack(packed, flip=".keras")
    out3, _ = run("third", forged)
    assert out3["imported"] is None and not out3["variants"][0]["cached"]
    assert any("sha256" in n for n in out3["notes"])
