"""A torch file looked at before torch opens it: what it declares (its cost, against the
limits) and what torch would unpickle from it.

``torch.export.load`` unpickles parts of a ``.pt2`` archive with Python's full unpickler —
pickled payloads and opaque constants directly, and its example inputs and legacy weight files
whenever torch's restricted (``weights_only``) unpickler refuses them — and loads the shared
libraries of AOTInductor packages: loading a hostile archive would run its code. So
:func:`load_export` refuses, unless the caller trusts the file (``trust_pickle``), an archive
with any part torch would run, and checks that every pickle torch reads loads under the
restricted unpickler first (then torch's own load of it never falls back). The archive is
opened once and that open file is what torch reads.

A ``torch.save`` zip (a whole module, a state dict) names its storages in its pickle:
:func:`declared_storages` reads them with an unpickler whose every class is a stand-in (nothing
from the file runs), so a file declaring gigabytes is refused before torch allocates them.
"""
from __future__ import annotations

import io
import os
import pickle
import stat
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

from .. import cost
from ..errors import ModelError
from ..units import fmt_bytes

#: The largest pickle (``data.pkl``) read for its declarations; a module's is kilobytes.
MAX_PICKLE_BYTES = 256 << 20
#: Bytes per element of the storage classes a ``torch.save`` pickle names.
_STORAGE_BYTES = {"UntypedStorage": 1, "ByteStorage": 1, "CharStorage": 1, "BoolStorage": 1,
                  "QUInt8Storage": 1, "QInt8Storage": 1, "ShortStorage": 2, "HalfStorage": 2,
                  "BFloat16Storage": 2, "IntStorage": 4, "FloatStorage": 4, "QInt32Storage": 4,
                  "LongStorage": 8, "DoubleStorage": 8, "ComplexFloatStorage": 8,
                  "ComplexDoubleStorage": 16}
_REEXPORT = ("re-export it from the training code with plain tensors: "
             "torch.export.save(torch.export.export(model, (x,)), 'model.pt2')")


def load_export(path: Path, name: str, lim: cost.Limits, trust_pickle: bool) -> Any:
    """``torch.export.load`` of ``path`` once its declarations are within ``lim`` and nothing
    in it would run (unless ``trust_pickle``); see the module docstring."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO never blocks
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ModelError(f"{path} is not a regular file; give the .pt2 file torch.export.save wrote")
    with os.fdopen(fd, "rb") as f:
        try:
            z = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise ModelError(f"{path} is not a torch.export archive (a zip written by "
                             f"torch.export.save): {exc}; {_REEXPORT}") from None
        with z:
            cost.check_torch_export(z, path, name, lim)
            _check_export_pickles(z, path, name, lim, trust_pickle)
        f.seek(0)
        import torch

        return torch.export.load(f)


def _check_export_pickles(z: zipfile.ZipFile, path: Path, name: str, lim: cost.Limits,
                          trust_pickle: bool) -> None:
    root = cost.pt2_root(z.namelist()) or ""
    runs: list[str] = []  # parts torch loads with the full unpickler or as native code
    restricted: list[zipfile.ZipInfo] = []  # parts torch tries weights_only first
    for info in z.infolist():
        n = info.filename
        rel = n[len(root):] if n.startswith(root) else n
        if rel.startswith("data/aotinductor/"):
            runs.append(f"an AOTInductor package ({n[:120]}: native code torch loads)")
        elif rel.startswith("data/constants/") and rel.rsplit("/", 1)[-1].startswith(
                ("custom_obj_", "opaque_obj_")):
            runs.append(f"a pickled constant ({n[:120]})")
        elif (rel.startswith("data/sample_inputs/") or n.startswith("serialized_")) and n.endswith(".pt") \
                or rel.startswith(("data/weights/", "data/constants/")) and rel.count("/") == 2 \
                and rel.endswith(".pt"):
            restricted.append(info)
    for table in (n for n in z.namelist() if n.endswith(("_weights_config.json", "_constants_config.json"))):
        cfg = cost.read_archive_json(z, table, path)
        entries = cfg.get("config") if isinstance(cfg, dict) else None
        for fqn, meta in (entries.items() if isinstance(entries, dict) else []):
            if isinstance(meta, dict) and meta.get("use_pickle"):
                runs.append(f"a pickled tensor ({str(fqn)[:80]!r} in {table[:120]})")
    if runs and not trust_pickle:
        raise ModelError(
            f"torch.export archive {path} holds {runs[0]}"
            f"{f' and {len(runs) - 1} more such parts' if len(runs) > 1 else ''}: "
            f"torch.export.load runs code from the file to load it. If you trust the file, pass "
            f"trust_pickle=True (load_model(path, trust_pickle=True); on the command line: "
            f"--trust-pickle); better, {_REEXPORT}")
    weights = 0
    for info in restricted:
        weights += _restricted_load(z, info, path, trust_pickle)
    if weights:
        lim.check(cost.Cost(weight_bytes=weights), name)


def _restricted_load(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, trust_pickle: bool) -> int:
    """Load one pickle of the archive with torch's restricted unpickler, its tensors on the
    ``meta`` device (no data allocated): the bytes its tensors declare. A pickle it refuses is
    one torch would load with the full unpickler: refused unless ``trust_pickle``."""
    import torch

    try:
        obj = torch.load(io.BytesIO(z.read(info)), map_location="meta", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any refusal means torch would fall back
        if trust_pickle:
            return 0
        raise ModelError(
            f"torch.export archive {path}: its record {info.filename[:120]!r} is a pickle that "
            f"torch's restricted unpickler refuses ({type(exc).__name__}: {_why(exc)}); "
            f"torch.export.load would "
            f"then load it with the full unpickler, running code from the file. If you trust "
            f"the file, pass trust_pickle=True (--trust-pickle); better, {_REEXPORT}") from None
    return _tensor_bytes(obj)


def _why(exc: Exception) -> str:
    """The line of torch's refusal that names what it refused (``Unsupported global: …``)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    named = [ln for ln in lines if "GLOBAL" in ln or "global" in ln.split(":")[0].lower()]
    return (named or lines or ["no reason given"])[0][:200]


