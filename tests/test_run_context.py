"""One context for a run and one variant label, through the API
a caller touches: ``compile(context=)``, ``export(context=)``, ``bench_model(context=)``,
``Router``'s lanes, ``label``/``parse_label``; and, read from the code itself, that only the
run's entries look the registry up or build a store.

The compile, export and bench tests run test plugins' instant targets (``cpu.test_context``,
``fpga.test_batchfree``) in a registry of their own, so what they see can only have come
through the context: the global registry does not hold those targets, and the global store is
not the one given."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from build_cost_targets import BatchFreeTarget, plugin
from run_context_targets import BUILT, ContextTarget

import hwbackends as hwb
from hwbackends.bench import ProfileCache, SingleStream, bench_model
from hwbackends.config import RouterConfig
from hwbackends.context import RunContext
from hwbackends.errors import ConfigError
from hwbackends.export import export
from hwbackends.labels import label, parse_label
from hwbackends.registry import build_registry, get_registry
from hwbackends.router import Lane
from hwbackends.store.artifacts import ArtifactStore

ROOT = Path(__file__).resolve().parents[1]
TARGET = "fpga.test_batchfree"


def _context(tmp_path: Path, said: list[str]) -> RunContext:
    reg = build_registry(entry_points=False)
    reg.register(plugin(BatchFreeTarget(str(tmp_path / "built"))), "ctx-test")
    return RunContext(store=ArtifactStore(tmp_path / "store"), registry=reg,
                      profiles=ProfileCache(tmp_path / "profiles"), progress=said.append)


def test_bench_model_uses_the_store_registry_cache_and_progress_it_is_given(tmp_path) -> None:
    said: list[str] = []
    ctx = _context(tmp_path, said)
    assert TARGET not in get_registry().targets  # only the context's registry has it
    res = bench_model("zoo:mlp", ["*"], ["fp32"], [SingleStream(n=30, warmup=2)], context=ctx,
                      bars=False)
    assert [a["target"] for a in res.availability] == [TARGET]
    (rec,) = res.variants
    assert rec.ok and rec.artifact_key in ctx.store.keys()  # built into the given store
    # the compile's own progress lines reached the same callback as the bench's
    assert any(f"{TARGET}:fp32 built in" in m for m in said), said
    assert any("fidelity" in m for m in said), said
    assert len(res.profiles) == 1 and not res.profiles[0].interrupted
    # the fresh profile was kept in the context's cache: a run that reuses profiles takes it
    said.clear()
    again = bench_model("zoo:mlp", ["*"], ["fp32"], [SingleStream(n=30, warmup=2)], context=ctx,
                        bars=False, reuse_profiles=True)
    assert any("profile from cache" in m for m in said), said
    assert again.profiles[0].created == res.profiles[0].created
    # without reuse it is measured again (and the cache refreshed), as `hwb bench` does
    said.clear()
    third = bench_model("zoo:mlp", ["*"], ["fp32"], [SingleStream(n=30, warmup=2)], context=ctx,
                        bars=False)
    assert not any("profile from cache" in m for m in said)
    assert third.profiles[0].created > res.profiles[0].created


def test_a_lane_takes_its_settings_from_the_router_config() -> None:
    """The lane has no defaults of its own: a lane built without settings samples as the
    config's ``[router]`` table does, and that default is the one docs/routing.md shows."""
    lane = Lane("s", [_Fake()], 1e9)
    default = RouterConfig()
    assert (lane.window, lane.sample_every, lane.switch_after, lane.switch_margin,
            lane.retry_after_s, lane.breaker_failures) == (
        default.window, default.sample_every, default.switch_after, default.switch_margin,
        default.retry_after_s, default.breaker_failures)
    doc = (ROOT / "docs" / "routing.md").read_text()
    shown = re.search(r"^sample_every = (\d+)", doc, re.M)
    assert shown and int(shown.group(1)) == default.sample_every == 4
    tuned = Lane("s", [_Fake()], 1e9, RouterConfig(window=50, sample_every=1, switch_after=5))
    assert (tuned.window, tuned.sample_every, tuned.switch_after) == (50, 1, 5)


class _Fake:
    """A candidate the lane can hold (it is never called here)."""

    variant, mode, p99_us = "a:fp32", "hardware", None

    class cm:  # noqa: N801 - the candidate's compiled model, as the lane reads it
        inputs = outputs = ()
        batch_size = 1

        @staticmethod
        def predict_into(x, out) -> None:
            out[...] = x


def test_label_and_parse_label_are_inverse() -> None:
    for target, precision in [("cpu.litert", "int8"), ("fpga.hls4ml", "ap_fixed<16,6>"),
                              ("cpu.native", "")]:
        text = label(target, precision)
        assert parse_label(text) == (target, precision, None)
    assert label("cpu.litert", "fp32") == "cpu.litert:fp32"
    assert label("tpu.xla", "") == "tpu.xla"  # a target never built has no precision


# -- compile and export through a context ----------------------------------------------------

