"""The readers of files a user (or CI, or another party) hands a command: results files,
fleet results, strategies files, tokens. Every file is read the same way, before any schema:

- a regular file only: opened non-blocking and checked on the opened descriptor
  (:func:`read_small_file`), so a FIFO never blocks, a device or a link to
  one (``/dev/zero``) is refused unread, and nothing is checked by path and then used;
- at most ``max_bytes`` (per kind);
- JSON nested at most :data:`MAX_JSON_DEPTH` deep, counted before the parser recurses (no
  ``RecursionError``, whatever the file);

and each kind's schema then names the field, the value found and what is expected
(:func:`schema_problem`). All of it is one line: a command exits 1 with it, never a traceback.
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError, HwbError

#: The deepest nesting a user's JSON file may have (a results file is about 6 deep).
MAX_JSON_DEPTH = 64
#: A JSON string, or one bracket: what :func:`json_depth` walks (strings are skipped whole,
#: so a bracket inside one is not counted).
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is, for a message: ``"a FIFO (named pipe)"``."""
    return _kind(mode)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_small_file(path: str | Path, what: str, max_bytes: int) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``max_bytes``; else a
    :class:`ConfigError` naming the path, what it is and what to give instead. For every file
    the user names (strategies file, token, TLS key, results, data): it is opened
    non-blocking (a FIFO never hangs the reader) and checked on the opened descriptor (no
    check-then-use), and never read past ``max_bytes`` (``/dev/zero`` is refused unread)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise ConfigError(f"{what} {p} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{what} {p} cannot be opened: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {p} is {_kind(st.st_mode)}, not a regular file; give the "
                              f"path of the file itself")
        if st.st_size > max_bytes:
            raise ConfigError(f"{what} {p} is {st.st_size} bytes; a {what} is at most "
                              f"{max_bytes} bytes")
        chunks, n = [], 0
        while n <= max_bytes:
            b = os.read(fd, max_bytes + 1 - n)
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > max_bytes:  # it grew while being read
            raise ConfigError(f"{what} {p} is over {max_bytes} bytes; a {what} is at most "
                              f"{max_bytes} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise ConfigError(f"{what} {p} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def decode_utf8(data: bytes, source: str) -> str:
    """``data`` as text; invalid UTF-8 is a ``FILE:LINE`` :class:`ConfigError` naming the byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{source}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at "
                          f"offset {exc.start}); save the file as UTF-8") from None


def read_text_file(path: str | Path, what: str, max_bytes: int) -> str:
    """:func:`read_small_file` decoded as UTF-8 (errors point at the line)."""
    return decode_utf8(read_small_file(path, what, max_bytes), str(path))


def json_depth(text: str, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep ``text``'s arrays and objects nest, counting stops past ``limit`` (the value
    returned is then ``limit + 1``). Linear in the text; never recursive."""
    depth = deepest = 0
    for m in _TOKENS.finditer(text):
        ch = m.group()
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def read_json(path: str | Path, what: str, max_bytes: int, error: type[HwbError],
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The parsed JSON of the file ``path`` (a ``what``: "results file"), read as the module
    doc says; any problem is an ``error`` naming the path, what was found and what a ``what``
    must be. Python's ``NaN`` / ``Infinity`` tokens are read as the numbers they are: each
    kind's schema (or gate) decides what a non-finite figure means."""
    try:
        text = read_text_file(path, what, max_bytes)
    except HwbError as exc:
        raise error(str(exc)) from None
    if json_depth(text, max_depth) > max_depth:
        raise error(f"{what} {path}: values nested too deeply to parse (more than {max_depth} "
                    f"levels of arrays and objects); a {what} is at most {max_depth} deep")
    try:
        return json.loads(text)
    except RecursionError:  # defensive: the count above keeps the parser well inside the limit
        raise error(f"{what} {path}: values nested too deeply to parse") from None
    except ValueError as exc:
        raise error(f"{what} {path} is not JSON: {exc}") from None


def schema_problem(path: str | Path, what: str, where: str, exc: Any,
                   expected: Mapping[str, str], hint: str) -> str:
    """The first problem of a pydantic ``ValidationError`` ``exc`` as one line: ``WHAT PATH:
    dotted.field: what is wrong, got VALUE; expected EXPECTATION (N more problem(s)). HINT``.
    ``expected`` maps a field name to what it must be, in words; ``where`` prefixes the
    location (the row being checked)."""
    errs = exc.errors()
    e = errs[0]
    loc = [x for x in e["loc"] if not str(x).startswith("function-")]
    field = next((str(x) for x in reversed(loc) if not isinstance(x, int)), "")
    dotted = where
    for x in loc:
        dotted += f"[{x}]" if isinstance(x, int) else (f".{x}" if dotted else str(x))
    dotted = dotted or "(top level)"
    said = ("required key missing" if e["type"] == "missing"
            else f"{e['msg']}, got {shown(e.get('input'))}")
    expect = expected.get(field)
    more = f" ({len(errs) - 1} more problem(s))" if len(errs) > 1 else ""
    return (f"{what} {path}: {dotted}: {said}" + (f"; expected {expect}" if expect else "")
            + more + (f". {hint}" if hint else ""))


def shown(v: Any) -> str:
    """A value for a message: its repr cut to 60 characters (a 400-digit number, a long
    string), containers by their kind."""
    if isinstance(v, dict):
        return f"an object of {len(v)} key(s)"
    if isinstance(v, list):
        return f"a list of {len(v)} item(s)"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10 ** 30:
        return f"an integer of {len(str(abs(v)))} digits"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "…"
