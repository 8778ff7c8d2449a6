"""Shared fixtures. Compiles are cached in one store for the whole session (the point of the
store), so each (model, target, precision) is built once however many tests use it."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:
    from hwbackends.isolate import Worker

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every temporary path this run makes — its own, its child processes', Ray's (which follows
# TMPDIR) — goes under one directory of its own, removed at the end; the leftover check below
# (pytest_sessionfinish) fails the run when a test left something there, and sees this run's
# paths only, never those of another run on the same machine. HWB_TEST_KEEP_TMP=1 keeps it.
# Under pytest-xdist every worker imports this file with the controller's TMPDIR (its RUN_TMP):
# each makes its own beside the controller's, not inside it, so socket paths under it (Ray's
# plasma_store, ~60 characters below its session dir) stay within AF_UNIX's 107 bytes.
RUN_TMP = Path(tempfile.mkdtemp(prefix="hwbt-", dir=os.environ.setdefault("HWB_TEST_TMP_ROOT",
                                                                          tempfile.gettempdir())))
os.environ["TMPDIR"] = str(RUN_TMP)
tempfile.tempdir = None  # re-read TMPDIR
# One artifact store for the whole run, shared by the pytest-xdist workers (the controller
# makes it in its RUN_TMP before they start; they inherit HWB_TEST_STORE): a variant one
# worker built is a load in the other, as for two processes of one user (the store is safe
# for that: tests/test_store_races.py). Its key sits beside it, so both verify each other's
# entries. HWB_TEST_STORE set by the caller keeps a store across runs instead.
SHARED_STORE = "hwb-shared-store"
if not os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("HWB_TEST_STORE"):
    os.environ["HWB_TEST_STORE"] = str(RUN_TMP / SHARED_STORE)
# The store's signing key (hwbackends.store.trust) never lands in the user's ~/.config during tests:
# a fresh one per run, or one kept beside HWB_TEST_STORE so a reused store stays valid.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="hwb-test-config-")
os.environ["HWB_KEY_FILE"] = os.environ["HWB_TEST_STORE"].rstrip("/") + ".key"
# Nothing a test runs reaches the user's own store (~/.cache/hwbackends or their
# HWB_CACHE_DIR): a zoo memo signed with the run's key there would fail verification in the
# user's next session. Every process of the run defaults to the run's store; tests that need
# another set HWB_CACHE_DIR themselves.
os.environ["HWB_CACHE_DIR"] = os.environ["HWB_TEST_STORE"]
# A user's store cap (HWB_CACHE_MAX_SIZE) would prune the run's store under tests that expect
# a cache hit; the tests that check the cap set it themselves.
os.environ.pop("HWB_CACHE_MAX_SIZE", None)


#: Seconds each heavier module takes (2026-12-02, an AMD EPYC 2-core machine: a run beside a
#: busy loop scaled to the quiet run's 705 s; test_fleet from the quiet run, since Ray's start
#: slows far more than the rest under load; test_export_triton as on a fresh machine, where it
#: builds its Triton venv, ~65 s). The run hands modules to the xdist workers longest first
#: (this order, with --no-loadscope-reorder in the Makefile; xdist's own order is by test
#: count): a 3-test module of 95 s handed out last had left one worker idle for 61 s. A stale
#: figure only changes the order.
MODULE_SECONDS = {
    "test_docs_run": 251, "test_conformance": 138, "test_fleet": 100, "test_serve_stress": 72,
    "test_export_triton": 65, "test_export": 63, "test_fpga_classifiers": 52,
    "test_fpga_hls4ml": 50, "test_accelerators": 49, "test_cpu_native_fixed": 50, "test_hostile_names": 35,
    "test_build_cache": 36, "test_scaffold": 31, "test_cpu_targets": 31, "test_report": 31,
    "test_layer_ir_formats": 26, "test_conformance_kit": 25, "test_torch_multi_io": 23,
    "test_multi_io": 22, "test_router": 18, "test_cpu_native": 17, "test_cli_data": 15,
    "test_core": 12, "test_isolate": 12, "test_shm_trust": 12, "test_store_prune": 12,
    "test_fleet_import": 11, "test_export_hostile": 30,
    "test_cost": 39,
    "test_desk_layers": 80,
    "test_store_prune_races": 10, "test_sliding_native": 60,
    "test_cli_conventions": 60,
    "test_cpu_install": 100, "test_zoo_twins": 35, "test_report_fleet": 40,
    "test_fidelity_policy": 35, "test_compiler_manifest": 17, "test_serve_sliding": 55,
    "test_bench_sliding": 45, "test_noise_floor": 40,
    "test_fpga_layers": 230, "test_converter_errors": 100, "test_sliding_conv": 50, "test_torch_fingerprint": 12,
    "test_native_abi": 30, "test_serve_shm_native": 30, "test_int8_calibration": 16, "test_lstm_chunked": 25,
    "test_sliding_dense": 35, "test_sliding_push_weights": 106, "test_signed_dir": 20,
    "test_run_context": 30, "test_sliding_load": 25, "test_fuzz_fixed": 90, "test_fuzz_layer_ir": 60, "test_fuzz_defects": 30,
    "test_sliding_streams": 35, "test_serve_sliding_streams": 40, "test_serve_oip": 30, "test_serve_oip_clients": 60,
    "test_fuzz_multi_io": 25, "test_source_layers": 30, "test_fpga_channels_first": 40,
    "test_onnx_backend_data": 76, "test_elementwise_ops": 40, "test_fpga_da4ml": 40,
    "test_formats_cli": 15, "test_bad_inputs": 14, "test_bench": 14, "test_leftovers": 10,
    "test_deeplob": 70, "test_fuzz_conv2d": 60,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first (:data:`MODULE_SECONDS`); the order inside a module is kept."""
    items.sort(key=lambda it: -MODULE_SECONDS.get(Path(it.nodeid.split("::")[0]).stem, 0))