def _own_context(tmp_path: Path, said: list[str]) -> RunContext:
    """A private store and a registry holding only ``cpu.test_context``."""
    reg = build_registry(entry_points=False)
    reg.register(plugin(ContextTarget()), "ctx-test-export")
    return RunContext(store=ArtifactStore(tmp_path / "store"), registry=reg, progress=said.append)


def test_compile_and_export_use_the_store_registry_and_progress_of_their_context(
        tmp_path, zoo_model, store_dir) -> None:
    said: list[str] = []
    ctx = _own_context(tmp_path, said)
    name = ContextTarget.name
    assert name not in get_registry().targets  # only the context's registry has it
    m = zoo_model("mlp")
    cm = hwb.compile(m, name, context=ctx, gate=False)
    assert cm.target == name and not cm.artifact.cached
    assert ctx.store.keys() == [cm.artifact.key]  # built into the given store...
    assert cm.artifact.key not in ArtifactStore(store_dir).keys()  # ...not the default one
    assert any(f"{name}:fp32 built in" in s for s in said), said
    with pytest.raises(hwb.UnknownTargetError, match=name):  # the default registry lacks it
        hwb.compile(m, name, gate=False)

    said.clear()
    res = export(m, name, "files", tmp_path / "out", context=ctx)
    (out,) = res.files
    assert out.name == BUILT and out.read_text() == cm.artifact.file(BUILT).read_text()
    # the export's compile loaded what the first one put into the context's store
    assert ctx.store.keys() == [cm.artifact.key]
    assert any(f"{name}:fp32 cached artifact {cm.artifact.key[:12]}" in s for s in said), said

    # the loose keywords are the same context, built at the call
    loose = hwb.compile(m, name, store=tmp_path / "loose", registry=ctx.registry, gate=False)
    assert ArtifactStore(tmp_path / "loose").keys() == [loose.artifact.key] == [cm.artifact.key]


def test_a_context_and_loose_pieces_together_are_refused(tmp_path) -> None:
    ctx = RunContext.at(tmp_path / "store")
    with pytest.raises(ConfigError, match=r"compile\(\) got context= and store=, progress=: .*"
                                          r"not both"):
        hwb.compile("zoo:mlp", "ref", context=ctx, store=tmp_path / "other", progress=print)
    with pytest.raises(ConfigError, match=r"export\(\) got context= and store=: "):
        export("zoo:mlp", "ref", "triton", tmp_path / "out", context=ctx, store=tmp_path)
    with pytest.raises(ConfigError, match=r"compile\(context=\) takes a hwbackends.RunContext; "
                                          r"got PosixPath"):
        hwb.compile("zoo:mlp", "ref", context=tmp_path)
    assert not (tmp_path / "out").exists() and not (tmp_path / "other").exists()


# -- only the entries look resources up (read from the code) ----------------------------------

CORE = ROOT / "hwbackends"

#: The only core files that may look up the process-wide registry (``get_registry``) or build
#: an artifact store (``ArtifactStore(...)``), and why. Everything else receives the run's
#: from its caller (a RunContext, or the registry from one).
LOOKUPS_ALLOWED = {
    "hwbackends/context.py": "RunContext's defaults: the one door",
    "hwbackends/registry.py": "defines get_registry; register_plugin (hwb.register_plugin) adds to it",
    "hwbackends/__init__.py": "the top-level API: hwb.targets()",
    "hwbackends/cli/": "the commands: each is its run's entry",
    "hwbackends/zoo.py": "the zoo's own cache beside the default store: a zoo:NAME model loads "
                         "with no run",
}

#: Where the core builds a RunContext (besides context.py and the CLI commands): the
#: top-level API calls that take one or its pieces loose, a fleet node's tasks, the kit.
ENTRIES = {
    ("hwbackends/compiler/__init__.py", "compile"),
    ("hwbackends/export/__init__.py", "export"),
    ("hwbackends/bench/harness.py", "bench_model"),
    ("hwbackends/router/__init__.py", "from_config"),
    ("hwbackends/fleet/runner.py", "run_fleet"),
    ("hwbackends/fleet/node.py", "node_info"),
    ("hwbackends/fleet/node.py", "bench_on_node"),
    ("hwbackends/testing/context.py", "__post_init__"),
    ("hwbackends/testing/context.py", "compile_variant"),
}

WATCHED = ("get_registry", "ArtifactStore", "RunContext")


def resource_uses(source: str) -> list[tuple[str, int, str]]:
    """``(kind, line, enclosing function)`` for each lookup in ``source``: ``get_registry``
    (any use of it but its import: a call, or the function handed on), ``ArtifactStore()``
    (the class called, or handed to a call as a factory) and ``RunContext()`` (built, with
    ``.at`` or ``.given`` too); names imported under another name are followed."""
    tree = ast.parse(source)
    alias = {w: w for w in WATCHED}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            alias.update({a.asname or a.name: a.name for a in node.names if a.name in WATCHED})
    out: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, fn: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = node.name
        if isinstance(node, (ast.Name, ast.Attribute)) and _named(node, alias) == "get_registry":
            out.append(("get_registry", node.lineno, fn))
        if isinstance(node, ast.Call):
            out.extend((kind, line, fn) for kind, line in _built(node, alias))
        for child in ast.iter_child_nodes(node):
            visit(child, fn)

    visit(tree, "<module>")
    return out


