"""The artifact store and what it rests on, one module per job:

* :mod:`.artifacts`: :class:`ArtifactStore`, the content-addressed, owner-checked, signed
  directory of compiled variants (``--cache-dir``, ``HWB_CACHE_DIR``);
* :mod:`.manifest`: the signed per-variant record kept beside an artifact's files;
* :mod:`.signed_dir`: the one signed record on disk (the store, the build cache, the profile
  cache and the zoo keep their entries in it);
* :mod:`.build_cache`: the store's cache of build intermediates (C-sim libraries, Verilator
  models);
* :mod:`.prune`: what the store holds (``hwb store``) and the least recently used removed first;
* :mod:`.trust`: who may own the store, the per-user HMAC key, private directories;
* :mod:`.dirfd`: walking, sizing and removing a tree through directory descriptors, never
  through a link.
"""
from __future__ import annotations

from .artifacts import MANIFEST, STORE_FORMAT, ArtifactStore, cache_key, default_root

__all__ = ["MANIFEST", "STORE_FORMAT", "ArtifactStore", "cache_key", "default_root"]
