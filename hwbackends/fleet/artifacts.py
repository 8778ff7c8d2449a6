"""Artifacts between nodes: a stored variant packed on the node that compiled it, sent through
Ray's object store, and imported on another node with the same toolchain, so a fleet of
identical hosts compiles once.

The receiving node commits the files through :meth:`ArtifactStore.commit` (the store's own
path, so whatever checks it applies to a new entry apply here too), which hashes every file;
the entry is kept only if each sha256 equals the sender's manifest, like every store entry is
verified on load."""
from __future__ import annotations

import io
import json
import logging
import tarfile
from dataclasses import dataclass
from typing import Any

from ..errors import CacheError
from ..store import MANIFEST, ArtifactStore

log = logging.getLogger("hwbackends.fleet")

#: Fields of a manifest that the store writes itself on commit.
#: Written by the receiving store itself on commit (the signature is the receiver's own key).
_STORE_FIELDS = ("key", "store_format", "files", "created", "hmac")


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


def import_packed(store: ArtifactStore, p: Packed) -> str:
    """Import ``p`` into ``store``: ``"present"`` (already there), ``"imported"`` (committed,
    every sha256 matches the sender's manifest). Raises :class:`CacheError` on a mismatch or
    a malformed package (nothing is left in the store then)."""
    if store.get(p.key) is not None:
        return "present"
    staged = store.stage()
    try:
        with tarfile.open(fileobj=io.BytesIO(p.blob), mode="r") as tar:
            tar.extractall(staged, filter="data")  # no absolute paths, links or devices
        sent = json.loads((staged / MANIFEST).read_text())
        (staged / MANIFEST).unlink()
    except (OSError, ValueError, tarfile.TarError) as exc:
        store.discard(staged)
        raise CacheError(f"artifact {p.key[:12]} from another node is malformed: {exc}") from exc
    if sent.get("key") != p.key:
        store.discard(staged)
        raise CacheError(f"artifact package says key {sent.get('key')!r}, expected {p.key}")
    listed = set(sent.get("files", {}))
    for f in [f for f in staged.rglob("*") if f.is_file()]:
        if str(f.relative_to(staged)) not in listed:  # only what the sender's manifest vouches for
            f.unlink()
    record = {k: v for k, v in sent.items() if k not in _STORE_FIELDS}
    got = store.commit(staged, p.key, record)
    if got.get("files") != sent.get("files"):
        store.evict(p.key)
        bad = sorted(k for k in set(got.get("files", {})) | set(sent.get("files", {}))
                     if got.get("files", {}).get(k) != sent.get("files", {}).get(k))
        raise CacheError(f"artifact {p.key[:12]} from another node failed sha256 verification "
                         f"({', '.join(bad) or 'file list differs'}); compiling locally instead")
    return "imported"
