"""The layer IR: one small, public description of a model's layers and weights that the targets
generating code from them build on (``cpu.native``, ``fpga.da4ml``, ``fpga.hls4ml``'s emulation,
and a third party's; docs/layer_ir.md). It imports nothing of the core but the contract.

A :class:`Network` is the input shape (per sample, no batch) and a chain of layers, each with
its weights as float32 NumPy arrays in the layout the emitters use (Keras' own:
``Dense.w`` is ``(n_in, n_out)``, ``Conv1D.w`` is ``(kernel, c_in, c_out)``, recurrent
kernels ``(n_in, gates·units)`` with Keras' gate order). Activations are layers of their own
(:class:`Act`), so an emitter can fuse them where it likes; BatchNormalization folds into the
Dense/Conv1D right before it and is otherwise a per-channel :class:`Affine`.

:func:`extract` reads Keras (``Sequential`` or a functional chain), torch (``nn.Sequential``,
or a ``torch.export`` program of one, through ``torch.export``; a program with Conv1d,
pooling, LSTM/GRU or transposes op by op: :mod:`.from_torch`) and ONNX (the graphs tf2onnx and
torch.onnx write for these layers: :mod:`.from_onnx`). Layers: Dense, ReLU/LeakyReLU/tanh/
sigmoid/softmax, BatchNorm (folded), Conv1D, pooling, Flatten, LSTM and GRU unrolled over
the fixed window, and over ``(rows, cols, channels)`` Conv2D, 2-D pooling and padding,
Reshape and a Concatenate of branches from one tensor (an inception module: :class:`Concat`);
anything else is refused with :class:`UnsupportedError` naming the layer or op.
:func:`forward` is the float64 NumPy reference of the IR: the check that extraction kept the
model's function, and the range measurement for int8 calibration.

``extract(..., dtype=np.float64)`` keeps the weights in float64 (a float32 source converts
exactly; BatchNormalization is folded in float64 from its unrounded scale), for targets that
quantize the weights themselves. :func:`dense_chain` views a network of Dense layers and
activations as :class:`DenseAct` (each Dense with the activation after it fused in, a
BatchNormalization folded): what targets building one circuit per matrix take.

Modules: :mod:`.ir` (the layers and :class:`Network`), :mod:`.read` (:func:`extract`, the
folding and shape checks), one reader per format (:mod:`.from_keras`, :mod:`.from_onnx`,
:mod:`.from_torch`; :mod:`.walk` is the graph walk the ONNX and torch.export readers share)
and :mod:`.reference` (:func:`forward`, :func:`dense_chain`).
"""
from __future__ import annotations

from .ir import (
    ACTIVATIONS,
    ONNX_OPS,
    SUPPORTED,
    TORCH_OPS,
    Act,
    Affine,
    Attention,
    Bidirectional,
    Concat,
    Conv1D,
    Conv2D,
    Dense,
    Flatten,
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
)
from .read import extract
from .reference import DenseAct, activate, apply, dense_chain, forward

__all__ = ["ACTIVATIONS", "ONNX_OPS", "SUPPORTED", "TORCH_OPS", "Act", "Affine", "Attention",
           "Bidirectional", "Concat", "Conv1D", "Conv2D", "Dense", "DenseAct", "Flatten",
           "GlobalPool1D", "Layer", "LayerNorm", "Network", "Pad1D", "Pad2D", "Pool1D", "Pool2D",
           "Recurrent", "Reshape", "Residual", "TimeSlice", "Transpose", "activate", "apply",
           "dense_chain", "extract", "forward"]
