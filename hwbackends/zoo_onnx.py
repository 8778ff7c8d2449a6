"""The zoo's Keras models as ONNX graphs written with ``onnx.helper`` (no framework), and the
NumPy training of the ``signal`` architecture: what the bundled zoo is on ``pip install
'.[cpu]'``, where Keras is not installed (:mod:`hwbackends.zoo` chooses).

Each builder takes the weights in Keras' ``get_weights`` order (the zoo's seeded NumPy
weights), so a graph computes the same function as the Keras model given the same weights:
Dense is ``Gemm``; an LSTM is the ONNX ``LSTM`` op (gates reordered Keras i, f, c, o → ONNX
i, o, f, c; kernels transposed to ONNX's ``(directions, 4·units, inputs)``; Keras' one bias
as ONNX's input bias, the recurrent bias zero; run over time-major data, hence a
``Transpose`` first, its ``Y_h`` the last step); Conv1D is ``Conv`` over (batch, channels,
time), global average pooling ``GlobalAveragePool``; DeepLOB's Conv2D a ``Conv`` over (batch,
channels, events, features), its inception module a ``Concat`` of branches. The graphs are what the layer-IR reader
of cpu.native takes (the shapes tf2onnx writes), and what ONNX Runtime runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

OPSET = 17
#: Keras' LSTM gate blocks (i, f, c, o) in ONNX's order (i, o, f, c).
_KERAS_TO_ONNX_GATES = (0, 3, 1, 2)


@dataclass
class _Graph:
    """A graph being written: its nodes and initializers, with fresh names for both."""

    name: str
    nodes: list[Any]
    inits: list[Any]

    def const(self, array: np.ndarray) -> str:
        from onnx import numpy_helper

        name = f"w{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, inputs: Sequence[str], out: str | None = None,
             n_out: int = 1, **attrs: Any) -> str:
        """Append ``op``; its (first) output's name (``out`` or a fresh one)."""
        from onnx import helper

        first = out or f"t{len(self.nodes)}"
        outs = [first] + [f"{first}_{i}" for i in range(1, n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=f"{op}_{len(self.nodes)}",
                                           **attrs))
        return first

    def dense(self, x: str, kernel: np.ndarray, bias: np.ndarray, act: str | None,
              out: str | None = None) -> str:
        """Keras Dense: ``act(x @ kernel + bias)`` (``act`` an ONNX op name or None)."""
        z = self.node("Gemm", [x, self.const(kernel), self.const(bias)],
                      None if act else out)
        if act is None:
            return z
        return self.node(act, [z], out, **({"axis": -1} if act == "Softmax" else {}))

    def lstm(self, x: str, kernel: np.ndarray, recurrent: np.ndarray, bias: np.ndarray,
             sequences: bool) -> str:
        """A Keras LSTM over time-major ``x`` (time, batch, inputs): the sequence (time, batch,
        units) when ``sequences``, else the last step (batch, units)."""
        u = recurrent.shape[0]

        def onnx(m: np.ndarray) -> np.ndarray:  # (…, 4u) Keras-ordered → (1, 4u, …) ONNX-ordered
            m = np.concatenate([m[..., j * u:(j + 1) * u] for j in _KERAS_TO_ONNX_GATES], axis=-1)
            return (m.T if m.ndim == 2 else m)[None]

        b = np.concatenate([onnx(bias)[0], np.zeros(4 * u, np.float32)])[None]
        y = self.node("LSTM", [x, self.const(onnx(kernel)), self.const(onnx(recurrent)),
                               self.const(b)], n_out=2, hidden_size=u)
        if sequences:  # Y: (time, directions=1, batch, units)
            return self.node("Squeeze", [y, self.const(np.array([1], np.int64))])
        return self.node("Squeeze", [f"{y}_1", self.const(np.array([0], np.int64))])  # Y_h

    def model(self, inputs: list[tuple[str, list[Any]]], outputs: list[tuple[str, list[Any]]]) -> Any:
        from onnx import TensorProto, checker, helper

        g = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="hwbackends.zoo")
        m.ir_version = 8
        checker.check_model(m)
        return m


