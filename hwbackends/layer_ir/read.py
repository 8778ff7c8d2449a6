"""``extract``: a model of any format as a :class:`Network`, BatchNormalization folded."""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

from . import batchnorm
from .from_keras import read_keras
from .from_onnx import read_onnx
from .from_torch import read_torch
from .ir import (
    Act,
    Affine,
    Attention,
    Bidirectional,
    Concat,
    Conv1D,
    Conv2D,
    Dense,
    GlobalPool1D,
    Layer,
    LayerNorm,
    Network,
    Pad1D,
    Pad2D,
    Pool1D,
    Pool2D,
    Recurrent,
    Reshape,
    Residual,
    TimeSlice,
    Transpose,
    chain_shape,
    f32,
)


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
    layers = _fold_slices(_fold(layers, dtype), tuple(model.input.shape))
    net = Network(model.name, tuple(model.input.shape), [_cast(layer, dtype) for layer in layers])
    _check_shapes(net, target)
    if net.output_shape != tuple(model.output.shape):
        raise UnsupportedError(f"{target}: the layers give output shape {net.output_shape}, the "
                               f"model's is {tuple(model.output.shape)}")
    return net


def finish_chain(layers: list[Layer], shape: tuple[int, ...], dtype: Any, target: str,
                 where: str) -> list[Layer]:
    """One chain of a model read in parts (:mod:`.multi`) as :func:`extract` finishes a whole
    model's: folded, cast to ``dtype``, its shapes checked from input ``shape``; refusals say
    ``where`` the chain is."""
    layers = _fold_slices(_fold(layers, np.dtype(dtype)), tuple(shape))
    layers = [_cast(layer, np.dtype(dtype)) for layer in layers]
    _check_chain(layers, tuple(shape), f"{target} ({where})")
    return layers


def _check_shapes(net: Network, target: str) -> None:
    _check_chain(net.layers, tuple(net.input_shape), target)


#: layers over (time, channels) only
_TIME_LAYERS = (Conv1D, Pool1D, GlobalPool1D, Recurrent, Pad1D, TimeSlice, Bidirectional, Attention)
#: layers over (rows, cols, channels) only
_SPATIAL_LAYERS = (Conv2D, Pool2D, Pad2D)


def _check_2d(layer: Layer, s: tuple[int, ...], target: str) -> None:
    """Shapes around a transpose, a reshape, a concatenation's branches, and a pooling whose
    window would hold only padding."""
    where = f"{target}: layer {layer.name!r} ({type(layer).__name__})"
    if isinstance(layer, Transpose) and sorted(layer.perm) != list(range(len(s))):
        raise UnsupportedError(f"{where} permutes axes {layer.perm} of an input of shape {s}")
    if isinstance(layer, Reshape) and int(np.prod(layer.shape)) != int(np.prod(s)):
        raise UnsupportedError(f"{where} reads {int(np.prod(s))} values (shape {s}) as shape "
                               f"{layer.shape}")
    if isinstance(layer, Concat):
        if not layer.branches:
            raise UnsupportedError(f"{where} concatenates no branch")
        for branch in layer.branches:
            _check_chain(branch, s, target)
        outs = [chain_shape(b, s) for b in layer.branches]
        if len({o[:-1] for o in outs}) != 1:
            raise UnsupportedError(f"{where} concatenates branches of shapes {outs} on the last "
                                   f"axis: every other axis must agree")
    if isinstance(layer, Pool2D) and len(s) == 3 and min(layer.out_shape(s)) >= 1:
        from .reference import apply

        probe = Pool2D("probe", "avg", layer.size, layer.stride, layer.dilation, layer.pad, False)
        with np.errstate(divide="ignore", invalid="ignore"):  # 0 / 0: a window of padding only
            cells = apply(probe, np.ones((1, s[0], s[1], 1)))
        if not np.all(np.isfinite(cells)):
            raise UnsupportedError(f"{where}: a window of {layer.size} (dilation {layer.dilation}, "
                                   f"padding {layer.pad}) over an input of shape {s} holds only "
                                   f"padding")


