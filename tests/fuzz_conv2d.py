"""Random 2-D convolutional models for the differential fuzz of cpu.native's Conv2D, 2-D
pooling and padding and Concatenate (tests/test_fuzz_conv2d.py).

A :class:`Spec2D` is a framework-neutral chain over a ``(rows, cols, channels)`` image: Conv2D
(kernel, stride, dilation, ``valid``/``same``/explicit padding, groups, an activation),
LeakyReLU, BatchNormalization with non-trivial statistics, zero padding, max/average pooling
(``valid``/``same``; torch's and ONNX's explicit padding with and without
``count_include_pad``), an inception block (branches from one tensor, concatenated on the
channels), and a head: Flatten → Dense, a global pooling → Dense, or the rows as a sequence
(``(rows, cols·channels)``) into an LSTM → Dense, DeepLOB's shape. :func:`specs` draws one
(Hypothesis), every layer fitting the shape before it; :func:`build` makes it a real model of
one front end — Keras (functional, channels-last), torch (an ``nn.Module`` over a
channels-first ``(channels, rows, cols)`` input) or ONNX (that module through
``torch.onnx.export``) — and :func:`reference` runs it in its own framework: the fuzz compares
against that, never against the IR.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

FRONTENDS = ("keras", "torch", "onnx")


@dataclass(frozen=True)
class Spec2D:
    frontend: str
    image: tuple[int, int, int]  # (rows, cols, channels)
    layers: tuple[tuple, ...]
    head: tuple
    seed: int = 0

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The model's own per-sample input shape (torch and ONNX take channels first)."""
        h, w, c = self.image
        return (h, w, c) if self.frontend == "keras" else (c, h, w)

    def describe(self) -> str:
        return f"{self.frontend} {self.image} " + " ".join(map(str, self.layers)) + f" {self.head}"


