"""Model files as users have them from older toolchains: Keras 2 JSON + HDF5 weights,
weights-only HDF5, unbuilt Keras models, whole-module ``torch.save`` pickles.

Each loader either returns a framework object :mod:`hwbackends.models` can take, or raises
:class:`ModelError` naming what the file is and the exact steps that make it loadable.
Frameworks are imported inside the functions (``import hwbackends`` stays light).
"""
from __future__ import annotations

import copy
import json
import re
import zipfile
from pathlib import Path
from typing import Any, Sequence

from ..errors import ModelError

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
    ``input_shape`` and so adds a dimension; hand it the per-sample shape instead. Keras ≤ 2.1
    wrote a Sequential's config as the bare list of its layers: wrap it as ``{"layers": …}``."""
    cfg = copy.deepcopy(cfg)
    if isinstance(cfg.get("config"), list):
        cfg["config"] = {"name": cfg.get("name", "sequential"), "layers": cfg["config"]}
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
        foreign = foreign_class_error(path, exc)
        if foreign is not None:
            raise foreign from exc
        raise ModelError(
            f"Keras' legacy loader cannot rebuild the architecture in {path} "
            f"({type(exc).__name__}: {str(exc)[:200]}). With Keras 2 (pip install tf-keras), load "
            f"it (tf_keras.models.model_from_json + load_weights) and save it as one file: "
            f"model.save('model.h5'); then pass that file, or export it to ONNX with "
            f"tf2onnx.convert.from_keras(model, input_signature=[tf.TensorSpec([None, ...])])"
        ) from exc
    if not Path(weights).is_file():
        raise ModelError(f"weights file not found: {weights} (given for {path}); pass the path of "
                         f"the HDF5 file saved with that model (weights=, or --weights on the "
                         f"command line){_h5_beside(path)}")
    try:
        _load_weights(km, Path(weights))
    except Exception as exc:
        raise ModelError(f"the weights {weights} do not fit the architecture in {path} "
                         f"({type(exc).__name__}: {str(exc)[:200]}); pass the weights file saved "
                         f"with that model (weights=, or --weights on the command line)") from exc
    return km


def _h5_beside(path: Path) -> str:
    found = sorted(p.name for p in Path(path).parent.glob("*.h5*"))[:8]
    return f"; next to it: {', '.join(found)}" if found else ""


def keras3_weights(path: Path) -> bool:
    """Whether an HDF5 file has Keras 3's ``save_weights`` layout (groups ``layers``/``vars``,
    no Keras 2 ``layer_names``), which Keras reads only from a file named ``*.weights.h5``."""
    import h5py

    with h5py.File(path, "r") as f:
        return "layer_names" not in f.attrs and ("layers" in f or "vars" in f)


def _load_weights(km: Any, weights: Path) -> None:
    """``km.load_weights`` for either layout, whatever the file is named: Keras picks its
    reader by the name alone and reads a Keras 3 file named ``w.h5`` with the Keras 2 reader
    ("found 0 saved layers"), so such a file is read through a ``*.weights.h5`` link."""
    import os
    import tempfile

    if weights.name.endswith(".weights.h5") or not keras3_weights(weights):
        km.load_weights(str(weights))
        return
    with tempfile.TemporaryDirectory(prefix="hwb-weights-") as d:
        link = Path(d) / f"{weights.stem}.weights.h5"
        os.symlink(weights.resolve(), link)
        km.load_weights(str(link))


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


#: A torch.save pickle names its module's class by module and name: these say which part is missing.
_MAIN_CLASS = re.compile(r"Can't get attribute '([^']+)' on <module '(?:[\w.]+\.)?__main__'")
_NO_ATTR = re.compile(r"Can't get attribute '([^']+)' on <module '([^']+)'")


