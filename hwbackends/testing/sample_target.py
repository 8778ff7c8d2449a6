"""A complete, minimal target: a NumPy implementation of Keras Dense models.

It is the body of the plugin ``hwb plugin new`` writes (the scaffold copies this file and
renames the target), and the kit's own self-tests run it, so the template is known to pass
the conformance kit. It shows every part of the contract in ~150 lines:

- ``probe()`` imports nothing (NumPy is always there) and names the device;
- ``compile()`` runs in the worker process: it reads the Keras model's Dense layers (weights
  and activation: linear, relu, tanh, sigmoid, softmax) and writes them to ``weights.npz`` +
  ``layers.json`` in ``workdir``; any other layer raises ``UnsupportedError`` naming it;
- ``load()`` reads the artifact back and returns an executor whose ``predict_into`` writes
  through preallocated buffers (``np.matmul(..., out=)``, in-place activations): nothing is
  allocated per call, and a wrong ``x``/``out`` raises ``InputError`` before any work.
"""
from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hwbackends.errors import UnsupportedError
from hwbackends.specs import Availability, TensorSpec
from hwbackends.target import Artifact, CompileOptions, Executor, Target

ACTIVATIONS = ("linear", "relu", "tanh", "sigmoid", "softmax")


class NumpyDenseExecutor(Executor):
    """Dense layers on preallocated buffers. Every call writes into the same arrays.

    The base class's ``predict_into`` guards ``x``/``out`` (shape, dtype) and turns any
    failure on a wrong array into ``InputError``; this class only implements ``_run``."""

    def __init__(self, weights: list[tuple[np.ndarray, np.ndarray]], activations: list[str],
                 batch: int, inp: TensorSpec, out: TensorSpec):
        self._init_io(inp, out, batch)
        # The first layer reads x through this buffer: a strided x is copied here, never
        # reshaped into a fresh array per call.
        self._x2d = np.zeros((batch, int(np.prod(inp.shape))), np.float32)
        self._layers = []
        for (w, b), act in zip(weights, activations, strict=True):
            buf = np.zeros((batch, w.shape[1]), np.float32)
            # softmax needs a per-row scratch column; allocated once here, not per call
            scratch = np.zeros((batch, 1), np.float32)
            self._layers.append((np.ascontiguousarray(w, np.float32),
                                 np.ascontiguousarray(b, np.float32), act, buf, scratch))

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        (x,), (out,) = xs, outs  # one tensor each way
        h = self._x2d
        np.copyto(h.reshape(x.shape), x)  # h is contiguous: the reshape is a view
        for w, b, act, buf, scratch in self._layers:
            np.matmul(h, w, out=buf)
            np.add(buf, b, out=buf)
            if act == "relu":
                np.maximum(buf, 0.0, out=buf)
            elif act == "tanh":
                np.tanh(buf, out=buf)
            elif act == "sigmoid":
                np.negative(buf, out=buf)
                np.exp(buf, out=buf)
                np.add(buf, 1.0, out=buf)
                np.reciprocal(buf, out=buf)
            elif act == "softmax":
                np.max(buf, axis=1, keepdims=True, out=scratch)
                np.subtract(buf, scratch, out=buf)
                np.exp(buf, out=buf)
                np.sum(buf, axis=1, keepdims=True, out=scratch)
                np.divide(buf, scratch, out=buf)
            h = buf
        np.copyto(out, h.reshape(out.shape))  # out may be strided: write through it


def dense_layers(km: Any, target: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[str]]:
    """(kernel, bias) and activation name of each Dense layer of a Keras model; any other
    layer (or activation) raises UnsupportedError naming it."""
    weights, acts = [], []
    for layer in km.layers:
        kind = type(layer).__name__
        if kind == "InputLayer":
            continue
        if kind != "Dense":
            raise UnsupportedError(f"{target} supports Dense layers only: layer {layer.name!r} "
                                   f"is a {kind}")
        cfg = layer.get_config()
        act = cfg.get("activation", "linear")
        act = act if isinstance(act, str) else str(act.get("config", {}).get("name", act))
        if act not in ACTIVATIONS:
            raise UnsupportedError(f"{target}: layer {layer.name!r} (Dense) has activation "
                                   f"{act!r}; supported: {', '.join(ACTIVATIONS)}")
        params = layer.get_weights()
        kernel = params[0]
        bias = params[1] if cfg.get("use_bias", True) else np.zeros(kernel.shape[1], np.float32)
        weights.append((kernel.astype(np.float32), bias.astype(np.float32)))
        acts.append(act)
    if not weights:
        raise UnsupportedError(f"{target}: the model has no Dense layer")
    return weights, acts


class NumpyDenseTarget(Target):
    name = "cpu.numpy_sample"  # scaffold:name
    family = "cpu"  # scaffold:family
    contract_version = 2  # scaffold:contract
    precisions = ("fp32",)
    formats = ("keras",)
    description = "NumPy reference implementation of Keras Dense models"  # scaffold:description
    #: Bump when compile()'s output changes: it is part of the artifact cache key.
    version = "1"

    def probe(self) -> Availability:
        # Fast and import-free: NumPy is a dependency of hwbackends itself.
        return Availability.hardware(f"CPU ({platform.machine()})", "NumPy matmul on the CPU")

    def toolchain(self) -> dict[str, str]:
        return {"numpy": np.__version__}

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        weights, acts = dense_layers(model.obj, self.name)
        np.savez(workdir / "weights.npz",
                 **{f"{k}{i}": a for i, (w, b) in enumerate(weights) for k, a in (("w", w), ("b", b))})
        (workdir / "layers.json").write_text(json.dumps({"activations": acts}))
        return {"layers": len(acts), "activations": acts}

    def load(self, artifact: Artifact, options: CompileOptions) -> NumpyDenseExecutor:
        acts = json.loads(artifact.file("layers.json").read_text())["activations"]
        with np.load(artifact.file("weights.npz")) as z:
            weights = [(z[f"w{i}"], z[f"b{i}"]) for i in range(len(acts))]
        return NumpyDenseExecutor(weights, acts, artifact.batch_size, artifact.inputs[0],
                                  artifact.outputs[0])
