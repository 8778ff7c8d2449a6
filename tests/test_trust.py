"""The artifact store's trust model: nothing planted is loaded.

Ownership tests chown directories to another uid (``nobody``, 65534); they need root (or
CAP_CHOWN) and skip with the reason elsewhere."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hwbt_targets import SoTarget, plugin

import hwbackends as hwb
from hwbackends import zoo
from hwbackends.errors import StoreTrustError
from hwbackends.registry import build_registry
from hwbackends.store import trust
from hwbackends.store.artifacts import MANIFEST, ArtifactStore, file_sha256

OTHER_UID = 65534


def _can_chown(tmp_path: Path) -> str | None:
    probe = tmp_path / "chown-probe"
    probe.touch()
    try:
        os.chown(probe, OTHER_UID, OTHER_UID)
    except PermissionError as exc:
        return f"cannot chown to uid {OTHER_UID} here ({exc}); run as root to test ownership"
    finally:
        probe.unlink()
    return None


def _chown_tree(d: Path, uid: int) -> None:
    os.chown(d, uid, uid)
    for dirpath, dirnames, filenames in os.walk(d):
        for n in dirnames + filenames:
            os.chown(Path(dirpath) / n, uid, uid, follow_symlinks=False)


def _commit(st: ArtifactStore, key: str, payload: bytes = b"model") -> Path:
    staged = st.stage()
    (staged / "model.bin").write_bytes(payload)
    st.commit(staged, key, {"target": "t"})
    return st.path_for(key)


# -- ownership and modes ---------------------------------------------------------------------
def test_store_creates_private_dirs_files_and_key(tmp_path: Path):
    st = ArtifactStore(tmp_path / "store")
    d = _commit(st, "ab" * 32)
    assert (st.root.stat().st_mode & 0o777) == 0o700
    assert (d.stat().st_mode & 0o777) == 0o700
    assert (d / "model.bin").stat().st_mode & 0o777 == 0o600
    assert (d / MANIFEST).stat().st_mode & 0o777 == 0o600
    key = trust.key_path()
    assert key.stat().st_mode & 0o777 == 0o600
    # the run's key, beside its shared store (tests/conftest.py), never the user's ~/.config
    assert str(key) == os.environ["HWB_KEY_FILE"]
    assert not key.resolve().is_relative_to(Path("~/.config").expanduser().resolve())


@pytest.mark.parametrize("where", ["root", "entry", "file"])
def test_writable_by_others_is_refused_with_the_fix(tmp_path: Path, where: str):
    st = ArtifactStore(tmp_path / "store")
    d = _commit(st, "ab" * 32)
    path = {"root": st.root, "entry": d, "file": d / "model.bin"}[where]
    path.chmod(path.stat().st_mode | 0o022)
    with pytest.raises(StoreTrustError, match=rf"{path}.*chmod (700|600) {path}"):
        st.get("ab" * 32)
    assert path.exists(), "a refused path is not deleted behind the user's back"


def test_a_symlink_inside_an_entry_is_refused(tmp_path: Path):
    st = ArtifactStore(tmp_path / "store")
    d = _commit(st, "ab" * 32)
    (d / "extra").symlink_to("/etc/passwd")
    with pytest.raises(StoreTrustError, match="symlink"):
        st.get("ab" * 32)


def test_a_shared_group_may_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import grp
    gid = os.getgid()
    monkeypatch.setenv("HWB_STORE_GROUP", grp.getgrgid(gid).gr_name)
    st = ArtifactStore(tmp_path / "store")
    d = _commit(st, "ab" * 32)
    for p in (st.root, st.objects, d.parent, d, d / "model.bin", d / MANIFEST):
        os.chown(p, -1, gid)
        p.chmod(p.stat().st_mode | 0o020)
    assert st.get("ab" * 32) is not None
    d.chmod(d.stat().st_mode | 0o002)  # world-writable stays refused
    with pytest.raises(StoreTrustError, match="writable by others"):
        st.get("ab" * 32)


def test_key_file_others_can_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HWB_KEY_FILE", str(tmp_path / "cfg" / "store.key"))
    key = trust.load_key()
    assert len(key) == trust.KEY_BYTES and trust.load_key() == key
    (tmp_path / "cfg" / "store.key").chmod(0o644)
    with pytest.raises(StoreTrustError, match="chmod 600"):
        trust.load_key()


def test_a_store_owned_by_another_user_is_refused_before_any_library_is_loaded(
        zoo_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    why = _can_chown(tmp_path)
    if why:
        pytest.skip(why)
    reg = build_registry(entry_points=False)
    reg.register(plugin(SoTarget()), "hwbt")
    ours = tmp_path / "ours"
    hwb.compile(zoo_model("mlp"), "fpga.hwbt_so", store=ours, registry=reg, fidelity=False,
                isolate_compile=False)
    # Another local user's cache holding an fpga.hls4ml-style entry whose .so has a constructor.
    theirs = tmp_path / "theirs"
    shutil.copytree(ours, theirs)
    _chown_tree(theirs, OTHER_UID)
    marker = tmp_path / "constructor-ran"
    monkeypatch.setenv("HWBT_MARKER", str(marker))
    with pytest.raises(StoreTrustError, match=rf"{theirs}.*uid {OTHER_UID}.*chown"):
        hwb.compile(zoo_model("mlp"), "fpga.hwbt_so", store=theirs, registry=reg, fidelity=False,
                    isolate_compile=False)
    assert not marker.exists(), "the planted library's constructor ran"
    # Only the store root is another user's: the entry inside is refused just the same.
    os.chown(theirs, os.getuid(), os.getgid())
    with pytest.raises(StoreTrustError, match=f"uid {OTHER_UID}"):
        hwb.compile(zoo_model("mlp"), "fpga.hwbt_so", store=theirs, registry=reg, fidelity=False,
                    isolate_compile=False)
    assert not marker.exists(), "the planted library's constructor ran"
    # The marker works: loading the planted library does run its constructor.
    ctypes.CDLL(str(next(theirs.rglob("lib.so"))))
    assert marker.exists()


# -- signatures and stored outputs ------------------------------------------------------------
def _other_mlp():
    """The zoo's MLP architecture with other weights: same I/O, different function."""
    m = zoo.keras_mlp()
    m.set_weights([w * -1.5 + 0.01 for w in m.get_weights()])
    return hwb.load_model(m, name="mlp-other")


