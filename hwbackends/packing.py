"""Several tensors as one float32 vector: how the serving engine, the shared-memory endpoint
and gRPC serve models with several inputs or outputs.

Those transports move one fixed-size float32 record per request (a shared-memory slot, a
``features`` byte string), and the engine batches such records. A model that takes
``features (32,)`` and ``state (4,)`` and returns ``signal (1,)`` and ``confidence (1,)``
is served as one record of 36 floats in and 2 out: each tensor, flattened in C order, at a
fixed offset, in the model's input (output) order. :class:`Layout` is that map — printed by
``hwb serve``, returned by :meth:`Layout.to_dict` — so a C or C++ strategy can fill and read
the record without Python. :class:`Packed` wraps a multi-IO compiled model (or router
strategy) so the engine sees one input and one output; the copies in and out cost well under
a microsecond for trading-sized tensors. Callers of the engine can still pass a tuple or dict
per tensor (:meth:`Layout.pack`) and get a tuple back (:meth:`Layout.split`).

The router and the benchmark harness do not pack: they call the model's own
``predict_into(xs, outs)`` with tuples (no copies on that hot path).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .errors import InputError, UnsupportedError
from .inputs import as_batches
from .specs import TensorSpec
from .target import close_executor


@dataclass(frozen=True)
class Field:
    """One tensor's place in the packed record: ``record[offset:offset + size]``."""

    name: str
    shape: tuple[int, ...]
    offset: int
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "offset": self.offset,
                "size": self.size}


@dataclass(frozen=True)
class Layout:
    """Where each tensor of one side (inputs or outputs) sits in the packed record."""

    fields: tuple[Field, ...]
    specs: tuple[TensorSpec, ...]

    @classmethod
    def of(cls, specs: Sequence[TensorSpec], side: str = "input") -> "Layout":
        """The layout of ``specs`` in order; :class:`UnsupportedError` for a non-float32
        tensor (the transports carry float32 only)."""
        bad = [f"{s.name} ({s.dtype})" for s in specs if s.dtype != "float32"]
        if bad:
            raise UnsupportedError(f"the serving engine packs float32 tensors only; {side}(s) "
                                   f"{', '.join(bad)} are not. Cast them in the model (or serve "
                                   f"it with CompiledModel.predict_into directly)")
        fields, off = [], 0
        for s in specs:
            n = int(np.prod(s.shape, dtype=np.int64))
            fields.append(Field(s.name, tuple(s.shape), off, n))
            off += n
        return cls(tuple(fields), tuple(specs))

    @property
    def size(self) -> int:
        """Floats per sample in the packed record."""
        return self.fields[-1].offset + self.fields[-1].size if self.fields else 0

    def spec(self, name: str) -> TensorSpec:
        """The packed record as a one-tensor spec named ``name``."""
        return TensorSpec(name, (self.size,))

    def to_dict(self) -> list[dict[str, Any]]:
        return [f.to_dict() for f in self.fields]

    def describe(self) -> str:
        """``features[0:32] (32,), state[32:36] (4,)`` — for logs."""
        return ", ".join(f"{f.name}[{f.offset}:{f.offset + f.size}] {f.shape}" for f in self.fields)

    # -- per call ---------------------------------------------------------------------------
    def pack(self, x: Any, nan_policy: str = "reject") -> np.ndarray:
        """Tensors (a tuple/list in order, or a dict by name; one sample or a batch each) as
        one C-contiguous ``(n, size)`` float32 record batch. Validated tensor by tensor
        (:func:`hwbackends.inputs.as_batches`: errors name the tensor)."""
        arrays = as_batches(x, list(self.specs), nan_policy)
        out = np.empty((len(arrays[0]), self.size), np.float32)
        self.write(out, arrays)
        return out

    def pack_sample(self, x: Any, nan_policy: str = "reject") -> np.ndarray | None:
        """One sample per tensor (float32 arrays of exactly each spec's shape, a tuple/list in
        order or a dict by name) as a ``(size,)`` record, checked for NaN/Inf per
        ``nan_policy``; ``None`` when ``x`` is anything else (then :meth:`pack` validates it
        and says what is wrong). The engine's per-request fast path."""
        if isinstance(x, dict) and len(x) != len(self.fields):
            return None  # missing or unknown names: pack() says which
        items = ([x.get(f.name) for f in self.fields] if isinstance(x, dict) else
                 list(x) if isinstance(x, (tuple, list)) else None)
        if items is None or len(items) != len(self.fields):
            return None
        rec = np.empty(self.size, np.float32)
        for f, a in zip(self.fields, items, strict=True):
            if type(a) is not np.ndarray or a.dtype != np.float32 or a.shape != f.shape:
                return None
            rec[f.offset:f.offset + f.size] = a.reshape(-1)
        if nan_policy == "reject" and not np.isfinite(rec).all():
            return None  # pack() names the tensor
        return rec

    def write(self, record: np.ndarray, arrays: Sequence[np.ndarray]) -> None:
        """Copy ``arrays`` (one ``(n, *shape)`` per field) into the ``(n, size)`` ``record``."""
        n = len(record)
        for f, a in zip(self.fields, arrays, strict=True):
            record[:, f.offset:f.offset + f.size] = np.reshape(a, (n, f.size))

    def split(self, record: np.ndarray) -> tuple[np.ndarray, ...]:
        """New arrays, one per field, from a packed record: ``(size,)`` → one sample each
        (no batch axis), ``(n, size)`` → ``(n, *shape)`` each."""
        rec = np.asarray(record, np.float32)
        if rec.ndim not in (1, 2) or rec.shape[-1] != self.size:
            raise InputError(f"packed record has shape {rec.shape}; expected ({self.size},) or "
                             f"(n, {self.size})")
        lead = rec.shape[:-1]
        return tuple(rec[..., f.offset:f.offset + f.size].reshape((*lead, *f.shape)).copy()
                     for f in self.fields)

    def into(self, record: np.ndarray, outs: Any) -> None:
        """Write one packed output ``record`` (``(size,)`` or ``(1, size)``) into caller
        buffers ``outs`` (a tuple in order or a dict by name; each of the tensor's shape, with
        or without a leading batch axis of 1)."""
        rec = np.asarray(record).reshape(-1)
        items = [outs.get(f.name) for f in self.fields] if isinstance(outs, dict) else list(outs)
        if len(items) != len(self.fields):
            raise InputError(f"got {len(items)} output buffers; the model has "
                             f"{len(self.fields)} outputs ({', '.join(f.name for f in self.fields)})")
        for f, buf in zip(self.fields, items, strict=True):
            if not isinstance(buf, np.ndarray) or buf.size != f.size or not buf.flags.writeable:
                raise InputError(f"output buffer for {f.name!r} is {type(buf).__name__} of shape "
                                 f"{np.shape(buf)}; expected a writeable float32 array of shape "
                                 f"{f.shape} (or (1, …))")
            buf[...] = rec[f.offset:f.offset + f.size].reshape(buf.shape)


