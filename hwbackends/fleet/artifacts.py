"""Artifacts between nodes: a stored variant packed on the node that compiled it, sent through
Ray's object store, and imported on another node with the same toolchain, so a fleet of
identical hosts compiles once.

A package is a peer's claim, never an instruction: the receiving node computes the store key
itself from what it asks for (its model, target, precision), refuses a package built for any
other key, takes only the files the package's manifest lists (plain relative names, no
``..``, no links or devices), and adopts them through
:func:`hwbackends.compiler.import_artifact`: sha256 of every file, then the artifact loaded
and checked against this node's own reference model, before it is committed with a manifest
written and signed here. Whatever is refused leaves nothing in the store (staging included)."""
from __future__ import annotations

import io
import json
import logging
import tarfile
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from ..errors import CacheError
from ..store.artifacts import MANIFEST, ArtifactStore, check_key

log = logging.getLogger("hwbackends.fleet")


@dataclass
class Packed:
    """What travels: the store key, the sender's toolchain for the target, and a tar of the
    entry (manifest included)."""

    key: str
    target: str
    precision: str
    toolchain: dict[str, Any]
    blob: bytes


def pack(store: ArtifactStore, key: str) -> Packed | None:
    """The verified store entry ``key`` as a :class:`Packed`, or ``None`` if absent/invalid."""
    rec = store.get(key)  # verifies every file's sha256 before it leaves this node
    if rec is None:
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(store.path_for(key), arcname=".")
    return Packed(key, rec["target"], rec["precision"], rec.get("toolchain", {}), buf.getvalue())


def import_packed(store: ArtifactStore, p: Packed, model: Any, target: str,
                  precision: str | None = None, *, registry: Any) -> str:
    """Import ``p`` into ``store`` as this node's compile of ``model`` (anything
    :func:`hwbackends.load_model` takes) for ``target:precision``, the target from this
    node's ``registry``: ``"present"`` (already there), ``"imported"`` (verified, see the
    module docstring). Raises :class:`CacheError`
    naming what is wrong for a package that is malformed, built for another key, altered on
    the way or not this model; nothing is left in the store then."""
    from ..compiler import import_artifact

    what = f"artifact package {str(p.key)[:12]!r} from another node"
    check_key(p.key)
    staged = store.stage()
    try:
        sent = _extract(p.blob, staged, what)
    except BaseException:
        store.discard(staged)
        raise
    return import_artifact(store, staged, sent, model, target, precision, registry=registry)


def _name(name: Any, what: str) -> str:
    """``name`` as a plain relative path inside an entry (``./a/b`` → ``a/b``), else refused."""
    path = PurePosixPath(name) if isinstance(name, str) else None
    if (path is None or path.is_absolute() or ".." in path.parts or "\0" in name
            or "\\" in name or not path.parts):
        raise CacheError(f"{what} names a file {name!r:.80}, which is not a plain relative path "
                         f"inside the entry; refused (compiling locally instead)")
    return str(path)


def _extract(blob: bytes, staged: Any, what: str) -> dict[str, Any]:
    """The package's manifest, and the files it lists extracted into ``staged``."""
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
            members = tar.getmembers()
            mf = next((m for m in members if m.isfile() and str(PurePosixPath(m.name)) == MANIFEST),
                      None)
            if mf is None:
                raise CacheError(f"{what} holds no {MANIFEST}; compiling locally instead")
            fobj = tar.extractfile(mf)
            sent = json.loads(fobj.read() if fobj else b"")
            if not isinstance(sent, dict) or not isinstance(sent.get("files"), dict):
                got = (f"a JSON {type(sent).__name__}" if not isinstance(sent, dict)
                       else "an object without a file list")
                raise CacheError(f"{what} is malformed: its {MANIFEST} is {got}, not a manifest; "
                                 f"compiling locally instead")
            listed = {_name(n, what) for n in sent["files"]}
            if len(listed) != len(sent["files"]) or MANIFEST in listed:
                raise CacheError(f"{what} is malformed: its file list repeats a name or lists "
                                 f"{MANIFEST}; compiling locally instead")
            take = []
            for m in members:
                if m is mf or m.isdir() or str(PurePosixPath(m.name)) in (".", ""):
                    continue
                if str(PurePosixPath(m.name)) not in listed:
                    continue  # only what the manifest vouches for (its sha256 is checked)
                if not m.isfile():
                    raise CacheError(f"{what} holds {m.name!r} as a link or device, not a file; "
                                     f"compiling locally instead")
                take.append(m)
            tar.extractall(staged, members=take, filter="data")
    except CacheError:
        raise
    except (OSError, ValueError, tarfile.TarError) as exc:
        raise CacheError(f"{what} is malformed: {exc}; compiling locally instead") from exc
    return sent
