"""Example models built in code with fixed seeds (no model hub), as Keras 3 and PyTorch.

========  =========================================  ===========================
name      architecture                               input (per sample)
========  =========================================  ===========================
mlp       Dense 64→64 relu →32 relu →3 softmax        (64,)
lstm      LSTM 32 over a window → Dense 1             (16, 8)  16 ticks × 8 features
conv1d    Conv1D 16 k3 ×2 → global avg pool → Dense 1 (32, 8)
signal    Dense 32→32 relu →16 relu →1 tanh, trained  (32,)    order-book features
          in seconds on synthetic order-book data
two_head  features →Dense 32 relu, state →Dense 8     features (16,) + state (4,)
          relu, concat →Dense 16 relu → signal (1,
          tanh) and confidence (1, sigmoid)
========  =========================================  ===========================

``lstm_a`` and ``lstm_b`` (:data:`STAC_NAMES`) have the *shapes* of STAC-ML Markets
(Inference)'s LSTM_A and LSTM_B as public reconstructions give them — they are not STAC's
models, weights or data: ``lstm_a`` a window of 50 ticks × 100 features, LSTM(100) →
LSTM(100) → Dense(1); ``lstm_b`` 100 × 250, LSTM(200) ×3 → Dense(1). Untrained: Glorot-uniform
kernels, recurrent kernels at 0.7 of that, forget-gate bias 1, from NumPy's generator with a
fixed seed (cheap to build; latency does not depend on training). They are large, so they are
built on request (``zoo:lstm_a``) and not in ``NAMES``.

``deeplob`` (:data:`DEEPLOB_NAMES`) is DeepLOB (Zhang, Zohren & Roberts, "DeepLOB: Deep
Convolutional Neural Networks for Limit Order Books", 2019) *reconstructed from the paper*:
100 events × 40 book features as a one-channel image; three conv blocks of 32 filters — a
(1, 2) stride (1, 2) conv (the third block's a (1, 10) conv), then two (4, 1) 'same' convs,
each conv followed by LeakyReLU(0.01) — an inception module (1×1 → 3×1, 1×1 → 5×1, a (3, 1)
'same' max pool → 1×1, 64 filters each, concatenated: (100, 1, 192)), reshaped to (100, 192),
LSTM(64), Dense(3, softmax). Random weights (He-uniform conv kernels, Glorot LSTM and head,
from NumPy's generator with a fixed seed), not the authors' trained model, nor trained at
all: a latency and fidelity workload. Built on request (``zoo:deeplob``), not in ``NAMES``;
without Keras it is its ONNX twin (``onnx_deeplob``), as the other Keras zoo models.

``two_head`` has two inputs and two outputs (Keras functional API); only the targets with
``multi_io`` take it, so it is listed in ``MULTI_IO_NAMES``, not in ``NAMES`` (which the
conformance kit runs on every target).

Without Keras (``pip install '.[cpu]'``; :func:`keras_available`) every Keras zoo model is its
ONNX twin, written with ``onnx.helper`` from *the same seeded weights* (:mod:`hwbackends.zoo_onnx`:
``onnx_mlp``, ``onnx_lstm``, ``onnx_conv1d``, ``onnx_two_head``, ``onnx_stac``), computing the same
function to float rounding; ``mlp_torch`` and ``lstm_torch`` still need torch. ``signal`` is the
exception: it is *trained*, and without Keras the same architecture is trained in NumPy on the same
data and recipe (:func:`numpy_signal`, well under a second, kept signed as
``signal-v1-numpy.onnx``). That is a different model from the Keras-trained signal (other
initial weights and arithmetic; about the same correlation with the target, 0.85), with its own
fingerprint, so artifacts, profiles and memos of the two never mix.

``mlp_torch`` and ``lstm_torch`` are PyTorch modules with *the same weights* as their Keras
twins (same seeds, gate order mapped), so both frameworks compute the same function. Weights
come from NumPy's seeded generator, so fingerprints are identical across processes.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import HwbError, ModelError
from .models import Model, load_model, register_source
from .store.signed_dir import SignedDir

log = logging.getLogger("hwbackends.zoo")

NAMES = ("mlp", "lstm", "conv1d", "signal", "mlp_torch", "lstm_torch")
#: Zoo models with several inputs/outputs (see the module docstring).
MULTI_IO_NAMES = ("two_head",)
#: The STAC-ML-shaped models (see the module docstring): (window, features, LSTM units, seed).
STAC_SHAPES: dict[str, tuple[int, int, tuple[int, ...], int]] = {
    "lstm_a": (50, 100, (100, 100), 11), "lstm_b": (100, 250, (200, 200, 200), 12)}
STAC_NAMES = tuple(STAC_SHAPES)
#: DeepLOB reconstructed from its paper (see the module docstring): built on request.
DEEPLOB_NAMES = ("deeplob",)
#: DeepLOB's input, (events, book features, channels), and its Keras layers in the paper's
#: order: (name, filters, kernel, strides, padding) of each conv, each one followed by
#: LeakyReLU(0.01); the inception branches read the trunk's last output.
DEEPLOB_SHAPE = (100, 40, 1)
DEEPLOB_TRUNK = tuple(
    (f"conv{b}_{i}", 32, k, s, pad) for b, first in ((1, (1, 2)), (2, (1, 2)), (3, (1, 10)))
    for i, (k, s, pad) in enumerate(((first, first if first == (1, 2) else (1, 1), "valid"),
                                     ((4, 1), (1, 1), "same"), ((4, 1), (1, 1), "same")), 1))
DEEPLOB_BRANCHES = (
    (("incep1_1x1", 64, (1, 1), (1, 1), "same"), ("incep1_3x1", 64, (3, 1), (1, 1), "same")),
    (("incep2_1x1", 64, (1, 1), (1, 1), "same"), ("incep2_5x1", 64, (5, 1), (1, 1), "same")),
    (("incep3_pool", 0, (3, 1), (1, 1), "same"), ("incep3_1x1", 64, (1, 1), (1, 1), "same")),
)
DEEPLOB_LSTM = 64
DEFAULT = "signal"
SIGNAL_VERSION = "v1"


def _glorot(rng: np.random.Generator, fan_in: int, fan_out: int, shape: tuple[int, ...]) -> np.ndarray:
    lim = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-lim, lim, shape).astype(np.float32)


def mlp_weights(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    ws = []
    for a, b in ((64, 64), (64, 32), (32, 3)):
        ws += [_glorot(rng, a, b, (a, b)), rng.normal(0, 0.05, b).astype(np.float32)]
    return ws


def lstm_weights(seed: int = 2, features: int = 8, units: int = 32) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    kernel = _glorot(rng, features, 4 * units, (features, 4 * units))
    recurrent = _glorot(rng, units, 4 * units, (units, 4 * units)) * 0.7
    bias = np.zeros(4 * units, np.float32)
    bias[units:2 * units] = 1.0  # forget-gate bias 1, as Keras' unit_forget_bias
    head = _glorot(rng, units, 1, (units, 1))
    return [kernel, recurrent, bias, head, np.array([0.01], np.float32)]


def keras_mlp() -> Any:
    import keras
    m = keras.Sequential([
        keras.Input((64,), name="features"),
        keras.layers.Dense(64, activation="relu", name="dense_1"),
        keras.layers.Dense(32, activation="relu", name="dense_2"),
        keras.layers.Dense(3, activation="softmax", name="probs"),
    ], name="zoo_mlp")
    m.set_weights(mlp_weights())
    return m


def onnx_mlp() -> Any:
    """zoo:mlp as an ONNX graph written with onnx.helper, from the same seeded weights (the
    same function as :func:`keras_mlp`): what ``zoo:mlp`` is where Keras is not installed
    (``pip install '.[cpu]'``), so the CPU targets have a bundled model to run."""
    from .zoo_onnx import dense_stack

    return dense_stack("zoo_mlp", mlp_weights(), ("Relu", "Relu", "Softmax"), ("features", "probs"))


def keras_available() -> bool:
    """Whether the import system finds Keras (cheap: nothing is imported). A finder that
    refuses it (raises ImportError) counts as not installed, as a ``.[cpu]`` install."""
    try:
        return importlib.util.find_spec("keras") is not None
    except (ImportError, ValueError):
        return False


#: (window, features) of the zoo's sequence models, and two_head's weight shapes in the Keras
#: model's ``get_weights`` order.
LSTM_SHAPE, CONV1D_SHAPE = (16, 8), (32, 8)
TWO_HEAD_SHAPES = ((16, 32), (32,), (4, 8), (8,), (40, 16), (16,), (16, 1), (1,), (16, 1), (1,))


def two_head_weights(seed: int = 11) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [_glorot(rng, s[0], s[-1], s) if len(s) == 2
            else rng.uniform(-0.1, 0.1, s).astype(np.float32) for s in TWO_HEAD_SHAPES]


def conv1d_weights(seed: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [_glorot(rng, 24, 16, (3, 8, 16)), np.zeros(16, np.float32),
            _glorot(rng, 48, 16, (3, 16, 16)), np.zeros(16, np.float32),
            _glorot(rng, 16, 1, (16, 1)), np.zeros(1, np.float32)]


def onnx_lstm() -> Any:
    """zoo:lstm as ONNX (LSTM op, same seeded weights as :func:`keras_lstm`)."""
    from .zoo_onnx import lstm_stack

    return lstm_stack("zoo_lstm", *LSTM_SHAPE, lstm_weights())


def onnx_conv1d() -> Any:
    """zoo:conv1d as ONNX (Conv, GlobalAveragePool, Gemm; the weights of :func:`keras_conv1d`)."""
    from .zoo_onnx import conv1d_stack

    return conv1d_stack("zoo_conv1d", *CONV1D_SHAPE, conv1d_weights())


def onnx_two_head() -> Any:
    """zoo:two_head as ONNX (two inputs, two outputs; the weights of :func:`keras_two_head`)."""
    from .zoo_onnx import two_head

    return two_head("zoo_two_head", two_head_weights())


def onnx_stac(name: str) -> Any:
    """``lstm_a`` / ``lstm_b`` as ONNX (stacked LSTM ops; the weights of :func:`keras_stac`)."""
    from .zoo_onnx import lstm_stack

    window, features, _, _ = STAC_SHAPES[name]
    return lstm_stack(f"zoo_{name}", window, features, stac_weights(name))


def keras_two_head() -> Any:
    """features (16,) + state (4,) → signal (1,) + confidence (1,); seeded weights."""
    import keras
    feats = keras.Input((16,), name="features")
    state = keras.Input((4,), name="state")
    h = keras.layers.Dense(32, activation="relu", name="feat_dense")(feats)
    s = keras.layers.Dense(8, activation="relu", name="state_dense")(state)
    z = keras.layers.Dense(16, activation="relu", name="trunk")(
        keras.layers.Concatenate(name="concat")([h, s]))
    signal = keras.layers.Dense(1, activation="tanh", name="signal")(z)
    conf = keras.layers.Dense(1, activation="sigmoid", name="confidence")(z)
    m = keras.Model([feats, state], [signal, conf], name="zoo_two_head")
    m.set_weights(two_head_weights())
    return m


def keras_lstm() -> Any:
    import keras
    m = keras.Sequential([
        keras.Input((16, 8), name="window"),
        keras.layers.LSTM(32, name="lstm"),
        keras.layers.Dense(1, name="signal"),
    ], name="zoo_lstm")
    m.set_weights(lstm_weights())
    return m


def stac_weights(name: str) -> list[np.ndarray]:
    """The seeded weights of a STAC-shaped model, in Keras' ``get_weights`` order."""
    _, features, units, seed = STAC_SHAPES[name]
    rng = np.random.default_rng(seed)
    ws, n_in = [], features
    for u in units:
        bias = np.zeros(4 * u, np.float32)
        bias[u:2 * u] = 1.0
        ws += [_glorot(rng, n_in, 4 * u, (n_in, 4 * u)), _glorot(rng, u, 4 * u, (u, 4 * u)) * 0.7, bias]
        n_in = u
    return ws + [_glorot(rng, n_in, 1, (n_in, 1)), np.zeros(1, np.float32)]