def dense_stack(name: str, weights: list[np.ndarray], acts: Sequence[str | None],
                io: tuple[str, str] = ("input", "output")) -> Any:
    """A Keras Sequential of Dense layers (``weights`` = kernel, bias per layer; ``acts`` their
    activations as ONNX ops, None for linear)."""
    g = _Graph(name, [], [])
    x = io[0]
    for i, act in enumerate(acts):
        last = i == len(acts) - 1
        x = g.dense(x, weights[2 * i], weights[2 * i + 1], act, io[1] if last else None)
    return g.model([(io[0], ["batch", weights[0].shape[0]])], [(io[1], ["batch", weights[-1].shape[0]])])


def lstm_stack(name: str, window: int, features: int, weights: list[np.ndarray]) -> Any:
    """Keras LSTM(s) (each but the last returning sequences) → Dense(1): ``weights`` =
    (kernel, recurrent kernel, bias) per LSTM, then the head's kernel and bias."""
    g = _Graph(name, [], [])
    x = g.node("Transpose", ["input"], perm=[1, 0, 2])  # (batch, time, f) → (time, batch, f)
    layers = [weights[i:i + 3] for i in range(0, len(weights) - 2, 3)]
    for i, (k, r, b) in enumerate(layers):
        x = g.lstm(x, k, r, b, sequences=i + 1 < len(layers))
    g.dense(x, weights[-2], weights[-1], None, "output")
    return g.model([("input", ["batch", window, features])], [("output", ["batch", 1])])


def conv1d_stack(name: str, window: int, features: int, weights: list[np.ndarray]) -> Any:
    """Keras Conv1D(relu, valid) layers → GlobalAveragePooling1D → Dense(1): ``weights`` =
    (kernel (k, in, out), bias) per Conv1D, then the head's kernel and bias."""
    g = _Graph(name, [], [])
    x = g.node("Transpose", ["input"], perm=[0, 2, 1])  # (batch, time, ch) → (batch, ch, time)
    for k, b in zip(weights[:-2:2], weights[1:-2:2], strict=True):
        x = g.node("Relu", [g.node("Conv", [x, g.const(k.transpose(2, 1, 0)), g.const(b)],
                                   kernel_shape=[k.shape[0]])])
    x = g.node("Squeeze", [g.node("GlobalAveragePool", [x]), g.const(np.array([2], np.int64))])
    g.dense(x, weights[-2], weights[-1], None, "output")
    return g.model([("input", ["batch", window, features])], [("output", ["batch", 1])])


