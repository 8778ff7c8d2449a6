"""``hwb store`` and ``hwb store prune`` never follow a symlink inside the store:
a linked ``objects/ab`` must not make prune delete a directory outside the store, nor
``profiles -> /usr`` make ``hwb store`` walk /usr. The walk goes through directory fds (hwbackends.store.dirfd):
a link is listed, prune unlinks the ones where the store writes none (below objects/,
build-cache/, tmp/, locks/) and leaves a top-level one, and nothing outside is read or
removed."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hwbackends.store.artifacts import ArtifactStore
from hwbackends.store.build_cache import DIRNAME, BuildCache, digest

DAY = 86400.0
KEY = "ab" * 32


def _old(path: Path) -> None:
    t = time.time() - 30 * DAY
    os.utime(path, (t, t), follow_symlinks=False)


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` and its bytes (what must be left untouched)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _outside_entry(tmp_path: Path, name: str) -> Path:
    """A directory outside the store shaped like store entries (``<name>/abab…/marker``), old."""
    out = tmp_path / name
    victim = out / KEY
    victim.mkdir(parents=True)
    (victim / "marker").write_bytes(b"not the store's" * 1000)
    (out / "marker").write_bytes(b"outside")
    for p in (victim, out):
        _old(p)
    return out


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    st = ArtifactStore(tmp_path / "store")
    st.check_root()
    (st.root / "objects").mkdir(mode=0o700)
    return st


def test_prune_never_follows_a_linked_objects_dir_and_unlinks_it(store, tmp_path, hwb_cli) -> None:
    outside = _outside_entry(tmp_path, "outside")
    elsewhere = _outside_entry(tmp_path, "elsewhere")
    before = {p: _tree(p) for p in (outside, elsewhere)}
    (store.root / "objects" / "ab").symlink_to(outside)           # where an ab/ dir belongs
    (store.root / "objects" / "cd").mkdir(mode=0o700)
    (store.root / "objects" / "cd" / ("cd" * 32)).symlink_to(elsewhere / KEY)  # where an entry belongs
    root = str(store.root)

    rc, out, _ = hwb_cli("store", "--cache-dir", root, "--json")
    u = json.loads(out)
    assert rc == 0 and u["entries"] == [], u  # nothing outside listed as an entry
    assert {link["path"]: link["target"] for link in u["links"]} == {
        "objects/ab": str(outside), f"objects/cd/{'cd' * 32}": str(elsewhere / KEY)}
    rc, out, _ = hwb_cli("store", "--cache-dir", root)
    assert rc == 0 and "2 symlink(s) in the store" in out and f"objects/ab -> '{outside}'" in out, out

    rc, out, _ = hwb_cli("store", "--cache-dir", root, "prune", "--older-than", "1d")
    assert rc == 0, out
    assert {p: _tree(p) for p in (outside, elsewhere)} == before, "a file outside the store changed"
    assert (elsewhere / KEY).is_dir() and (outside / KEY).is_dir()
    assert "2 symlink(s) in the store removed" in out, out
    assert not os.path.lexists(store.root / "objects" / "ab")  # the links, not what they name
    assert not os.path.lexists(store.root / "objects" / "cd" / ("cd" * 32))


def test_listing_never_walks_a_linked_profiles_dir(store, tmp_path, hwb_cli) -> None:
    """``profiles -> /usr`` made ``hwb store`` walk /usr: here a big tree, counted as kept."""
    big = tmp_path / "big"
    (big / "sub").mkdir(parents=True)
    (big / "sub" / "blob").write_bytes(os.urandom(4 << 20))
    (store.root / "profiles").symlink_to(big)
    (store.root / "zoo").mkdir(mode=0o700)
    (store.root / "zoo" / "m.keras").write_bytes(b"z" * 10_000)
    rc, out, _ = hwb_cli("store", "--cache-dir", str(store.root), "--json")
    u = json.loads(out)
    assert rc == 0 and "profiles" not in u["kept_bytes"], u  # 4 MiB outside, not counted
    assert u["kept_bytes"]["zoo"] >= 10_000 and u["total_bytes"] < 1 << 20, u
    assert u["links"] == [{"path": "profiles", "target": str(big)}]
    rc, out, _ = hwb_cli("store", "--cache-dir", str(store.root), "prune", "--max-size", "0")
    assert rc == 0 and (store.root / "profiles").is_symlink(), out  # a top-level link stays
    assert "1 symlink(s) in the store left in place" in out and (big / "sub" / "blob").exists()


def test_prune_refuses_a_linked_tmp_and_sweeps_nothing_through_it(store, tmp_path, hwb_cli) -> None:
    """Prune renames what it removes into tmp/ and sweeps old stagings there: through a link
    that removed every old directory of another tree."""
    outside = _outside_entry(tmp_path, "outside")
    before = _tree(outside)
    (store.root / "tmp").symlink_to(outside)
    rc, out, err = hwb_cli("store", "--cache-dir", str(store.root), "prune", "--older-than", "1d")
    assert _tree(outside) == before and (outside / KEY).is_dir()
    assert rc == 1 and f"{store.root / 'tmp'} is a symlink" in err, (out, err)


def test_a_linked_build_cache_dir_is_not_followed(store, tmp_path, hwb_cli) -> None:
    """The same for build products: ``build-cache/ab -> outside`` is listed, never entered."""
    cache = BuildCache(store.root / DIRNAME)
    src = tmp_path / "lib.a"
    src.write_bytes(b"x" * 5000)
    name = digest("real")
    cache.put(name, src)
    _old(cache.path_for(name))
    outside = _outside_entry(tmp_path, "outside")
    before = _tree(outside)
    (store.root / DIRNAME / "ab").symlink_to(outside)
    assert cache.names() == [name]  # the linked ab/ lists nothing
    rc, out, _ = hwb_cli("store", "--cache-dir", str(store.root), "--json", "prune", "--max-size", "0")
    r = json.loads(out)
    assert rc == 0 and [e["name"] for e in r["removed"]] == [name], r
    assert r["links_removed"] == [{"path": f"{DIRNAME}/ab", "target": str(outside)}]
    assert _tree(outside) == before


def test_evict_never_follows_a_linked_ab_dir(store, tmp_path) -> None:
    """The compile's own eviction (a corrupt or refused entry) goes the same way."""
    outside = _outside_entry(tmp_path, "outside")
    before = _tree(outside)
    (store.root / "objects" / "ab").symlink_to(outside)
    removed = store.evict(KEY)
    assert _tree(outside) == before
    assert removed is False