def keras_stac(name: str) -> Any:
    """``lstm_a`` / ``lstm_b``: the reconstructed STAC-ML shapes (module docstring)."""
    import keras
    window, features, units, _ = STAC_SHAPES[name]
    layers = [keras.Input((window, features), name="window")]
    layers += [keras.layers.LSTM(u, return_sequences=i + 1 < len(units), name=f"lstm_{i + 1}")
               for i, u in enumerate(units)]
    m = keras.Sequential([*layers, keras.layers.Dense(1, name="signal")], name=f"zoo_{name}")
    m.set_weights(stac_weights(name))
    return m


def keras_conv1d() -> Any:
    import keras
    m = keras.Sequential([
        keras.Input((32, 8), name="window"),
        keras.layers.Conv1D(16, 3, activation="relu", name="conv_1"),
        keras.layers.Conv1D(16, 3, activation="relu", name="conv_2"),
        keras.layers.GlobalAveragePooling1D(name="pool"),
        keras.layers.Dense(1, name="signal"),
    ], name="zoo_conv1d")
    m.set_weights(conv1d_weights())
    return m


def deeplob_weights(seed: int = 13) -> dict[str, list[np.ndarray]]:
    """DeepLOB's seeded weights by layer name (the Keras layers :func:`keras_deeplob` names):
    He-uniform conv kernels (the LeakyReLU stack keeps its scale), biases in ±0.1, the LSTM as
    the zoo's other recurrent models (Glorot, recurrent at 0.7, forget-gate bias 1), the head's
    kernel at 4× Glorot so the three probabilities spread over inputs (std ≈ 0.04–0.1 on
    standard-normal books) instead of sitting near 1/3."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[np.ndarray]] = {}

    def conv(name: str, f: int, k: tuple[int, int], ci: int) -> int:
        if f == 0:  # the branch's pool: no weights, its channels kept
            return ci
        lim = np.sqrt(6.0 / (k[0] * k[1] * ci))
        out[name] = [rng.uniform(-lim, lim, (k[0], k[1], ci, f)).astype(np.float32),
                     rng.uniform(-0.1, 0.1, f).astype(np.float32)]
        return f

    ci = DEEPLOB_SHAPE[2]
    for name, f, k, _, _ in DEEPLOB_TRUNK:
        ci = conv(name, f, k, ci)
    for branch in DEEPLOB_BRANCHES:
        cb = ci
        for name, f, k, _, _ in branch:
            cb = conv(name, f, k, cb)
    u, n_in = DEEPLOB_LSTM, 3 * 64
    bias = np.zeros(4 * u, np.float32)
    bias[u:2 * u] = 1.0
    out["lstm"] = [_glorot(rng, n_in, 4 * u, (n_in, 4 * u)), _glorot(rng, u, 4 * u, (u, 4 * u)) * 0.7, bias]
    out["probs"] = [_glorot(rng, u, 3, (u, 3)) * 4.0, np.zeros(3, np.float32)]
    return out


def onnx_deeplob() -> Any:
    """zoo:deeplob as ONNX (Conv, LeakyRelu, MaxPool, Concat, LSTM; the weights of
    :func:`keras_deeplob`)."""
    from .zoo_onnx import deeplob

    return deeplob("zoo_deeplob", DEEPLOB_SHAPE, DEEPLOB_TRUNK, DEEPLOB_BRANCHES, deeplob_weights())


def keras_deeplob() -> Any:
    """DeepLOB as a Keras functional model (module docstring: reconstructed from the paper,
    random weights)."""
    import keras

    L = keras.layers

    def conv(x: Any, name: str, f: int, k: tuple, s: tuple, pad: str) -> Any:
        if f == 0:
            return L.MaxPooling2D(k, strides=s, padding=pad, name=name)(x)
        y = L.Conv2D(f, k, strides=s, padding=pad, name=name)(x)
        return L.LeakyReLU(negative_slope=0.01, name=f"{name}_leaky")(y)

    book = keras.Input(DEEPLOB_SHAPE, name="book")
    x = book
    for spec in DEEPLOB_TRUNK:
        x = conv(x, *spec)
    outs = []
    for branch in DEEPLOB_BRANCHES:
        y = x
        for spec in branch:
            y = conv(y, *spec)
        outs.append(y)
    y = L.Concatenate(axis=-1, name="inception")(outs)
    y = L.Reshape((DEEPLOB_SHAPE[0], 3 * 64), name="events")(y)
    y = L.LSTM(DEEPLOB_LSTM, name="lstm")(y)
    probs = L.Dense(3, activation="softmax", name="probs")(y)
    m = keras.Model(book, probs, name="zoo_deeplob")
    for name, ws in deeplob_weights().items():
        m.get_layer(name).set_weights(ws)
    return m


def torch_mlp() -> Any:
    import torch
    from torch import nn

    m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                      nn.Linear(32, 3), nn.Softmax(dim=-1))
    ws = mlp_weights()
    with torch.no_grad():
        for layer, (w, b) in zip([m[0], m[2], m[4]], zip(ws[0::2], ws[1::2], strict=True), strict=True):
            layer.weight.copy_(torch.from_numpy(w.T.copy()))
            layer.bias.copy_(torch.from_numpy(b))
    return m.eval()


def _torch_lstm_class() -> type:
    from torch import nn

    class ZooLSTM(nn.Module):
        """LSTM over the window, last hidden state → linear head (as the Keras zoo LSTM)."""

        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(8, 32, batch_first=True)
            self.head = nn.Linear(32, 1)

        def forward(self, x: Any) -> Any:
            y, _ = self.lstm(x)
            return self.head(y[:, -1])

    return ZooLSTM


def torch_lstm() -> Any:
    import torch

    m = _torch_lstm_class()()
    k, r, b, hw, hb = lstm_weights()
    with torch.no_grad():  # Keras and torch share the gate order i, f, c/g, o
        m.lstm.weight_ih_l0.copy_(torch.from_numpy(k.T.copy()))
        m.lstm.weight_hh_l0.copy_(torch.from_numpy(r.T.copy()))
        m.lstm.bias_ih_l0.copy_(torch.from_numpy(b))
        m.lstm.bias_hh_l0.zero_()
        m.head.weight.copy_(torch.from_numpy(hw.T.copy()))
        m.head.bias.copy_(torch.from_numpy(hb))
    return m.eval()


# -- the default model: a signal trained on synthetic order-book features ---------------------
def orderbook_features(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic order-book features (32 per tick) and the next-tick return they predict.

    Columns: 10 level imbalances, 5 spreads (bps), 8 lagged returns, 5 volume z-scores, 4 trade
    flow signs. A latent short-horizon alpha drives imbalance and flow; the target is
    ``tanh``-squashed future return with noise, so a small model learns a real, imperfect
    signal."""
    rng = np.random.default_rng(seed)
    alpha = rng.standard_normal(n)
    imb = 0.6 * alpha[:, None] * np.linspace(1, 0.3, 10) + rng.standard_normal((n, 10)) * 0.8
    spread = np.abs(rng.standard_normal((n, 5))) * (1 + 0.3 * np.abs(alpha[:, None]))
    rets = rng.standard_normal((n, 8)) * 0.5 + 0.2 * alpha[:, None]
    vol = rng.standard_normal((n, 5))
    flow = np.tanh(alpha[:, None] * 0.8 + rng.standard_normal((n, 4)))
    x = np.concatenate([imb, spread, rets, vol, flow], axis=1).astype(np.float32)
    y = np.tanh(0.8 * alpha + 0.3 * rng.standard_normal(n) - 0.05 * spread[:, 0]).astype(np.float32)
    return x, y[:, None]


