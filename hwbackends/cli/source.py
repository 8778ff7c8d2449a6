"""How every ``hwb`` command that takes a model file loads it: the options that say how
(``--trust-pickle``, ``--weights``, ``--input-shape``, ``--import``, ``--validation``) and the
one function that applies them.

Without any of them the model argument is handed on as given (a path or ``zoo:NAME``), so
the commands behave as before; with one, the model is loaded here with
:func:`~hwbackends.models.load_model` and the loaded model is handed on.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

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
                        "my_layers (with PYTHONPATH=DIR for your own); repeatable")
    g.add_argument("--validation", default=None, metavar="FILE",
                   help="samples of the model's real inputs for calibration and the fidelity "
                        "check: a .npy batch (n, ...), or a .npz with one array per input name "
                        "(default: synthetic N(0,1), which a model may answer with a constant)")
    g.add_argument("--input-shape", action="append", default=None, metavar="D[,D...]",
                   help="per-sample input shape of a torch module file (TorchScript .pt/.ts or a "
                        "pickle), e.g. 16 or 32,8; repeat once per input, in forward's order")


def parse_shapes(items: list[str] | None) -> Any:
    """``["16", "32,8"]`` → ``[(16,), (32, 8)]``; one item gives one shape, ``None`` none."""
    from ..errors import ConfigError

    if not items:
        return None
    shapes = []
    for item in items:
        try:
            shape = tuple(int(d) for d in item.replace("x", ",").split(",") if d.strip())
        except ValueError:
            shape = ()
        if not shape or any(d < 1 for d in shape):
            raise ConfigError(f"--input-shape {item!r}: expected positive integers separated by "
                              f"commas, e.g. 16 or 32,8 (per sample, without the batch)")
        shapes.append(shape)
    return shapes[0] if len(shapes) == 1 else shapes


def model_from_args(args: argparse.Namespace) -> Any:
    """``args.model`` as ``compile``/``bench_model`` take it: the path or ``zoo:NAME`` itself,
    or, when a loading option is given, the model loaded with it."""
    imports = getattr(args, "imports", None)
    if imports:  # registers layer classes for this process; Model.save names them for the worker
        from ..legacy import import_modules
        import_modules(imports)
    shape = parse_shapes(getattr(args, "input_shape", None))
    trust = bool(getattr(args, "trust_pickle", False))
    weights = getattr(args, "weights", None)
    validation = getattr(args, "validation", None)
    if args.model is None or (shape is None and not trust and weights is None and validation is None):
        return args.model
    from ..models import load_model

    return load_model(args.model, input_shape=shape, weights=weights, trust_pickle=trust,
                      validation_data=read_arrays(validation) if validation else None)


def read_arrays(path: str) -> Any:
    """A ``.npy`` array, or a ``.npz``'s arrays: the only one, else a dict keyed by name."""
    import numpy as np

    from ..errors import ConfigError

    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
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