# -- the strategy -------------------------------------------------------------------------------
def _out(n: int, k: int, s: int, d: int, pad: Any) -> int:
    """Cells along one axis after a window ``k`` (stride ``s``, dilation ``d``); ``pad`` is
    'valid', 'same' (ceil(n / s)) or the cells added on each side."""
    if pad == "same":
        return -(-n // s)
    p = 0 if pad == "valid" else 2 * pad
    return (n + p - (k - 1) * d - 1) // s + 1


@st.composite
def _conv(draw: Any, shape: tuple[int, int, int], fe: str) -> tuple[tuple, tuple[int, int, int]] | None:
    h, w, c = shape
    kh, kw = draw(st.integers(1, min(4, h + 1))), draw(st.integers(1, min(4, w + 1)))
    dil = draw(st.sampled_from([(1, 1), (1, 1), (1, 1), (2, 1), (1, 2), (2, 2)]))
    stride = (1, 1) if dil != (1, 1) else draw(st.sampled_from([(1, 1), (1, 1), (1, 2), (2, 1), (2, 2), (3, 2)]))
    pads = ["valid", "same"] if fe == "keras" or stride == (1, 1) else ["valid"]
    if fe != "keras":
        pads.append(draw(st.integers(1, 2)))  # explicit, symmetric
    pad = draw(st.sampled_from(pads))
    if pad == "same" and fe == "onnx" and dil != (1, 1):
        pad = "valid"  # torch.onnx writes it as auto_pad SAME_UPPER, which ORT runs without dilation only
    groups = draw(st.sampled_from([1, 1, 1, c])) if c > 1 else 1
    filters = draw(st.integers(1, 6)) * groups if groups > 1 else draw(st.integers(1, 9))
    oh, ow = _out(h, kh, stride[0], dil[0], pad), _out(w, kw, stride[1], dil[1], pad)
    if fe == "keras" and c == 1 and stride[1] > 1 and ow == 1 and groups == 1:
        # TF 2.21's Keras Conv2D with oneDNN (its default on x86) answers 0 for every output
        # row but the first when one input channel gives one output column through a column
        # stride > 1 (this fuzz found it; right with TF_ENABLE_ONEDNN_OPTS=0): a reference
        # that is wrong compares nothing, so Keras is not drawn there (torch and ONNX are)
        return None
    if oh < 1 or ow < 1:
        return None
    act = draw(st.sampled_from(["linear", "linear", "relu", "tanh"]))
    return ("conv", filters, (kh, kw), stride, dil, pad, groups, act), (oh, ow, filters)


@st.composite
def _pool(draw: Any, shape: tuple[int, int, int], fe: str) -> tuple[tuple, tuple[int, int, int]] | None:
    h, w, c = shape
    kind = draw(st.sampled_from(["max", "avg"]))
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pads: list[Any] = ["valid", "same"] if fe == "keras" else ["valid", 1]
    pad = draw(st.sampled_from(pads))
    if isinstance(pad, int) and min(k) < 2:  # torch: padding at most half the kernel
        pad = "valid"
    count_pad = draw(st.booleans()) if kind == "avg" and isinstance(pad, int) else False
    oh, ow = _out(h, k[0], s[0], 1, pad), _out(w, k[1], s[1], 1, pad)
    if oh < 1 or ow < 1:
        return None
    return ("pool", kind, k, s, pad, count_pad), (oh, ow, c)


@st.composite
def _block(draw: Any, shape: tuple[int, int, int], fe: str, depth: int = 0
           ) -> tuple[tuple, tuple[int, int, int]] | None:
    kind = draw(st.sampled_from(["conv", "conv", "conv", "pool", "lrelu", "bn", "zpad"]
                                + (["inception"] if depth == 0 else [])))
    h, w, c = shape
    if kind == "conv":
        return draw(_conv(shape, fe))
    if kind == "pool":
        return draw(_pool(shape, fe))
    if kind == "lrelu":
        return ("lrelu", draw(st.sampled_from([0.01, 0.2]))), shape
    if kind == "bn":
        return ("bn",), shape
    if kind == "zpad":
        p = ((draw(st.integers(0, 2)), draw(st.integers(0, 2))), (draw(st.integers(0, 2)), draw(st.integers(0, 2))))
        return ("zpad", p), (h + p[0][0] + p[0][1], w + p[1][0] + p[1][1], c)
    # inception: 2-3 branches keeping rows and cols (stride-1 'same' convs and pools)
    branches, chans = [], 0
    for _ in range(draw(st.integers(2, 3))):
        br: list[tuple] = []
        bc = c
        for _ in range(draw(st.integers(0, 2))):
            if draw(st.booleans()):
                kh, kw = draw(st.sampled_from([(1, 1), (3, 1), (1, 3), (3, 3)]))
                bc = draw(st.integers(1, 6))
                br.append(("conv", bc, (kh, kw), (1, 1), (1, 1), "same", 1,
                           draw(st.sampled_from(["linear", "relu"]))))
            else:
                k = draw(st.sampled_from([(3, 1), (1, 3), (3, 3)]))
                br.append(("pool", "max", k, (1, 1), "same" if fe == "keras" else "same_odd", False))
        branches.append(tuple(br))
        chans += bc
    return ("inception", tuple(branches)), (h, w, chans)


@st.composite
def specs(draw: Any, frontend: str | None = None) -> Spec2D:
    fe = frontend or draw(st.sampled_from(FRONTENDS))
    shape = (draw(st.integers(2, 9)), draw(st.integers(2, 9)), draw(st.integers(1, 4)))
    image = shape
    layers = []
    for _ in range(draw(st.integers(1, 4))):
        got = draw(_block(shape, fe))
        if got is None:
            continue
        layer, shape = got
        layers.append(layer)
    if not any(lay[0] in ("conv", "inception") for lay in layers):
        got = draw(_conv(shape, fe))
        if got is not None:
            layers.append(got[0])
            shape = got[1]
    head_kind = draw(st.sampled_from(["flatten", "gpool", "lstm"]))
    head = (head_kind, draw(st.sampled_from(["avg", "max"])), draw(st.integers(1, 4)))
    return Spec2D(fe, image, tuple(layers), head, draw(st.integers(0, 2 ** 16)))


# -- Keras --------------------------------------------------------------------------------------
def _keras_layer(x: Any, lay: tuple, rng: np.random.Generator) -> Any:
    import keras

    L = keras.layers
    kind = lay[0]
    if kind == "conv":
        _, f, k, s, d, pad, groups, act = lay
        return L.Conv2D(f, k, strides=s, dilation_rate=d, padding=pad, groups=groups, activation=act)(x)
    if kind == "pool":
        _, pk, k, s, pad, _ = lay
        cls = L.MaxPooling2D if pk == "max" else L.AveragePooling2D
        return cls(k, strides=s, padding=pad)(x)
    if kind == "lrelu":
        return L.LeakyReLU(negative_slope=lay[1])(x)
    if kind == "zpad":
        return L.ZeroPadding2D(lay[1])(x)
    if kind == "bn":
        bn = L.BatchNormalization()
        y = bn(x)
        c = int(x.shape[-1])
        bn.set_weights([rng.uniform(0.5, 2.0, c), rng.uniform(-0.5, 0.5, c), rng.uniform(-1, 1, c),
                        rng.uniform(0.5, 2.0, c)])
        return y
    outs = []
    for br in lay[1]:
        y = x
        for sub in br:
            y = _keras_layer(y, sub, rng)
        outs.append(y)
    return L.Concatenate()(outs)


def _keras(spec: Spec2D) -> Any:
    import keras

    L = keras.layers
    keras.utils.set_random_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    x0 = keras.Input(spec.image)
    x = x0
    for lay in spec.layers:
        x = _keras_layer(x, lay, rng)
    kind, pool, units = spec.head
    if kind == "flatten":
        x = L.Flatten()(x)
    elif kind == "gpool":
        x = (L.GlobalAveragePooling2D() if pool == "avg" else L.GlobalMaxPooling2D())(x)
    else:
        h, w, c = (int(d) for d in x.shape[1:])
        x = L.LSTM(units)(L.Reshape((h, w * c))(x))
    return keras.Model(x0, L.Dense(units)(x))


# -- torch (and ONNX through torch.onnx) -------------------------------------------------------
def _torch_layers(lay: tuple, c: int, rng: np.random.Generator) -> tuple[Any, int]:
    """One spec layer as a torch module over (N, C, H, W), and its output channels."""
    import torch
    from torch import nn

    kind = lay[0]
    if kind == "conv":
        _, f, k, s, d, pad, groups, act = lay
        conv = nn.Conv2d(c, f, k, stride=s, dilation=d, padding=pad, groups=groups)
        acts = {"linear": [], "relu": [nn.ReLU()], "tanh": [nn.Tanh()]}[act]
        return nn.Sequential(conv, *acts), f
    if kind == "pool":
        _, pk, k, s, pad, count_pad = lay
        if pad == "same_odd":  # a stride-1 'same' window of odd size
            p = (k[0] // 2, k[1] // 2)
        else:
            p = 0 if pad == "valid" else pad
        if pk == "max":
            return nn.MaxPool2d(k, stride=s, padding=p), c
        return nn.AvgPool2d(k, stride=s, padding=p, count_include_pad=count_pad), c
    if kind == "lrelu":
        return nn.LeakyReLU(lay[1]), c
    if kind == "zpad":
        (t, b), (lft, r) = lay[1]
        return nn.ZeroPad2d((lft, r, t, b)), c
    if kind == "bn":
        bn = nn.BatchNorm2d(c).eval()
        with torch.no_grad():
            bn.running_mean.copy_(torch.from_numpy(rng.uniform(-1, 1, c).astype(np.float32)))
            bn.running_var.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, c).astype(np.float32)))
            bn.weight.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, c).astype(np.float32)))
            bn.bias.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, c).astype(np.float32)))
        return bn, c
    branches, total = [], 0
    for br in lay[1]:
        mods, bc = [], c
        for sub in br:
            m, bc = _torch_layers(sub, bc, rng)
            mods.append(m)
        branches.append(nn.Sequential(*mods))
        total += bc
    return _Inception(branches), total