def keras_signal(epochs: int = 4) -> tuple[Any, np.ndarray]:
    import keras

    keras.utils.set_random_seed(7)
    x, y = orderbook_features(20000, seed=0)
    m = keras.Sequential([
        keras.Input((32,), name="book"),
        keras.layers.Dense(32, activation="relu", name="hidden_1"),
        keras.layers.Dense(16, activation="relu", name="hidden_2"),
        keras.layers.Dense(1, activation="tanh", name="signal"),
    ], name="signal")
    m.compile(optimizer=keras.optimizers.Adam(3e-3), loss="mse")
    m.fit(x, y, batch_size=256, epochs=epochs, verbose=0, shuffle=False)
    xv, _ = orderbook_features(2048, seed=1)
    return m, xv


#: The zoo directory's entries' format (1: signed entries with a JSON record beside each file).
ZOO_FORMAT = 1


def _zoo() -> SignedDir:
    """``<store root>/zoo``: each trained model and memo a file beside its signed record
    (``<file>.hmac``), under the store's trust rules (:mod:`hwbackends.store.signed_dir`)."""
    from .store.artifacts import ArtifactStore

    st = ArtifactStore()
    st.check_root()
    return SignedDir(st.root / "zoo", "zoo", ZOO_FORMAT, fanout=False, suffix=".hmac")


