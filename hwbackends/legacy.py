"""Model files as users have them from older toolchains: Keras 2 JSON + HDF5 weights,
weights-only HDF5, unbuilt Keras models, whole-module ``torch.save`` pickles.

Each loader either returns a framework object :mod:`hwbackends.models` can take, or raises
:class:`ModelError` naming what the file is and the exact steps that make it loadable.
Frameworks are imported inside the functions (``import hwbackends`` stays light).
"""
from __future__ import annotations

import copy
import json
import zipfile
from pathlib import Path
from typing import Any, Sequence

from .errors import ModelError

#: Names a Keras 2 weights file next to ``NAME.json`` usually has (hls4ml example-models
#: use ``NAME_weights.h5``).
WEIGHT_NAMES = ("{stem}_weights.h5", "{stem}.h5", "{stem}.weights.h5", "{stem}_weights.hdf5")


def h5_kind(path: Path) -> str:
    """``model`` (a whole saved model), ``weights`` (``save_weights``: no architecture) or
    ``unknown`` for an HDF5 file."""
    import h5py

    with h5py.File(path, "r") as f:
        if "model_config" in f.attrs:
            return "model"
        if "layer_names" in f.attrs or "model_weights" not in f and len(f.keys()):
            return "weights"
    return "unknown"


def weights_only_error(path: Path) -> ModelError:
    return ModelError(
        f"{path} is a weights-only HDF5 file (written by model.save_weights): it has no "
        f"architecture. Load it with its architecture: pass the Keras 2 JSON "
        f"(load_model('model.json', weights='{path.name}'); on the command line: hwb compile "
        f"model.json --weights {path.name}), or build the model in code, call "
        f"model.load_weights('{path}') and pass the model object")


def _keras2_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Keras 3's legacy loader turns a layer's ``batch_input_shape`` into a per-sample
    ``input_shape`` and so adds a dimension; hand it the per-sample shape instead."""
    cfg = copy.deepcopy(cfg)
    layers = cfg.get("config", {}).get("layers", []) if isinstance(cfg.get("config"), dict) else []
    for layer in layers:
        lc = layer.get("config", {})
        if layer.get("class_name") != "InputLayer" and lc.get("batch_input_shape"):
            lc["input_shape"] = list(lc.pop("batch_input_shape"))[1:]
    return cfg


def keras2_json(path: Path, weights: Path | None) -> Any:
    """A Keras 2 ``model.to_json()`` architecture with its HDF5 weights, through Keras'
    legacy loader."""
    from keras.src.legacy.saving import saving_utils

    weights = weights or next((path.parent / w.format(stem=path.stem) for w in WEIGHT_NAMES
                               if (path.parent / w.format(stem=path.stem)).exists()), None)
    if weights is None:
        tried = ", ".join(w.format(stem=path.stem) for w in WEIGHT_NAMES)
        raise ModelError(f"{path} is a Keras architecture (JSON) without weights: none of {tried} "
                         f"is next to it. Pass weights='path/to/weights.h5' (command line: "
                         f"--weights path/to/weights.h5)")
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelError(f"{path} is not a Keras model JSON ({exc}); expected the output of "
                         f"model.to_json()") from exc
    if not isinstance(cfg, dict) or "class_name" not in cfg:
        raise ModelError(f"{path} is not a Keras model JSON: expected an object with "
                         f"'class_name' and 'config' (the output of model.to_json())")
    try:
        km = saving_utils.model_from_config(_keras2_config(cfg))
    except Exception as exc:
        raise ModelError(
            f"Keras' legacy loader cannot rebuild the architecture in {path} "
            f"({type(exc).__name__}: {str(exc)[:200]}). With Keras 2 (pip install tf-keras), load "
            f"it (tf_keras.models.model_from_json + load_weights) and save it as one file: "
            f"model.save('model.h5'); then pass that file, or export it to ONNX with "
            f"tf2onnx.convert.from_keras(model, input_signature=[tf.TensorSpec([None, ...])])"
        ) from exc
    try:
        km.load_weights(str(weights))
    except Exception as exc:
        raise ModelError(f"the weights {weights} do not fit the architecture in {path} "
                         f"({type(exc).__name__}: {str(exc)[:200]}); pass the weights file saved "
                         f"with that model (weights=, or --weights on the command line)") from exc
    return km


def build_keras(km: Any, input_shape: Sequence[int] | None, name: str) -> Any:
    """An unbuilt Keras model (no ``inputs`` yet) built for ``input_shape`` (per sample)."""
    try:
        km.inputs  # noqa: B018 - raises on an unbuilt Sequential
        return km
    except (AttributeError, ValueError):
        pass
    if input_shape is None:
        raise ModelError(f"Keras model {name!r} is not built (it has no input shape yet): pass "
                         f"input_shape=(features, ...) per sample, or build it first with "
                         f"model.build((None, features, ...)) or a keras.Input layer")
    try:
        km.build((None, *input_shape))
        km.inputs  # noqa: B018
    except Exception as exc:
        raise ModelError(f"Keras model {name!r} cannot be built for input_shape="
                         f"{tuple(input_shape)} ({type(exc).__name__}: {str(exc)[:200]}); pass "
                         f"the per-sample shape its first layer takes") from exc
    return km


def _is_torch_zip(path: Path) -> tuple[bool, bool]:
    """(a zip archive, a TorchScript one: it has code/ and constants)."""
    if not zipfile.is_zipfile(path):
        return False, False
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    return True, any(n.endswith("/constants.pkl") or "/code/" in n for n in names)


def torch_file(path: Path, trust_pickle: bool) -> Any:
    """A ``.pt``/``.pth`` file: TorchScript, else a ``torch.save`` pickle (a whole module only
    with ``trust_pickle=True``; a state dict is refused with what to do)."""
    import pickle

    import torch

    is_zip, scripted = _is_torch_zip(path)
    if scripted:
        return torch.jit.load(str(path))
    try:  # safe: tensors and containers only
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if not trust_pickle:
            raise ModelError(
                f"{path} is a torch.save pickle of a whole module (not TorchScript or "
                f"torch.export): loading it runs code from the file, and needs the module's "
                f"class importable. If you trust the file, pass trust_pickle=True "
                f"(load_model(path, trust_pickle=True, input_shape=...); on the command line: "
                f"--trust-pickle --input-shape D[,D...]); better, re-export it: "
                f"torch.export.save(torch.export.export(model, (x,)), 'model.pt2')") from exc
        obj = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as exc:
        what = "zip archive" if is_zip else "file"
        raise ModelError(f"{path} is not a TorchScript, torch.export or torch.save {what} that "
                         f"torch can read ({type(exc).__name__}: {str(exc)[:200]}); is the file "
                         f"complete? Re-export it from the training code") from exc
    if isinstance(obj, torch.nn.Module):
        return obj
    if isinstance(obj, dict):
        raise ModelError(f"{path} holds a state dict (weights only, keys like "
                         f"{', '.join(list(map(str, obj))[:3])}): build the module in code, "
                         f"model.load_state_dict(torch.load(path)), and pass the module with "
                         f"input_shape=")
    raise ModelError(f"{path} holds a {type(obj).__name__}, not a torch.nn.Module; save the "
                     f"model itself (torch.export.save or torch.jit.save)")
