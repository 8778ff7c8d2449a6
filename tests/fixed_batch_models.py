"""ONNX files with a batch dimension baked in, built in code as users' exporters make them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _torch_mlp(reshape: str | None) -> Any:
    import torch

    class Net(torch.nn.Module):
        def __init__(self, batch: int) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.batch = batch
            self.l1 = torch.nn.Linear(16, 32)
            self.l2 = torch.nn.Linear(32, 3)

        def forward(self, x: Any) -> Any:
            if reshape == "baked":  # a literal batch, as in code written for one batch size
                x = x.reshape(self.batch, 16)
            elif reshape == "mixing":  # regroups rows across samples: no symbolic batch possible
                x = x.reshape(self.batch // 2, 32).reshape(self.batch, 16)
            else:
                x = x.flatten(1)
            return self.l2(torch.relu(self.l1(x)))
    return Net


def torch_fixed_onnx(path: Path, batch: int, reshape: str | None = None) -> Path:
    """``torch.onnx.export`` without ``dynamic_axes``: the example's batch is baked in."""
    import torch

    net = _torch_mlp(reshape)(batch).eval()
    torch.onnx.export(net, (torch.zeros(batch, 4, 4),), str(path), dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["output"])
    return path


def keras_batch1_onnx(path: Path, activation: str = "softmax") -> Path:
    """A Keras model built with ``batch_size=1`` and exported by tf2onnx at that batch."""
    import keras
    import tensorflow as tf
    import tf2onnx

    keras.utils.set_random_seed(0)
    km = keras.Sequential([keras.Input((4, 4), batch_size=1), keras.layers.Flatten(),
                           keras.layers.Dense(8, activation="relu"),
                           keras.layers.Dense(3, activation=activation)])
    spec = [tf.TensorSpec([1, 4, 4], tf.float32, name="x")]

    @tf.function(input_signature=spec)
    def serve(x: Any) -> Any:
        return km(x)

    proto, _ = tf2onnx.convert.from_function(serve, input_signature=spec, opset=17)
    path.write_bytes(proto.SerializeToString())
    return path


def run_original(path: Path, x: np.ndarray) -> np.ndarray:
    """The file as exported, in ONNX Runtime at its own fixed batch (padding the last
    chunk): the ground truth, independent of hwbackends."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    b = inp.shape[0]
    outs = []
    for i in range(0, len(x), b):
        chunk = x[i:i + b]
        pad = np.zeros((b - len(chunk), *x.shape[1:]), np.float32)
        outs.append(sess.run(None, {inp.name: np.concatenate([chunk, pad])})[0][:len(chunk)])
    return np.concatenate(outs)
