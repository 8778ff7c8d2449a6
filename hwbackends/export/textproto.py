"""Protocol-buffer text format, written from plain Python values.

Both servers read their configuration as protobuf text (Triton's ``config.pbtxt``, TF
Serving's ``batching_parameters.txt`` and ``models.config``). Their proto modules are not
dependencies of hwbackends (tritonclient's ``[grpc]`` extra pins protobuf < 7, and TF
Serving's API package has no batching message), so the files are written here and the tests
parse them with the servers' own protos.

Values: ``str`` (UTF-8) or ``bytes`` → a quoted string, every byte outside printable ASCII
and ``"``, ``'``, ``\\`` as a 3-digit octal escape (text format's own, which protobuf's C++
and Python parsers read back byte for byte: no newline, quote or NUL ends the literal);
``bool`` → ``true``/``false``, ``int``/``float`` as they are, :class:`Enum` → the bare
identifier, a ``dict`` → a nested message, a list of scalars → ``[a, b]``, a list of dicts →
the message repeated. Comments (:func:`comment`) hold only hwbackends' own text and figures,
never a name from a model or a results file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Enum:
    """An enum value (written bare: ``TYPE_FP32``, ``KIND_CPU``, ``REJECT``)."""

    name: str


def _scalar(v: Any) -> str:
    if isinstance(v, Enum):
        return v.name
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        try:
            return string(v.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 form, so no proto string
            raise ValueError(f"text format: {v!r:.80} is not valid Unicode text") from None
    if isinstance(v, bytes):
        return string(v)
    raise TypeError(f"text format: cannot write {type(v).__name__} {v!r}")


def string(data: bytes) -> str:
    """``data`` as a text-format string literal (see the module docstring)."""
    return '"' + "".join(chr(b) if 0x20 <= b < 0x7F and b not in b"\"'\\" else f"\\{b:03o}"
                         for b in data) + '"'


def dumps(msg: dict[str, Any], indent: int = 0) -> str:
    """``msg`` in text format, one field per line, nested messages indented by two."""
    pad = " " * indent
    lines: list[str] = []
    for key, v in msg.items():
        if v is None:
            continue
        if isinstance(v, dict):
            lines.append(f"{pad}{key} {{\n{dumps(v, indent + 2)}{pad}}}")
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for x in v:
                lines.append(f"{pad}{key} {{\n{dumps(x, indent + 2)}{pad}}}")
        elif isinstance(v, list):
            if v:
                lines.append(f"{pad}{key}: [ {', '.join(_scalar(x) for x in v)} ]")
        else:
            lines.append(f"{pad}{key}: {_scalar(v)}")
    return "".join(line + "\n" for line in lines)


def comment(lines: list[str]) -> str:
    """``lines`` as ``#`` comments (text format's comment syntax); a line holding newlines
    (a library's error message) becomes several comment lines, never a line of config."""
    return "".join(f"# {part}\n" for ln in lines for part in str(ln).splitlines() or [""])