def _entry(st: ArtifactStore, cm) -> Path:
    return st.path_for(cm.artifact.key)


def _rehash(d: Path, *, files_empty: bool = False, key: bytes | None = None) -> None:
    rec = json.loads((d / MANIFEST).read_text())
    rec["files"] = {} if files_empty else {r: file_sha256(d / r) for r in rec["files"]}
    if key is not None:
        rec["hmac"] = trust.sign(key, rec)
    (d / MANIFEST).write_text(json.dumps(rec))


@pytest.mark.parametrize("edit", ["rehash", "files-empty", "resigned-with-key"])
def test_another_models_artifact_planted_in_an_entry_is_never_returned(
        zoo_model, tmp_path: Path, edit: str):
    """Another model's model.tflite copied into an entry with its manifest re-hashed (or
    "files": {}) is not returned as a cached compile; with the key re-signed as well, the
    stored outputs still catch it."""
    st = ArtifactStore(tmp_path / "store")
    mine, other = zoo_model("mlp"), _other_mlp()
    cm = hwb.compile(mine, "cpu.litert", "fp32", store=st, isolate_compile=False, fidelity=False)
    cm_other = hwb.compile(other, "cpu.litert", "fp32", store=st, isolate_compile=False,
                           fidelity=False)
    d, d_other = _entry(st, cm), _entry(st, cm_other)
    tflites = [p.relative_to(d) for p in d.rglob("*.tflite")]
    assert tflites, "expected a .tflite in the LiteRT entry"
    for rel in tflites:
        shutil.copy(d_other / rel, d / rel)
    _rehash(d, files_empty=edit == "files-empty",
            key=st.key if edit == "resigned-with-key" else None)

    x = mine.representative(16, seed=5)
    again = hwb.compile(mine, "cpu.litert", "fp32", store=st, isolate_compile=False, fidelity=False)
    assert not again.artifact.cached, "the planted artifact was returned from the cache"
    np.testing.assert_allclose(again.predict(x), mine.reference(x), atol=1e-4)
    assert not np.allclose(cm_other.predict(x), mine.reference(x), atol=1e-2), "test models too alike"
    # and the rebuilt entry is valid again
    assert hwb.compile(mine, "cpu.litert", "fp32", store=st, isolate_compile=False,
                       fidelity=False).artifact.cached


def test_an_extra_file_in_an_entry_invalidates_it(tmp_path: Path):
    st = ArtifactStore(tmp_path / "store")
    d = _commit(st, "ab" * 32)
    (d / "evil.so").write_bytes(b"\x7fELF")
    (d / "evil.so").chmod(0o600)
    assert st.get("ab" * 32) is None and not d.exists()


def test_listing_entries_shows_only_verified_manifests(tmp_path: Path):
    st = ArtifactStore(tmp_path / "store")
    _commit(st, "ab" * 32)
    bad = _commit(st, "cd" * 32)
    rec = json.loads((bad / MANIFEST).read_text())
    rec["target"] = "gpu.tensorrt"  # edited after signing
    (bad / MANIFEST).write_text(json.dumps(rec))
    listed = list(st.entries())
    assert [e["target"] for e in listed] == ["t"] and not bad.exists()


# -- the zoo's trained model --------------------------------------------------------------------
def test_a_planted_zoo_model_is_not_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A planted zoo/signal-v1.keras is not served (it would pass with fidelity 1.0)."""
    monkeypatch.setenv("HWB_CACHE_DIR", str(tmp_path / "cache"))
    trained: list[int] = []

    def train(epochs: int = 4):
        trained.append(1)
        return zoo.keras_mlp(), None
    monkeypatch.setattr(zoo, "keras_signal", train)
    zdir = tmp_path / "cache" / "zoo"
    zdir.mkdir(parents=True, mode=0o700)
    (tmp_path / "cache").chmod(0o700)
    planted = zdir / f"signal-{zoo.SIGNAL_VERSION}.keras"
    zoo.keras_conv1d().save(planted)
    planted_bytes = planted.read_bytes()
    path = zoo.signal_path()
    assert trained == [1], "the planted file was used instead of retraining"
    assert path.read_bytes() != planted_bytes
    assert zoo.signal_path() == path and trained == [1], "a signed model is reused"
    # the same file, edited after signing, is retrained again
    path.write_bytes(path.read_bytes() + b"\0")
    zoo.signal_path()
    assert trained == [1, 1]