def _inception_class() -> type:
    import torch
    from torch import nn

    class Inception(nn.Module):
        def __init__(self, branches: list) -> None:
            super().__init__()
            self.branches = nn.ModuleList(branches)

        def forward(self, x: Any) -> Any:
            return torch.cat([b(x) for b in self.branches], dim=1)

    return Inception


def _Inception(branches: list) -> Any:  # noqa: N802 (a class made on first use: torch is optional)
    return _inception_class()(branches)


def _torch(spec: Spec2D) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    h, w, c = spec.image
    mods = []
    for lay in spec.layers:
        m, c = _torch_layers(lay, c, rng)
        mods.append(m)
    body = nn.Sequential(*mods)
    with torch.no_grad():
        oh, ow = body(torch.zeros(1, spec.image[2], h, w)).shape[2:]
    kind, pool, units = spec.head

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = body
            if kind == "lstm":
                self.lstm = nn.LSTM(int(ow) * c, units, batch_first=True)
                self.fc = nn.Linear(units, units)
            else:
                self.fc = nn.Linear(c * (int(oh) * int(ow) if kind == "flatten" else 1), units)

        def forward(self, x: Any) -> Any:
            y = self.body(x)
            if kind == "flatten":
                return self.fc(y.flatten(1))
            if kind == "gpool":
                return self.fc(y.mean((2, 3)) if pool == "avg" else y.amax((2, 3)))
            seq = y.permute(0, 2, 3, 1).flatten(2)  # (N, rows, cols·channels), channels last
            out, _ = self.lstm(seq)
            return self.fc(out[:, -1])

    return Head().eval()


def _onnx(spec: Spec2D) -> Any:
    import io

    import onnx
    import torch

    m = _torch(spec)
    buf = io.BytesIO()
    torch.onnx.export(m, (torch.zeros(1, *spec.input_shape),), buf, dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    return onnx.load_from_string(buf.getvalue())


def build(spec: Spec2D) -> Any:
    return {"keras": _keras, "torch": _torch, "onnx": _onnx}[spec.frontend](spec)


def reference(obj: Any, spec: Spec2D, x: np.ndarray) -> np.ndarray:
    """The source framework's own output for ``x`` (float64 where it can: torch in double)."""
    if spec.frontend == "keras":
        return np.asarray(obj(x, training=False), np.float64)
    if spec.frontend == "torch":
        import copy

        import torch
        with torch.no_grad():
            return copy.deepcopy(obj).double()(torch.from_numpy(x).double()).numpy()
    import onnxruntime as ort
    sess = ort.InferenceSession(obj.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0].astype(np.float64)


def load(obj: Any, spec: Spec2D) -> Any:
    import hwbackends as hwb
    if spec.frontend == "torch":
        import torch
        return hwb.load_model(obj, example_input=torch.zeros(2, *spec.input_shape))
    return hwb.load_model(obj)
