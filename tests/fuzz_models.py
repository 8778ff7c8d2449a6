"""Random models for the differential fuzz of the layer IR (tests/test_fuzz_layer_ir.py).

A :class:`Spec` is a framework-neutral layer chain over a window ``(time, channels)`` or a
flat vector, drawn by :func:`specs` (Hypothesis) from the layers cpu.native claims
(``layer_ir.SUPPORTED`` / ``TORCH_OPS`` / ``ONNX_OPS``): Conv1D with every padding, stride
and dilation, pooling, BatchNormalization and activations anywhere (first included) with
non-trivial statistics, Flatten in both layouts (torch's channels-first too), global
pooling, LSTM/GRU with and without ``return_sequences``, stacked, and a Dense head. Each
builder turns a spec into a real model of one front end: Keras (``Sequential`` or
functional), torch (``nn.Sequential`` where the chain is one, else a module with its own
``forward`` over channels-first convolutions) or ONNX (written with ``onnx.helper``), and
:func:`reference` runs it in its own framework — the fuzz compares against that, never
against the IR.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

ACTS = ("relu", "leaky_relu", "tanh", "sigmoid", "softmax")
FRONTENDS = ("keras", "keras_functional", "torch", "onnx")


@dataclass(frozen=True)
class L:
    """One layer of a spec: ``kind`` and its parameters."""

    kind: str  # conv | pool | gpool | bn | act | rnn | flatten | dense
    p: tuple = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.p).get(key, default)


@dataclass(frozen=True)
class Spec:
    frontend: str
    input_shape: tuple[int, ...]
    layers: tuple[L, ...]
    seed: int = 0
    #: torch: flatten the channels-first tensor (its own layout) instead of transposing back
    channels_first_flatten: bool = False
    extra: dict = field(default_factory=dict, compare=False)

    def describe(self) -> str:
        return f"{self.frontend} {self.input_shape} " + " ".join(
            l.kind + ("(" + ",".join(f"{k}={v}" for k, v in l.p) + ")" if l.p else "") for l in self.layers)


def _layer(layer_kind: str, **p: Any) -> L:
    return L(layer_kind, tuple(sorted(p.items())))


# -- the strategy -------------------------------------------------------------------------------
@st.composite
def _act(draw: Any) -> L:
    kind = draw(st.sampled_from(ACTS))
    return _layer("act", kind=kind, alpha=draw(st.sampled_from([0.01, 0.2, 0.3])) if kind == "leaky_relu" else 0.0)


@st.composite
def _conv(draw: Any, t: int, frontend: str) -> tuple[L, int] | None:
    k = draw(st.integers(1, 4))
    dil = draw(st.sampled_from([1, 1, 2, 3]))
    stride = 1 if dil > 1 else draw(st.sampled_from([1, 1, 2, 3]))
    pads = ["valid", "same"] + (["causal"] if frontend.startswith("keras") else [])
    if frontend in ("torch", "onnx"):
        pads.append("sym")  # an explicit (left, right) = (p, p) padding
    pad = draw(st.sampled_from(pads))
    if pad == "same" and (stride != 1 or (frontend == "onnx" and (k - 1) * dil % 2)):
        pad = "valid"
    span = (k - 1) * dil
    p = draw(st.integers(1, 2)) if pad == "sym" else 0
    t_pad = t + {"valid": 0, "same": span, "causal": span, "sym": 2 * p}[pad]
    t_out = (t_pad - span - 1) // stride + 1
    if t_out < 1:
        return None
    act = draw(st.sampled_from(["linear", "linear", "relu", "tanh"]))
    filters = draw(st.integers(1, 6))
    return _layer("conv", filters=filters, k=k, stride=stride, dil=dil, pad=pad, sym=p, act=act), t_out


@st.composite
def specs(draw: Any, frontend: str | None = None) -> Spec:
    """A random model spec for ``frontend`` (drawn when None)."""
    fe = frontend or draw(st.sampled_from(FRONTENDS))
    window = draw(st.booleans())
    layers: list[L] = []
    if window:
        t, c = draw(st.integers(3, 10)), draw(st.integers(1, 5))
        shape: tuple[int, ...] = (t, c)
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(["conv", "conv", "pool", "bn", "act", "rnn"] if fe != "onnx"
                                        else ["conv", "conv", "pool", "act"]))
            if kind == "conv":
                got = draw(_conv(t, fe))
                if got is None:
                    continue
                layers.append(got[0])
                t = got[1]
            elif kind == "pool":
                size = draw(st.integers(1, 3))
                stride = draw(st.integers(1, 3))
                if size > t:
                    continue
                layers.append(_layer("pool", op=draw(st.sampled_from(["max", "avg"])), size=size, stride=stride))
                t = (t - size) // stride + 1
            elif kind == "bn":
                layers.append(_layer("bn"))
            elif kind == "act":
                layers.append(draw(_act()))
            else:
                cell = draw(st.sampled_from(["lstm", "gru"]))
                reset_after = draw(st.booleans()) if cell == "gru" and fe.startswith("keras") else True
                layers.append(_layer("rnn", cell=cell, units=draw(st.integers(1, 6)), seq=True,
                                     reset_after=reset_after))
        end = draw(st.sampled_from(["flatten", "gpool", "rnn"] if fe != "onnx" else ["flatten", "gpool"]))
        if end == "rnn":
            cell = draw(st.sampled_from(["lstm", "gru"]))
            reset_after = draw(st.booleans()) if cell == "gru" and fe.startswith("keras") else True
            layers.append(_layer("rnn", cell=cell, units=draw(st.integers(1, 6)), seq=False,
                                 reset_after=reset_after))
        else:
            layers.append(_layer("flatten") if end == "flatten" else
                          _layer("gpool", op=draw(st.sampled_from(["max", "avg"]))))
    else:
        shape = (draw(st.integers(1, 12)),)
        if fe == "torch" and draw(st.booleans()):  # nn.Sequential(Flatten, ...) over a window
            shape = (draw(st.integers(2, 6)), draw(st.integers(1, 4)))
            layers += [draw(_act())] if draw(st.booleans()) else []
            layers.append(_layer("flatten"))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["dense", "bn", "act"] if fe != "onnx" else ["dense", "act", "affine"]))
        layers.append(_layer("dense", units=draw(st.integers(1, 8)), act="linear") if kind == "dense"
                      else draw(_act()) if kind == "act" else _layer(kind))
    head = draw(st.sampled_from(["linear", "linear", "tanh", "sigmoid", "softmax"]))
    layers.append(_layer("dense", units=draw(st.integers(1, 4)), act=head))
    return Spec(fe, shape, tuple(layers), draw(st.integers(0, 2**16)),
                channels_first_flatten=draw(st.booleans()))


# -- Keras ------------------------------------------------------------------------------------
def _keras_layers(spec: Spec) -> list[Any]:
    import keras
    kl = keras.layers
    out: list[Any] = []
    for lay in spec.layers:
        g = lay.get
        if lay.kind == "conv":
            pad = {"sym": "valid"}.get(g("pad"), g("pad"))
            out.append(kl.Conv1D(g("filters"), g("k"), strides=g("stride"), padding=pad,
                                 dilation_rate=g("dil"), activation=None if g("act") == "linear" else g("act")))
        elif lay.kind == "pool":
            cls = kl.MaxPooling1D if g("op") == "max" else kl.AveragePooling1D
            out.append(cls(g("size"), strides=g("stride")))
        elif lay.kind == "gpool":
            out.append(kl.GlobalMaxPooling1D() if g("op") == "max" else kl.GlobalAveragePooling1D())
        elif lay.kind == "bn":
            out.append(kl.BatchNormalization())
        elif lay.kind == "act":
            kind = g("kind")
            out.append(kl.LeakyReLU(negative_slope=g("alpha")) if kind == "leaky_relu" else
                       kl.Softmax() if kind == "softmax" and spec.seed % 2 else
                       kl.ReLU() if kind == "relu" and spec.seed % 2 else kl.Activation(kind))
        elif lay.kind == "rnn":
            if g("cell") == "lstm":
                out.append(kl.LSTM(g("units"), return_sequences=g("seq")))
            else:
                out.append(kl.GRU(g("units"), return_sequences=g("seq"), reset_after=g("reset_after")))
        elif lay.kind == "flatten":
            out.append(kl.Flatten())
        elif lay.kind == "dense":
            out.append(kl.Dense(g("units"), activation=None if g("act") == "linear" else g("act")))
    return out


def build_keras(spec: Spec) -> Any:
    import keras
    keras.utils.set_random_seed(spec.seed)
    layers = _keras_layers(spec)
    if spec.frontend == "keras_functional":
        inp = keras.Input(spec.input_shape)
        y = inp
        for layer in layers:
            y = layer(y)
        km = keras.Model(inp, y)
    else:
        km = keras.Sequential([keras.Input(spec.input_shape), *layers])
    rng = np.random.default_rng(spec.seed)
    for layer in km.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.get_weights()[0].shape[0]
            layer.set_weights([rng.uniform(0.5, 2.0, n), rng.normal(0, 0.5, n),
                               rng.normal(0, 0.5, n), rng.uniform(0.2, 3.0, n)])
    return km


# -- torch ------------------------------------------------------------------------------------
def _torch_sequential_ok(spec: Spec) -> bool:
    """A chain nn.Sequential can hold: flat layers, after at most an activation and a Flatten."""
    seen_flat = len(spec.input_shape) == 1
    for lay in spec.layers:
        if lay.kind == "flatten":
            seen_flat = True
        elif lay.kind not in ("dense", "bn", "act") or (not seen_flat and lay.kind != "act"):
            return False
        elif not seen_flat and lay.get("kind") == "softmax":
            return False  # nn.Softmax(dim=-1) over the window: only the op walk (a module) says so
    return True


def build_torch(spec: Spec) -> Any:
    import torch
    from torch import nn
    torch.manual_seed(spec.seed)
    if _torch_sequential_ok(spec):
        return _torch_randomize(nn.Sequential(*_torch_flat_modules(spec)).eval(), spec.seed)
    return _torch_randomize(FuzzNet(spec).eval(), spec.seed)


def _torch_act(lay: L, dim: int) -> Any:
    from torch import nn
    kind = lay.get("kind") if lay.kind == "act" else lay.get("act")
    return {"relu": nn.ReLU(), "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid(), "linear": nn.Identity(),
            "softmax": nn.Softmax(dim=dim)}.get(kind) or nn.LeakyReLU(lay.get("alpha"))


def _torch_flat_modules(spec: Spec) -> list[Any]:
    from torch import nn
    mods: list[Any] = []
    n = int(np.prod(spec.input_shape)) if any(l.kind == "flatten" for l in spec.layers) else spec.input_shape[-1]
    for lay in spec.layers:
        if lay.kind == "flatten":
            mods.append(nn.Flatten())
        elif lay.kind == "act":
            mods.append(_torch_act(lay, -1))
        elif lay.kind == "bn":
            mods.append(nn.BatchNorm1d(n))
        elif lay.kind == "dense":
            mods.append(nn.Linear(n, lay.get("units")))
            n = lay.get("units")
            if lay.get("act") != "linear":
                mods.append(_torch_act(lay, -1))
    return mods


def _torch_randomize(m: Any, seed: int) -> Any:
    import torch
    from torch import nn
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm1d):
                k = mod.num_features
                mod.running_mean.copy_(torch.randn(k, generator=g) * 0.5)
                mod.running_var.copy_(torch.rand(k, generator=g) * 2.8 + 0.2)
                mod.weight.copy_(torch.rand(k, generator=g) * 1.5 + 0.5)
                mod.bias.copy_(torch.randn(k, generator=g) * 0.5)
    return m


try:  # the module class needs torch at import; the fuzz skips torch models without it
    from torch import nn as _nn
except ImportError:  # pragma: no cover
    _nn = None

if _nn is not None:
    class FuzzNet(_nn.Module):
        """A spec as a module with its own ``forward``: convolutions, pooling and batch norm
        channels-first (transposes around them), LSTM/GRU batch-first, the last step indexed."""

        def __init__(self, spec: Spec):
            super().__init__()
            self.ops: list[tuple[str, Any]] = []
            self.mods = _nn.ModuleList()
            t, c = spec.input_shape if len(spec.input_shape) == 2 else (0, spec.input_shape[0])
            cf = False  # the tensor is channels-first (N, C, T)
            for lay in spec.layers:
                g = lay.get
                need = {"conv": True, "pool": True, "bn": True, "gpool": True, "rnn": False,
                        "flatten": spec.channels_first_flatten}.get(lay.kind)
                if t and need is not None and need != cf:
                    self.ops.append(("transpose", None))
                    cf = need
                if lay.kind == "conv":
                    span = (g("k") - 1) * g("dil")
                    pad = {"same": "same", "valid": 0, "sym": g("sym")}[g("pad")]
                    self._add("mod", _nn.Conv1d(c, g("filters"), g("k"), stride=g("stride"),
                                                padding=pad, dilation=g("dil")))
                    if g("act") != "linear":
                        self._add("mod", _torch_act(lay, 1))
                    c = g("filters")
                    t = t if pad == "same" else (t + 2 * (pad or 0) - span - 1) // g("stride") + 1
                elif lay.kind == "pool":
                    cls = _nn.MaxPool1d if g("op") == "max" else _nn.AvgPool1d
                    self._add("mod", cls(g("size"), g("stride")))
                    t = (t - g("size")) // g("stride") + 1
                elif lay.kind == "gpool":
                    self.ops.append(("gmax" if g("op") == "max" else "gmean", None))
                    t = 0
                elif lay.kind == "bn":
                    self._add("mod", _nn.BatchNorm1d(c))
                elif lay.kind == "act":
                    self._add("mod", _torch_act(lay, 1 if cf and t else -1))
                elif lay.kind == "rnn":
                    cls = _nn.LSTM if g("cell") == "lstm" else _nn.GRU
                    self._add("rnn" if g("seq") else "rnn_last", cls(c, g("units"), batch_first=True))
                    c = g("units")
                    t = t if g("seq") else 0
                elif lay.kind == "flatten":
                    self.ops.append(("flatten", None))
                    c, t = c * max(t, 1), 0
                elif lay.kind == "dense":
                    self._add("mod", _nn.Linear(c, g("units")))
                    if g("act") != "linear":
                        self._add("mod", _torch_act(lay, -1))
                    c = g("units")

        def _add(self, op: str, mod: Any) -> None:
            self.ops.append((op, len(self.mods)))
            self.mods.append(mod)

        def forward(self, x: Any) -> Any:
            import torch
            for op, i in self.ops:
                if op == "transpose":
                    x = x.transpose(1, 2)
                elif op == "mod":
                    x = self.mods[i](x)
                elif op == "rnn":
                    x, _ = self.mods[i](x)
                elif op == "rnn_last":
                    x, _ = self.mods[i](x)
                    x = x[:, -1]
                elif op == "flatten":
                    x = torch.flatten(x, 1)
                elif op == "gmax":
                    x = x.amax(dim=2)
                elif op == "gmean":
                    x = x.mean(dim=2)
            return x
else:  # pragma: no cover
    FuzzNet = None  # type: ignore[assignment,misc]


# -- ONNX --------------------------------------------------------------------------------------
class _OnnxWriter:
    """A spec as ONNX nodes (opset 17): the (batch, time, channels) input transposed to
    channels-first for Conv/pooling, flattened in either layout, Gemm or MatMul+Add,
    per-channel Mul+Add (an affine), activations."""

    def __init__(self, spec: Spec):
        self.spec, self.rng = spec, np.random.default_rng(spec.seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.cur = "x"
        window = len(spec.input_shape) == 2
        self.t, self.c = spec.input_shape if window else (0, spec.input_shape[0])
        self.cf = False

    def new(self, op: str, ins: list[str], **attrs: Any) -> str:
        from onnx import helper
        out = f"{op.lower()}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        self.cur = out
        return out

    def const(self, a: Any) -> str:
        from onnx import numpy_helper
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(a, np.float32), name))
        return name

    def act(self, kind: str, alpha: float, axis: int) -> None:
        if kind == "leaky_relu":
            self.new("LeakyRelu", [self.cur], alpha=alpha)
        elif kind == "softmax":
            self.new("Softmax", [self.cur], axis=axis)
        elif kind != "linear":
            self.new({"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}[kind], [self.cur])

    def layout(self, lay: L) -> None:
        want = {"conv": True, "pool": True, "gpool": True, "flatten": self.spec.channels_first_flatten}.get(lay.kind)
        if self.t and want is not None and want != self.cf:
            self.new("Transpose", [self.cur], perm=[0, 2, 1])
            self.cf = want

    def layer(self, lay: L) -> None:
        g, rng, c = lay.get, self.rng, self.c
        self.layout(lay)
        if lay.kind == "conv":
            k, s, d = g("k"), g("stride"), g("dil")
            span = (k - 1) * d
            pads = {"valid": [0, 0], "same": [span // 2, span - span // 2], "sym": [g("sym")] * 2}[g("pad")]
            w = rng.normal(0, 1 / np.sqrt(k * c), (g("filters"), c, k))
            self.new("Conv", [self.cur, self.const(w), self.const(rng.normal(0, 0.1, g("filters")))],
                     kernel_shape=[k], strides=[s], dilations=[d], pads=pads)
            self.t, self.c = (self.t + sum(pads) - span - 1) // s + 1, g("filters")
            self.act(g("act"), 0.0, 1)
        elif lay.kind == "pool":
            self.new("MaxPool" if g("op") == "max" else "AveragePool", [self.cur],
                     kernel_shape=[g("size")], strides=[g("stride")])
            self.t = (self.t - g("size")) // g("stride") + 1
        elif lay.kind in ("gpool", "flatten"):
            if lay.kind == "gpool":
                self.new("GlobalMaxPool" if g("op") == "max" else "GlobalAveragePool", [self.cur])
            self.new("Flatten", [self.cur], axis=1)
            self.c, self.t = (c if lay.kind == "gpool" else c * max(self.t, 1)), 0
        elif lay.kind == "act":
            self.act(g("kind"), g("alpha"), 1 if self.cf and self.t else -1)
        elif lay.kind == "affine":
            self.new("Mul", [self.cur, self.const(rng.uniform(0.5, 2.0, c))])
            self.new("Add", [self.cur, self.const(rng.normal(0, 0.5, c))])
        elif lay.kind == "dense":
            w, b = rng.normal(0, 1 / np.sqrt(c), (c, g("units"))), rng.normal(0, 0.1, g("units"))
            if self.spec.seed % 2:
                self.new("Gemm", [self.cur, self.const(w), self.const(b)])
            else:
                self.new("Add", [self.new("MatMul", [self.cur, self.const(w)]), self.const(b)])
            self.c = g("units")
            self.act(g("act"), 0.0, -1)


def build_onnx(spec: Spec) -> Any:
    """The spec as an ONNX model (:class:`_OnnxWriter`), input ``x``, output ``y``."""
    from onnx import TensorProto, helper

    wr = _OnnxWriter(spec)
    for lay in spec.layers:
        wr.layer(lay)
    wr.nodes.append(helper.make_node("Identity", [wr.cur], ["y"], name="out"))
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", *spec.input_shape])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", wr.c])]
    graph = helper.make_graph(wr.nodes, "fuzz", ins, outs, wr.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# -- running a model in its own framework -------------------------------------------------------
def build(spec: Spec) -> Any:
    if spec.frontend.startswith("keras"):
        return build_keras(spec)
    return build_torch(spec) if spec.frontend == "torch" else build_onnx(spec)


def reference(obj: Any, spec: Spec, x: np.ndarray) -> np.ndarray:
    """The source framework's own output for ``x``."""
    if spec.frontend.startswith("keras"):
        return np.asarray(obj(x, training=False), np.float64)
    if spec.frontend == "torch":
        import torch
        with torch.no_grad():
            return obj(torch.from_numpy(x)).double().numpy()
    import onnxruntime as ort
    sess = ort.InferenceSession(obj.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0].astype(np.float64)


def reference64(obj: Any, spec: Spec, x: np.ndarray) -> np.ndarray:
    """The framework's output computed in float64 where the framework can (torch: a copy of
    the module in double), else :func:`reference`. The IR's reference runs in float64, so
    comparing it with a float32 framework measures the framework's rounding too: a deep
    torch stack (3 recurrent layers, 3 BatchNorms) rounds by 1.04e-5 of its output scale in
    float32 while the IR is within 7.5e-7 of its float64 run (make fuzz found it)."""
    if spec.frontend != "torch":
        return reference(obj, spec, x)
    import copy

    import torch
    with torch.no_grad():
        return copy.deepcopy(obj).double()(torch.from_numpy(x).double()).numpy()


def load(obj: Any, spec: Spec) -> Any:
    """``obj`` as the core's Model (what ``hwb.compile`` and ``layer_ir.extract`` take)."""
    import hwbackends as hwb
    if spec.frontend == "torch":
        import torch
        return hwb.load_model(obj, example_input=torch.zeros(2, *spec.input_shape))
    return hwb.load_model(obj)
