"""The one signed-record-on-disk primitive (hwbackends.store.signed_dir) and the one private
directory helper (hwbackends.store.trust.private_dir), tested directly and through the surfaces
that use them: ``hwb bench``'s profile cache, the zoo's memo, ``hwb store``.

A record that is missing, unsigned, edited, of another format version or for another key is
a miss (evicted; the caller rebuilds); something another party could have changed on the way
(a symlink, another owner, a group/world-writable path) is refused with a StoreTrustError that
says what to do, and nothing outside is read, changed or removed."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path

import pytest
import test_zoo_memo

from hwbackends.errors import CacheError, StoreTrustError
from hwbackends.store import trust
from hwbackends.store.signed_dir import SignedDir

KEY = "ab" * 32
own_store = test_zoo_memo.own_store  # the fixture: a store (HWB_CACHE_DIR) of the test's own


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def sd(tmp_path: Path) -> SignedDir:
    return SignedDir(tmp_path / "d", "test dir", 3)


def test_a_written_entry_reads_back_and_every_kind_of_damage_is_a_miss(sd: SignedDir) -> None:
    rec = sd.write(KEY, {"what": "x"}, {"blob": b"payload", "sub/more": b"more"})
    assert rec is not None and rec["format"] == 3 and rec["key"] == KEY and rec["hmac"]
    entry = sd.read(KEY)
    assert entry is not None and entry.record["what"] == "x"
    assert (entry.path / "blob").read_bytes() == b"payload"
    d = sd.path_for(KEY)
    assert d.stat().st_mode & 0o777 == 0o700 and (d / "blob").stat().st_mode & 0o777 == 0o600
    assert sd.write(KEY, {"what": "second"}, {"blob": b"other"}) is None  # the first stands
    assert sd.read(KEY).record["what"] == "x"

    def damaged(change) -> bool:
        sd.write(KEY, {"what": "x"}, {"blob": b"payload"})
        change(d)
        gone = sd.read(KEY) is None and not os.path.lexists(d)
        return gone

    def edit_record(d: Path, **kv) -> None:
        r = json.loads((d / "record.json").read_text())
        (d / "record.json").write_text(json.dumps(r | kv))

    def resign(d: Path, **kv) -> None:  # validly signed with the user's key, but other content
        r = json.loads((d / "record.json").read_text()) | kv
        r["hmac"] = trust.sign(sd.key, r)
        (d / "record.json").write_text(json.dumps(r))

    assert damaged(lambda d: (d / "blob").write_bytes(b"payloaD"))       # a changed file
    assert damaged(lambda d: (d / "extra").write_bytes(b"planted"))      # an extra file
    assert damaged(lambda d: (d / "blob").unlink())                      # a missing file
    assert damaged(lambda d: (d / "record.json").unlink())               # no record
    assert damaged(lambda d: edit_record(d, what="y"))                   # edited: no longer verifies
    assert damaged(lambda d: edit_record(d, hmac="0" * 64))              # unsigned / forged
    assert damaged(lambda d: resign(d, format=2))                        # an older format version
    assert damaged(lambda d: resign(d, key="cd" * 32))                   # moved from another key
    assert sd.read(KEY) is None and sd.keys() == []
    with pytest.raises(CacheError, match="not a test dir key"):
        sd.path_for("../" + "a" * 61)


def test_links_are_refused_and_never_followed(sd: SignedDir, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    other = SignedDir(outside, "test dir", 3)
    other.write(KEY, {"what": "genuine, but outside"}, {"blob": b"outside"})
    before = _tree(outside)
    sd.root.mkdir(mode=0o700)
    (sd.root / "ab").symlink_to(outside / "ab")          # a linked ab/: refused, not read
    with pytest.raises(StoreTrustError, match=r"d/ab is a symlink.*Remove it"):
        sd.read(KEY)
    with pytest.raises(StoreTrustError, match="symlink"):
        sd.write(KEY, {"what": "x"}, {"blob": b"x"})
    assert sd.evict(KEY) is False and sd.keys() == []
    (sd.root / "ab").unlink()
    (sd.root / "ab").mkdir(mode=0o700)
    (sd.root / "ab" / KEY).symlink_to(outside / "ab" / KEY)   # a linked entry
    with pytest.raises(StoreTrustError, match="symlink"):
        sd.read(KEY)
    assert sd.evict(KEY) is True and not os.path.lexists(sd.root / "ab" / KEY)  # the link
    assert _tree(outside) == before and other.read(KEY) is not None


def test_record_files_and_the_data_file_beside_them(tmp_path: Path) -> None:
    sd = SignedDir(tmp_path / "z", "zoo", 1, fanout=False, suffix=".hmac")
    path = sd.write_file("m.onnx", {"note": 1}, b"weights")
    assert path == tmp_path / "z" / "m.onnx" and path.read_bytes() == b"weights"
    assert sd.read_bytes("m.onnx") == b"weights" and sd.keys() == ["m.onnx"]
    path.write_bytes(b"weightS")  # edited: a miss, and both files go
    assert sd.read_bytes("m.onnx") is None
    assert not path.exists() and not (tmp_path / "z" / "m.onnx.hmac").exists()
    sd.write_file("m.onnx", {}, b"weights")
    sd.write_file("m.onnx", {}, b"retrained")  # a re-write replaces both
    assert sd.read_bytes("m.onnx") == b"retrained"
    with pytest.raises(CacheError, match="not a zoo key"):
        sd.path_for("m.onnx.hmac")


def test_private_dir_creates_0700_and_refuses_what_others_could_change(tmp_path: Path) -> None:
    d = trust.private_dir(tmp_path / "a" / "b", "scratch directory")
    assert all((p.stat().st_mode & 0o777) == 0o700 for p in (tmp_path / "a", d))
    assert trust.private_dir(d, "scratch directory") == d  # an existing private one is fine
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StoreTrustError, match=r"scratch directory .*link is a symlink.*rm "):
        trust.private_dir(tmp_path / "link", "scratch directory")
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(StoreTrustError, match=r"writable by others.*chmod 700"):
        trust.private_dir(tmp_path / "open", "scratch directory")
    (tmp_path / "readable").mkdir()
    (tmp_path / "readable").chmod(0o755)
    trust.private_dir(tmp_path / "readable", "scratch directory")
    with pytest.raises(StoreTrustError, match=r"open to others.*chmod 700"):
        trust.private_dir(tmp_path / "readable", "scratch directory", closed=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreTrustError, match="not a directory"):
        trust.private_dir(tmp_path / "file", "scratch directory")


# -- through the users' public surfaces (own_store: a store of the test's own) -----------------
def _bench(hwb_cli, store: Path, out: Path) -> tuple[int, str, str]:
    return hwb_cli("bench", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "30",
                   "--use-cache", "-o", str(out), "--cache-dir", str(store))


def test_hwb_bench_remeasures_a_tampered_profile_and_a_linked_one_is_refused(
        hwb_cli, store_dir: Path, own_store: Path, tmp_path: Path) -> None:
    """The artifacts come from the session's store (``--cache-dir``), the profiles go to this
    test's own (``HWB_CACHE_DIR``). (The cache's hit itself:
    tests/test_bench.py::test_profile_cache_hit_and_miss.)"""
    from hwbackends.bench import ProfileCache

    out = tmp_path / "r.json"
    rc, _, err = _bench(hwb_cli, store_dir, out)
    assert rc == 0, err
    (entry,) = (own_store / "profiles").glob("*/*.json")
    cache = ProfileCache(own_store / "profiles")
    assert cache.get(entry.stem) is not None  # what the next --use-cache run would reuse
    rec = json.loads(entry.read_text())
    rec["profile"]["p99_us"] = 0.001  # "this variant is the fastest"
    entry.write_text(json.dumps(rec))
    rc, _, err = _bench(hwb_cli, store_dir, out)
    assert rc == 0 and "from cache" not in err, err  # not believed: measured again
    assert json.loads(out.read_text())["profiles"][0]["p99_us"] != 0.001
    again = cache.get(entry.stem)
    assert again is not None and again.p99_us != 0.001  # and kept, signed, for the next run
    # the profiles' ab/ swapped for a link to a planted profile: refused, with what to do
    # (through hwb, a linked store directory: tests/test_store_links.py, hwb store prune)
    planted = tmp_path / "planted"
    SignedDir(planted, "profile cache", 2, suffix=".json").write_file(
        entry.stem, {"profile": rec["profile"]})
    ab = entry.parent
    for p in ab.iterdir():
        p.unlink()
    ab.rmdir()
    ab.symlink_to(planted / ab.name)
    with pytest.raises(StoreTrustError, match=rf"{ab} is a symlink.*Remove it"):
        cache.get(entry.stem)
    assert cache.clear() == 0 and SignedDir(planted, "profile cache", 2, suffix=".json").keys()


def test_a_zoo_memo_of_the_old_format_is_rebuilt_not_misread(own_store: Path) -> None:
    """The memo was signed with a bare hex HMAC beside it (``NAME.model.json.hmac``); that is
    now no record at all: the memo is a miss, the model built and the memo written anew."""
    from hwbackends import zoo

    zoo.get("mlp")
    memo = own_store / "zoo" / "mlp.model.json"
    sidecar = memo.with_name(memo.name + ".hmac")
    assert "obj" not in vars(zoo.get("mlp"))  # deferred: the memo is used
    sidecar.write_text(hmac.new(trust.load_key(), memo.read_bytes(), hashlib.sha256).hexdigest())
    m = zoo.get("mlp")
    assert "obj" in vars(m), "an old-format memo was used"
    assert json.loads(sidecar.read_text())["files"]["mlp.model.json"] == hashlib.sha256(
        memo.read_bytes()).hexdigest()
    assert "obj" not in vars(zoo.get("mlp"))  # the rewritten memo is used from then on