# -- no fork of a process JAX runs in -----------------------------------------------------------
#: Where the test process forked in Python (os.fork, a subprocess preexec_fn, multiprocessing's
#: fork) after JAX had started its threads: JAX warns "os.fork() was called ... JAX is
#: multithreaded, so this will likely lead to a deadlock", and the child may hang. Every test
#: fails that forks so (_no_fork_after_jax); fork-free forms: subprocess without preexec_fn
#: (its user=/group=/start_new_session= run in C), a fresh interpreter (tests/as_user.py).
FORKS_AFTER_JAX: list[str] = []


def jax_threads_run() -> bool:
    """Whether JAX has started its backends (and threads) in this process: what makes it
    register the fork warning (jax._src.xla_bridge); ``import jax`` alone does not."""
    xb = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(xb, "_at_fork_handler_installed", xb is not None))


def _note_fork() -> None:
    if jax_threads_run():
        FORKS_AFTER_JAX.append("".join(traceback.format_stack(limit=12)[:-1]))


os.register_at_fork(before=_note_fork)


@pytest.fixture(autouse=True)
def _no_fork_after_jax() -> Iterator[None]:
    seen = len(FORKS_AFTER_JAX)
    yield
    if len(FORKS_AFTER_JAX) > seen:
        pytest.fail("the test process forked in Python after JAX started its threads (JAX: "
                    "'os.fork() was called ... likely lead to a deadlock'); start the child "
                    "without a fork of this process: subprocess without preexec_fn, or a fresh "
                    "interpreter (tests/as_user.py). Forked at:\n" + FORKS_AFTER_JAX[-1],
                    pytrace=False)


@pytest.fixture(scope="session")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's artifact store (HWB_TEST_STORE to reuse one across runs)."""
    env = os.environ.get("HWB_TEST_STORE")
    d = Path(env) if env else tmp_path_factory.mktemp("hwb-store")
    os.environ["HWB_CACHE_DIR"] = str(d)  # the zoo's trained model lands here too
    return d


@pytest.fixture(scope="session")
def zoo_model(store_dir: Path):
    """``zoo_model(name)`` → the zoo Model, built once per session."""
    from hwbackends import zoo

    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = zoo.get(name)
        return cache[name]
    return get


