"""Generate the hook and contract reference in ``docs/plugins.md`` from the code's docstrings.

The reference between the two markers is written from ``hwbackends/hookspecs.py`` and the
contract classes (``Target``, ``Executor``, ``CompileOptions``, ``Artifact``, ``Converter``,
``Availability``, ``Mode``, ``TensorSpec``, the errors), so the docs cannot drift from the
code. ``tests/test_plugin_docs.py`` fails when a hook or a public contract class, method or
``Target`` attribute has no documentation, or when the generated section is stale.

    python -m hwbackends.docgen            # rewrite the generated section of docs/plugins.md
    python -m hwbackends.docgen --check    # exit 1 (and say so) if it is stale
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import inspect
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable

from . import errors, hookspecs, specs, target
from .target import CONTRACT_VERSION, Target

BEGIN = ("<!-- BEGIN GENERATED REFERENCE: written by `python -m hwbackends.docgen` from "
         "hwbackends/hookspecs.py and the contract docstrings; edit those, not this section -->")
END = "<!-- END GENERATED REFERENCE -->"
DEFAULT_DOC = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def contract_objects() -> list[Any]:
    """The public contract a plugin author works with, in the order the reference lists it."""
    objs: list[Any] = [target.Target, target.Executor, target.BufferedExecutor,
                       target.CompileOptions, target.Artifact,
                       target.TritonForm, target.TritonFile,
                       target.Converter, target.check_io, target.several,
                       specs.Availability, specs.Mode,
                       specs.TensorSpec]
    errs = [c for _, c in inspect.getmembers(errors, inspect.isclass)
            if issubclass(c, errors.HwbError) and c.__module__ == errors.__name__]
    return objs + sorted(errs, key=lambda c: (c is not errors.HwbError, c.__name__))


def hook_specs(module: ModuleType | None = None) -> list[tuple[str, Callable[..., Any], dict[str, Any]]]:
    """``(name, function, options)`` of every hook spec in ``module`` (default: hookspecs)."""
    mod = module or hookspecs
    marker = f"{hookspecs.PROJECT}_spec"
    out = []
    for name, fn in vars(mod).items():
        opts = getattr(fn, marker, None)
        if inspect.isfunction(fn) and opts is not None:
            out.append((name, fn, dict(opts)))
    return out


def target_attributes(cls: type) -> list[tuple[str, str, str]]:
    """``(name, default, doc)`` of the class attributes, documented by ``#:`` comments."""
    src = textwrap.dedent(inspect.getsource(cls)).splitlines()
    out, doc = [], []
    for line in src:
        s = line.strip()
        if s.startswith("#:"):
            doc.append(s[2:].strip())
            continue
        m = re.match(r"(\w+)\s*:\s*ClassVar\[.*?\]\s*=\s*(.+)$", s)
        if m:
            out.append((m.group(1), m.group(2), " ".join(doc)))
        doc = [] if not s.startswith("#:") else doc
    return out


#: Underscored methods that are part of the contract: what an executor subclass calls or
#: implements (they are underscored so they stay out of the executor's public surface).
SUBCLASS_API = ("_init_io", "_run", "_check", "_buffers")


def _public_methods(cls: type) -> list[tuple[str, Any]]:
    out = []
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for name, obj in vars(cls).items():
        if (name.startswith("_") and name not in SUBCLASS_API) or name in fields:
            continue
        fn = obj.__func__ if isinstance(obj, (classmethod, staticmethod)) else obj
        if isinstance(fn, property):
            out.append((name, fn))
        elif inspect.isfunction(fn):
            out.append((name, fn))
    return out


def missing_docs(hooks_module: ModuleType | None = None,
                 objects: Iterable[Any] | None = None) -> list[str]:
    """Everything of the plugin contract that has no documentation (empty = complete)."""
    missing = [f"hook {name}" for name, fn, _ in hook_specs(hooks_module) if not inspect.getdoc(fn)]
    for obj in objects if objects is not None else contract_objects():
        label = obj.__name__
        if not (obj.__doc__ or "").strip():
            missing.append(f"{label}")
        if inspect.isclass(obj):
            for name, fn in _public_methods(obj):
                if not (getattr(fn, "__doc__", None) or "").strip():
                    missing.append(f"{label}.{name}")
            if obj is Target or (inspect.isclass(obj) and issubclass(obj, Target)):
                missing += [f"{label}.{n} (add a #: comment above it)"
                            for n, _, doc in target_attributes(obj) if not doc]
    return missing


_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc):`~?([^`]+)`")


def md(text: str) -> str:
    """reStructuredText-ish docstring → Markdown (roles and double backticks)."""
    text = _ROLE.sub(lambda m: f"`{m.group(1).split('.')[-1]}`", text)
    text = text.replace("``", "`")
    return text.replace("::\n", ":\n")