def _zoo_dir() -> Path:
    """The zoo directory, created private (:func:`hwbackends.store.trust.private_dir`)."""
    from .store.trust import private_dir, trusted_gid

    return private_dir(_zoo().root, "zoo directory", trusted_gid())


def _signed(path: Path) -> bool:
    """Whether the zoo file ``path`` is ours: its bytes are what its signed record says."""
    return _zoo().read(path.name, touch=False) is not None


def signal_init(seed: int = 7) -> list[np.ndarray]:
    """The NumPy-trained signal's starting weights: Glorot-uniform kernels, zero biases (Keras'
    Dense defaults), from a seeded generator."""
    rng = np.random.default_rng(seed)
    ws: list[np.ndarray] = []
    for a, b in ((32, 32), (32, 16), (16, 1)):
        ws += [_glorot(rng, a, b, (a, b)), np.zeros(b, np.float32)]
    return ws


def numpy_signal() -> Any:
    """The signal architecture (Dense 32 relu → 16 relu → 1 tanh) trained in NumPy on the same
    synthetic order-book data and recipe as :func:`keras_signal` (Adam 3e-3, MSE, batch 256, 4
    epochs, in order), as an ONNX graph. It is *another model* than the Keras-trained signal
    (other initial weights, other float arithmetic): its own weights and fingerprint. What
    ``zoo:signal`` is where Keras is not installed; about a second to train."""
    from .zoo_onnx import dense_stack, train_signal

    x, y = orderbook_features(20000, seed=0)
    ws = train_signal(signal_init(), x, y)
    return dense_stack("signal", ws, ("Relu", "Relu", "Tanh"), ("book", "signal"))


