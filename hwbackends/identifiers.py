"""How text from a model file reaches generated code or configuration: only through here.

A model file is data (docs/architecture.md, "Trust model"): its layer, node, tensor and file
names are free text (Keras forbids only ``/``; ONNX names and file stems may hold newlines,
quotes, ``*/``, NUL). Every generator — cpu.native's C and header, fpga.hls4ml's project,
fpga.da4ml's Verilog, Triton's ``config.pbtxt`` and ``model.py``, TF Serving's files — takes
names through these functions and nothing else:

* :func:`ident` — an identifier we make (``layer3``), carrying none of the user's text;
* :func:`safe_ident` — the user's name where it already is a plain identifier, else a derived
  one (``prefix_<digest>``); for places where a readable name helps (tensor names in a served
  config) and the mapping is kept for reports;
* :func:`c_string` — a C/C++ string literal holding any text, every byte outside printable
  ASCII (and ``"``, ``\\``, ``?``) written as an octal escape;
* :func:`py_string` — a Python string literal (``repr`` of a ``str``: valid, single line).

Generated comments carry no model text at all; reports and error messages keep showing the
user's names (with ``!r``).
"""
from __future__ import annotations

import hashlib
import re

#: A plain identifier in C, C++, Verilog, Python and protobuf text alike (ASCII, no leading
#: digit, no double underscore that C++ reserves, short enough for every tool).
_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")
#: Names the generated languages reserve or our generated code uses itself.
_RESERVED = frozenset({
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef",
    "union", "unsigned", "void", "volatile", "while", "class", "delete", "new", "namespace",
    "operator", "private", "protected", "public", "template", "this", "throw", "try", "catch",
    "virtual", "module", "endmodule", "input", "output", "wire", "reg", "assign", "begin", "end",
    "None", "True", "False", "and", "or", "not", "import", "from", "def", "lambda", "pass",
    "x", "y", "n", "i", "j", "t",
})


def ident(prefix: str, index: int) -> str:
    """An identifier we derive: ``prefix`` (our own ASCII text) and a counter, e.g. ``layer3``."""
    if not _PLAIN.fullmatch(prefix) or "__" in prefix:
        raise ValueError(f"ident: prefix {prefix!r} is not a plain identifier")
    if index < 0:
        raise ValueError(f"ident: index {index} is negative")
    return f"{prefix}{index}"


def is_plain(name: str) -> bool:
    """Whether ``name`` can appear as is in every generated language (see :func:`safe_ident`)."""
    return (isinstance(name, str) and bool(_PLAIN.fullmatch(name)) and "__" not in name
            and not name.endswith("_") and name not in _RESERVED)


def safe_ident(name: object, prefix: str = "n") -> str:
    """``name`` when it is a plain identifier (letters, digits, single underscores, ≤ 63
    characters, not a reserved word), else ``prefix_<12 hex digits of its sha256>``: the same
    text always maps to the same identifier, and no text reaches the output unescaped."""
    text = name if isinstance(name, str) else repr(name)
    if is_plain(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    ident(prefix, 0)  # checks the prefix
    return f"{prefix}_{digest}"


def unique_idents(names: list[str], prefix: str = "n") -> list[str]:
    """:func:`safe_ident` of each name, made unique (a clash gets ``_2``, ``_3`` …)."""
    out: list[str] = []
    seen: set[str] = set()
    for name in names:
        base = safe_ident(name, prefix)
        cand, k = base, 2
        while cand in seen:
            cand, k = f"{base}_{k}", k + 1
        seen.add(cand)
        out.append(cand)
    return out


def c_string(text: object, max_chars: int = 256) -> str:
    """A C (and C++) string literal holding ``text`` (cut to ``max_chars`` characters): every
    byte outside printable ASCII, and ``"``, ``\\`` and ``?`` (trigraphs), as a 3-digit octal
    escape, so no newline, quote, comment closer or NUL can end the literal."""
    s = text if isinstance(text, str) else str(text)
    data = s[:max_chars].encode("utf-8", "backslashreplace")
    parts = []
    for b in data:
        if 0x20 <= b < 0x7F and b not in (0x22, 0x5C, 0x3F):
            parts.append(chr(b))
        else:
            parts.append(f"\\{b:03o}")
    return '"' + "".join(parts) + '"'


def py_string(text: object, max_chars: int = 256) -> str:
    """A Python string literal for ``text``: ``ascii()`` of it, one line, every quote and
    control character escaped."""
    s = text if isinstance(text, str) else str(text)
    return ascii(s[:max_chars])