def _tensor_bytes(obj: Any, depth: int = 0) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return int(obj.numel()) * int(obj.element_size())
    if depth > 32:
        return 0
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return sum(_tensor_bytes(v, depth + 1) for v in items)


# -- torch.save zips: the storages the pickle declares, read without running it -------------
class _Stub:
    """What every class a pickle names becomes: accepts any construction and state."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Stub:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _DeclarationReader(pickle.Unpickler):
    """Unpickles with stand-ins only (:class:`_Stub`), noting each storage the pickle names:
    its key and the bytes its element count and type declare."""

    def __init__(self, f: BinaryIO) -> None:
        super().__init__(f)
        self.storages: dict[str, int] = {}

    def find_class(self, module: str, name: str) -> Any:
        return type("Stub", (_Stub,), {"hwb_name": str(name)[:80]})

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            size = _STORAGE_BYTES.get(getattr(pid[1], "hwb_name", ""), 8)
            numel = pid[4]
            if isinstance(numel, int) and not isinstance(numel, bool) and numel >= 0:
                key = str(pid[2])[:200]
                self.storages[key] = max(self.storages.get(key, 0), min(numel * size, 1 << 62))
        return _Stub()


def declared_storages(z: zipfile.ZipFile, path: Path) -> cost.Cost | None:
    """The weights a ``torch.save`` zip declares (:func:`hwbackends.cost.torch_storage_cost`),
    read from its ``data.pkl`` without running anything in it; ``None`` when it holds none
    that can be read so (torch then says what is wrong)."""
    pkl = next((i for i in z.infolist() if i.filename.endswith("/data.pkl")
                and i.filename.count("/") == 1), None)
    if pkl is None:
        return None
    if pkl.file_size > MAX_PICKLE_BYTES:
        raise ModelError(f"{path}: its pickle is {fmt_bytes(pkl.file_size)}; a torch.save "
                         f"module's is at most {fmt_bytes(MAX_PICKLE_BYTES)}. Refused before "
                         f"torch reads it")
    reader = _DeclarationReader(io.BytesIO(z.read(pkl)))
    try:
        reader.load()
    except Exception:  # noqa: BLE001 - not a pickle this reader can follow: torch decides
        return None
    base = pkl.filename[: -len("data.pkl")] + "data/"
    records = {i.filename[len(base):]: i.file_size for i in z.infolist() if i.filename.startswith(base)}
    return cost.torch_storage_cost(reader.storages, records)
