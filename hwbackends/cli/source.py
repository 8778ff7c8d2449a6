"""How every ``hwb`` command that takes a model file loads it: the options that say how
(``--trust-pickle``, ``--weights``, ``--input-shape``, ``--import``) and with which data
(``--calibration-data``, ``--validation-data``), and the functions that apply them.

Without any of them the model argument is handed on as given (a path or ``zoo:NAME``), and
each command loads it itself; with one, the model is loaded here with
:func:`~hwbackends.models.load_model` and the loaded model is handed on. The data files are
read and checked against the model's inputs here (hwbackends/samples.py): validation data
becomes the model's own (so every compile of every command uses it), calibration data is
handed to the compiles (:func:`calibration_from_args`).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import number

TRUST_PICKLE_HELP = ("load a whole-module torch.save pickle (.pt/.pth). Unpickling runs code "
                     "from the file (and imports the module's class): only for files you trust")


def add_source_args(p: argparse.ArgumentParser) -> None:
    """The model-loading options, on a command whose parser has a ``model`` argument."""
    g = p.add_argument_group("model loading")
    g.add_argument("--trust-pickle", action="store_true", help=TRUST_PICKLE_HELP)
    g.add_argument("--weights", default=None, metavar="PATH",
                   help="HDF5 weights of a Keras 2 JSON architecture (MODEL is the .json; default: "
                        "NAME_weights.h5 or NAME.h5 next to it)")
    g.add_argument("--import", dest="imports", action="append", default=None, metavar="MODULE",
                   help="import MODULE before loading the model: the module that defines its "
                        "custom Keras layer classes (registering them), e.g. qkeras or "
                        "my_layers (with PYTHONPATH=DIR for your own); repeatable (default: none)")
    g.add_argument("--input-shape", action="append", default=None, metavar="D[,D...]",
                   type=number(check_shape, "shape"),
                   help="per-sample input shape of a torch module file (TorchScript .pt/.ts or a "
                        "pickle), e.g. 16 or 32,8; repeat once per input, in forward's order "
                        "(default: the shape the file records)")
    add_data_args(p)


CALIBRATION_HELP = ("samples of the model's real inputs to calibrate quantized and fixed-point "
                    "variants on (int8, fixed<W,I>, auto): a .npy batch (n, ...) or a .npz with "
                    "one array per input name (default: the first half of the validation data, "
                    "else synthetic N(0,1))")
VALIDATION_HELP = ("samples of the model's real inputs to check fidelity on: a .npy batch "
                   "(n, ...) or a .npz with one array per input name; without "
                   "--calibration-data its first half calibrates and the second half is held "
                   "out (default: the model's own data, else synthetic N(0,1), which a model "
                   "may answer with a constant; results and report say which)")


def add_data_args(p: argparse.ArgumentParser, *, where: str = "") -> None:
    """``--calibration-data`` and ``--validation-data`` (``where`` adds to their help)."""
    g = p.add_argument_group("data")
    g.add_argument("--calibration-data", default=None, metavar="FILE",
                   help=CALIBRATION_HELP + where)
    g.add_argument("--validation-data", "--validation", dest="validation_data", default=None,
                   metavar="FILE", help=VALIDATION_HELP + where)


def check_shape(item: str) -> str:
    """One ``--input-shape`` checked when parsed (a bad one is a usage error), kept as text."""
    parse_shapes([item])
    return item


def parse_shapes(items: list[str] | None) -> Any:
    """``["16", "32,8"]`` → ``[(16,), (32, 8)]``; one item gives one shape, ``None`` none."""
    from ..errors import ConfigError
    from ..units import parse_count

    if not items:
        return None
    shapes = []
    for item in items:
        dims = [d for d in item.replace("x", ",").split(",") if d.strip()]
        try:  # each dimension bounded; the model's cost limits judge the product
            shape = tuple(parse_count(d, 1, 1 << 24, "a dimension") for d in dims[:8])
        except ConfigError:
            shape = ()
        if not shape or len(dims) > 8:
            raise ConfigError(f"--input-shape {item[:40]!r}: expected positive integers separated "
                              f"by commas (up to 8, each at most {1 << 24}), e.g. 16 or 32,8 (per "
                              f"sample, without the batch)")
        shapes.append(shape)
    return shapes[0] if len(shapes) == 1 else shapes


def model_from_args(args: argparse.Namespace) -> Any:
    """``args.model`` as ``compile``/``bench_model`` take it: the path or ``zoo:NAME`` itself,
    or, when a loading option is given, the model loaded with it."""
    imports = getattr(args, "imports", None)
    if imports:  # registers layer classes for this process; Model.save names them for the worker
        from ..models.legacy import import_modules
        import_modules(imports)
    shape = parse_shapes(getattr(args, "input_shape", None))
    trust = bool(getattr(args, "trust_pickle", False))
    weights = getattr(args, "weights", None)
    validation = getattr(args, "validation_data", None)
    calibration = getattr(args, "calibration_data", None)
    if args.model is None or (shape is None and not trust and weights is None and validation is None
                              and calibration is None):
        return args.model
    cached = getattr(args, "_loaded_model", None)
    if cached is not None:
        return cached
    from ..models import load_model
    from ..samples import attach_validation, read_samples

    m = load_model(args.model, input_shape=shape, weights=weights, trust_pickle=trust)
    if validation:
        attach_validation(m, read_samples(validation, m.inputs, "--validation-data"))
    args._loaded_model = m  # compile/serve call this once per batch size: load once
    return m


def calibration_from_args(args: argparse.Namespace, model: Any = None) -> Any:
    """``--calibration-data`` read and checked against the model's inputs (a
    :class:`~hwbackends.samples.Samples`), or ``None``. ``model``: the loaded model (default:
    :func:`model_from_args`)."""
    path = getattr(args, "calibration_data", None)
    if not path:
        return None
    from ..models import load_model
    from ..samples import read_samples

    m = load_model(model if model is not None else model_from_args(args))
    return read_samples(path, m.inputs, "--calibration-data")


def read_arrays(path: str) -> Any:
    """A ``.npy`` array, or a ``.npz``'s arrays: the only one, else a dict keyed by name."""
    import io

    import numpy as np

    from ..errors import ConfigError
    from ..samples import read_data_file

    raw = read_data_file(path, "--input file")
    try:
        data = np.load(io.BytesIO(raw), allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ConfigError(f"cannot read {path} as a .npy/.npz array file: {exc}") from exc
    if isinstance(data, np.lib.npyio.NpzFile):
        arrays = {k: data[k] for k in data.files}
        return next(iter(arrays.values())) if len(arrays) == 1 else arrays
    return data


def portable_model_file(args: argparse.Namespace, workdir: Path) -> str:
    """For a command that ships the model file to other machines (``hwb fleet``): the path as
    given, or, when a loading option is needed, the model loaded here and saved as one
    self-contained file in ``workdir`` (a ``.pt2`` torch.export program, a ``.keras`` file),
    so no node unpickles anything or needs the weights file."""
    from ..errors import UnsupportedError

    if not (getattr(args, "input_shape", None) or getattr(args, "trust_pickle", False)
            or getattr(args, "weights", None)):
        return args.model  # data files travel on their own (hwb fleet's data_payload)
    m = model_from_args(args)
    if isinstance(m, str):
        return m
    saved = m.save(workdir / "model")
    src = saved / json.loads((saved / "model.json").read_text())["file"]
    if src.suffix == ".ts":
        raise UnsupportedError(f"{args.model} is a TorchScript module: the nodes could load it "
                               f"only with --input-shape of their own. Export it once as a "
                               f"torch.export program (torch.export.save(torch.export.export(m, "
                               f"(x,)), 'model.pt2')) and pass the .pt2")
    dst = workdir / f"{m.name}{src.suffix}"
    src.rename(dst)
    return str(dst)
