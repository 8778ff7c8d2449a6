"""The signed per-variant record the artifact store keeps beside an artifact's files.

It is the store's and the compiler's schema, not part of the plugin contract (no plugin reads
or writes it), so it lives here rather than in :mod:`hwbackends.target`. The store's format
version (:data:`hwbackends.store.STORE_FORMAT`) is bumped whenever this schema changes: an
entry of another version is removed and rebuilt, never read with the wrong schema.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..specs import TensorSpec
from ..target import Artifact


@dataclass
class Manifest:
    """What the store keeps, signed, beside an artifact's files (``manifest.json``; the store
    adds its own ``files`` sha256 list, ``store_format`` and ``hmac``): what was built, for
    which request (``key_parts``, what the store key hashes), and the outputs a reload must
    reproduce (``reload_check``). :meth:`to_dict` / :meth:`from_dict` are its schema; every
    record the core writes is made here, from this process's own request (never a peer's)."""

    target: str
    precision: str
    fingerprint: str
    batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    model: str = "model"
    #: The options as they enter the cache key (:meth:`CompileOptions.key_dict`).
    options: dict[str, Any] = field(default_factory=dict)
    #: What the target's ``compile`` returned.
    meta: dict[str, Any] = field(default_factory=dict)
    toolchain: dict[str, str] = field(default_factory=dict)
    #: The converters that ran before the target, by name.
    chain: list[str] = field(default_factory=list)
    compile_seconds: float = 0.0
    key_parts: dict[str, Any] | None = None
    #: The *reload check*: a few inputs, the outputs for them and the tolerance a reload must
    #: meet (``compiler.make_reload_check``).
    reload_check: dict[str, Any] | None = None
    #: The store key; "" before the store assigns it.
    key: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "target": self.target, "precision": self.precision, "fingerprint": self.fingerprint,
            "model": self.model, "batch_size": self.batch_size,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs], "options": self.options,
            "meta": self.meta, "toolchain": self.toolchain, "chain": self.chain,
            "compile_seconds": self.compile_seconds, "key_parts": self.key_parts}
        if self.reload_check is not None:
            d["reload_check"] = self.reload_check
        if self.key:
            d["key"] = self.key
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Manifest:
        """The inverse of :meth:`to_dict`. Keys the store adds (``files``, ``store_format``,
        ``hmac``) and unknown ones are ignored; a missing optional one takes its default."""
        known = {f.name for f in fields(Manifest)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["inputs"] = [TensorSpec.from_dict(x) for x in d["inputs"]]
        kw["outputs"] = [TensorSpec.from_dict(x) for x in d["outputs"]]
        return Manifest(**kw)

    def artifact(self, path: Path, cached: bool = False) -> Artifact:
        """The :class:`Artifact` this record describes, its files in ``path``."""
        return Artifact(path=path, key=self.key, target=self.target, precision=self.precision,
                        fingerprint=self.fingerprint, batch_size=self.batch_size,
                        inputs=list(self.inputs), outputs=list(self.outputs), meta=self.meta,
                        toolchain=self.toolchain, compile_seconds=self.compile_seconds,
                        cached=cached)
