"""The store root is pinned (no check-then-use),
an entry is bound to its key, and the key file, profile cache and shared-group rules hold.

A "second user" is uid 65534 (``nobody``): files, directories and symlinks are chown'ed to
it, which needs root (or CAP_CHOWN); those tests skip with the reason elsewhere."""
from __future__ import annotations

import grp
import os
import pwd
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from test_trust import OTHER_UID, _can_chown, _chown_tree, _commit

import hwbackends as hwb
from hwbackends import zoo
from hwbackends.bench.profile import LatencyProfile
from hwbackends.bench.profile_cache import ProfileCache
from hwbackends.errors import StoreTrustError
from hwbackends.registry import get_registry
from hwbackends.store import signed_dir, trust
from hwbackends.store.artifacts import ArtifactStore

KEY = "ab" * 32


def _need_chown(tmp_path: Path) -> None:
    why = _can_chown(tmp_path)
    if why:
        pytest.skip(why)


def _swap_link(link: Path, to: Path) -> None:
    """Point ``link`` at ``to`` atomically (as someone who can write its directory would)."""
    new = link.with_name(link.name + ".new")
    new.symlink_to(to)
    os.replace(new, link)


def _other_signal():
    """The zoo's signal model with other weights: same inputs and outputs, another function."""
    import keras

    km = keras.models.load_model(zoo.signal_path())
    km.set_weights([w * -1.5 + 0.01 for w in km.get_weights()])
    return hwb.load_model(km, name="signal-other")


def _ref_loads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Where the ``ref`` target's ``load()`` reads each artifact from (real paths)."""
    seen: list[Path] = []
    cls = type(get_registry().target("ref"))
    orig = cls.load

    def load(self, artifact, options):
        seen.append(Path(os.path.realpath(artifact.path)))
        return orig(self, artifact, options)
    monkeypatch.setattr(cls, "load", load)
    return seen


# -- 4. the root is resolved and pinned once ---------------------------------------------------
def test_a_root_reached_through_another_users_symlink_is_refused(tmp_path: Path):
    """The link itself is the other user's: they can point it anywhere after the check."""
    _need_chown(tmp_path)
    mine = ArtifactStore(tmp_path / "mine")
    _commit(mine, KEY)
    link = tmp_path / "store-link"
    link.symlink_to(tmp_path / "mine")
    os.lchown(link, OTHER_UID, OTHER_UID)
    with pytest.raises(StoreTrustError, match=rf"symlink.*{link}.*uid {OTHER_UID}"):
        ArtifactStore(link).get(KEY)
    # the same link owned by this user is followed, to the real directory
    os.lchown(link, os.getuid(), os.getgid())
    st = ArtifactStore(link)
    assert st.get(KEY) is not None and st.root == (tmp_path / "mine").resolve()


def test_a_link_swapped_after_the_check_is_not_followed_by_the_load(
        zoo_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A link raced between check and load: checked through the link, then loaded through it
    again after it was pointed at another user's copy. The load reads from what was checked."""
    _need_chown(tmp_path)
    m = zoo_model("signal")
    (tmp_path / "mine").mkdir(mode=0o700)
    link = tmp_path / "store-link"
    link.symlink_to(tmp_path / "mine")
    hwb.compile(m, "ref", store=link, isolate_compile=False, fidelity=False)
    theirs = tmp_path / "theirs"
    shutil.copytree(tmp_path / "mine", theirs, symlinks=True)
    _chown_tree(theirs, OTHER_UID)
    before = sorted(str(p) for p in theirs.rglob("*"))

    check_tree = trust.check_tree

    def check_then_swap(d, gid):
        check_tree(d, gid)
        _swap_link(link, theirs)  # between the check and the load
    monkeypatch.setattr(trust, "check_tree", check_then_swap)
    loads = _ref_loads(monkeypatch)
    cm = hwb.compile(m, "ref", store=link, isolate_compile=False, fidelity=False)
    assert cm.artifact.cached
    assert loads and all(p.is_relative_to((tmp_path / "mine").resolve()) for p in loads), loads
    assert sorted(str(p) for p in theirs.rglob("*")) == before, "the other user's tree changed"


def test_evict_after_a_swap_stays_in_the_pinned_store(tmp_path: Path):
    """evict() through a swapped link moves no entry of the other tree."""
    _need_chown(tmp_path)
    (tmp_path / "mine").mkdir(mode=0o700)
    link = tmp_path / "store-link"
    link.symlink_to(tmp_path / "mine")
    st = ArtifactStore(link)
    d = _commit(st, KEY)
    assert st.get(KEY) is not None
    theirs = tmp_path / "theirs"
    shutil.copytree(tmp_path / "mine", theirs, symlinks=True)
    _chown_tree(theirs, OTHER_UID)
    before = sorted(str(p) for p in theirs.rglob("*"))
    _swap_link(link, theirs)
    st.evict(KEY)
    assert not d.exists(), "the genuine entry was not evicted"
    assert sorted(str(p) for p in theirs.rglob("*")) == before, "the other user's tree changed"


@pytest.mark.parametrize("when", ["before-the-tree-check", "while-hashing"])
def test_an_entry_evicted_meanwhile_is_absent_not_a_raw_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str):
    """A concurrent eviction is a miss, never a raw FileNotFoundError."""
    st = ArtifactStore(tmp_path / "store")
    d = _commit(st, KEY)
    if when == "before-the-tree-check":
        check_tree = trust.check_tree

        def vanish_then_check(path, gid):
            shutil.rmtree(d)
            check_tree(path, gid)
        monkeypatch.setattr(trust, "check_tree", vanish_then_check)
    else:
        sha = signed_dir.file_sha256

        def vanish_then_hash(*args):
            shutil.rmtree(d, ignore_errors=True)
            return sha(*args)
        monkeypatch.setattr(signed_dir, "file_sha256", vanish_then_hash)
    assert st.get(KEY) is None