def _profile():
    from hwbackends.bench.profile import LatencyProfile

    return LatencyProfile("ref:fp32", "ref", "fp32", 1, "single-stream", {}, "hardware", 10,
                          1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.1)


@pytest.mark.parametrize("where", ["root", "ab"])
def test_the_profile_cache_reads_and_clears_nothing_through_a_link(tmp_path, where) -> None:
    """ProfileCache reads through the store's path checks, and clear() unlinks nothing through a
    linked root (``*/*.json``)."""
    from hwbackends.bench import ProfileCache
    from hwbackends.errors import StoreTrustError

    key = "cd" * 32
    elsewhere = tmp_path / "elsewhere"
    ProfileCache(elsewhere).put(key, _profile())  # a genuine, signed profile, outside
    before = _tree(elsewhere)
    root = tmp_path / "store" / "profiles"
    if where == "root":
        root.parent.mkdir(mode=0o700)
        root.symlink_to(elsewhere)
    else:
        root.mkdir(mode=0o700, parents=True)
        (root / "cd").symlink_to(elsewhere / "cd")
    pc = ProfileCache(root)
    with pytest.raises(StoreTrustError, match="symlink"):
        pc.get(key)
    with pytest.raises(StoreTrustError, match="symlink"):
        pc.put(key, _profile())
    assert pc.clear() == 0
    assert _tree(elsewhere) == before


def test_a_commit_is_never_moved_through_a_linked_ab_dir(store, tmp_path) -> None:
    from hwbackends.errors import StoreTrustError

    outside = tmp_path / "outside"
    outside.mkdir()
    (store.root / "objects" / "ab").symlink_to(outside)
    staged = store.stage()
    (staged / "model.bin").write_bytes(b"model")
    with pytest.raises(StoreTrustError, match=r"objects/ab is a symlink"):
        store.commit(staged, KEY, {"target": "t"})
    assert list(outside.iterdir()) == []