def _sig(fn: Any) -> str:
    try:
        s = str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(…)"
    return s.replace("'", "").replace('"', "")


def _doc(obj: Any) -> str:
    return md(inspect.getdoc(obj) or "")


def _indent_code(doc: str) -> str:
    """Docstring code blocks (indented after a ``::`` line) → fenced blocks."""
    out, in_code = [], False
    for line in doc.splitlines():
        if line.startswith("    ") and (in_code or (out and out[-1] == "" )):
            if not in_code:
                out.append("```")
                in_code = True
            out.append(line[4:])
            continue
        if in_code and line.strip():
            out.append("```")
            in_code = False
        out.append(line)
    if in_code:
        out.append("```")
    return "\n".join(out)


def render() -> str:
    """The generated reference (Markdown, without the markers)."""
    parts = [f"Contract version: **{CONTRACT_VERSION}** (`hwbackends.CONTRACT_VERSION`).", "",
             "### Hooks", ""]
    for name, fn, opts in hook_specs():
        flags = [k for k, v in sorted(opts.items()) if v is True]
        parts += [f"#### `{name}{_sig(fn)}`", ""]
        if flags:
            parts += ["Options: " + ", ".join(f"`{f}`" for f in flags), ""]
        parts += [_indent_code(_doc(fn)), ""]
    parts += ["### Contract classes", ""]
    for obj in contract_objects():
        kind = "function" if inspect.isfunction(obj) else "class"
        head = f"{obj.__name__}{_sig(obj)}" if kind == "function" else obj.__name__
        bases = ""
        if inspect.isclass(obj) and issubclass(obj, Exception):
            bases = " (" + ", ".join(b.__name__ for b in obj.__bases__) + ")"
        parts += [f"#### `{head}`{bases}", "", f"`{obj.__module__}.{obj.__name__}`", "",
                  _indent_code(_doc(obj)), ""]
        if obj is Target:
            parts += ["| attribute | default | meaning |", "|---|---|---|"]
            for n, default, doc in target_attributes(obj):
                parts.append(f"| `{n}` | `{default}` | {md(doc)} |")
            parts.append("")
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
            rows = [f"| `{f.name}` | `{_cell(f.type)}` | `{_cell(_default(f))}` |"
                    for f in dataclasses.fields(obj) if not f.name.startswith("_")]
            parts += ["| field | type | default |", "|---|---|---|", *rows, ""]
        if inspect.isclass(obj) and issubclass(obj, enum.Enum):
            parts += ["Members: " + ", ".join(f"`{m.name}` (`{m.value!r}`)" for m in obj), ""]
        if inspect.isclass(obj) and not issubclass(obj, Exception):
            for n, fn in _public_methods(obj):
                if isinstance(fn, property):
                    parts += [f"- **`{n}`** (property): {_first_para(fn)}"]
                else:
                    parts += [f"- **`{n}{_sig(fn)}`**: {_first_para(fn)}"]
            parts.append("")
    return re.sub(r"\n{3,}", "\n\n", "\n".join(parts)).strip() + "\n"


def _cell(text: Any) -> str:
    """A value for a Markdown table cell (a bare ``|`` would split the cell)."""
    return str(text).replace("|", "\\|")


def _default(f: "dataclasses.Field[Any]") -> str:
    if f.default is not dataclasses.MISSING:
        # a function's repr carries its address: not reproducible, so name it instead
        return "a function" if callable(f.default) else repr(f.default)
    return "(factory)" if f.default_factory is not dataclasses.MISSING else "required"


def _first_para(fn: Any) -> str:
    doc = _doc(fn).strip()
    return " ".join(doc.split("\n\n")[0].split()) if doc else ""


def splice(text: str, body: str, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with the generated section between the ``begin`` and ``end`` marker lines
    replaced by ``body`` (every generated section of the docs is spliced by this)."""
    if begin not in text or end not in text:
        raise ValueError(f"the markers are missing; add these two lines where the generated "
                         f"section goes:\n{begin}\n{end}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n\n{body}\n{end}{tail}"


def is_current(path: Path = DEFAULT_DOC) -> bool:
    text = path.read_text()
    return splice(text, render()) == text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hwbackends.docgen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the generated section is stale")
    ap.add_argument("path", nargs="?", type=Path, default=DEFAULT_DOC)
    a = ap.parse_args(argv)
    missing = missing_docs()
    if missing:
        print("undocumented parts of the plugin contract: " + ", ".join(missing), file=sys.stderr)
    text = a.path.read_text()
    new = splice(text, render())
    if a.check:
        if new != text:
            print(f"{a.path}: the generated reference is stale; run python -m hwbackends.docgen",
                  file=sys.stderr)
            return 1
        return 1 if missing else 0
    if new != text:
        a.path.write_text(new)
        print(f"{a.path}: reference regenerated")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
