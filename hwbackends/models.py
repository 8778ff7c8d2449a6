"""Source models: load Keras 3, PyTorch or ONNX; specs, a stable fingerprint, the reference.

Frameworks are imported only when a model of their kind is loaded, so ``import hwbackends``
stays light.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import batchdim, cost, legacy
from .errors import HwbError, ModelError
from .inputs import as_batches
from .specs import TensorSpec, several

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
        xs = _as_tuple(x)
        try:
            ys = self._reference(tuple(np.ascontiguousarray(a, dtype=np.float32) for a in xs))
        except HwbError:
            raise
        except Exception as exc:  # the source framework itself failed: say so, never raw
            shape = [np.shape(a) for a in xs] if len(xs) > 1 else np.shape(xs[0])
            raise ModelError(f"the source model {self.name!r} ({self.format}) failed to run on a "
                             f"batch of shape {shape}: {type(exc).__name__}: {_clip(str(exc))}. "
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
            ys = _as_tuple(self._ref(*chunk))
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
                   for a in _as_tuple(self.validation_data))
        return xs if len(self.inputs) > 1 else xs[0]

    def synthetic(self, n: int, seed: int) -> Any:
        """``n`` seeded N(0,1) inputs (a tuple, one array per input, for a multi-input model)."""
        rng = np.random.default_rng(seed)
        xs = tuple(rng.standard_normal((n, *s.shape)).astype(np.float32) for s in self.inputs)
        return xs if len(self.inputs) > 1 else xs[0]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "format": self.format, "fingerprint": self.fingerprint,
                "inputs": [s.to_dict() for s in self.inputs],
                "outputs": [s.to_dict() for s in self.outputs],
                "batch": self.meta.get("batch"),
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


def load_saved(directory: Path, limits: cost.Limits | None = None) -> Model:
    """Inverse of :meth:`Model.save`: same fingerprint, specs, name and data (its cost
    checked against ``limits`` again: the compile worker reads it under its own)."""
    info = json.loads((directory / "model.json").read_text())
    legacy.import_modules(info.get("imports", []))
    shapes = [tuple(d["shape"]) for d in info["inputs"]]
    m = load_model(directory / info["file"], name=info["name"],
                   input_shape=shapes[0] if len(shapes) == 1 else shapes, limits=limits)
    m.fingerprint = info["fingerprint"]
    m.inputs = [TensorSpec.from_dict(d) for d in info["inputs"]]
    m.outputs = [TensorSpec.from_dict(d) for d in info["outputs"]]
    m.meta = info.get("meta", {})
    if info.get("source"):
        m.source = Path(info["source"])
    val = directory / "validation.npy"
    if val.exists():
        m.validation_data = np.load(val)
    elif (directory / "validation.0.npy").exists():
        m.validation_data = tuple(np.load(directory / f"validation.{i}.npy")
                                  for i in range(len(m.inputs)))
    return m


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


# -- loading ---------------------------------------------------------------------------------
def _module_of(obj: Any) -> str:
    return " ".join(c.__module__ for c in type(obj).__mro__)


#: Named model sources, by prefix: ``"zoo:NAME"`` → ``SOURCES["zoo"]("NAME")``. Filled by the
#: modules that provide them (:mod:`hwbackends.zoo` registers ``zoo``), so this module imports
#: none of them.
SOURCES: dict[str, Callable[[str], Model]] = {}


def register_source(prefix: str, get: Callable[[str], Model]) -> None:
    """Make ``load_model("PREFIX:NAME")`` return ``get("NAME")``."""
    SOURCES[prefix] = get


def load_model(source: Any, *, name: str | None = None, example_input: Any = None,
               input_shape: Sequence[int] | None = None,
               validation_data: np.ndarray | None = None,
               weights: str | os.PathLike | None = None, trust_pickle: bool = False,
               limits: cost.Limits | None = None) -> Model:
    """Load a source model.

    ``source`` is a path (``.keras``/``.h5`` Keras, ``.json`` a Keras 2 architecture with its
    HDF5 ``weights`` (found next to it when not given), ``.onnx``, ``.pt2`` torch.export,
    ``.pt``/``.ts`` TorchScript, or a whole-module ``torch.save`` pickle with
    ``trust_pickle=True``: unpickling runs the file's code), ``"zoo:NAME"`` for a bundled
    example, a ``keras.Model`` (an unbuilt one is built for ``input_shape``), an
    ``onnx.ModelProto``, or a ``torch.nn.Module`` together with ``example_input`` (a tensor of
    one batch) or ``input_shape`` (per sample, without the batch dimension). An
    ``input_shape`` that contradicts the model's own is refused, never ignored.

    The model's declared cost (:mod:`hwbackends.cost`: weights, external data, multiply-adds
    and activations per sample) is checked against ``limits`` (default
    :meth:`~hwbackends.cost.Limits.from_env`) before its weights are read or anything runs;
    over a limit is a :class:`~hwbackends.cost.CostError`. The estimate is ``meta["cost"]``.
    """
    lim = limits or cost.Limits.from_env()
    if isinstance(source, Model):
        if validation_data is not None:
            source.validation_data = validation_data
        return source
    if isinstance(source, str) and source.partition(":")[0] in SOURCES:
        prefix, _, rest = source.partition(":")
        m = SOURCES[prefix](rest)
        if validation_data is not None:
            m.validation_data = validation_data
        return m
    if isinstance(source, (str, os.PathLike)):
        model = _load_path(Path(source), name, example_input, input_shape,
                           Path(weights) if weights is not None else None, trust_pickle, lim)
    else:
        mods = _module_of(source)
        if "keras" in mods and hasattr(source, "get_config"):
            nm = name or getattr(source, "name", "model")
            model = _from_keras(legacy.build_keras(source, input_shape, nm), nm, None, lim)
        elif "onnx" in mods and hasattr(source, "graph"):
            model = _from_onnx(source, name or "model", None, lim)
        elif "torch" in mods:
            model = _from_torch(source, name or type(source).__name__, None, example_input,
                                input_shape, lim)
        else:
            raise ModelError(f"cannot load a model from {type(source).__qualname__}; expected a file "
                             f"path, 'zoo:NAME', a keras.Model, a torch.nn.Module or an onnx.ModelProto")
    if input_shape is not None:
        _check_input_shape(model, input_shape)
    if validation_data is not None and len(model.inputs) > 1:
        model.validation_data = as_batches(validation_data, model.inputs, "pass")
    elif validation_data is not None:
        v = np.asarray(validation_data, dtype=np.float32)
        if v.shape[1:] != model.input.shape:
            raise ModelError(f"validation_data has samples of shape {v.shape[1:]}; the model "
                             f"takes {model.input.shape}")
        model.validation_data = v
    return model


def _check_input_shape(model: Model, input_shape: Any) -> None:
    """Refuse an ``input_shape`` (one shape, or one per input) that contradicts the model's."""
    given = [tuple(x) for x in input_shape] if _is_shape_list(input_shape) else [tuple(input_shape)]
    own = [s.shape for s in model.inputs]
    if given != own[:len(given)] or (len(given) > 1 and len(given) != len(own)):
        shown = given[0] if len(given) == 1 else given
        theirs = own[0] if len(own) == 1 else own
        raise ModelError(f"input_shape={shown} was given but model {model.name!r} takes samples "
                         f"of shape {theirs}; drop input_shape= or pass the model's own")