def _signal_file() -> Path:
    """Where the trained signal is kept: the Keras one, or (no Keras) the NumPy-trained ONNX."""
    suffix = ".keras" if keras_available() else "-numpy.onnx"
    return _zoo_dir() / f"signal-{SIGNAL_VERSION}{suffix}"


def signal_path() -> Path:
    """The trained default model, trained once and kept in the cache (a ``.keras`` file, or
    without Keras the NumPy-trained ``-numpy.onnx`` of :func:`numpy_signal`), signed with the
    store key: a file put there by anyone else (or edited) is retrained."""
    path = _signal_file()
    if _signed(path):
        return path
    if path.exists():
        log.warning("%s is not signed with this user's store key; retraining it", path)
    if path.suffix == ".onnx":
        _write_signed(path, numpy_signal().SerializeToString())
        return path
    m, _ = keras_signal()
    tmp = path.with_name(f".{os.getpid()}-saved-{path.name}")
    m.save(tmp)
    try:
        _write_signed(path, tmp.read_bytes())
    finally:
        tmp.unlink(missing_ok=True)
    return path


#: Each Keras zoo model and its ONNX twin (:mod:`hwbackends.zoo_onnx`): the same function from
#: the same seeded weights; the twin is what the name builds where Keras is not installed.
TWINS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "mlp": (keras_mlp, onnx_mlp), "lstm": (keras_lstm, onnx_lstm),
    "conv1d": (keras_conv1d, onnx_conv1d), "two_head": (keras_two_head, onnx_two_head),
    "deeplob": (keras_deeplob, onnx_deeplob),
    **{n: ((lambda n=n: keras_stac(n)), (lambda n=n: onnx_stac(n))) for n in STAC_NAMES}}