def _named(node: ast.AST, alias: dict[str, str]) -> str | None:
    """Which of :data:`WATCHED` ``node`` names (a name, or an attribute of a module)."""
    if isinstance(node, ast.Name):
        return alias.get(node.id)
    if isinstance(node, ast.Attribute) and node.attr in WATCHED:
        return node.attr
    return None


def _built(call: ast.Call, alias: dict[str, str]) -> list[tuple[str, int]]:
    """The stores and contexts ``call`` builds: the class called (a context also through
    ``.at``/``.given``), or handed to the call as a factory (not to a type test)."""
    out = []
    called = _named(call.func, alias)
    if called in ("ArtifactStore", "RunContext"):
        out.append((f"{called}()", call.lineno))
    if (isinstance(call.func, ast.Attribute) and call.func.attr in ("at", "given")
            and _named(call.func.value, alias) == "RunContext"):
        out.append(("RunContext()", call.lineno))
    if not (isinstance(call.func, ast.Name) and call.func.id in ("isinstance", "issubclass")):
        for a in [*call.args, *(k.value for k in call.keywords)]:
            if _named(a, alias) in ("ArtifactStore", "RunContext"):
                out.append((f"{_named(a, alias)}()", a.lineno))
    return out


def _core_uses() -> list[tuple[str, str, int, str]]:
    return [(f.relative_to(ROOT).as_posix(), kind, line, fn)
            for f in sorted(CORE.rglob("*.py")) for kind, line, fn in resource_uses(f.read_text())]


def _allowed(rel: str) -> str | None:
    return next((k for k in LOOKUPS_ALLOWED if rel == k or (k.endswith("/") and rel.startswith(k))),
                None)


def test_only_the_runs_entries_look_up_the_registry_or_build_a_store() -> None:
    bad, used = [], set()
    for rel, kind, line, fn in _core_uses():
        if kind not in ("get_registry", "ArtifactStore()"):
            continue
        where = _allowed(rel)
        if where is None:
            bad.append(f"{rel}:{line} in {fn}(): {kind}")
        else:
            used.add(where)
    assert not bad, ("core modules that look up the registry or build a store themselves; take "
                     "them from the caller's RunContext (ctx.registry, ctx.store) or the registry "
                     "passed down:\n  " + "\n  ".join(bad))
    assert used == set(LOOKUPS_ALLOWED), f"allowed but unused (remove): {set(LOOKUPS_ALLOWED) - used}"


def test_only_the_entries_build_a_run_context() -> None:
    bad, seen = [], set()
    for rel, kind, line, fn in _core_uses():
        if kind != "RunContext()" or rel == "hwbackends/context.py" or rel.startswith("hwbackends/cli/"):
            continue
        if (rel, fn) in ENTRIES:
            seen.add((rel, fn))
        else:
            bad.append(f"{rel}:{line} in {fn}()")
    assert not bad, ("a RunContext built below the run's entry: take the caller's instead\n  "
                     + "\n  ".join(bad))
    assert seen == ENTRIES, f"listed entries that build none (remove): {ENTRIES - seen}"


@pytest.mark.parametrize("source, expect", [
    ("def f():\n    return get_registry().targets", [("get_registry", 2, "f")]),
    ("from hwbackends.registry import get_registry as g\nr = g()", [("get_registry", 2, "<module>")]),
    ("import hwbackends.registry as R\ndef f():\n    R.get_registry()", [("get_registry", 3, "f")]),
    ("x = field(default_factory=get_registry)", [("get_registry", 1, "<module>")]),
    ("def f(p):\n    return ArtifactStore(p)", [("ArtifactStore()", 2, "f")]),
    ("from hwbackends.store.artifacts import ArtifactStore as S\nS()", [("ArtifactStore()", 2, "<module>")]),
    ("import hwbackends.store.artifacts as a\na.ArtifactStore()", [("ArtifactStore()", 2, "<module>")]),
    ("x = field(default_factory=ArtifactStore)", [("ArtifactStore()", 1, "<module>")]),
    ("def f():\n    return RunContext.at(None)", [("RunContext()", 2, "f")]),
    ("class C:\n    def g(self):\n        return RunContext()", [("RunContext()", 3, "g")]),
    ("def f(c):\n    return RunContext.given(c, 'f')", [("RunContext()", 2, "f")]),
    # what is not a lookup: a type test, an annotation, a context's own fields
    ("def f(s: ArtifactStore, c: RunContext) -> bool:\n    return isinstance(s, ArtifactStore)", []),
    ("def f(ctx):\n    return ctx.registry, ctx.store, ctx.with_profiles()", []),
])
def test_the_lookup_scan_sees_every_form(source, expect) -> None:
    assert resource_uses(source) == expect
