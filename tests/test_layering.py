"""Layering rules of the source tree, read from the code itself (no import is executed):

* no import cycle among the modules of ``hwbackends`` and ``hwb_plugins``, counting every
  import: inside functions and under ``if TYPE_CHECKING:`` too, since an import that closes a
  cycle there only hides it (and there is no list of edges to ignore);
* no module imports another module's ``_private`` name;
* the core never imports the built-in plugins (``hwb_plugins``): it reaches them, like any
  third-party plugin, only through the hooks. No exception, ``hwbackends/testing`` included:
  the conformance kit tests whatever target it is given by name through the registry;
* the plugins take nothing from the core but the contract (``hwbackends.contract``) and the
  layer IR (``hwbackends.layer_ir``), as a third party's would: the core can move anything
  behind them without touching a plugin;
* the layer IR is public and stands on the contract alone, so a third party's code-generating
  target can build on it without the rest of the core.
"""
from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Installed package name → source folder (pyproject's package-dir).
PACKAGES = {"hwbackends": REPO / "hwbackends", "hwb_plugins": REPO / "hwb_plugins"}
#: Generated code (grpcio-tools), not written by hand.
GENERATED = ("hwbackends.serve.proto.signal_pb2", "hwbackends.serve.proto.signal_pb2_grpc",
             "hwbackends.serve.proto.grpc_service_pb2", "hwbackends.serve.proto.grpc_service_pb2_grpc",
             "hwbackends.serve.proto.model_config_pb2")


@dataclass(frozen=True)
class Import:
    importer: str
    module: str          # the module imported (absolute)
    names: tuple[str, ...]  # names taken from it (empty for `import x`)
    line: int


def modules() -> dict[str, Path]:
    """Every module of the two packages: dotted name → file."""
    out = {}
    for pkg, root in PACKAGES.items():
        for f in root.rglob("*.py"):
            rel = f.relative_to(root).with_suffix("")
            parts = [pkg, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return {m: f for m, f in out.items() if m not in GENERATED}


def imports_of(name: str, path: Path) -> list[Import]:
    """Every import statement of module ``name`` (file ``path``), at any depth."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(name, a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[:len(base) - node.level + 1]
                mod = ".".join(parent + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append(Import(name, mod, tuple(a.name for a in node.names), node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    """Module → the project modules it imports (a name that is a submodule counts as one)."""
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for imp in imports_of(m, path):
            targets = [f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in mods]
            if imp.module in mods and len(targets) < len(imp.names) or not imp.names:
                targets.append(imp.module)
            edges[m] |= {t for t in targets if t in mods and t != m}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_walker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_subpackages_do_not_import_the_package_root():
    """``from .. import compile`` in a subpackage ties it to everything the root imports."""
    bad = [f"{m} imports {', '.join(sorted(t & set(PACKAGES)))}" for m, t in graph().items()
           if "." in m and m.split(".")[0] == "hwbackends" and t & {"hwbackends"}]
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, ("import cycles (module-level, inside functions or under "
                       "TYPE_CHECKING):\n" + "\n".join(" ↔ ".join(c) for c in found))


@pytest.mark.parametrize("source", [
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
    "def f():\n    from .b import B\n",
    "from . import b\n",
])
def test_the_cycle_check_counts_every_form_of_import(tmp_path, source):
    """An annotation-only or function-level import is an edge like a module-level one."""
    f = tmp_path / "a.py"
    f.write_text(source)
    imps = imports_of("hwbackends.a", f)
    assert "hwbackends.b" in {i.module for i in imps} | {f"{i.module}.{n}" for i in imps
                                                         for n in i.names}


def test_no_module_imports_another_modules_private_names():
    mods = modules()
    bad = []
    for m, path in mods.items():
        for imp in imports_of(m, path):
            if not (imp.module.startswith(tuple(PACKAGES))):
                continue
            private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
            # a package's own private submodule (hwb_plugins._shared) is its internal layout
            private = [n for n in private if f"{imp.module}.{n}" not in mods]
            # ... and so is its private native extension (serve/_shmloop.c behind serve/shm.py)
            pkg_dir = Path(importlib.import_module(imp.module).__file__).parent \
                if imp.module in mods and mods[imp.module].name == "__init__.py" else None
            private = [n for n in private
                       if not (pkg_dir and any(pkg_dir.glob(f"{n}.*.so")) and m.startswith(imp.module))]
            hidden = [p for p in imp.module.split(".")[1:] if p.startswith("_")
                      and not p.startswith("__")]
            sibling = imp.module.split(".")[:2] == m.split(".")[:2]
            if private or (hidden and not sibling and imp.module.split(".")[0] != "hwb_plugins"):
                bad.append(f"{m}:{imp.line} imports {', '.join(private) or imp.module} from {imp.module}")
    assert not bad, "imports of another module's private names:\n" + "\n".join(bad)


def plugin_imports(name: str, path: Path) -> list[str]:
    """Where module ``name`` imports ``hwb_plugins``: import statements (at any level, inside
    functions too) and ``importlib.import_module("hwb_plugins...")`` / ``__import__`` calls."""
    out = [f"{name}:{imp.line} imports {imp.module}" for imp in imports_of(name, path)
           if imp.module.split(".")[0] == "hwb_plugins"]
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and node.args[0].value.split(".")[0] == "hwb_plugins"
                and ast.unparse(node.func).split(".")[-1] in ("import_module", "__import__")):
            out.append(f"{name}:{node.lineno} imports {node.args[0].value} dynamically")
    return out


#: What a plugin may import of the core: the contract package and its modules.
CONTRACT = "hwbackends.contract"
#: The public layer IR, which code-generating plugins (and a third party's) build on.
LAYER_IR = "hwbackends.layer_ir"


def core_imports(name: str, path: Path, allowed: tuple[str, ...] = (CONTRACT, LAYER_IR)) -> list[str]:
    """The imports of module ``name`` that reach the core outside the packages ``allowed``."""
    out = []
    for imp in imports_of(name, path):
        mods = [imp.module] if imp.module != "hwbackends" or not imp.names else [
            f"hwbackends.{n}" for n in imp.names]
        for mod in mods:
            top = mod.split(".")[0]
            if top == "hwbackends" and not any(mod == a or mod.startswith(a + ".") for a in allowed):
                out.append(f"{name}:{imp.line} imports {mod}")
    return out


def test_plugins_import_only_the_contract():
    bad = [b for m, path in modules().items() if m.split(".")[0] == "hwb_plugins"
           for b in core_imports(m, path)]
    assert not bad, ("plugins import the core outside hwbackends.contract and hwbackends.layer_ir "
                     "(add what they need to the contract):\n" + "\n".join(bad))


def test_the_layer_ir_stands_on_the_contract_alone():
    """The IR is what a third party's code generator builds on: it takes the contract's errors
    and nothing else of the core, so it can be read (and moved) on its own."""
    ir = [m for m in modules() if m == LAYER_IR or m.startswith(LAYER_IR + ".")]
    assert len(ir) > 5, ir
    bad = [b for m in ir for b in core_imports(m, modules()[m], (CONTRACT, LAYER_IR))]
    assert not bad, "the layer IR imports the core outside the contract:\n" + "\n".join(bad)


@pytest.mark.parametrize("source, expect", [
    ("from hwbackends.errors import InputError\n", 1),
    ("def f():\n    from hwbackends import machine\n", 1),
    ("import hwbackends\n", 1),
    ("from hwbackends.contract import InputError\n", 0),
    ("from hwbackends.contract.cli import emit\n", 0),
    ("from hwbackends import contract\n", 0),
    ("from hwbackends import layer_ir as ir\n", 0),
    ("from hwbackends.layer_ir import batchnorm\n", 0),
    ("from hwbackends.layer_ir_extra import x\n", 1),
])
def test_the_contract_check_sees_every_form(tmp_path, source, expect):
    f = tmp_path / "x.py"
    f.write_text(source)
    assert len(core_imports("hwb_plugins.x", f)) == expect


def test_the_core_never_imports_the_builtin_plugins():
    """A core that imports a plugin breaks when that plugin is not installed and makes the
    built-in plugins special; their commands and report sections come through
    hwb_cli_commands / hwb_report_sections instead."""
    bad = [b for m, path in modules().items() if m.split(".")[0] == "hwbackends"
           for b in plugin_imports(m, path)]
    assert not bad, "the core imports plugins:\n" + "\n".join(bad)


@pytest.mark.parametrize("source", [
    "from hwb_plugins.fpga_hls4ml.trace import trace_layers\n",
    "def f():\n    import hwb_plugins.fpga_da4ml as d\n",
    "import importlib\nimportlib.import_module('hwb_plugins.ref')\n",
])
def test_the_plugin_import_check_sees_every_form(tmp_path, source):
    f = tmp_path / "x.py"
    f.write_text(source)
    assert len(plugin_imports("hwbackends.x", f)) == 1


@pytest.mark.parametrize("source, expect", [
    ("from .models import _reference_fn\n", ["_reference_fn"]),
    ("from .models import load_model\n", []),
])
def test_the_private_check_sees_private_names(tmp_path, source, expect):
    f = tmp_path / "x.py"
    f.write_text(source)
    imp = imports_of("hwbackends.x", f)[0]
    assert imp.module == "hwbackends.models"
    assert [n for n in imp.names if n.startswith("_")] == expect