def _load_path(path: Path, name: str | None, example: Any = None, input_shape: Any = None,
               weights: Path | None = None, trust_pickle: bool = False,
               lim: cost.Limits | None = None) -> Model:
    if not path.exists():
        raise ModelError(f"model file not found: {path}. Pass the path of a .keras, .h5, .onnx, "
                         f".pt2 or .pt file, or 'zoo:NAME' for a bundled example")
    suffix = path.suffix.lower()
    name = name or path.stem
    lim = lim or cost.Limits.from_env()
    if path.is_file():  # its size bounds the weights before any framework parses it
        cost.check_file(path, name, lim)
    try:
        if suffix in (".h5", ".hdf5") and legacy.h5_kind(path) == "weights":
            raise legacy.weights_only_error(path)
        if suffix in (".keras", ".h5", ".hdf5"):
            import keras
            km = keras.saving.load_model(path, compile=False)
            return _from_keras(legacy.build_keras(km, input_shape, name), name, path, lim)
        if suffix == ".json":
            return _from_keras(legacy.keras2_json(path, weights), name, path, lim)
        if suffix == ".onnx":
            return _load_onnx(path, name, lim)
        if suffix == ".pt2":
            import torch
            ep = torch.export.load(str(path))
            return _from_torch(ep, name, path, None, None, lim)
        if suffix in (".pt", ".pth", ".ts"):
            return _from_torch(legacy.torch_file(path, trust_pickle), name, path, example,
                               input_shape, lim)
    except ModelError:
        raise
    except Exception as exc:
        foreign = legacy.foreign_class_error(path, exc) if suffix in KERAS_SUFFIXES else None
        if foreign is not None:
            raise foreign from exc
        raise ModelError(f"could not load {path} as a {suffix} model ({type(exc).__name__}: "
                         f"{_clip(str(exc))}). Is the file complete? Re-export it from the "
                         f"training code.") from exc
    raise ModelError(f"unknown model file type {suffix!r} ({path}); supported: .keras .h5 "
                     f".json (Keras 2 + weights) .onnx .pt2 (torch.export) .pt/.ts (TorchScript)")


