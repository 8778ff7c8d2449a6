"""Content-addressed artifact store: one directory per cache key, verified on every load.

Layout under the root (``HWB_CACHE_DIR``, default ``~/.cache/hwbackends``)::

    objects/ab/abcdef…/manifest.json   the record, with the sha256 of every file
    objects/ab/abcdef…/<files>         what the target wrote
    tmp/<random>/                      staging; renamed into objects/ atomically

A missing manifest, a missing file or a hash mismatch makes the entry invalid: it is
removed and the caller rebuilds it. Nothing half-written is ever visible under ``objects/``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

from .errors import CacheError

log = logging.getLogger("hwbackends.store")
STORE_FORMAT = 1
MANIFEST = "manifest.json"


def default_root() -> Path:
    env = os.environ.get("HWB_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hwbackends"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_key(parts: dict[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


class ArtifactStore:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root else default_root()

    @property
    def objects(self) -> Path:
        return self.root / "objects"

    def path_for(self, key: str) -> Path:
        return self.objects / key[:2] / key

    def get(self, key: str) -> dict[str, Any] | None:
        """The verified manifest of ``key``, or ``None`` (absent, or invalid and now removed)."""
        d = self.path_for(key)
        if not d.exists():
            return None
        try:
            record = self._verify(d)
        except CacheError as exc:
            log.warning("artifact %s is corrupt (%s); removing it, it will be rebuilt", key[:12], exc)
            self.evict(key)
            return None
        return record

    def _verify(self, d: Path) -> dict[str, Any]:
        try:
            record = json.loads((d / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise CacheError(f"unreadable manifest: {exc}") from exc
        if record.get("store_format") != STORE_FORMAT:
            raise CacheError(f"store format {record.get('store_format')} != {STORE_FORMAT}")
        for rel, digest in record.get("files", {}).items():
            p = d / rel
            if not p.is_file():
                raise CacheError(f"missing file {rel}")
            if file_sha256(p) != digest:
                raise CacheError(f"checksum mismatch for {rel}")
        return record

    def stage(self) -> Path:
        tmp = self.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        self._sweep(tmp)
        d = tmp / uuid.uuid4().hex
        d.mkdir()
        return d

    def _sweep(self, tmp: Path, max_age: float = 24 * 3600) -> None:
        now = time.time()
        for p in tmp.iterdir():
            try:
                if now - p.stat().st_mtime > max_age:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass

    def commit(self, staged: Path, key: str, record: dict[str, Any]) -> dict[str, Any]:
        """Hash the staged files, write the manifest and move the directory into place."""
        files = {str(p.relative_to(staged)): file_sha256(p)
                 for p in sorted(staged.rglob("*")) if p.is_file() and p.name != MANIFEST}
        record = dict(record, key=key, store_format=STORE_FORMAT, files=files, created=time.time())
        tmp_manifest = staged / (MANIFEST + ".tmp")
        tmp_manifest.write_text(json.dumps(record, indent=1, default=str))
        os.replace(tmp_manifest, staged / MANIFEST)
        final = self.path_for(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staged, final)
        except OSError:
            # Another process committed the same key first; its entry is as good as ours.
            shutil.rmtree(staged, ignore_errors=True)
            existing = self.get(key)
            if existing is None:
                raise CacheError(f"could not place artifact {key[:12]} into {final}") from None
            return existing
        return record

    def discard(self, staged: Path) -> None:
        shutil.rmtree(staged, ignore_errors=True)

    def evict(self, key: str) -> None:
        d = self.path_for(key)
        if d.exists():
            # Rename first so a concurrent reader never sees a half-deleted entry.
            trash = self.root / "tmp" / f"evict-{uuid.uuid4().hex}"
            trash.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(d, trash)
            except OSError:
                trash = d
            shutil.rmtree(trash, ignore_errors=True)

    def entries(self) -> Iterator[dict[str, Any]]:
        if not self.objects.exists():
            return
        for d in sorted(self.objects.glob("*/*")):
            try:
                yield json.loads((d / MANIFEST).read_text())
            except (OSError, ValueError):
                continue

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
