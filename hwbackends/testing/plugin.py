"""pytest plugin of the conformance kit (entry point ``pytest11``: ``hwbackends``).

Adds ``--hwb-target NAME`` (repeatable; or the ``hwb_target`` ini setting), ``--hwb-models``,
``--hwb-precisions`` and ``--hwb-store``, and the fixtures ``hwb_target_ctx`` (one :class:`Conformance` per selected
target) and ``hwb_variant`` (``(Conformance, Variant)`` per zoo model × precision). When
``--hwb-target`` is given without test paths, the kit's own test module is what runs, so
``pytest --hwb-target NAME`` works from any directory. Without ``--hwb-target`` the plugin
only registers its options: other test suites are unaffected.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .kit import Conformance, NotApplicable, Variant

KIT_MODULE = Path(__file__).with_name("test_contract.py")
_CTX = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("hwbackends", "hwbackends target conformance kit")
    g.addoption("--hwb-target", action="append", default=[], metavar="NAME",
                help="run the target conformance kit against this registered target (repeatable)")
    g.addoption("--hwb-models", default=None, metavar="M1,M2",
                help="zoo models to compile (default: every zoo model the target claims)")
    g.addoption("--hwb-precisions", default="all", metavar="all|default|P1,P2",
                help="precisions to check (default: all the target offers)")
    g.addoption("--hwb-store", default=None, metavar="PATH",
                help="artifact store for the kit's compiles (default: a fresh temporary one)")
    # A plugin project names its target once in its pytest configuration; its tests then
    # import the kit's test functions (what `hwb plugin new` generates), so `pytest` there and
    # `hwb plugin check NAME` run the same suite.
    parser.addini("hwb_target", type="args", default=[],
                  help="targets the kit's tests run against when --hwb-target is not given")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hwb_conformance: a check of the hwbackends target conformance kit")
    config.stash[_CTX] = {}
    if config.getoption("hwb_target") and config.args_source is not pytest.Config.ArgsSource.ARGS:
        # `pytest --hwb-target NAME` with no paths: run the kit, not the project's own tests.
        config.args = [str(KIT_MODULE)]


def _split(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _new(config: pytest.Config, target: str, store: Path) -> Conformance:
    precs = config.getoption("hwb_precisions")
    return Conformance(target, store, models=_split(config.getoption("hwb_models")),
                       precisions=None if precs in (None, "all") else _split(precs))


def conformance(config: pytest.Config, target: str, store_root: Path) -> Conformance:
    """The session's :class:`Conformance` for ``target`` (created once, so each variant is
    compiled once however many checks use it)."""
    cache = config.stash[_CTX]
    if target not in cache:
        cache[target] = _new(config, target, store_root / target)
    return cache[target]


def selected_targets(config: pytest.Config) -> list[str]:
    """``--hwb-target`` values, else the ``hwb_target`` ini setting."""
    return list(config.getoption("hwb_target") or config.getini("hwb_target"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    targets = selected_targets(metafunc.config)
    if "hwb_target_ctx" in metafunc.fixturenames:
        metafunc.parametrize("hwb_target_ctx", targets or [None], indirect=True,
                             ids=[t or "no-target" for t in targets or [None]])
    if "hwb_variant" in metafunc.fixturenames:
        params: list[Any] = []
        ids: list[str] = []
        for t in targets:
            tmp = _new(metafunc.config, t, Path("."))  # names only: nothing is compiled here
            try:
                vs = tmp.variants()
            except Exception as exc:  # unknown target: one param that reports it
                params.append((t, None, f"{type(exc).__name__}: {exc}"))
                ids.append(f"{t}-error")
                continue
            if not vs:
                params.append((t, None, f"{t} claims none of the selected zoo models "
                                        f"(formats {tmp.target.formats})"))
                ids.append(f"{t}-none")
            for v in vs:
                params.append((t, v, None))
                ids.append(f"{t}-{v.id}")
        metafunc.parametrize("hwb_variant", params or [(None, None, None)], indirect=True,
                             ids=ids or ["no-target"])


@pytest.fixture(scope="session")
def hwb_store_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    opt = request.config.getoption("hwb_store")
    return Path(opt) if opt else tmp_path_factory.mktemp("hwb-conformance")


@pytest.fixture
def hwb_target_ctx(request: pytest.FixtureRequest, hwb_store_root: Path) -> Conformance:
    if request.param is None:
        pytest.skip("no target selected: run `pytest --hwb-target NAME` (see `hwb targets`)")
    return conformance(request.config, request.param, hwb_store_root)


@pytest.fixture
def hwb_variant(request: pytest.FixtureRequest, hwb_store_root: Path) -> tuple[Conformance, Variant]:
    target, variant, problem = request.param
    if target is None:
        pytest.skip("no target selected: run `pytest --hwb-target NAME` (see `hwb targets`)")
    if problem:
        if "claims none" in problem:
            pytest.skip(problem)
        pytest.fail(problem)
    return conformance(request.config, target, hwb_store_root), variant


def run_check(fn: Any, *args: Any) -> str:
    """Run a kit check: NotApplicable → skip with its reason; ConformanceError → failure."""
    try:
        return fn(*args)
    except NotApplicable as exc:
        pytest.skip(exc.reason)