@pytest.fixture(scope="session")
def compiled(store_dir: Path, zoo_model):
    """``compiled(model_name, target, precision, **kw)`` → CompiledModel, memoised per session."""
    import hwbackends as hwb

    cache: dict[tuple, object] = {}

    def get(name: str, target: str, precision: str | None = None, **kw):
        key = (name, target, precision, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = hwb.compile(zoo_model(name), target, precision, store=store_dir, **kw)
        return cache[key]
    return get


@pytest.fixture
def private_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Worker]:
    """A compile worker of this test's own, for tests whose compile kills or crashes it (a
    timeout, a segfaulting converter, Ctrl-C): the session's shared worker keeps its warm
    imports, so no later test pays a cold worker start or meets what the kill left behind."""
    from hwbackends import isolate

    w = isolate.Worker()
    monkeypatch.setattr(isolate, "_WORKER", w)  # what isolate.worker() hands every compile
    try:
        yield w
    finally:
        w.kill()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def hwb_cli():
    """``hwb_cli(*args)`` → (exit code, stdout, stderr) of ``hwb ARGS``, run in this process
    (tests/cli_run.py)."""
    from cli_run import hwb
    return hwb


# -- leftovers -------------------------------------------------------------------
#: What may stay in RUN_TMP at the end (removed with it): pytest's own temp dirs, this
#: conftest's config dir, the run's shared store and its key, ONNX Runtime's telemetry session id (kept per TMPDIR by design),
#: TensorFlow autograph's generated modules (one per converted function, never removed by TF,
#: in the process that converts), torch's compile cache (torchinductor_USER, reused across
#: runs by design) and the compile worker's private dir (hwbackends.isolate.private_dir), if
#: it is empty.
_ALLOWED = ("pytest-of-", "hwb-test-config-", ".ses", "__autograph_generated_file",
            "torchinductor_", SHARED_STORE)
_first_seen: dict[str, str] = {}


def leftovers(root: Path) -> list[Path]:
    """Paths under ``root`` that a run left behind (see :data:`_ALLOWED`)."""
    left = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if p.name.startswith(_ALLOWED):
            continue
        if p.name == f"hwb-{os.getuid()}" and p.is_dir() and not p.is_symlink():
            left += sorted(p.iterdir())  # the private dir stays; what a job put in it must not
            continue
        left.append(p)
    return left


def _sigint_state() -> tuple[object, bool]:
    import signal
    return signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.fixture(autouse=True)
def _sigint_kept(request):
    """A test (or a library it starts) that leaves SIGINT ignored, handled elsewhere or blocked
    in the main thread breaks every later Ctrl-C test — and every child process started after
    it inherits an ignored or blocked SIGINT. Put it back and say which test did it."""
    import signal
    import warnings
    before = _sigint_state()
    yield
    after = _sigint_state()
    if after != before:
        warnings.warn(f"{request.node.nodeid} left SIGINT as {after} (was {before}); restored",
                      stacklevel=2)
        signal.signal(signal.SIGINT, before[0])
        if after[1] and not before[1]:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.fixture(autouse=True)
def _note_new_temp_paths(request):
    """Remember which test a temp path first appeared after (for the leftover report)."""
    yield
    for p in leftovers(RUN_TMP):
        _first_seen.setdefault(str(p), request.node.nodeid)


#: Leftover lines the pytest-xdist workers reported (their own output never reaches the terminal).
_worker_leftovers: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist, in the controller: a worker finished; keep the leftovers it found in its RUN_TMP."""
    _worker_leftovers.extend(getattr(node, "workeroutput", {}).get("hwb_leftovers", []))


def _contents(p: Path) -> str:
    """What a leftover directory holds (its first 10 paths): which library wrote it."""
    if not p.is_dir() or p.is_symlink():
        return ""
    inside = sorted(str(q.relative_to(p)) for q in p.rglob("*"))
    return f"; holds {inside[:10]}" + (f" and {len(inside) - 10} more" if len(inside) > 10 else "")


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session, exitstatus):
    lines = [f"  {p}  (first seen after {_first_seen.get(str(p), 'a session fixture')})"
             f"{_contents(p)}" for p in leftovers(RUN_TMP)]
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller reports them
        session.config.workeroutput["hwb_leftovers"] = lines
        lines = []
    lines += _worker_leftovers
    if lines:
        msg = ("LEFTOVERS: these temporary paths were created by this run and not removed "
               "(each run cleans up what it made):\n" + "\n".join(lines))
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        (tr.write_line if tr else print)(msg)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if os.environ.get("HWB_TEST_KEEP_TMP") != "1":
        shutil.rmtree(RUN_TMP, ignore_errors=True)
