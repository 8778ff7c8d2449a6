"""Format conversions offered as plugins: keras→onnx (tf2onnx) and torch→onnx (torch.onnx).

The core chains them when a target needs another format than the model's. Built-in features
are plugins too: a third-party converter (say onnx→keras) registers the same way."""
from __future__ import annotations

import functools

from hwbackends.contract import Converter, hookimpl

from .._util import importable
from .to_onnx import keras_to_onnx, torch_to_onnx


def _missing(mods: tuple[str, ...]) -> str | None:
    missing = [m for m in mods if not importable(m)]
    return f"{', '.join(missing)} not installed" if missing else None


def _needs(*mods: str):
    return functools.partial(_missing, mods)  # picklable: converters travel to the worker


@hookimpl
def hwb_converters():
    return [
        Converter("tf2onnx", "keras", "onnx", keras_to_onnx, _needs("tf2onnx", "tensorflow")),
        Converter("torch.onnx", "torch", "onnx", torch_to_onnx, _needs("torch", "onnx")),
    ]