def _load_onnx(path: Path, name: str, lim: cost.Limits) -> Model:
    """An ONNX file: the graph is read without its external data, its cost checked (the
    external tensors against the files they live in), and only then the data read."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    c = cost.onnx_cost(proto, name, path.parent)
    lim.check(c, name)
    if c.external_bytes:
        onnx.load_external_data_for_model(proto, str(path.parent))
    return _from_onnx(proto, name, path, lim, c)


def _clip(text: str, limit: int = 300) -> str:
    """``text`` cut at a word boundary (never mid-word) with an ellipsis."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " …"


def _unique(kind: str, names: Sequence[str], name: str) -> None:
    if len(set(names)) != len(names):
        raise ModelError(f"model {name!r} has {kind}s with the same name ({', '.join(names)}); "
                         f"give each {kind} its own name (keras.Input(name=...))")


def _static(shape: Sequence[Any], what: str, name: str) -> tuple[int, ...]:
    dims = tuple(shape)
    if any(d is None or (isinstance(d, int) and d < 0) or not isinstance(d, (int, np.integer)) for d in dims):
        raise ModelError(f"model {name!r} has a dynamic {what} shape {dims} beyond the batch "
                         f"dimension; compile needs static shapes (fix the window length)")
    return tuple(int(d) for d in dims)


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:32]


def _keras_names(km: Any, kind: str) -> list[str]:
    """Tensor names: ``input``/``output`` for a single tensor (the names every single-tensor
    model shares, whatever its framework called them), else the
    Keras layer names (``keras.Input(name=...)``, the output layers' names)."""
    tensors = km.inputs if kind == "input" else km.outputs
    if len(tensors) == 1:
        return [kind]
    names = list(getattr(km, f"{kind}_names", None) or [])
    if len(names) != len(tensors):
        names = [getattr(t, "name", "") or f"{kind}_{i}" for i, t in enumerate(tensors)]
    return [str(n) for n in names]


def keras_call_input(km: Any, flat: Sequence[Any]) -> Any:
    """``flat`` (one tensor per ``km.inputs``, in order) in the structure of ``km.input``.

    A Keras model keeps the structure it was built with: one tensor (``keras.Model(x, y)``),
    a list of one (a Keras 2 functional JSON: ``"input_layers": [[name, 0, 0]]``), several,
    or a dict. ``clone_model(input_tensors=…)`` refuses any other structure ("input_tensors
    must have the same structure as model.input") and a call warns, so both follow it. A
    ``Sequential`` has no ``input`` until called; it takes one tensor."""
    import keras

    flat = list(flat)
    if isinstance(km, keras.Sequential):
        return flat[0] if len(flat) == 1 else flat
    return keras.tree.pack_sequence_as(km.input, flat)