# -- 5. an entry is bound to its key ----------------------------------------------------------
def test_a_signed_entry_moved_under_another_key_is_not_served(zoo_model, tmp_path: Path):
    """Another model's correctly signed entry renamed into this key's directory is not served
    (served, it would answer 1.78 off; with fidelity on, corr -0.21)."""
    st = ArtifactStore(tmp_path / "store")
    mine, other = zoo_model("signal"), _other_signal()
    cm = hwb.compile(mine, "ref", store=st, isolate_compile=False, fidelity=False)
    cm_other = hwb.compile(other, "ref", store=st, isolate_compile=False, fidelity=False)
    d, d_other = st.path_for(cm.artifact.key), st.path_for(cm_other.artifact.key)
    shutil.rmtree(d)
    os.rename(d_other, d)
    x = mine.representative(64, seed=5)
    assert not np.allclose(cm_other.predict(x), mine.reference(x), atol=0.05), "models too alike"
    again = hwb.compile(mine, "ref", store=st, isolate_compile=False)
    assert not again.artifact.cached, "the moved entry was served from the cache"
    np.testing.assert_allclose(again.predict(x), mine.reference(x), atol=1e-5)
    assert again.fidelity.corr > 0.9999
    rec = st.get(cm.artifact.key)
    assert rec["key"] == cm.artifact.key and rec["key_parts"]["fingerprint"] == mine.fingerprint


# -- minors -----------------------------------------------------------------------------------
def test_a_key_file_that_is_a_fifo_is_refused_without_blocking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fifo = tmp_path / "store.key"
    os.mkfifo(fifo, 0o600)
    monkeypatch.setenv("HWB_KEY_FILE", str(fifo))
    got: list[BaseException | bytes] = []

    def load():
        try:
            got.append(trust.load_key())
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            got.append(exc)
    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # today's behaviour: blocked in open(); release it, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        pytest.fail("load_key() blocked on a FIFO key file")
    assert isinstance(got[0], StoreTrustError) and "FIFO" in str(got[0]) and str(fifo) in str(got[0])


def test_a_key_file_that_is_a_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    d = tmp_path / "store.key"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("HWB_KEY_FILE", str(d))
    with pytest.raises(StoreTrustError, match=rf"{d} is a directory.*regular file"):
        trust.load_key()


def test_profile_cache_files_and_dirs_are_private(tmp_path: Path):
    root = tmp_path / "cache" / "profiles"
    pc = ProfileCache(root)
    prof = LatencyProfile("ref:fp32", "ref", "fp32", 1, "single-stream", {}, "hardware", 10,
                          1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.1)
    pc.put("cd" * 32, prof)
    f = root / "cd" / f"{'cd' * 32}.json"
    assert pc.get("cd" * 32) is not None
    assert f.stat().st_mode & 0o777 == 0o600
    for p in (tmp_path / "cache", root, f.parent):
        assert p.stat().st_mode & 0o777 == 0o700, p


def test_a_group_writable_file_of_a_non_member_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _need_chown(tmp_path)
    gid = os.getgid()
    group = grp.getgrgid(gid)
    try:
        other = pwd.getpwuid(OTHER_UID)
        if other.pw_gid == gid or other.pw_name in group.gr_mem:
            pytest.skip(f"uid {OTHER_UID} is a member of {group.gr_name} here")
    except KeyError:
        pass  # no such user: a member of nothing
    monkeypatch.setenv("HWB_STORE_GROUP", group.gr_name)
    st = ArtifactStore(tmp_path / "store")
    d = _commit(st, KEY)
    f = d / "model.bin"
    os.chown(f, OTHER_UID, gid)
    f.chmod(0o660)
    with pytest.raises(StoreTrustError, match=rf"{f}.*uid {OTHER_UID}.*not a member of "
                                              rf"HWB_STORE_GROUP={group.gr_name}"):
        st.get(KEY)
    os.chown(f, os.getuid(), gid)  # a member's (here: this user's) group-writable file is fine
    assert st.get(KEY) is not None
