"""The source model (:class:`Model`): the framework object, its specs, a stable fingerprint,
the fp32 reference predictor and its transport to the compile worker (:meth:`Model.save`).

Frameworks are imported only when a model of their kind is used, so ``import hwbackends``
stays light."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import HwbError, ModelError
from ..specs import TensorSpec, several
from . import legacy
from .common import as_tuple, clip
from .onnx_dtypes import INTEGRAL

FORMATS = ("keras", "torch", "onnx")


KERAS_SUFFIXES = (".keras", ".h5", ".hdf5", ".json")


@dataclass
class Model:
    """One source model and everything the targets and the fidelity check need from it.

    A model made by :meth:`deferred` knows its fingerprint, specs and meta (from a signed
    memo: :mod:`hwbackends.zoo`) but not yet its framework object: ``obj`` and the reference
    load it on first use, once (copies share the load), so serving a cached artifact of it
    never imports the framework."""

    obj: Any = field(repr=False)
    format: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    fingerprint: str
    name: str = "model"
    source: Path | None = None
    #: Representative inputs (calibration and fidelity); generated from the spec when absent.
    validation_data: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    _ref: Callable[..., Any] | None = field(default=None, repr=False)

    @classmethod
    def deferred(cls, load: Callable[[], Model], format: str, inputs: list[TensorSpec],
                 outputs: list[TensorSpec], fingerprint: str, name: str, **kw: Any) -> Model:
        """A model whose framework object ``load()`` makes on first use (``load`` returns the
        whole :class:`Model`; its fingerprint must be this one)."""
        m = cls(None, format, inputs, outputs, fingerprint, name, **kw)
        del m.obj  # reads reach __getattr__ until it is loaded
        m.__dict__["_deferred"] = _Deferred(load)
        return m

    def __getattr__(self, name: str) -> Any:
        # Reached only when ``obj`` is not loaded yet (a deferred model): load it now.
        deferred = self.__dict__.get("_deferred")
        if name != "obj" or deferred is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        real = deferred.get()
        if real.fingerprint != self.fingerprint:
            raise ModelError(f"model {self.name!r} loaded with fingerprint {real.fingerprint}, "
                             f"but its memo said {self.fingerprint}: {deferred.stale_hint}")
        self.__dict__["obj"] = real.obj
        if self._ref is None:
            self._ref = real._ref
        return real.obj

    def __copy__(self) -> Model:
        # A copy of a deferred model stays deferred (dataclasses.replace would load it).
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    @property
    def multi_io(self) -> bool:
        """Whether the model has several inputs or several outputs (the one test:
        :func:`hwbackends.target.several`)."""
        return several(self.inputs, self.outputs)

    @property
    def input(self) -> TensorSpec:
        return self.inputs[0]

    @property
    def output(self) -> TensorSpec:
        return self.outputs[0]

    def reference(self, x: Any) -> Any:
        """The source framework's fp32 output for ``x`` of shape ``(n, *input.shape)``.

        ``x`` is one array (a model with one input) or a tuple/list with one ``(n,
        *spec.shape)`` array per input, in ``inputs`` order. Given a tuple it returns a tuple
        with one array per output; given an array, the array of the one output (a tuple when
        there are several)."""
        if self._ref is None:
            self.obj  # noqa: B018 -- a deferred model loads here, and with it its reference
        if self._ref is None:
            self._ref = _reference_fn(self)
        xs = as_tuple(x)
        try:
            ys = self._reference(tuple(np.ascontiguousarray(a, dtype=np.float32) for a in xs))
        except HwbError:
            raise
        except Exception as exc:  # the source framework itself failed: say so, never raw
            shape = [np.shape(a) for a in xs] if len(xs) > 1 else np.shape(xs[0])
            raise ModelError(f"the source model {self.name!r} ({self.format}) failed to run on a "
                             f"batch of shape {shape}: {type(exc).__name__}: {clip(str(exc))}. "
                             f"Check that it runs in its own framework and re-export it") from exc
        return ys if isinstance(x, (tuple, list)) or len(ys) > 1 else ys[0]

    def _reference(self, xs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """The reference on tuples: chunks of 1024 rows (a fixed-batch graph runs only at its
        batch: the last chunk is zero-padded), one ``(n, *spec.shape)`` array per output."""
        if len(xs) != len(self.inputs):
            raise ModelError(f"model {self.name!r} takes {len(self.inputs)} inputs "
                             f"({', '.join(s.name for s in self.inputs)}); got {len(xs)}")
        n = len(xs[0])
        fixed = self.meta.get("fixed_batch")
        step = fixed or 1024
        parts: list[list[np.ndarray]] = [[] for _ in self.outputs]
        for i in range(0, n, step):
            chunk = [a[i:i + step] for a in xs]
            if fixed and len(chunk[0]) < fixed:
                chunk = [np.concatenate([c, np.zeros((fixed - len(c), *c.shape[1:]), np.float32)])
                         for c in chunk]
            ys = as_tuple(self._ref(*chunk))
            for j, y in enumerate(ys):
                parts[j].append(np.asarray(y)[:n - i])
        return tuple(np.concatenate(p).astype(np.float32, copy=False).reshape((n, *s.shape))
                     for p, s in zip(parts, self.outputs, strict=True))

    def representative(self, n: int = 256, seed: int = 0) -> Any:
        """Inputs for calibration/fidelity: the model's own validation data, else
        :meth:`synthetic` (a tuple, one array per input, for a multi-input model)."""
        if self.validation_data is None:
            return self.synthetic(n, seed)
        xs = tuple(np.ascontiguousarray(a[:n], dtype=np.float32)
                   for a in as_tuple(self.validation_data))
        return xs if len(self.inputs) > 1 else xs[0]

    def synthetic(self, n: int, seed: int) -> Any:
        """``n`` seeded N(0,1) inputs (a tuple, one array per input, for a multi-input model);
        rounded to whole numbers for an input the graph casts to an integer type (and their
        magnitude for an unsigned one), as a user would feed it."""
        rng = np.random.default_rng(seed)
        cast = (self.meta.get("cast") or {}).get("inputs", {})
        xs = tuple(_as_fed(rng.standard_normal((n, *s.shape)).astype(np.float32), cast.get(s.name))
                   for s in self.inputs)
        return xs if len(self.inputs) > 1 else xs[0]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "format": self.format, "fingerprint": self.fingerprint,
                "inputs": [s.to_dict() for s in self.inputs],
                "outputs": [s.to_dict() for s in self.outputs],
                "batch": self.meta.get("batch"),
                "upgraded": self.meta.get("upgraded"),  # an old ONNX opset converted (models/onnx.py)
                "cast": self.meta.get("cast"),  # ONNX inputs/outputs cast to float32 (models/onnx_dtypes.py)
                "source": str(self.source) if self.source else None}

    # -- transport to the compile child process ---------------------------------------------
    def save(self, directory: Path) -> Path:
        """Write the model into ``directory`` so :func:`load_saved` restores it elsewhere,
        fingerprint and data included."""
        directory.mkdir(parents=True, exist_ok=True)
        if self.format == "keras":
            fname = "model.keras"
            self.obj.save(directory / fname)
        elif self.format == "onnx":
            fname = "model.onnx"
            (directory / fname).write_bytes(self.obj.SerializeToString())
        else:
            fname = _save_torch(self, directory)
        if isinstance(self.validation_data, tuple):
            for i, a in enumerate(self.validation_data):
                np.save(directory / f"validation.{i}.npy", a)
        elif self.validation_data is not None:
            np.save(directory / "validation.npy", self.validation_data)
        info = self.describe() | {"file": fname, "meta": self.meta}
        if self.format == "keras":  # modules of layer classes not Keras' own, for the worker
            info["imports"] = legacy.keras_imports(self.obj)
        (directory / "model.json").write_text(json.dumps(info, default=str))
        return directory


def _as_fed(x: np.ndarray, cast_to: str | None) -> np.ndarray:
    """Synthetic float32 inputs ``x`` as fed to a graph input cast to ``cast_to``."""
    if cast_to is None or cast_to.upper() not in INTEGRAL:
        return x
    x = np.rint(x)
    return np.abs(x) if cast_to.startswith("u") or cast_to == "bool" else x


class _Deferred:
    """The load of a deferred model's framework object: run once, shared by its copies."""

    stale_hint = "the memo was out of date and is removed: load the model again"

    def __init__(self, load: Callable[[], Model]) -> None:
        self._load = load
        self._model: Model | None = None
        self._lock = threading.Lock()

    def get(self) -> Model:
        with self._lock:
            if self._model is None:
                self._model = self._load()
            return self._model