def _source(name: str) -> Any:
    """The Keras model ``name`` where Keras is installed, else its ONNX twin."""
    keras_build, onnx_build = TWINS[name]
    return keras_build() if keras_available() else onnx_build()


_BUILDERS: dict[str, Callable[[], Model]] = {
    **{n: (lambda n=n: load_model(_source(n), name=n)) for n in TWINS},
    "signal": lambda: _own_data(load_model(signal_path(), name="signal",
                                           validation_data=_signal_validation()),
                                "zoo:signal's bundled order-book features (simulated, seed 1)"),
    "mlp_torch": lambda: load_model(torch_mlp(), name="mlp_torch", input_shape=(64,)),
    "lstm_torch": lambda: load_model(torch_lstm(), name="lstm_torch", input_shape=(16, 8)),
}


def _own_data(m: Model, label: str) -> Model:
    """Record where a zoo model's bundled validation data comes from (hwbackends/samples.py)."""
    m.meta["validation_source"] = {"kind": "model", "label": label, "n": len(m.validation_data)}
    return m


def _with_framework(name: str, build: Callable[[], Model]) -> Callable[[], Model]:
    """``build`` with a missing framework (a ``pip install '.[cpu]'`` has no Keras or torch)
    said as what to install, not as an import traceback."""
    def run() -> Model:
        try:
            return build()
        except ModuleNotFoundError as exc:
            from .errors import UnavailableError
            root = (exc.name or "").split(".")[0]
            extra = {"torch": "torch", "onnx": "cpu", "onnxruntime": "cpu"}.get(root, "keras")
            raise UnavailableError(
                f"zoo:{name} is built with {exc.name}, which is not installed: pip install "
                f"'hwbackends[{extra}]'; with the cpu extra alone every zoo model but the torch "
                f"ones (mlp_torch, lstm_torch) runs, as ONNX, and so does your own .onnx "
                f"model") from None
    return run


