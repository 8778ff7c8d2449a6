"""Calibration and validation samples, and where they came from.

A fidelity figure means only as much as the inputs it was measured on, and a quantized or
fixed-point variant only as much as the inputs it was calibrated on. So every compile records
the **provenance** of both (a :class:`DataSource` each), and it travels with the variant:
``CompiledModel.data`` and ``describe()["data"]``, every variant row and profile of a results
file, the report, ``hwb compile``'s output. Without data of the user's, the label says
*synthetic N(0,1)*: numbers measured on inputs the model was never meant to see.

Users give their own as ``.npy`` (one input: ``(n, *sample_shape)``) or ``.npz`` (one array
per input name) files: ``--calibration-data`` / ``--validation-data`` on every model command,
``calibration_data`` / ``validation_data`` per strategy in ``strategies.toml``, or
``compile(..., calibration_data=, validation_data=)`` with arrays or :class:`Samples`.
:func:`read_samples` checks a file against the model's inputs (shape, dtype, NaN/Inf) with
errors that name the file, the flag and the fix.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import InputError
from .inputs import as_batches
from .specs import TensorSpec

SUFFIXES = (".npy", ".npz")
#: The largest data file read (calibration, validation, predict inputs): a regular file only,
#: read through :func:`hwbackends.config.read_small_file` (a FIFO never blocks, a device is
#: refused unread).
MAX_DATA_BYTES = 2 << 30
#: Samples used at most: calibration (converters iterate it; the FPGA search simulates it
#: per trial build) and validation (every variant runs it once).
MAX_CALIBRATION = 2048
MAX_VALIDATION = 8192
#: Without data: the seeded N(0,1) inputs :meth:`Model.representative` generates.
SYNTHETIC = "synthetic N(0,1) inputs"
#: The most bytes of synthetic inputs one compile generates per set (calibration, validation):
#: a wide input (an image, a long window) gets fewer samples, never fewer than
#: :data:`MIN_SYNTHETIC`, rather than hundreds of megabytes of noise.
SYNTHETIC_BYTES = 32 << 20
MIN_SYNTHETIC = 16


def synthetic_count(inputs: list[TensorSpec], n: int) -> int:
    """How many of ``n`` synthetic samples of ``inputs`` fit :data:`SYNTHETIC_BYTES` (at
    least :data:`MIN_SYNTHETIC`)."""
    row = sum(4 * int(np.prod(s.shape, dtype=np.int64)) for s in inputs) or 4
    return max(min(n, MIN_SYNTHETIC), min(n, SYNTHETIC_BYTES // row))


@dataclass(frozen=True)
class DataSource:
    """Where a set of samples came from. ``kind``: ``file`` (a user's .npy/.npz), ``array``
    (passed from Python), ``model`` (the model's own validation data, e.g. a zoo model's
    bundled features) or ``synthetic`` (N(0,1), nothing the model was trained on)."""

    kind: str
    label: str
    n: int = 0
    path: str | None = None
    sha256: str | None = None

    @property
    def synthetic(self) -> bool:
        return self.kind == "synthetic"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"synthetic": self.synthetic}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DataSource":
        return cls(**{k: d[k] for k in ("kind", "label", "n", "path", "sha256") if k in d})

    def part(self, what: str, n: int) -> "DataSource":
        """The same source, described as ``what`` of it (``first half``), ``n`` samples."""
        return dataclasses.replace(self, label=f"{what} of {self.label}", n=n)

    def __str__(self) -> str:
        return self.label


def synthetic(n: int, seed: int) -> DataSource:
    return DataSource("synthetic", f"{SYNTHETIC} (seed {seed}, {n} samples): no data was "
                                   f"given, so the figures say little about real inputs", n)


@dataclass(frozen=True)
class Samples:
    """Input samples with their :class:`DataSource`: ``arrays`` is one float32 batch
    ``(n, *shape)`` for a one-input model, a tuple of them (input order) for several."""

    arrays: Any
    source: DataSource

    def __len__(self) -> int:
        return count(self.arrays)


def count(arrays: Any) -> int:
    return len(arrays[0] if isinstance(arrays, tuple) else arrays)


def head(arrays: Any, n: int) -> Any:
    """The first ``n`` samples (per tensor for a tuple), C-contiguous float32."""
    if isinstance(arrays, tuple):
        return tuple(np.ascontiguousarray(a[:n], np.float32) for a in arrays)
    return np.ascontiguousarray(arrays[:n], np.float32)


def rows(arrays: Any, start: int, stop: int | None) -> Any:
    if isinstance(arrays, tuple):
        return tuple(np.ascontiguousarray(a[start:stop], np.float32) for a in arrays)
    return np.ascontiguousarray(arrays[start:stop], np.float32)


def digest(arrays: Any) -> str:
    h = hashlib.sha256()
    for a in arrays if isinstance(arrays, tuple) else (arrays,):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def check(data: Any, specs: Sequence[TensorSpec], what: str) -> Any:
    """``data`` (an array; for several inputs a tuple/list in input order or a dict keyed by
    input name) as checked float32 batches: one array, or a tuple for several inputs.
    Refuses non-numeric dtypes, wrong shapes, an empty batch and NaN/Inf, naming ``what``."""
    items = data if isinstance(data, dict) else (
        dict(zip([s.name for s in specs], data, strict=False))
        if isinstance(data, (tuple, list)) and len(specs) > 1 else {specs[0].name: data})
    shapes = {s.name: tuple(s.shape) for s in specs}
    for name, a in items.items():
        arr = np.asarray(a) if not isinstance(a, np.ndarray) else a
        label = f"{what}" + (f" (input {name!r})" if len(specs) > 1 or isinstance(data, dict) else "")
        want = shapes.get(name)
        if want is not None and tuple(arr.shape) != want and tuple(arr.shape[1:]) != want:
            raise InputError(f"{label} is an array of shape {tuple(arr.shape)}; the model takes "
                             f"samples of shape {want}: give (n, {', '.join(map(str, want))}), "
                             f"one sample per row")
        if arr.dtype.kind not in "fiub":
            raise InputError(f"{label} has dtype {arr.dtype}; expected numbers (float32, or any "
                             f"float/int dtype, converted to float32 once)"
                             + (": an object array needs pickling, which is refused"
                                if arr.dtype.kind == "O" else ""))
        if arr.dtype.kind == "f":
            finite = np.isfinite(arr)
            if not finite.all():
                bad_rows = np.flatnonzero(~finite.reshape(len(arr), -1).all(1)) if arr.ndim else []
                nan, inf = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
                shown = ", ".join(str(int(r)) for r in bad_rows[:5]) + (", …" if len(bad_rows) > 5 else "")
                raise InputError(f"{label} contains {nan} NaN and {inf} Inf value(s)"
                                 + (f" in sample(s) {shown}" if len(bad_rows) else "")
                                 + "; clean or drop those samples (fidelity and calibration need "
                                   "finite inputs)")
        if arr.dtype.kind == "f" and arr.dtype.itemsize > 4 and arr.size:
            big = float(np.abs(arr).max())
            if big > float(np.finfo(np.float32).max):
                raise InputError(f"{label} has values up to {big:.3g}, beyond float32's range; "
                                 f"the models take float32 inputs")
    try:
        batches = as_batches(data if isinstance(data, dict) or len(specs) > 1 else (data,), specs,
                             "reject")
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None
    return batches if len(specs) > 1 else batches[0]


def read_data_file(path: str | Path, what: str, want: str = "a .npy or .npz file") -> bytes:
    """The bytes of a data file a user names (``--calibration-data``, ``--input``): a regular
    file of at most :data:`MAX_DATA_BYTES`, opened without blocking and checked on the
    descriptor; anything else is an :class:`InputError` saying what to give instead."""
    from .errors import ConfigError
    from .user_files import read_small_file

    try:
        return read_small_file(path, what, MAX_DATA_BYTES)
    except ConfigError as exc:
        raise InputError(f"{exc}; give {want}") from None


def read_samples(path: str | Path, specs: Sequence[TensorSpec], what: str = "data",
                 limit: int | None = None) -> Samples:
    """Read a ``.npy``/``.npz`` file of samples for a model with inputs ``specs`` and check
    them (:func:`check`). A one-input model takes a ``.npy`` ``(n, *shape)`` or a ``.npz``
    holding one array (or one named after the input); several inputs take a ``.npz`` with one
    array per input name. ``what`` names the option in errors (``--validation-data``).
    ``limit`` keeps the first ``limit`` samples (the label says so)."""
    p = Path(path).expanduser()
    names = [s.name for s in specs]
    want = (f"a .npy array (n, {', '.join(map(str, specs[0].shape))})" if len(specs) == 1 else
            f"a .npz with one array per input ({', '.join(names)})")
    if not p.exists() and not p.is_symlink():
        raise InputError(f"{what} {p}: no such file; give {want}")
    if p.suffix.lower() not in SUFFIXES:
        raise InputError(f"{what} {p}: a {p.suffix or 'suffix-less'} file; give {want}")
    raw = read_data_file(p, what, want)
    try:
        loaded = np.load(io.BytesIO(raw), allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        why = ("it holds Python objects (pickled), which are never loaded: save numbers "
               "(np.save(path, x.astype(np.float32)))" if "pickle" in str(exc).lower() else str(exc))
        raise InputError(f"{what} {p} cannot be read as {p.suffix}: {why}") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            try:
                arrays = {k: loaded[k] for k in loaded.files}
            except ValueError as exc:
                raise InputError(f"{what} {p}: an array in it cannot be read without pickling "
                                 f"({exc}); save numbers only") from None
        if not arrays:
            raise InputError(f"{what} {p} is an empty .npz; give {want}")
        if len(specs) == 1:
            if len(arrays) == 1:
                data: Any = next(iter(arrays.values()))
            elif names[0] in arrays:
                data = arrays[names[0]]
            else:
                raise InputError(f"{what} {p} holds arrays {', '.join(sorted(arrays))}; the model "
                                 f"takes one input ({names[0]!r}): keep one array, or name it "
                                 f"{names[0]!r}")
        else:
            data = arrays
    else:
        if len(specs) > 1:
            raise InputError(f"{what} {p} is one array {loaded.shape}; the model takes "
                             f"{len(specs)} inputs ({', '.join(names)}): give a .npz with one "
                             f"array per name (np.savez(path, {'=…, '.join(names)}=…))")
        data = loaded
    batches = check(data, specs, f"{what} {p.name}")
    total = count(batches)
    n = total if limit is None else min(total, limit)
    if n < total:
        batches = head(batches, n)
    label = f"{p.name} ({n} samples" + (f", the first of {total}" if n < total else "") + ")"
    return Samples(batches, DataSource("file", label, n, str(p.resolve()),
                                       hashlib.sha256(raw).hexdigest()))


def as_samples(data: Any, specs: Sequence[TensorSpec], what: str) -> Samples:
    """``data`` given to ``compile`` (arrays or :class:`Samples`) as checked :class:`Samples`."""
    if isinstance(data, Samples):
        return Samples(check(data.arrays, specs, f"{what} ({data.source.label})"), data.source)
    arrays = check(data, specs, what)
    n = count(arrays)
    return Samples(arrays, DataSource("array", f"{what} passed from Python ({n} samples)", n))


def own_source(meta: dict[str, Any], n: int) -> DataSource:
    """The source of a model's own ``validation_data`` (``meta["validation_source"]`` when
    who attached it said where it came from)."""
    d = meta.get("validation_source")
    if isinstance(d, dict) and d.get("kind"):
        return dataclasses.replace(DataSource.from_dict(d), n=n)
    return DataSource("model", f"the model's own validation data ({n} samples)", n)


def attach_validation(model: Any, samples: Samples) -> None:
    """Make ``samples`` ``model``'s own validation data, recording where they came from."""
    model.validation_data = samples.arrays
    model.meta["validation_source"] = samples.source.to_dict()


def describe(data: dict[str, Any] | None) -> str:
    """One line for people: ``validated on …; calibrated on …``."""
    if not data:
        return ""
    v, c = data.get("validation"), data.get("calibration")
    out = f"validated on {v['label']}" if v else "no validation"
    if c:
        out += f"; calibrated on {c['label']}"
    return out