def _save_torch(model: Model, directory: Path) -> str:
    import torch

    obj = model.obj
    if isinstance(obj, torch.export.ExportedProgram):
        torch.export.save(obj, directory / "model.pt2")
        return "model.pt2"
    if isinstance(obj, torch.jit.ScriptModule):
        obj.save(str(directory / "model.ts"))
        return "model.ts"
    # Batch 2 in the example: torch.export specialises a dimension of size 1 to a constant.
    examples = tuple(torch.zeros((2, *s.shape), dtype=torch.float32) for s in model.inputs)
    try:
        # Dynamic batch (one Dim shared by every input) so converters downstream can fix any
        # batch size they need.
        batch = torch.export.Dim("batch", min=1, max=65536)
        ep = torch.export.export(obj.eval(), examples,
                                 dynamic_shapes=tuple({0: batch} for _ in examples))
    except Exception:
        ep = torch.export.export(obj.eval(), examples)
    torch.export.save(ep, directory / "model.pt2")
    return "model.pt2"


def _reference_fn(model: Model) -> Callable[..., Any]:
    if model.format == "onnx":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(model.obj.SerializeToString(), so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]

        def run(*xs: np.ndarray) -> tuple[np.ndarray, ...]:  # one array per input, in order
            return tuple(sess.run(None, dict(zip(names, xs, strict=True))))
        return run
    raise ModelError(f"model {model.name!r} has no reference predictor")