def _check_desk(layer: Layer, s: tuple[int, ...], target: str) -> None:
    """Shapes inside and around the desk layers (slices, residuals, norms, attention)."""
    where = f"{target}: layer {layer.name!r} ({type(layer).__name__})"
    if isinstance(layer, TimeSlice) and not (0 <= layer.start < layer.stop <= s[0]):
        raise UnsupportedError(f"{where} takes steps {layer.start}:{layer.stop} of a window of {s[0]}")
    if isinstance(layer, Residual):
        _check_chain(layer.body, s, target)
        _check_chain(layer.shortcut, s, target)
        a, b = chain_shape(layer.body, s), chain_shape(layer.shortcut, s)
        if a != b:
            raise UnsupportedError(f"{where} adds a branch of shape {a} to one of shape {b}: both "
                                   f"sides of a residual add must have one shape")
    if isinstance(layer, LayerNorm) and layer.gamma.shape != (s[-1],):
        raise UnsupportedError(f"{where} normalizes {layer.gamma.shape} features; its input has "
                               f"shape {s} (it normalizes the last axis)")
    if isinstance(layer, Attention) and (layer.wq.shape[0] != s[-1] or layer.wq.shape[1] % layer.heads):
        raise UnsupportedError(f"{where} takes {layer.wq.shape[0]} features in {layer.heads} heads; "
                               f"its input has shape {s}")


def _check_chain(layers: list[Layer], s: tuple[int, ...], target: str) -> None:
    for layer in layers:
        _check_desk(layer, s, target)
        need = 2 if isinstance(layer, _TIME_LAYERS) else 3 if isinstance(layer, _SPATIAL_LAYERS) else None
        if need is not None and len(s) != need:
            raise UnsupportedError(f"{target} cannot compile layer {layer.name!r} "
                                   f"({type(layer).__name__}) on an input of shape {s}: it takes "
                                   + ("(time, channels)" if need == 2 else "(rows, cols, channels)"))
        _check_2d(layer, s, target)
        _check_vectors(layer, s, target)
        if isinstance(layer, Dense) and s[-1] != layer.w.shape[0]:
            raise UnsupportedError(f"{target}: layer {layer.name!r} (Dense) takes {layer.w.shape[0]} "
                                   f"features; its input has shape {s}")
        if isinstance(layer, Dense) and len(s) not in (1, 2):
            raise UnsupportedError(f"{target} cannot compile layer {layer.name!r} (Dense) on a "
                                   f"{len(s)}-D input {s}: put a Flatten or a pooling layer before it")
        s = layer.out_shape(s)
        if min(s) < 1:
            raise UnsupportedError(f"{target}: layer {layer.name!r} ({type(layer).__name__}) "
                                   f"leaves no output (shape {s})")


def _fold_slices(layers: list[Layer], shape: tuple[int, ...]) -> list[Layer]:
    """A slice that cuts a stride-1 Conv1D's right padding off (``Conv1d(padding=p)`` then
    ``[..., :-p]``: a causal conv) becomes that conv's padding; the last step of a recurrent
    layer's sequence becomes its last state. Other slices stay (a copy)."""
    out: list[Layer] = []
    ins: list[tuple[int, ...]] = []  # the input shape of each layer in out
    for layer in layers:
        prev = out[-1] if out else None
        if isinstance(layer, Residual):
            layer = replace(layer, body=_fold_slices(layer.body, shape),
                            shortcut=_fold_slices(layer.shortcut, shape))
        if isinstance(layer, Concat):
            layer = replace(layer, branches=[_fold_slices(b, shape) for b in layer.branches])
        if isinstance(layer, TimeSlice) and isinstance(prev, TimeSlice) and prev.keep:
            # x[:, a:b] then a step or slice of it (x[:, -1:] then a squeeze): one slice
            layer = replace(layer, start=prev.start + layer.start, stop=prev.start + layer.stop)
            out.pop()
            shape = ins.pop()
            prev = out[-1] if out else None
        if isinstance(layer, TimeSlice) and isinstance(prev, Conv1D) and len(ins[-1]) == 2:
            cut = prev.out_shape(ins[-1])[0] - layer.stop
            if layer.keep and layer.start == 0 and prev.stride == 1 and 0 <= cut <= prev.pad[1]:
                out[-1] = replace(prev, pad=(prev.pad[0], prev.pad[1] - cut))
                shape = out[-1].out_shape(ins[-1])
                continue
        if (isinstance(layer, TimeSlice) and not layer.keep and isinstance(prev, Recurrent)
                and prev.return_sequences and layer.start == shape[0] - 1):
            prev.return_sequences = False
            shape = (prev.units,)
            continue
        out.append(layer)
        ins.append(shape)
        try:
            shape = layer.out_shape(shape)
        except (IndexError, ValueError):
            pass  # _check_shapes says what is wrong
    return out


