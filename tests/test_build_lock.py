"""One build per store key at a time (ArtifactStore.build_lock): a second compile of the same
variant, in another thread or process sharing the store, waits for the first build and loads
it instead of repeating it; a builder that dies releases the lock with its process."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import hwbackends as hwb
from hwbackends.registry import get_registry


@pytest.fixture
def slow_ref_builds(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The ``ref`` target's compile, 1.5 s slower (in this process: isolate_compile=False);
    returns the list of build start times."""
    cls = type(get_registry().target("ref"))
    orig, starts = cls.compile, []

    def compile(self, model, options, workdir):
        starts.append(time.monotonic())
        time.sleep(1.5)
        return orig(self, model, options, workdir)
    monkeypatch.setattr(cls, "compile", compile)
    return starts


def _compile(model, store: Path, said: list[str]):
    return hwb.compile(model, "ref", store=store, isolate_compile=False, fidelity=False,
                       progress=said.append)


def test_two_threads_compiling_one_variant_build_it_once(zoo_model, tmp_path, slow_ref_builds):
    m = zoo_model("mlp")
    results: dict[int, object] = {}
    said: dict[int, list[str]] = {0: [], 1: []}

    def run(i: int) -> None:
        results[i] = _compile(m, tmp_path / "store", said[i])
    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(slow_ref_builds) == 1, said
    built, waited = sorted((0, 1), key=lambda i: results[i].artifact.cached)
    assert not results[built].artifact.cached and results[waited].artifact.cached
    assert results[built].artifact.key == results[waited].artifact.key
    assert any("another process is building it" in s for s in said[waited]), said[waited]
    assert not any("another process" in s for s in said[built])


_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def test_a_builder_killed_mid_build_releases_the_key_to_the_next(zoo_model, tmp_path,
                                                                 slow_ref_builds):
    """A process holding the key's lock (a build in progress) is SIGKILLed before it
    commits: the waiting compile goes on at once and builds the variant itself."""
    m = zoo_model("mlp")
    store = tmp_path / "store"
    key = _compile(m, store, []).artifact.key  # the key (and a store) to contend for
    hwb.ArtifactStore(store).evict(key)
    slow_ref_builds.clear()
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(store / "locks" / f"{key}.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        said: list[str] = []
        out: list[object] = []
        t = threading.Thread(target=lambda: out.append(_compile(m, store, said)))
        t.start()
        deadline = time.monotonic() + 30
        while not any("another process is building it" in s for s in said):
            assert time.monotonic() < deadline and t.is_alive(), said
            time.sleep(0.02)
        assert not slow_ref_builds, "built while another process held the key"
        holder.send_signal(signal.SIGKILL)
        t.join(60)
        (cm,) = out
        assert not cm.artifact.cached and len(slow_ref_builds) == 1
    finally:
        holder.kill()
        holder.wait()