def _unpickle_module(path: Path) -> Any:
    """A whole-module pickle (``trust_pickle``): unpickling imports the class by its module
    and name, so a class from the training script or from a module not on the path fails
    here; say which and how to make it importable."""
    import torch

    redo = ("or re-export it once from the training code as a torch.export program, which needs "
            "no class to load: torch.export.save(torch.export.export(model, (x,)), 'model.pt2')")
    try:
        return torch.load(str(path), map_location="cpu", weights_only=False)
    except ModuleNotFoundError as exc:
        raise ModelError(f"{path} is a pickle of a module whose class lives in module "
                         f"{exc.name!r}, which is not importable here: put the directory that "
                         f"holds {exc.name}.py (or the package) on PYTHONPATH "
                         f"(PYTHONPATH=/path/to/training/code hwb …), {redo}") from exc
    except AttributeError as exc:
        main, other = _MAIN_CLASS.search(str(exc)), _NO_ATTR.search(str(exc))
        if main:
            raise ModelError(f"{path} is a pickle of class {main.group(1)} that the training "
                             f"script defined in itself (__main__): unpickling needs that class, "
                             f"and this program is not that script. Move the class into a module "
                             f"(e.g. net.py), save the model again from code that imports it, and "
                             f"put that directory on PYTHONPATH; {redo}") from exc
        if other:
            raise ModelError(f"{path} is a pickle of class {other.group(1)} from module "
                             f"{other.group(2)!r}, which has no such class here: the module on "
                             f"the path is not the code the model was saved with (check "
                             f"PYTHONPATH), {redo}") from exc
        raise


def torch_file(path: Path, trust_pickle: bool, lim: Any = None, name: str | None = None) -> Any:
    """A ``.pt``/``.pth`` file: TorchScript, else a ``torch.save`` pickle (a whole module only
    with ``trust_pickle=True``; a state dict is refused with what to do). The storages a
    ``torch.save`` zip's pickle declares are checked against ``lim``
    (:class:`hwbackends.cost.Limits`) first, read without running the pickle."""
    import pickle

    from .torch_archive import declared_storages

    is_zip, scripted = _is_torch_zip(path)
    if is_zip and not scripted and lim is not None:  # before torch is even imported
        with zipfile.ZipFile(path) as z:
            declared = declared_storages(z, path)
        if declared is not None:
            lim.check(declared, name or path.stem)
    import torch

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
        obj = _unpickle_module(path)
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


# -- layer classes that are not Keras' own --------------------------------------------------
#: What to install for the quantization libraries hls4ml reads, by package (module root, or
#: the ``package>`` of a registered name).
PACKAGES = {"qkeras": "QKeras (pip install qkeras-v3 for Keras 3; qkeras is Keras 2 only)",
            "hgq": "HGQ2 (pip install HGQ2)",
            "HGQ": "HGQ, which needs Keras 2 (HGQ2 is its Keras 3 successor: pip install HGQ2)"}
_MODEL_CLASSES = ("Sequential", "Functional", "Model")


def keras_file_config(path: Path) -> dict[str, Any] | None:
    """The architecture a ``.keras``, ``.h5`` or ``.json`` model file holds, or None."""
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                return json.loads(z.read("config.json"))
        if path.suffix.lower() == ".json":
            return json.loads(path.read_text())
        import h5py

        with h5py.File(path, "r") as f:
            raw = f.attrs.get("model_config")
        return json.loads(raw.decode() if isinstance(raw, bytes) else raw) if raw else None
    except Exception:  # noqa: BLE001 - naming the classes is a courtesy; the caller has the error
        return None


def _layer_entries(cfg: Any) -> list[dict[str, Any]]:
    """Every layer entry of a model config, nested models' layers included."""
    inner = cfg.get("config") if isinstance(cfg, dict) else None
    layers = inner if isinstance(inner, list) else (inner or {}).get("layers", []) if isinstance(inner, dict) else []
    out = []
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and "class_name" in layer:
            out.append(layer)
            if layer["class_name"] in _MODEL_CLASSES:
                out += _layer_entries(layer)
    return out


