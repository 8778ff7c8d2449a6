"""``hwb predict MODEL --target T --input x.npy``: outputs of a compiled variant."""
from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from . import emit
from .compile import add_model_args, compile_from_args


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="run a compiled variant on inputs from a .npy file")
    add_model_args(p)
    p.add_argument("--input", "-i", required=True,
                   help=".npy file: one sample or (n, ...) batch; for a model with several "
                        "inputs, a .npz with one array per input name")
    p.add_argument("--output", "-o", default=None,
                   help="write outputs to this .npy file (.npz keyed by output name for "
                        "several outputs; default: print them)")
    p.add_argument("--nan-policy", choices=("reject", "pass"), default="reject",
                   help="NaN/Inf in the input: reject (an error) or pass it to the model")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .source import read_arrays

    x = read_arrays(args.input)  # a .npz: its only array, else a dict keyed by input name
    if args.precision is None:
        args.precision = last_used_precision(args)
    cm = compile_from_args(args, fidelity=False, nan_policy=args.nan_policy)
    if isinstance(x, dict) and len(cm.inputs) == 1:
        x = _one_array(x, cm.inputs[0], args.input)
    y = cm.predict(x)
    if isinstance(y, tuple):  # several outputs
        ys = {s.name: a for s, a in zip(cm.outputs, y, strict=True)}
        if args.output:
            np.savez(args.output, **ys)
        emit(args, {"variant": cm.variant, "mode": cm.mode.value,
                    "outputs": {k: {"shape": list(a.shape), "values": a.tolist()}
                                for k, a in ys.items()}},
             f"{cm.variant} ({cm.mode.value})\n" + "\n".join(
                 f"{k} shape {a.shape}\n{np.array2string(a, precision=6)}" for k, a in ys.items()))
        return 0
    if args.output:
        np.save(args.output, y)
    emit(args, {"variant": cm.variant, "mode": cm.mode.value, "shape": list(y.shape),
                "outputs": y.tolist()},
         f"{cm.variant} ({cm.mode.value}) → shape {y.shape}\n{np.array2string(y, precision=6)}")
    return 0


def last_used_precision(args: argparse.Namespace) -> str | None:
    """Without ``-p``: the precision of this model's variant for ``--target`` when the store
    holds exactly one (``hwb compile … -p int8`` then ``hwb predict …`` runs that int8
    variant, not a fresh build of the target's first precision), said on stderr. ``None``
    (the target's first precision, as a build request) when it holds none or several: which
    of several to run is never guessed from their history; the message names them. Read from
    the store's signed listing, no artifact hashed; the compile then loads and verifies it."""
    import sys

    from ..models import load_model
    from ..store.artifacts import ArtifactStore
    from ..store.prune import usage
    from .source import model_from_args

    m = load_model(model_from_args(args))
    args.model = m  # loaded once: the compile takes the Model
    want = f"{m.name} {args.target}:"
    batch = f" batch {args.batch_size}" if args.batch_size not in (None, 1) else ""
    found: list[str] = []
    for e in usage(ArtifactStore(args.cache_dir)).entries:
        if e.kind != "artifact" or not e.what.startswith(want):
            continue
        prec, _, b = e.what[len(want):].partition(" batch ")
        if (f" batch {b}" if b else "") == batch and prec and prec not in found:
            found.append(prec)
    if len(found) == 1:
        print(f"hwb predict: no -p given: {args.target}:{found[0]}, the variant of {m.name} the "
              f"store holds (-p PRECISION to choose)", file=sys.stderr)
        return found[0]
    if found:
        print(f"hwb predict: no -p given and the store holds {len(found)} variants of {m.name} "
              f"for {args.target} ({', '.join(sorted(found))}): running the target's first "
              f"precision; -p PRECISION to choose", file=sys.stderr)
    return None


def _one_array(arrays: dict[str, np.ndarray], spec: Any, path: str) -> np.ndarray:
    """The array of a ``.npz`` given to a one-input model: its only one, or the one named
    after the input."""
    from ..errors import InputError

    if len(arrays) == 1:
        return next(iter(arrays.values()))
    if spec.name in arrays:
        return arrays[spec.name]
    raise InputError(f"{path} is a .npz holding {len(arrays)} arrays ({', '.join(sorted(arrays))}); "
                     f"this model takes one input ({spec.name!r}, samples of shape "
                     f"{tuple(spec.shape)}): pass a .npy file (np.save), or a .npz with one array "
                     f"or one named {spec.name!r}")