def _from_keras(km: Any, name: str, path: Path | None, lim: cost.Limits | None = None) -> Model:
    _unique("input", _keras_names(km, "input"), name)
    c = cost.keras_cost(km)
    (lim or cost.Limits.from_env()).check(c, name)
    ins = [TensorSpec(n, _static(t.shape[1:], "input", name))
           for n, t in zip(_keras_names(km, "input"), km.inputs, strict=True)]
    outs = [TensorSpec(n, _static(t.shape[1:], "output", name))
            for n, t in zip(_keras_names(km, "output"), km.outputs, strict=True)]
    arch = json.dumps(km.get_config(), sort_keys=True, default=str).encode()
    weights = [np.ascontiguousarray(w).tobytes() for w in km.get_weights()]
    fp = _digest(b"keras", arch, *weights)

    def ref(*xs: np.ndarray, km: Any = km) -> tuple[np.ndarray, ...]:  # one array per output
        y = km(keras_call_input(km, xs), training=False)
        return tuple(np.asarray(t) for t in (y if isinstance(y, (list, tuple)) else [y]))

    if len(ins) > 1 or len(outs) > 1:
        meta = {} if km.inputs[0].shape[0] is None else {"fixed_batch": int(km.inputs[0].shape[0])}
    else:
        meta = _keras_batch(km, ins[0], ref)
    meta["cost"] = c.to_dict()
    return Model(km, "keras", ins, outs, fp, name, path, meta=meta, _ref=ref)


def _keras_batch(km: Any, inp: TensorSpec, ref: Callable[..., tuple[np.ndarray, ...]]) -> dict[str, Any]:
    """A Keras model built with ``keras.Input(..., batch_size=N)`` usually still runs at any
    batch (Keras layers take the batch from the data); check that rather than assume it."""
    b = km.inputs[0].shape[0]
    if b is None:
        return {}
    b = int(b)
    try:
        ok = ref(np.zeros((b + 1, *inp.shape), np.float32))[0].shape[0] == b + 1
    except Exception:  # noqa: BLE001 - any failure means it runs only at its batch
        ok = False
    if ok:
        return {"batch": batchdim.BatchInfo(b, batchdim.SYMBOLIC, f"built with batch_size={b}; "
                                            f"the Keras model runs at any batch").to_dict()}
    return {"fixed_batch": b, "batch": batchdim.BatchInfo(
        b, batchdim.FIXED, f"built with batch_size={b} and runs only at it").to_dict()}


def _from_onnx(proto: Any, name: str, path: Path | None, lim: cost.Limits | None = None,
               c: cost.Cost | None = None) -> Model:
    if c is None:  # an in-memory graph: its data is in it (estimated all the same)
        c = cost.onnx_cost(proto, name)
        (lim or cost.Limits.from_env()).check(c, name)
    g = proto.graph
    inits = {i.name for i in g.initializer}
    real_inputs = [i for i in g.input if i.name not in inits]
    if not real_inputs or not len(g.output):
        raise ModelError(f"ONNX model {name!r} has {len(real_inputs)} inputs and {len(g.output)} "
                         f"outputs; it needs at least one of each")

    def dims(vi: Any, what: str) -> tuple[int, ...]:
        d = [x.dim_value if x.HasField("dim_value") else None for x in vi.type.tensor_type.shape.dim]
        return _static(d[1:], what, name)

    ins = [TensorSpec(i.name, dims(i, "input")) for i in real_inputs]
    outs = [TensorSpec(o.name, dims(o, "output")) for o in g.output]
    # The fingerprint is the file as the user has it, before any batch rewrite.
    fp = _digest(b"onnx", proto.SerializeToString(deterministic=True))
    if len(ins) > 1 or len(outs) > 1:
        graph, info = _onnx_batch_multi(proto, real_inputs, name)
    else:
        graph, info = _onnx_batch(proto, ins[0].shape, name)
    meta: dict[str, Any] = {"batch": info.to_dict(), "cost": c.to_dict()}
    if info.handling == batchdim.FIXED:
        meta["fixed_batch"] = info.exported
    return Model(graph, "onnx", ins, outs, fp, name, path, meta=meta)


def _onnx_batch_multi(proto: Any, real_inputs: list[Any], name: str) -> tuple[Any, batchdim.BatchInfo]:
    """A multi-IO graph keeps its batch dimension as exported: symbolic runs at any batch; a
    fixed one is compiled at (``predict`` pads/chunks). The rewrite to symbolic that
    single-input graphs get is not tried here (it verifies with one input)."""
    import onnx

    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelError(f"ONNX model {name!r} is not a valid ONNX graph ({_clip(str(exc))}); "
                         f"is the file complete? Re-export it") from exc
    batches = {batchdim.dim0(i) for i in real_inputs}
    if len(batches) > 1:
        raise ModelError(f"ONNX model {name!r} declares different batch dimensions on its "
                         f"inputs ({sorted(map(str, batches))}); every input needs the same "
                         f"batch. {batchdim.reexport_advice('onnx')}")
    b = batches.pop()
    if b is None:
        return proto, batchdim.BatchInfo(None, batchdim.DYNAMIC, "the batch dimension is symbolic")
    if b < 1:
        raise ModelError(f"ONNX model {name!r} declares a batch dimension of {b}; expected ≥ 1 "
                         f"or symbolic. To fix, {batchdim.reexport_advice('onnx')}")
    return proto, batchdim.BatchInfo(b, batchdim.FIXED, f"exported with batch {b} (several "
                                     f"inputs/outputs: compiled at it, not made symbolic)")