def foreign_classes(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The layer entries whose class Keras cannot find here: neither one of its own layers
    nor registered (``@keras.saving.register_keras_serializable`` runs when its module is
    imported). Each entry: ``class_name``, ``module``, ``registered_name``, ``package``."""
    import keras

    out, seen = [], set()
    for e in _layer_entries(cfg):
        cls, module, reg = str(e["class_name"]), e.get("module"), e.get("registered_name")
        if reg and keras.saving.get_registered_object(reg) is not None:
            continue
        own = module is None or module == "keras" or str(module).startswith("keras.")
        if own and (">" not in cls) and (hasattr(keras.layers, cls) or cls in _MODEL_CLASSES):
            continue
        package = (str(module).split(".")[0] if module and not own else
                   (reg or cls).split(">")[0] if ">" in (reg or cls) else _guess_package(cls))
        if (cls, module) not in seen:
            seen.add((cls, module))
            out.append({"class_name": cls, "module": module, "registered_name": reg,
                        "package": package})
    return out


def _guess_package(cls: str) -> str | None:
    """QKeras' layers are ``Q`` + a Keras layer (QDense); HGQ's (Keras 2) ``H`` + one."""
    import keras

    if cls[:1] in ("Q", "H") and hasattr(keras.layers, cls[1:]):
        return "qkeras" if cls[0] == "Q" else "HGQ"
    return None


def foreign_class_error(path: Path, exc: Exception) -> ModelError | None:
    """A :class:`ModelError` naming the layer classes of ``path`` that are not importable
    here and how to make each one so, or None when every class is found (another error)."""
    import importlib.util

    cfg = keras_file_config(path)
    foreign = foreign_classes(cfg) if cfg else []
    if not foreign:
        return None
    names = ", ".join(e["class_name"] + (f" (module {e['module']})" if e["module"] else "")
                      for e in foreign)
    fixes = []
    for e in foreign:
        pkg, module = e["package"], e["module"]
        if pkg in PACKAGES:
            fixes.append(f"{e['class_name']} comes from {PACKAGES[pkg]}: install it and import "
                         f"{pkg} first (hwb … --import {pkg})")
        elif module in (None, "__main__") or pkg == "__main__":
            fixes.append(f"{e['class_name']} was defined in the training script itself: move the "
                         f"class into a module (e.g. my_layers.py, decorated with "
                         f"@keras.saving.register_keras_serializable()), put its directory on "
                         f"PYTHONPATH and import it first (hwb … --import my_layers)")
        elif importlib.util.find_spec(str(module).split(".")[0]) is None:
            fixes.append(f"module {module!r} (of {e['class_name']}) is not importable here: put "
                         f"the directory that holds it on PYTHONPATH (PYTHONPATH=/path/to/code "
                         f"hwb … --import {module})")
        else:
            fixes.append(f"import {module} before loading, so {e['class_name']} is registered "
                         f"(hwb … --import {module}; in Python: import {module})")
    return ModelError(f"{path} uses layer class(es) Keras cannot find here: {names}. A layer class "
                      f"that is not Keras' own must be imported (which registers it) before the "
                      f"model loads: " + "; ".join(fixes)
                      + f". (Keras said: {type(exc).__name__}: {str(exc).splitlines()[0][:160]})")


def keras_imports(km: Any) -> list[dict[str, str]]:
    """The modules (and the ``sys.path`` entry each came from) that define ``km``'s layer
    classes that are not Keras' own: what another process must import before it loads the
    saved model (:meth:`hwbackends.models.Model.save`, :func:`import_modules`)."""
    import sys

    out: dict[str, str] = {}
    for layer in km._flatten_layers(include_self=False):
        module = type(layer).__module__
        top = module.split(".")[0]
        if top == "keras" or module in out:
            continue
        if module == "__main__":
            raise ModelError(
                f"layer {layer.name!r} has class {type(layer).__name__} defined in __main__ (the "
                f"script you are running): the compile worker, another process, cannot import it. "
                f"Move the class into a module (e.g. my_layers.py, decorated with "
                f"@keras.saving.register_keras_serializable()) and import it from there")
        file = getattr(sys.modules.get(top), "__file__", None)
        root = Path(file).parent if file else None
        if root is not None and Path(file).name == "__init__.py":
            root = root.parent
        out[module] = str(root) if root else ""
    return [{"module": m, "path": p} for m, p in out.items()]


def import_modules(items: Sequence[Any]) -> None:
    """Import each module (a name, or a :func:`keras_imports` entry whose ``path`` is put on
    ``sys.path`` first), so the layer classes it registers are found when a model loads."""
    import importlib
    import sys

    for item in items:
        name, path = (item["module"], item.get("path")) if isinstance(item, dict) else (item, None)
        if path and path not in sys.path:
            sys.path.append(path)
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ModelError(f"cannot import module {name!r} ({exc}): install the package that "
                             f"provides it, or put the directory holding {name.split('.')[0]} "
                             f"on PYTHONPATH (PYTHONPATH=/path/to/code hwb …)") from exc