def _same(n: int, k: int, s: int) -> tuple[int, int]:
    """Keras' 'same' padding of one axis (ceil(n / s) outputs, the odd cell after)."""
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def deeplob(name: str, shape: tuple[int, int, int], trunk: Sequence[tuple], branches: Sequence[Sequence[tuple]],
            weights: dict[str, list[np.ndarray]]) -> Any:
    """DeepLOB as :func:`hwbackends.zoo.keras_deeplob` builds it, from the same weights: the
    book (batch, events, features, 1) as NCHW (a Transpose); each Conv2D a ``Conv`` (kernel
    (kh, kw, in, out) → (out, in, kh, kw), Keras' 'same' as explicit pads) then
    ``LeakyRelu(0.01)``; the inception's pool a ``MaxPool`` with pads; the branches a
    ``Concat`` on the channels; (batch, 192, events, 1) back to (batch, events, 192)
    (Transpose, Reshape), time-major into the ``LSTM``; the head ``Gemm`` + ``Softmax``."""
    g = _Graph(name, [], [])

    def layer(x: str, hw: tuple[int, int], spec: tuple) -> tuple[str, tuple[int, int]]:
        lname, f, k, s, pad = spec
        (pt, pb), (pl, pr) = (_same(hw[0], k[0], s[0]), _same(hw[1], k[1], s[1])) if pad == "same" \
            else ((0, 0), (0, 0))
        out = ((hw[0] + pt + pb - k[0]) // s[0] + 1, (hw[1] + pl + pr - k[1]) // s[1] + 1)
        window = {"kernel_shape": list(k), "strides": list(s), "pads": [pt, pl, pb, pr]}
        if f == 0:
            return g.node("MaxPool", [x], **window), out
        kern, bias = weights[lname]
        y = g.node("Conv", [x, g.const(kern.transpose(3, 2, 0, 1)), g.const(bias)], **window)
        return g.node("LeakyRelu", [y], alpha=0.01), out

    x, hw = g.node("Transpose", ["input"], perm=[0, 3, 1, 2]), shape[:2]
    for spec in trunk:
        x, hw = layer(x, hw, spec)
    outs = []
    for branch in branches:
        y, bhw = x, hw
        for spec in branch:
            y, bhw = layer(y, bhw, spec)
        outs.append(y)
    y = g.node("Concat", outs, axis=1)
    channels = sum(weights[b[-1][0]][0].shape[3] for b in branches)
    y = g.node("Reshape", [g.node("Transpose", [y], perm=[0, 2, 3, 1]),
                           g.const(np.array([0, hw[0], hw[1] * channels], np.int64))])
    k, r, b = weights["lstm"]
    y = g.lstm(g.node("Transpose", [y], perm=[1, 0, 2]), k, r, b, sequences=False)
    g.dense(y, *weights["probs"], "Softmax", "output")
    return g.model([("input", ["batch", *shape])], [("output", ["batch", 3])])


def two_head(name: str, weights: list[np.ndarray]) -> Any:
    """features →Dense relu, state →Dense relu, concatenated →Dense relu → signal (tanh) and
    confidence (sigmoid): ``weights`` in the Keras model's ``get_weights`` order."""
    g = _Graph(name, [], [])
    h = g.dense("features", weights[0], weights[1], "Relu")
    s = g.dense("state", weights[2], weights[3], "Relu")
    z = g.dense(g.node("Concat", [h, s], axis=1), weights[4], weights[5], "Relu")
    g.dense(z, weights[6], weights[7], "Tanh", "signal")
    g.dense(z, weights[8], weights[9], "Sigmoid", "confidence")
    return g.model([("features", ["batch", weights[0].shape[0]]), ("state", ["batch", weights[2].shape[0]])],
                   [("signal", ["batch", 1]), ("confidence", ["batch", 1])])


# -- the signal architecture trained in NumPy ----------------------------------------------------
def _relu_mlp_forward(ws: list[np.ndarray], x: np.ndarray) -> list[np.ndarray]:
    """Activations of Dense relu → … → Dense tanh (the signal architecture), input first."""
    acts = [x]
    for i in range(0, len(ws), 2):
        z = acts[-1] @ ws[i] + ws[i + 1]
        acts.append(np.tanh(z) if i + 2 == len(ws) else np.maximum(z, 0))
    return acts


def signal_forward(ws: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The signal architecture's output for ``x`` under weights ``ws`` (NumPy, float64)."""
    return _relu_mlp_forward([w.astype(np.float64) for w in ws], x.astype(np.float64))[-1]


def train_signal(init: list[np.ndarray], x: np.ndarray, y: np.ndarray, *, epochs: int = 4,
                 batch: int = 256, lr: float = 3e-3) -> list[np.ndarray]:
    """Mean-squared-error training of the signal architecture from ``init`` with Adam (Keras'
    defaults: β 0.9/0.999, ε 1e-7), in order, no shuffling: the same recipe as the Keras
    signal, done in float64 NumPy so it needs no framework. Deterministic for given inputs."""
    ws = [w.astype(np.float64) for w in init]
    m = [np.zeros_like(w) for w in ws]
    v = [np.zeros_like(w) for w in ws]
    b1, b2, eps, t = 0.9, 0.999, 1e-7, 0
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    for _ in range(epochs):
        for lo in range(0, len(x64), batch):
            xb, yb = x64[lo:lo + batch], y64[lo:lo + batch]
            acts = _relu_mlp_forward(ws, xb)
            # d(mean (out - y)^2)/d out, through tanh
            delta = 2.0 * (acts[-1] - yb) / yb.size * (1.0 - acts[-1] ** 2)
            grads: list[np.ndarray] = [np.empty(0)] * len(ws)
            for i in range(len(ws) - 2, -1, -2):
                grads[i], grads[i + 1] = acts[i // 2].T @ delta, delta.sum(axis=0)
                if i:
                    delta = (delta @ ws[i].T) * (acts[i // 2] > 0)
            t += 1
            for j, gr in enumerate(grads):
                m[j] = b1 * m[j] + (1 - b1) * gr
                v[j] = b2 * v[j] + (1 - b2) * gr * gr
                step = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                ws[j] = ws[j] - step * m[j] / (np.sqrt(v[j]) + eps)
    return [w.astype(np.float32) for w in ws]
