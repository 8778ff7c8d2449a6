"""Loading a model from what a caller has: a file (by suffix: Keras, Keras 2 JSON + HDF5,
ONNX, torch.export, TorchScript, a trusted pickle), a framework object, or a named source
(``zoo:NAME``); and the compile worker's :func:`load_saved`."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import cost
from ..errors import ModelError
from ..inputs import as_batches
from ..specs import TensorSpec
from ..user_files import file_kind
from . import legacy, torch_archive
from .common import clip, module_of
from .keras import from_keras
from .model import KERAS_SUFFIXES, Model
from .onnx import from_onnx, load_onnx
from .torch import from_torch, is_shape_list

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
    ``trust_pickle=True``: unpickling runs the file's code; a ``.pt2`` archive with pickled
    parts or compiled AOTInductor code needs it too), ``"zoo:NAME"`` for a bundled
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
        mods = module_of(source)
        if "keras" in mods and hasattr(source, "get_config"):
            nm = name or getattr(source, "name", "model")
            model = from_keras(legacy.build_keras(source, input_shape, nm), nm, None, lim)
        elif "onnx" in mods and hasattr(source, "graph"):
            model = from_onnx(source, name or "model", None, lim)
        elif "torch" in mods:
            model = from_torch(source, name or type(source).__name__, None, example_input,
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
    given = [tuple(x) for x in input_shape] if is_shape_list(input_shape) else [tuple(input_shape)]
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
    kind = os.stat(path).st_mode
    if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):  # nothing a framework opens may block
        raise ModelError(f"{path} is {file_kind(kind)}, not a model file; give the path of the "
                         f"file itself (.keras, .h5, .onnx, .pt2, .pt)")
    suffix = path.suffix.lower()
    name = name or path.stem
    lim = lim or cost.Limits.from_env()
    if path.is_file():  # its size bounds the weights before any framework parses it
        cost.check_file(path, name, lim)
    try:
        if suffix in (".h5", ".hdf5") and legacy.h5_kind(path) == "weights":
            raise legacy.weights_only_error(path)
        if suffix in KERAS_SUFFIXES and path.is_file():  # what it declares, before Keras builds it
            cost.check_keras_declaration(path, name, lim)
        if suffix in (".keras", ".h5", ".hdf5"):
            import keras
            km = keras.saving.load_model(path, compile=False)
            return from_keras(legacy.build_keras(km, input_shape, name), name, path, lim)
        if suffix == ".json":
            return from_keras(legacy.keras2_json(path, weights), name, path, lim)
        if suffix == ".onnx":
            return load_onnx(path, name, lim)
        if suffix == ".pt2":  # its declarations, and nothing in it that would run
            return from_torch(torch_archive.load_export(path, name, lim, trust_pickle), name,
                              path, None, None, lim)
        if suffix in (".pt", ".pth", ".ts"):
            return from_torch(legacy.torch_file(path, trust_pickle, lim, name), name, path, example,
                               input_shape, lim)
    except ModelError:
        raise
    except Exception as exc:
        foreign = legacy.foreign_class_error(path, exc) if suffix in KERAS_SUFFIXES else None
        if foreign is not None:
            raise foreign from exc
        raise ModelError(f"could not load {path} as a {suffix} model ({type(exc).__name__}: "
                         f"{clip(str(exc))}). Is the file complete? Re-export it from the "
                         f"training code.") from exc
    raise ModelError(f"unknown model file type {suffix!r} ({path}); supported: .keras .h5 "
                     f".json (Keras 2 + weights) .onnx .pt2 (torch.export) .pt/.ts (TorchScript)")


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