def layouts(backend: Any) -> tuple[Layout, Layout] | None:
    """``(inputs, outputs)`` layouts of a :class:`Packed` backend, ``None`` for any other."""
    return (backend.inputs_layout, backend.outputs_layout) if isinstance(backend, Packed) else None


class Packed:
    """A multi-IO model (a :class:`~hwbackends.compiled.CompiledModel` or a router strategy)
    as a one-input, one-output backend for the serving engine: ``predict_into(x, out)`` with
    ``x`` of ``(batch, inputs.size)`` and ``out`` of ``(batch, outputs.size)`` float32 (see
    the module docstring)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.inputs_layout = Layout.of(inner.inputs, "input")
        self.outputs_layout = Layout.of(inner.outputs, "output")
        self.input = self.inputs_layout.spec("packed_inputs")
        self.output = self.outputs_layout.spec("packed_outputs")
        self.inputs = [self.input]
        self.outputs = [self.output]
        self.multi_io = False
        self.batch_size: int = inner.batch_size
        self.static_batch: bool = getattr(inner, "static_batch", True)
        #: Shares the lock of what it wraps (hwbackends.exclusive): its buffers are per object,
        #: and the engine never runs one executor on two threads.
        self.exclusive_key = inner
        self.tolerance = getattr(inner, "tolerance", None)
        self._bufs: dict[int, tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]] = {}
        self._routes: dict[tuple[int, int], tuple[Any, ...]] = {}
        self._buffers(self.batch_size)

    def _buffers(self, b: int) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        got = self._bufs.get(b)
        if got is None:
            got = self._bufs[b] = (
                tuple(np.zeros(s.batched(b), np.float32) for s in self.inputs_layout.specs),
                tuple(np.zeros(s.batched(b), np.float32) for s in self.outputs_layout.specs))
        return got

    @property
    def variant(self) -> str:
        return str(getattr(self.inner, "variant", type(self.inner).__name__))

    @property
    def fidelity(self) -> Any:
        return getattr(self.inner, "fidelity", None)

    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None:
        # The engine passes the same few slot buffers every call: their per-tensor views are
        # made once. At batch 1 a slice of a C-contiguous record is itself C-contiguous, so
        # the model reads and writes the records in place (no copy); larger batches copy.
        route = self._routes.get((id(x), id(out)))
        if route is None or route[0] is not x or route[1] is not out:
            route = self._route(x, out)
        _, _, xs, ys, copies_in, copies_out = route
        for dst, src in copies_in:
            np.copyto(dst, src)
        self.inner.predict_into(xs, ys)
        for dst, src in copies_out:
            np.copyto(dst, src)

    def _route(self, x: np.ndarray, out: np.ndarray) -> tuple[Any, ...]:
        n = len(x)
        if x.shape != self.input.batched(n) or out.shape != self.output.batched(n):
            raise InputError(f"packed call got {x.shape} → {out.shape}; expected "
                             f"{self.input.batched(n)} → {self.output.batched(n)}")
        if n == 1 and x.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable:
            xs = tuple(x[:, f.offset:f.offset + f.size].reshape((1, *f.shape))
                       for f in self.inputs_layout.fields)
            ys = tuple(out[:, f.offset:f.offset + f.size].reshape((1, *f.shape))
                       for f in self.outputs_layout.fields)
            copies_in: list[tuple[np.ndarray, np.ndarray]] = []
            copies_out: list[tuple[np.ndarray, np.ndarray]] = []
        else:
            xs, ys = self._buffers(n)
            copies_in = [(b.reshape(n, f.size), x[:, f.offset:f.offset + f.size])
                         for b, f in zip(xs, self.inputs_layout.fields, strict=True)]
            copies_out = [(out[:, f.offset:f.offset + f.size], b.reshape(n, f.size))
                          for b, f in zip(ys, self.outputs_layout.fields, strict=True)]
        route = (x, out, xs, ys, copies_in, copies_out)
        if len(self._routes) >= 16:  # callers with fresh arrays each call: keep it bounded
            self._routes.clear()
        self._routes[(id(x), id(out))] = route
        return route

    def warmup(self, n: int = 20) -> None:
        xs, ys = self._buffers(self.batch_size)
        for _ in range(n):
            self.inner.predict_into(xs, ys)

    def failovers(self) -> int:
        f = getattr(self.inner, "failovers", None)
        return int(f()) if f else 0

    def close(self) -> None:
        close_executor(self.inner)