def get(name: str, *, deferred: bool = True) -> Model:
    """A zoo model by name (see the module docstring).

    After its first build a zoo model's fingerprint, specs and meta are kept in a memo beside
    the trained model (``<store>/zoo/NAME.model.json``, signed with the store key like the
    model, keyed by the code that builds and fingerprints it and the frameworks' versions);
    from then on ``get`` returns a :meth:`~hwbackends.models.Model.deferred` model that builds
    the framework object only when something uses it. A cached artifact of a zoo model is
    served without importing TensorFlow or torch (``hwb serve zoo:signal``: 0.83–0.93 s to
    start and stop instead of 7.4–10.5 s here, docs/performance.md). ``deferred=False``
    always builds."""
    try:
        build = _BUILDERS[name]
    except KeyError:
        raise ModelError(f"no zoo model {name!r}; available: "
                         f"{', '.join(NAMES + MULTI_IO_NAMES + STAC_NAMES + DEEPLOB_NAMES)}") from None
    build = _with_framework(name, build)
    if not deferred:
        return build()
    key = _memo_key(name)
    memo = _read_memo(name, key) if key else None
    if memo is None:
        m = build()
        key = key or _memo_key(name)  # the signal is keyed by its file: trained just now
        if key:
            _write_memo(name, key, m)
        return m
    from .specs import TensorSpec

    def load() -> Model:
        real = build()
        if real.fingerprint != memo["fingerprint"]:  # never trusted twice: the next get builds
            _zoo().evict(_memo_path(name).name)
        return real

    m = Model.deferred(load, memo["format"], [TensorSpec.from_dict(d) for d in memo["inputs"]],
                       [TensorSpec.from_dict(d) for d in memo["outputs"]], memo["fingerprint"],
                       name, source=Path(memo["source"]) if memo.get("source") else None,
                       meta=memo["meta"])
    if name == "signal":
        m.validation_data = _signal_validation()
    return m