def _check_vectors(layer: Layer, s: tuple[int, ...], target: str) -> None:
    """Every per-channel vector and weight against the axis it acts on (``s`` the layer's
    input shape): generated code indexes them by that axis' size, so a mismatch is refused
    here, never read past an array's end."""
    c = s[-1] if s else 0
    sizes: list[tuple[str, int, int]] = []  # (what, its length, the length it must have)
    if isinstance(layer, Affine):
        sizes += [("scale", layer.scale.size, c), ("shift", layer.shift.size, c)]
    elif isinstance(layer, Dense):
        sizes += [("bias", layer.b.size, layer.w.shape[1])]
    elif isinstance(layer, Conv1D):
        sizes += [("kernel's input channels", layer.w.shape[1], c), ("bias", layer.b.size, layer.w.shape[2])]
    elif isinstance(layer, Conv2D):
        sizes += [("kernel's input channels", layer.w.shape[2], c), ("bias", layer.b.size, layer.w.shape[3])]
    elif isinstance(layer, Recurrent):
        gu = (4 if layer.cell == "lstm" else 3) * layer.units
        sizes += [("kernel's rows", layer.kernel.shape[0], c), ("kernel's columns", layer.kernel.shape[1], gu),
                  ("recurrent kernel", layer.recurrent.size, layer.units * gu),
                  ("bias", layer.bias.size, gu * (2 if layer.cell == "gru" and layer.reset_after else 1))]
    for what, n, want in sizes:
        if n != want:
            raise UnsupportedError(f"{target}: layer {layer.name!r} ({type(layer).__name__}) has a "
                                   f"{what} of {n} values where its input of shape {s} needs "
                                   f"{want}: the model's weights do not fit the axis they act on")


def _cast(layer: Layer, dtype: np.dtype) -> Layer:
    """``layer`` with its arrays in ``dtype`` (C-contiguous), the layers it holds too."""
    arrays: dict = {f.name: np.ascontiguousarray(getattr(layer, f.name), dtype) for f in fields(layer)
                    if isinstance(getattr(layer, f.name), np.ndarray)}
    if isinstance(layer, Residual):
        arrays.update(body=[_cast(x, dtype) for x in layer.body],
                      shortcut=[_cast(x, dtype) for x in layer.shortcut])
    if isinstance(layer, Bidirectional):
        arrays.update(forward=_cast(layer.forward, dtype), backward=_cast(layer.backward, dtype))
    if isinstance(layer, Concat):
        arrays.update(branches=[[_cast(x, dtype) for x in b] for b in layer.branches])
    return replace(layer, **arrays) if arrays else layer


def _fold(layers: list[Layer], dtype: np.dtype) -> list[Layer]:
    """Fold each :class:`Affine` into the Dense/Conv1D/Conv2D right before it, and a zero
    padding into the convolution right after it. The converters give
    an Affine's scale/shift in float64; the float32 IR folds their float32 values (what an
    unfolded Affine holds), the float64 IR the unrounded ones."""
    out: list[Layer] = []
    for layer in layers:
        prev = out[-1] if out else None
        if isinstance(layer, Residual):
            layer = replace(layer, body=_fold(layer.body, dtype), shortcut=_fold(layer.shortcut, dtype))
        if isinstance(layer, Concat):
            layer = replace(layer, branches=[_fold(b, dtype) for b in layer.branches])
        if isinstance(layer, Conv1D) and isinstance(prev, Pad1D):  # F.pad, ZeroPadding1D
            out[-1] = replace(layer, pad=(layer.pad[0] + prev.pad[0], layer.pad[1] + prev.pad[1]))
            continue
        if isinstance(layer, Conv2D) and isinstance(prev, Pad2D) and prev.mode == "constant" \
                and prev.value == 0:  # ZeroPadding2D, a zero Pad
            (a, b), (c, d) = layer.pad
            (e, f), (g, h) = prev.pad
            out[-1] = replace(layer, pad=((a + e, b + f), (c + g, d + h)))
            continue
        if isinstance(layer, Affine) and isinstance(prev, (Dense, Conv1D, Conv2D)) and \
                layer.scale.size == layer.shift.size == prev.b.size:  # else refused by the checks
            scale, shift = (layer.scale, layer.shift) if dtype == np.float64 else (
                f32(layer.scale), f32(layer.shift))
            w, b = batchnorm.fold(prev.w, prev.b, scale.astype(np.float64), shift.astype(np.float64))
            prev.w, prev.b = (w, b) if dtype == np.float64 else (f32(w), f32(b))
            continue
        out.append(layer)
    return [layer for layer in out if not (isinstance(layer, Act) and layer.kind == "linear")]
