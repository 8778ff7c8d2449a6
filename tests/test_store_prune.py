"""``hwb store`` / ``hwb store prune`` (hwbackends.store.prune): what the store holds, and the
least recently used removed first, never an entry in use, never a wrong answer afterwards.

Last use is an entry directory's mtime (set at commit, touched on each load); the tests age
entries by setting it, so no test waits."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.store.artifacts import ArtifactStore
from hwbackends.store.build_cache import DIRNAME, BuildCache, digest
from hwbackends.store.prune import GRACE_S, MAX_SIZE_ENV, prune, usage

DAY = 86400.0


def _age(path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


@pytest.fixture(scope="module")
def built_store(zoo_model, tmp_path_factory):
    """A store holding zoo:mlp on two targets (both real compiles), built once."""
    root = tmp_path_factory.mktemp("prune-store")
    m = zoo_model("mlp")
    keys = {t: hwb.compile(m, t, "fp32", store=root, fidelity=False).artifact.key
            for t in ("cpu.onnxruntime", "cpu.litert")}
    return m, root, keys


@pytest.fixture
def two_variants(built_store, tmp_path):
    """A copy of :func:`built_store` of this test's own (entries are signed for their key,
    not their path; modes and mtimes copied): (model, store, {target: key})."""
    m, root, keys = built_store
    shutil.copytree(root, tmp_path / "store", symlinks=True)
    return m, ArtifactStore(tmp_path / "store"), keys


def test_usage_lists_every_artifact_with_what_it_is_and_its_size(two_variants) -> None:
    _, st, keys = two_variants
    u = usage(st)
    arts = {e.name: e for e in u.entries if e.kind == "artifact"}
    assert set(arts) == set(keys.values()), arts
    for t, k in keys.items():
        e = arts[k]
        assert e.what == f"mlp {t}:fp32"
        files = sum(p.stat().st_size for p in st.path_for(k).rglob("*") if p.is_file())
        assert e.bytes >= files > 0
    assert u.total_bytes >= u.removable_bytes == sum(e.bytes for e in u.entries)
    assert [e.last_used for e in u.entries] == sorted((e.last_used for e in u.entries), reverse=True)


def test_a_load_from_the_store_marks_the_entry_used(two_variants) -> None:
    m, st, keys = two_variants
    path = st.path_for(keys["cpu.litert"])
    _age(path, 10 * DAY)
    again = hwb.compile(m, "cpu.litert", "fp32", store=st.root, fidelity=False)
    assert again.artifact.cached and again.artifact.key == keys["cpu.litert"]
    assert time.time() - path.stat().st_mtime < 600


def test_prune_removes_the_least_recently_used_first_and_a_rebuild_answers_the_same(
        two_variants) -> None:
    m, st, keys = two_variants
    old, recent = keys["cpu.onnxruntime"], keys["cpu.litert"]
    _age(st.path_for(old), 3 * DAY)
    _age(st.path_for(recent), 1 * DAY)
    sizes = {e.name: e.bytes for e in usage(st).entries}
    x = np.random.default_rng(3).standard_normal((16, *m.inputs[0].shape)).astype(np.float32)
    want = hwb.compile(m, "cpu.onnxruntime", "fp32", store=st.root, fidelity=False).predict(x)
    _age(st.path_for(old), 3 * DAY)  # that compile was a load: a use

    dry = prune(st, max_bytes=sizes[recent], dry_run=True)
    assert [e.name for e in dry.removed] == [old] and st.path_for(old).exists()

    r = prune(st, max_bytes=sizes[recent])
    assert [e.name for e in r.removed] == [old]
    assert not st.path_for(old).exists() and st.path_for(recent).exists()
    assert {e.name for e in r.after.entries} == {recent}
    rebuilt = hwb.compile(m, "cpu.onnxruntime", "fp32", store=st.root, fidelity=False)
    assert not rebuilt.artifact.cached  # gone from the store: built again, not half-found
    np.testing.assert_array_equal(rebuilt.predict(x), want)


def test_age_limit_and_the_grace_period(two_variants) -> None:
    _, st, keys = two_variants
    for k in keys.values():
        os.utime(st.path_for(k))  # just used
    r = prune(st, max_bytes=0)  # over the limit, but used within GRACE_S: kept
    assert r.removed == [] and r.kept_recent == 2
    stale, fresh = keys["cpu.litert"], keys["cpu.onnxruntime"]
    _age(st.path_for(stale), 2 * GRACE_S)
    r = prune(st, older_than_s=GRACE_S)
    assert [e.name for e in r.removed] == [stale]
    assert not st.path_for(stale).exists() and st.path_for(fresh).exists()


def test_hwb_cache_max_size_prunes_after_each_compile(two_variants, monkeypatch, caplog) -> None:
    """ccache's max_size: with HWB_CACHE_MAX_SIZE set, each compile that commits prunes the
    least recently used entries over it (what it just built is within the grace period)."""
    m, st, keys = two_variants
    old, recent = keys["cpu.onnxruntime"], keys["cpu.litert"]
    _age(st.path_for(old), 3 * DAY)
    _age(st.path_for(recent), 1 * DAY)
    said: list[str] = []
    monkeypatch.setenv(MAX_SIZE_ENV, "1")
    new = hwb.compile(m, "cpu.onnxruntime", "int8-dynamic", store=st.root, fidelity=False,
                      progress=said.append)
    assert not new.artifact.cached
    assert st.keys() == [new.artifact.key]  # both older entries gone, the new one kept
    assert any(f"store over {MAX_SIZE_ENV}=1: removed 2 least recently used entries" in s
               for s in said), said
    x = np.ones((4, *m.inputs[0].shape), np.float32)
    assert np.isfinite(new.predict(x)).all()  # what it built is served
    # a value it cannot read: said in the log, the compile stands, nothing removed
    monkeypatch.setenv(MAX_SIZE_ENV, "lots")
    with caplog.at_level("WARNING", logger="hwbackends.store"):
        again = hwb.compile(m, "cpu.litert", "fp32", store=st.root, fidelity=False)
    assert not again.artifact.cached and len(st.keys()) == 2
    assert f"{MAX_SIZE_ENV}: 'lots' is not a size" in caplog.text


def test_pinned_entries_outlive_the_automatic_cap(two_variants, monkeypatch) -> None:
    """What ``hwb export`` does over a batch-size sweep: the variants it will copy are pinned,
    and the cap each later compile enforces removes only what is not pinned."""
    m, st, keys = two_variants
    old, recent = keys["cpu.onnxruntime"], keys["cpu.litert"]
    _age(st.path_for(old), 3 * DAY)
    _age(st.path_for(recent), 1 * DAY)
    monkeypatch.setenv(MAX_SIZE_ENV, "1")
    with ArtifactStore(st.root).pinned([old]) as pins:  # another instance, the same root
        assert st.is_pinned(old) and not st.is_pinned(recent)
        new = hwb.compile(m, "cpu.onnxruntime", "int8-dynamic", store=st.root, fidelity=False)
        pins.add(new.artifact.key)
        assert sorted(st.keys()) == sorted([old, new.artifact.key])  # the unpinned one went
        r = prune(st, max_bytes=0, now=time.time() + 2 * GRACE_S)
        assert r.removed == [] and r.kept_pinned == 2
        with st.pinned([old]):  # nested: still pinned after the inner block
            pass
        assert st.is_pinned(old)
    assert not st.is_pinned(old) and not st.is_pinned(new.artifact.key)
    r = prune(st, max_bytes=0, now=time.time() + 2 * GRACE_S)
    assert {e.name for e in r.removed} == {old, new.artifact.key} and st.keys() == []
    with pytest.raises(hwb.errors.CacheError, match="not a store key"):
        with st.pinned(["../x"]):
            pass


def test_build_products_are_listed_touched_when_fetched_and_pruned(tmp_path) -> None:
    st = ArtifactStore(tmp_path / "store")
    cache = BuildCache(st.root / DIRNAME)
    src = tmp_path / "libmodel.a"
    src.write_bytes(os.urandom(50_000))
    a, b = digest("a"), digest("b")
    cache.put(a, src)
    cache.put(b, src)
    _age(cache.path_for(a), 5 * DAY)
    _age(cache.path_for(b), 5 * DAY)
    assert cache.fetch(b, tmp_path / "out.a")  # a use: b is now the most recent
    u = usage(st)
    assert [(e.kind, e.name, e.what) for e in u.entries] == [
        ("build product", b, "libmodel.a"), ("build product", a, "libmodel.a")]
    assert all(e.bytes >= 50_000 for e in u.entries)
    r = prune(st, older_than_s=DAY)
    assert [e.name for e in r.removed] == [a]
    assert not cache.fetch(a, tmp_path / "o2.a") and cache.fetch(b, tmp_path / "o3.a")


def test_idle_lock_files_go_and_a_held_one_stays(tmp_path) -> None:
    st = ArtifactStore(tmp_path / "store")
    idle, busy = digest("idle"), digest("busy")
    with st.build_lock(idle):
        pass
    holding, release = threading.Event(), threading.Event()

    def builder() -> None:
        with st.build_lock(busy):
            holding.set()
            release.wait(30)

    t = threading.Thread(target=builder)
    t.start()
    try:
        assert holding.wait(30)
        r = prune(st, older_than_s=DAY)
        assert r.locks_removed == 1
        assert not (st.root / "locks" / f"{idle}.lock").exists()
        lock = st.root / "locks" / f"{busy}.lock"
        assert lock.exists()
        fd = os.open(lock, os.O_RDWR)
        try:  # still held by the builder
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        release.set()
        t.join(30)


def test_prune_needs_a_limit() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        prune(ArtifactStore("/nonexistent-never-created"))


def test_cli_lists_and_prunes(two_variants, hwb_cli, capsys) -> None:
    _, st, _ = two_variants
    root = str(st.root)
    rc, out, _ = hwb_cli("store", "--cache-dir", root)
    assert rc == 0 and f"store {st.root}" in out and "mlp cpu.litert:fp32" in out, out
    with pytest.raises(SystemExit) as no_limit:  # no limit at all: a usage error too
        hwb_cli("store", "--cache-dir", root, "prune")
    err = capsys.readouterr().err
    assert no_limit.value.code == 2, err
    assert "usage: hwb store prune" in err and "give --max-size SIZE" in err and "--older-than AGE" in err, err
    with pytest.raises(SystemExit) as usage_error:  # argparse: a usage error
        hwb_cli("store", "prune", "--max-size", "2 bananas", "--cache-dir", root)
    err = capsys.readouterr().err
    assert usage_error.value.code == 2 and "'2 bananas' is not a size" in err and "800M, 2G" in err, err
    for k in st.keys():
        _age(st.path_for(k), 2 * DAY)
    rc, out, _ = hwb_cli("store", "--cache-dir", root, "prune", "--max-size", "0", "--dry-run")
    assert rc == 0 and out.startswith("would remove 2 artifact(s)") and len(st.keys()) == 2, out
    rc, out, _ = hwb_cli("store", "--cache-dir", root, "--json", "prune", "--older-than", "1d")
    r = json.loads(out)
    assert rc == 0 and len(r["removed"]) == 2 and not r["after"]["entries"] and st.keys() == []
