"""Shared fixtures. Compiles are cached in one store for the whole session (the point of the
store), so each (model, target, precision) is built once however many tests use it."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The store's signing key (hwbackends.trust) never lands in the user's ~/.config during tests:
# a fresh one per run, or one kept beside HWB_TEST_STORE so a reused store stays valid.
if os.environ.get("HWB_TEST_STORE"):
    os.environ.setdefault("HWB_KEY_FILE", os.environ["HWB_TEST_STORE"].rstrip("/") + ".key")
else:
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="hwb-test-config-")
    os.environ.pop("HWB_KEY_FILE", None)


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
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def hwb_cli(capsys):
    """``hwb_cli(*args)`` → (exit code, stdout, stderr) of ``hwb ARGS``, run in this process."""
    from hwbackends.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        rc = main(list(args))
        out = capsys.readouterr()
        return rc, out.out, out.err
    return run
