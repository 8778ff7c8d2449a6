"""Prune beside live use: last use is checked again at the moment of removal
(after the rename: an entry used since the scan is put back), a pinned entry is never
removed, and a reader that loses its entry to a prune sees a miss, never a raw error."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from test_trust import _commit

import hwbackends as hwb
from hwbackends.store import prune as store_prune
from hwbackends.store import signed_dir, trust
from hwbackends.store.artifacts import ArtifactStore
from hwbackends.store.build_cache import DIRNAME, BuildCache, digest
from hwbackends.store.prune import prune

DAY = 86400.0


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def _after_the_scan(monkeypatch: pytest.MonkeyPatch, then) -> None:
    """Run ``then()`` once, right after prune's scan returns (its view is stale from then on)."""
    scan = store_prune.usage

    def scan_then(store, **kw):
        u = scan(store, **kw)
        then()
        return u
    monkeypatch.setattr(store_prune, "usage", scan_then)


def test_an_entry_loaded_after_the_scan_is_not_removed(zoo_model, tmp_path, monkeypatch) -> None:
    """The stale-scan race: an entry loaded while a prune ran was evicted 11 s after use."""
    m = zoo_model("signal")
    root = tmp_path / "store"
    key = hwb.compile(m, "ref", store=root, isolate_compile=False, fidelity=False).artifact.key
    st = ArtifactStore(root)
    _age(st.path_for(key), 10 * DAY)
    loads = []
    _after_the_scan(monkeypatch, lambda: loads.append(
        hwb.compile(m, "ref", store=root, isolate_compile=False, fidelity=False)))
    r = prune(st, older_than_s=DAY)
    assert loads and loads[0].artifact.cached  # the load happened, between scan and removal
    assert r.removed == [] and r.kept_recent == 1, r
    assert st.keys() == [key] and st.get(key) is not None
    x = m.representative(8, seed=1)
    assert (loads[0].predict(x) == hwb.compile(m, "ref", store=root, isolate_compile=False,
                                               fidelity=False).predict(x)).all()


def test_an_entry_pinned_after_the_scan_is_put_back(tmp_path, monkeypatch) -> None:
    st = ArtifactStore(tmp_path / "store")
    key = "cd" * 32
    d = _commit(st, key)
    _age(d, 10 * DAY)
    with st.pinned() as pins:
        _after_the_scan(monkeypatch, lambda: pins.add(key))
        r = prune(st, max_bytes=0)
    assert r.removed == [] and r.kept_pinned == 1 and st.get(key) is not None


def test_a_use_recorded_before_the_rename_is_seen_after_it(tmp_path, monkeypatch) -> None:
    """The window between the re-check and the rename: a reader that touched the entry just
    before prune moved it away has it put back (the check runs on what was moved)."""
    st = ArtifactStore(tmp_path / "store")
    key = "ef" * 32
    d = _commit(st, key)
    _age(d, 10 * DAY)
    rename = os.rename
    seen = []

    def touch_then_rename(src, dst, **kw):
        if os.fspath(src).endswith(key) and not seen:  # prune moving the entry into tmp/
            seen.append(st.get(key))       # a reader gets in first (and records its use)
        return rename(src, dst, **kw)
    monkeypatch.setattr(os, "rename", touch_then_rename)
    r = prune(st, older_than_s=DAY)
    monkeypatch.undo()
    assert seen and seen[0] is not None
    assert r.removed == [] and r.kept_recent == 1 and st.get(key) is not None


def test_a_reader_that_loses_its_entry_midway_sees_a_miss_and_removes_nothing(
        tmp_path, monkeypatch) -> None:
    """Prune moved the entry away while it was hashed (to put it back later): the reader's
    files are no longer at the entry's path. That is a miss, not a corrupt entry to evict
    (it would evict the put-back one), and what was moved is left whole."""
    st = ArtifactStore(tmp_path / "store")
    key = "12" * 32
    d = _commit(st, key)
    sha = signed_dir.file_sha256
    away = tmp_path / "away"

    def vanish_while_hashing(*args):
        if d.exists():
            os.rename(d, away)
        return sha(*args)
    monkeypatch.setattr(signed_dir, "file_sha256", vanish_while_hashing)
    assert st.get(key) is None
    monkeypatch.undo()
    assert (away / "manifest.json").is_file() and (away / "model.bin").is_file()
    os.rename(away, d)
    assert st.get(key) is not None


def _product(tmp_path: Path) -> tuple[BuildCache, str, bytes]:
    st = ArtifactStore(tmp_path / "store")
    cache = BuildCache(st.root / DIRNAME)
    data = os.urandom(256 << 10)
    (tmp_path / "lib.a").write_bytes(data)
    name = digest("lib")
    cache.put(name, tmp_path / "lib.a")
    return cache, name, data


def test_fetch_of_a_product_pruned_after_its_check_is_a_miss(tmp_path, monkeypatch) -> None:
    cache, name, _ = _product(tmp_path)
    verify = trust.verify

    def verify_then_prune(key, record):
        ok = verify(key, record)
        cache.discard(name)  # removed between the check of its record and the copy
        return ok
    monkeypatch.setattr(trust, "verify", verify_then_prune)
    dest = tmp_path / "out.a"
    assert cache.fetch(name, dest) is False and not dest.exists()
    assert not any(p.name.startswith(".out.a") for p in tmp_path.iterdir())  # no half copy left


def test_fetch_beside_a_pruner_is_a_hit_or_a_miss_never_an_error(tmp_path) -> None:
    """53 of 60 fetches raised FileNotFoundError while a prune removed the product."""
    cache, name, data = _product(tmp_path)
    stop = threading.Event()

    def pruner() -> None:
        while not stop.is_set():
            cache.discard(name)
            cache.put(name, tmp_path / "lib.a")
    t = threading.Thread(target=pruner)
    t.start()
    got = {True: 0, False: 0}
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and min(got.values()) < 20:
            dest = tmp_path / "out.a"
            hit = cache.fetch(name, dest)
            got[hit] += 1
            if hit:
                assert dest.read_bytes() == data
                dest.unlink()
    finally:
        stop.set()
        t.join(30)
    assert got[True] + got[False] >= 20, got
