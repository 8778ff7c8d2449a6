"""``extract``: a model of any format as a :class:`Network`, BatchNormalization folded."""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import numpy as np

from hwbackends.errors import UnsupportedError

from .. import batchnorm
from .from_keras import read_keras
from .from_onnx import read_onnx
from .from_torch import read_torch
from .ir import Act, Affine, Conv1D, Dense, GlobalPool1D, Layer, Network, Pool1D, Recurrent, f32


def extract(model: Any, target: str, *, dtype: Any = np.float32) -> Network:
    """``model`` (a :class:`hwbackends.models.Model` in format keras or torch) as a
    :class:`Network`. ``target`` names the caller in refusals; ``dtype`` (float32 or float64)
    is the weights' dtype (see the module's doc)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise UnsupportedError(f"layer_ir.extract keeps weights as float32 or float64, not {dtype}")
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise UnsupportedError(f"{target} compiles models with one input and one output")
    if model.format == "keras":
        layers = read_keras(model.obj, target)
    elif model.format == "torch":
        layers = read_torch(model.obj, target, tuple(model.input.shape))
    elif model.format == "onnx":
        layers = read_onnx(model.obj, target)
    else:
        raise UnsupportedError(f"{target} reads Keras, PyTorch or ONNX models; got format {model.format!r}")
    net = Network(model.name, tuple(model.input.shape), [_cast(layer, dtype) for layer in _fold(layers, dtype)])
    _check_shapes(net, target)
    if net.output_shape != tuple(model.output.shape):
        raise UnsupportedError(f"{target}: the layers give output shape {net.output_shape}, the "
                               f"model's is {tuple(model.output.shape)}")
    return net


def _check_shapes(net: Network, target: str) -> None:
    s = tuple(net.input_shape)
    for layer in net.layers:
        need = {Conv1D: 2, Pool1D: 2, GlobalPool1D: 2, Recurrent: 2}.get(type(layer))
        if need is not None and len(s) != need:
            raise UnsupportedError(f"{target} cannot compile layer {layer.name!r} "
                                   f"({type(layer).__name__}) on an input of shape {s}: it takes "
                                   f"(time, channels)")
        if isinstance(layer, Dense) and s[-1] != layer.w.shape[0]:
            raise UnsupportedError(f"{target}: layer {layer.name!r} (Dense) takes {layer.w.shape[0]} "
                                   f"features; its input has shape {s}")
        if isinstance(layer, Dense) and len(s) != 1:
            raise UnsupportedError(f"{target} cannot compile layer {layer.name!r} (Dense) on a "
                                   f"{len(s)}-D input {s}: put a Flatten or a pooling layer before it")
        s = layer.out_shape(s)
        if min(s) < 1:
            raise UnsupportedError(f"{target}: layer {layer.name!r} ({type(layer).__name__}) "
                                   f"leaves no output (shape {s})")


def _cast(layer: Layer, dtype: np.dtype) -> Layer:
    """``layer`` with its arrays in ``dtype`` (C-contiguous)."""
    arrays = {f.name: np.ascontiguousarray(getattr(layer, f.name), dtype) for f in fields(layer)
              if isinstance(getattr(layer, f.name), np.ndarray)}
    return replace(layer, **arrays) if arrays else layer


def _fold(layers: list[Layer], dtype: np.dtype) -> list[Layer]:
    """Fold each :class:`Affine` into the Dense/Conv1D right before it. The converters give
    an Affine's scale/shift in float64; the float32 IR folds their float32 values (what an
    unfolded Affine holds), the float64 IR the unrounded ones."""
    out: list[Layer] = []
    for layer in layers:
        prev = out[-1] if out else None
        if isinstance(layer, Affine) and isinstance(prev, (Dense, Conv1D)):
            scale, shift = (layer.scale, layer.shift) if dtype == np.float64 else (
                f32(layer.scale), f32(layer.shift))
            w, b = batchnorm.fold(prev.w, prev.b, scale.astype(np.float64), shift.astype(np.float64))
            prev.w, prev.b = (w, b) if dtype == np.float64 else (f32(w), f32(b))
            continue
        out.append(layer)
    return [layer for layer in out if not (isinstance(layer, Act) and layer.kind == "linear")]