def _onnx_batch(proto: Any, sample: tuple[int, ...], name: str) -> tuple[Any, batchdim.BatchInfo]:
    import onnx

    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelError(f"ONNX model {name!r} is not a valid ONNX graph ({_clip(str(exc))}); "
                         f"is the file complete? Re-export it") from exc
    inits = {i.name for i in proto.graph.initializer}
    first = next(i for i in proto.graph.input if i.name not in inits)
    dim0 = first.type.tensor_type.shape.dim
    if len(dim0) and dim0[0].HasField("dim_value") and dim0[0].dim_value < 1:
        raise ModelError(f"ONNX model {name!r} declares a batch dimension of "
                         f"{dim0[0].dim_value}; expected ≥ 1 or symbolic. To fix, "
                         f"{batchdim.reexport_advice('onnx')}")
    try:
        graph, info = batchdim.relax_onnx(proto, sample)
    except Exception as exc:  # the original graph itself does not run
        raise ModelError(f"ONNX model {name!r} does not run in ONNX Runtime ({type(exc).__name__}: "
                         f"{str(exc)[:300]}); check it with onnx.checker.check_model and "
                         f"re-export it") from exc
    if info.handling == batchdim.FIXED and "output's first dimension" in info.detail:
        raise ModelError(f"ONNX model {name!r}: {info.detail}; hwbackends needs one output row "
                         f"per input sample")
    return graph, info


def _from_torch(obj: Any, name: str, path: Path | None, example: Any, input_shape: Any,
                lim: cost.Limits | None = None) -> Model:
    """A torch model: an ``nn.Module``/TorchScript module with ``example`` (one batch: a
    tensor, or a tuple with one tensor per ``forward`` argument) or ``input_shape``, or a
    ``torch.export`` program. Several inputs are named after ``forward``'s arguments, several
    outputs (a tuple return) ``output_0``, ``output_1``, … (a single one is ``input`` /
    ``output``, as in every format)."""
    import torch

    if isinstance(obj, torch.export.ExportedProgram):
        module, examples, in_names, fixed_batch = _exported_inputs(obj, name)
        arch = str(obj.graph).encode()
        arch_from_call = False  # the graph is the architecture
        state = obj.state_dict
    else:
        module, fixed_batch = obj, None
        examples = _torch_examples(example, input_shape, name)
        in_names = _torch_arg_names(obj, len(examples))
        # repr() shows the submodules, not what forward does with them (norm_first, an
        # activation chosen by a plain attribute): the torch calls of the example run are
        # part of the architecture too (_TorchCallTrace)
        arch = repr(obj).encode()
        arch_from_call = True
        state = obj.state_dict()
        if hasattr(module, "eval"):
            module.eval()
    lim = lim or cost.Limits.from_env()
    base = cost.torch_param_cost(state)
    lim.check(base, name)  # the weights, before the example call
    lim.check(cost.torch_input_cost(base, examples), name)  # the inputs, before the call
    with torch.no_grad(), cost.TorchProbe(module) as probe:
        try:
            result = module(*examples)
        except Exception as exc:
            raise _torch_shape_error(obj, name, examples, example is not None, exc) from exc
        ys = _torch_outputs(result, name)
    if arch_from_call:
        arch += _batch1_trace(module, examples)
    c = probe.cost(base, examples, int(examples[0].shape[0]) if examples[0].dim() else 1)
    lim.check(c, name)
    multi = len(examples) > 1 or len(ys) > 1
    ins = [TensorSpec(n if multi else "input", _static(tuple(e.shape[1:]), "input", name))
           for n, e in zip(in_names, examples, strict=True)]
    out_names = [f"output_{i}" for i in range(len(ys))] if len(ys) > 1 else ["output"]
    outs = [TensorSpec(n, _static(tuple(y.shape[1:]), "output", name))
            for n, y in zip(out_names, ys, strict=True)]
    wb = [k.encode() + v.detach().cpu().contiguous().numpy().tobytes() for k, v in sorted(state.items())]
    # Single-IO fingerprints are unchanged from before multi-IO (cached artifacts stay valid);
    # a multi-IO one covers every output spec as well.
    specs = repr(ins).encode() + (repr(outs).encode() if multi else b"")
    fp = _digest(b"torch", arch, specs, *wb)
    meta: dict[str, Any] = {"fixed_batch": fixed_batch} if fixed_batch is not None else {}
    meta["cost"] = c.to_dict()

    def ref(*xs: np.ndarray, m: Any = module) -> tuple[np.ndarray, ...]:  # one array per output
        with torch.no_grad():
            r = m(*(torch.from_numpy(x) for x in xs))
        return tuple(t.numpy() for t in _torch_outputs(r, name))

    return Model(obj, "torch", ins, outs, fp, name, path, meta=meta, _ref=ref)