def _signal_validation() -> np.ndarray:
    return orderbook_features(2048, seed=1)[0]


def _memo_path(name: str) -> Path:
    return _zoo_dir() / f"{name}.model.json"


def _code_files() -> list[Path]:
    """The sources that build and fingerprint a zoo model: this module, the specs and the
    model readers (``models``, a module beside ``legacy.py`` or a package: every file of it)."""
    from . import models, specs

    out = [Path(__file__), Path(specs.__file__)]
    m = Path(models.__file__)
    out += sorted(m.parent.rglob("*.py")) if m.name == "__init__.py" else [m, m.with_name("legacy.py")]
    return [p for p in out if p.is_file()]


def _memo_key(name: str) -> str | None:
    """What the memo of ``name`` is valid for: the code that builds and fingerprints it, the
    framework's version and, for the trained signal, the signed model file's bytes. ``None``
    when there is nothing to key it by yet (the signal not trained: building it trains it)."""
    from importlib import metadata

    h = hashlib.sha256()
    for f in _code_files():
        h.update(hashlib.sha256(f.read_bytes()).digest())
    for dist in ("keras", "tensorflow-cpu", "tensorflow", "torch"):  # whichever builds it
        try:
            h.update(f"{dist}={metadata.version(dist)};".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none;".encode())
    # the Keras build or its ONNX twin: another model (Keras may be installed but refused)
    h.update(f"numpy={np.__version__};{name};source={'keras' if keras_available() else 'onnx'}".encode())
    if name == "signal":
        path = _signal_file()
        try:
            entry = _zoo().read(path.name, touch=False)
            if entry is None:
                return None
            h.update(entry.record["files"][path.name].encode())  # the signed file's sha256
        except (OSError, HwbError):
            return None
    return h.hexdigest()


def _read_memo(name: str, key: str) -> dict[str, Any] | None:
    """The memo if it is ours (signed with this user's store key) and for ``key``; anything
    else (absent, unsigned, edited, for other code or another framework version, unreadable)
    is ``None``: the model is built, and the memo written again."""
    path = _memo_path(name)
    try:
        data = _zoo().read_bytes(path.name)
        if data is None:
            return None
        memo = json.loads(data)
    except (OSError, ValueError, HwbError) as exc:
        log.info("zoo memo %s not used (%s); building %s", path, exc, name)
        return None
    if not isinstance(memo, dict) or memo.get("key") != key:
        return None
    return memo


def _write_memo(name: str, key: str, m: Model) -> None:
    """Keep what a deferred ``m`` needs; a memo that cannot be written only costs later
    processes the build."""
    try:
        if json.loads(json.dumps(m.meta)) != m.meta:  # read back, it must be the same meta
            raise ValueError("its meta does not round-trip through JSON")
        memo = {"key": key, "format": m.format, "fingerprint": m.fingerprint,
                "inputs": [s.to_dict() for s in m.inputs],
                "outputs": [s.to_dict() for s in m.outputs],
                "source": str(m.source) if m.source else None, "meta": m.meta}
        _write_signed(_memo_path(name), json.dumps(memo, sort_keys=True).encode())
    except (OSError, TypeError, ValueError, HwbError) as exc:
        log.info("zoo memo for %s not written (%s)", name, exc)


def _write_signed(path: Path, data: bytes) -> None:
    """``data`` as the zoo file ``path``, signed (a reader sees the old pair or the new one,
    never half a file)."""
    _zoo().write_file(path.name, {}, data)


# "zoo:NAME" in load_model (and everywhere a model is named: CLI, strategies.toml).
register_source("zoo", get)