class _TorchCallTrace:
    """Every torch function the example call ran, with its non-tensor arguments and the
    shapes and dtypes of its tensors (a ``TorchFunctionMode``): what the module's ``forward``
    did, which ``repr`` does not show, as a digest for the fingerprint."""

    def __init__(self) -> None:
        import torch

        trace = self
        self._h = hashlib.sha256()

        class Mode(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                trace._h.update(f"{_func_name(func)}{_call_shape(args)}"
                                f"{_call_shape(kwargs)};".encode())
                return func(*args, **kwargs)

        self._mode = Mode()

    def __enter__(self) -> _TorchCallTrace:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def digest(self) -> bytes:
        return self._h.digest()


def _batch1_trace(module: Any, examples: tuple[Any, ...]) -> bytes:
    """The digest of one more call, on the examples' first rows, under :class:`_TorchCallTrace`
    (batch 1 whatever batch the example has, so its shapes and the ints a forward derives from
    them are the same however the model was loaded; no cost hooks attached). Empty when that
    call fails (the example call itself succeeded: ``repr`` and the weights still key it)."""
    import torch

    rows = tuple(e[:1] if e.dim() else e for e in examples)  # sliced outside the trace
    one = _TorchCallTrace()
    try:
        with torch.no_grad(), one:
            module(*rows)
    except Exception:
        return b""
    return one.digest()


def _func_name(func: Any) -> str:
    """A torch function's name without its object address (the same in every process)."""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    owner = getattr(getattr(func, "__objclass__", None), "__name__", "")
    return f"{owner}.{name}" if name else type(func).__name__


def _call_shape(a: Any, depth: int = 0) -> str:
    """A torch call's arguments as text: tensors by shape and dtype, containers item by item,
    plain values by repr (bounded: a model's call arguments are small)."""
    import torch

    if isinstance(a, torch.Tensor):
        return f"T{tuple(a.shape)}{a.dtype}"
    if depth > 4:
        return "…"
    if isinstance(a, (list, tuple)):
        return "(" + ",".join(_call_shape(v, depth + 1) for v in a[:64]) + ")"
    if isinstance(a, dict):
        return "{" + ",".join(f"{k}:{_call_shape(v, depth + 1)}" for k, v in list(a.items())[:64]) + "}"
    if isinstance(a, (int, float, bool, str, type(None), slice, torch.dtype, torch.device)):
        return repr(a)[:200]
    return type(a).__name__


def _torch_shape_error(obj: Any, name: str, examples: tuple[Any, ...], given: bool,
                       exc: Exception) -> ModelError:
    """The torch model did not run on the example batch: almost always an input shape that
    is not the one its forward takes. Name the shape tried, the first layer's, and the fix."""
    shapes = ", ".join(str(tuple(e.shape)) for e in examples)
    how = ("example_input" if given else
           "input_shape= (per sample; --input-shape D[,D...] on the command line)")
    first = next((m for m in getattr(obj, "modules", lambda: [])()
                  if hasattr(m, "in_features") or hasattr(m, "input_size")
                  or hasattr(m, "in_channels")), None)
    wants = ""
    if first is not None:
        n = next(getattr(first, a) for a in ("in_features", "input_size", "in_channels")
                 if hasattr(first, a))
        wants = f"; its first layer, {type(first).__name__}, takes {n} features/channels"
    return ModelError(f"torch model {name!r} does not run on a batch of shape {shapes} made from "
                      f"{how.split(' ')[0]} ({type(exc).__name__}: {_clip(str(exc), 200)}){wants}. "
                      f"Pass the per-sample shape its forward takes as {how}")


def _exported_inputs(ep: Any, name: str) -> tuple[Any, tuple[Any, ...], list[str], int | None]:
    """A ``torch.export`` program's module, one zero example per user input (batch 1 when the
    batch is symbolic), the inputs' names (``forward``'s arguments) and its fixed batch."""
    import torch

    names = list(ep.graph_signature.user_inputs)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    examples, batches = [], set()
    for n in names:
        val = placeholders[n].meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() < 1:
            raise ModelError(f"torch.export program {name!r}: input {n!r} is not a tensor with "
                             f"a batch dimension ({type(val).__name__}); every input must be a "
                             f"float tensor of shape (batch, ...)")
        dims = val.shape
        batches.add(None if isinstance(dims[0], torch.SymInt) else int(dims[0]))
        examples.append(torch.zeros(tuple(1 if isinstance(s, torch.SymInt) else int(s) for s in dims)))
    if len(batches) > 1:
        raise ModelError(f"torch.export program {name!r} has inputs with different batch "
                         f"dimensions ({sorted(map(str, batches))}); export every input with "
                         f"the same batch Dim: {batchdim.reexport_advice('torch')}")
    fixed = batches.pop()
    if fixed is not None:  # a fixed-batch program runs only at its batch
        examples = [torch.zeros((fixed, *e.shape[1:])) for e in examples]
    return ep.module(), tuple(examples), [str(n) for n in names], fixed


def _torch_examples(example: Any, input_shape: Any, name: str) -> tuple[Any, ...]:
    """One float32 example batch per input: ``example`` (a tensor or a tuple/list of them),
    else zeros of ``input_shape`` (one shape, or one per input)."""
    import torch

    if example is None:
        if input_shape is None:
            raise ModelError(f"a torch model needs example_input= (one batch: a tensor, or a tuple "
                             f"with one per forward argument) or input_shape= (per sample; a list "
                             f"of shapes for several inputs; on the command line --input-shape, "
                             f"once per input) to know its inputs; got neither for {name!r}")
        shapes = input_shape if _is_shape_list(input_shape) else [input_shape]
        return tuple(torch.zeros((1, *s), dtype=torch.float32) for s in shapes)
    items = example if isinstance(example, (tuple, list)) else (example,)
    try:
        return tuple(torch.as_tensor(e, dtype=torch.float32) for e in items)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ModelError(f"example_input for {name!r} must be a tensor or array of one batch, "
                         f"or a tuple with one per forward argument; got {type(example).__name__} "
                         f"({exc})") from exc


def _is_shape_list(shape: Any) -> bool:
    """Whether ``shape`` is a list of per-input shapes (``[(16,), (4,)]``), not one shape."""
    return (isinstance(shape, (tuple, list)) and len(shape) > 0
            and all(isinstance(s, (tuple, list)) for s in shape))


def _torch_arg_names(module: Any, n: int) -> list[str]:
    """The names of ``forward``'s first ``n`` arguments (TorchScript: from its schema), or
    ``input_0``, … when they cannot be read. A single input is ``input`` anyway."""
    import inspect

    names: list[str] = []
    schema = getattr(getattr(module, "forward", None), "schema", None)
    if schema is not None:  # TorchScript
        names = [a.name for a in schema.arguments if a.name != "self"]
    else:
        try:
            params = inspect.signature(module.forward).parameters.values()
            names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError, AttributeError):
            names = []
    if len(names) < n:
        return [f"input_{i}" for i in range(n)]
    return names[:n]


def _torch_outputs(y: Any, name: str) -> tuple[Any, ...]:
    """A torch model's result as a tuple of tensors: one tensor, or a flat tuple/list of them."""
    import torch

    ys = tuple(y) if isinstance(y, (tuple, list)) else (y,)
    bad = [type(t).__name__ for t in ys if not isinstance(t, torch.Tensor)]
    if bad or not ys:
        raise ModelError(f"torch model {name!r} returns {type(y).__name__} "
                         f"({', '.join(bad) or 'empty'}); expected a tensor or a flat tuple of "
                         f"tensors, one per output (not dicts or nested tuples)")
    return ys


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
