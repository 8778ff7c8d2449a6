"""Random models for the differential fuzz of the layer IR (tests/test_fuzz_layer_ir.py).

A :class:`Spec` is a framework-neutral layer chain over a window ``(time, channels)`` or a
flat vector, drawn by :func:`specs` (Hypothesis) from the layers cpu.native claims
(``layer_ir.SUPPORTED`` / ``TORCH_OPS`` / ``ONNX_OPS``): Conv1D with every padding, stride
and dilation (causal/left padding written as the front end writes it: Keras' ``causal`` or
``ZeroPadding1D``, torch's ``F.pad`` or ``Conv1d(padding)`` plus a slice, an ONNX ``Pad`` or
``Conv`` pads plus a ``Slice``), pooling, BatchNormalization, LayerNormalization and
activations (GELU too) anywhere (first included) with non-trivial statistics, Flatten in
both layouts (torch's channels-first too), global pooling, time slices (``x[:, -1]``,
``x[..., -1]``, ``x[:, a:b]``, an ONNX Gather/Slice), Dense per time step, LSTM/GRU with and
without ``return_sequences``, stacked (torch ``num_layers``), bidirectional (Keras
``Bidirectional``, torch ``bidirectional=True``, ONNX ``direction``), residual adds (TCN
blocks: conv → act → conv + skip; per-step and flat MLP blocks; ``x + attention(x)``),
self-attention (Keras ``MultiHeadAttention``, torch ``nn.MultiheadAttention``,
``F.scaled_dot_product_attention`` over per-head views, ``nn.TransformerEncoderLayer``),
and a Dense head. A residual is one layer of the chain holding its two branches
(``res``: ``body`` and ``shortcut``, each a tuple of layers), the IR's own form, so specs stay
chains. Each builder turns a spec into a real model of one front end: Keras (``Sequential``
where the chain is one, else functional), torch (``nn.Sequential`` where the chain is one,
else a module with its own ``forward`` over channels-first convolutions) or ONNX (written
with ``onnx.helper``), and :func:`reference` runs it in its own framework — the fuzz
compares against that, never against the IR.

``specs(frontend, family=F)`` puts layer family F (:data:`FAMILIES`) in every draw (the
fast run draws each family in each front end that has it); ``desk=False`` draws only the
first fuzz's layers (chains of Conv1D, pooling, BN, activations, LSTM/GRU, Dense).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

ACTS = ("relu", "leaky_relu", "tanh", "sigmoid", "softmax")
FRONTENDS = ("keras", "keras_functional", "torch", "onnx")
#: the desk layer families and the front ends that claim each
FAMILIES = {
    "zpad": FRONTENDS, "causal": FRONTENDS, "slice": FRONTENDS, "layernorm": FRONTENDS,
    "gelu": ("keras", "keras_functional", "torch"), "bidirectional": FRONTENDS,
    "stacked": FRONTENDS, "residual": FRONTENDS, "attention": ("keras", "keras_functional", "torch"),
    "step_dense": FRONTENDS,
}


@dataclass(frozen=True)
class L:
    """One layer of a spec: ``kind`` and its parameters (a ``res`` holds its branches as
    tuples of layers under ``body`` and ``short``)."""

    kind: str  # conv | pool | gpool | bn | ln | act | rnn | flatten | dense | tdense | slice | res | attn
    p: tuple = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.p).get(key, default)

    def describe(self) -> str:
        def fmt(v: Any) -> str:
            return "[" + " ".join(x.describe() for x in v) + "]" if isinstance(v, tuple) else str(v)
        return self.kind + ("(" + ",".join(f"{k}={fmt(v)}" for k, v in self.p) + ")" if self.p else "")


@dataclass(frozen=True)
class Spec:
    frontend: str
    input_shape: tuple[int, ...]
    layers: tuple[L, ...]
    seed: int = 0
    #: torch: flatten the channels-first tensor (its own layout) instead of transposing back
    channels_first_flatten: bool = False
    extra: dict = field(default_factory=dict, compare=False)
    #: torch/ONNX: the model takes its window channels-first, ``input_shape`` (channels,
    #: time), straight into its first Conv1d/pool/BatchNorm1d (no transpose before it)
    channels_first_input: bool = False

    def window(self) -> tuple[int, int]:
        """(time steps, channels) of the window the layers run over (0 steps: flat)."""
        if len(self.input_shape) == 1:
            return 0, self.input_shape[0]
        a, b = self.input_shape
        return (b, a) if self.channels_first_input else (a, b)

    def describe(self) -> str:
        cf = " channels-first" if self.channels_first_input else ""
        return f"{self.frontend} {self.input_shape}{cf} " + " ".join(lay.describe() for lay in self.layers)


def _layer(layer_kind: str, **p: Any) -> L:
    return L(layer_kind, tuple(sorted(p.items())))


def walk(layers: tuple[L, ...]) -> list[L]:
    """Every layer of ``layers``, those inside residual branches included."""
    out: list[L] = []
    for lay in layers:
        out.append(lay)
        if lay.kind == "res":
            out += walk(lay.get("body")) + walk(lay.get("short"))
    return out


def has_family(spec: Spec, family: str) -> bool:
    """Whether ``spec`` holds a layer of ``family`` (:data:`FAMILIES`)."""
    def one(lay: L) -> bool:
        g = lay.get
        return {"zpad": lay.kind == "conv" and g("pad") == "zpad",
                "causal": lay.kind == "conv" and g("pad") == "causal",
                "slice": lay.kind == "slice", "layernorm": lay.kind == "ln",
                "gelu": lay.kind == "act" and str(g("kind")).startswith("gelu"),
                "bidirectional": lay.kind == "rnn" and bool(g("bidir")),
                "stacked": lay.kind == "rnn" and (g("layers") or 1) > 1,
                "residual": lay.kind == "res", "attention": lay.kind == "attn",
                "step_dense": lay.kind == "tdense"}[family]
    every = walk(spec.layers)
    if family == "stacked" and spec.frontend != "torch":  # two recurrent layers in a row
        return any(a.kind == b.kind == "rnn" for a, b in zip(spec.layers, spec.layers[1:], strict=False))
    return any(one(lay) for lay in every)


def _chain_only(spec: Spec) -> bool:
    """No residual, slice or attention: a Keras ``Sequential`` can hold the spec."""
    return not any(lay.kind in ("res", "slice", "attn") for lay in walk(spec.layers))


# -- the strategy -------------------------------------------------------------------------------
#: the element-wise ops each front end writes as one layer/module/node: Keras has no
#: negation activation, torch's Softsign is abs/add/div nodes. ``exp`` is drawn as the exp of
#: a tanh (two layers): exp over the fuzz's unbounded values, twice, overflows to inf.
ELEMENTWISE = {
    "keras": ("elu", "selu", "softplus", "log_softmax", "relu6", "exp", "hard_sigmoid", "softsign", "prelu"),
    "torch": ("elu", "selu", "softplus", "log_softmax", "relu6", "exp", "neg", "hard_sigmoid", "prelu"),
    "onnx": ("elu", "selu", "softplus", "log_softmax", "relu6", "exp", "neg", "hard_sigmoid", "softsign",
             "prelu"),
}
ELEMENTWISE["keras_functional"] = ELEMENTWISE["keras"]


def _acts(fe: str, desk: bool) -> list[str]:
    gelu = ["gelu"] + (["gelu_tanh"] if fe == "torch" else [])
    return list(ACTS) + (gelu if desk and fe != "onnx" else []) + list(ELEMENTWISE[fe])


def _over_one(kind: Any) -> bool:
    """(log) softmax over one channel: a constant (ones, zeros), nothing left to normalise."""
    return kind in ("softmax", "log_softmax")


@st.composite
def _act(draw: Any, fe: str = "keras", desk: bool = False, kind: str | None = None) -> L:
    kind = kind or draw(st.sampled_from(_acts(fe, desk)))
    return _layer("act", kind=kind, alpha=draw(st.sampled_from([0.01, 0.2, 0.3])) if kind == "leaky_relu" else 0.0)


def _pads(frontend: str, desk: bool) -> list[str]:
    pads = ["valid", "same"] + (["causal"] if frontend.startswith("keras") or desk else [])
    if frontend in ("torch", "onnx"):
        pads.append("sym")  # an explicit (left, right) = (p, p) padding
    return pads + (["zpad"] if desk else [])


@st.composite
def _conv(draw: Any, t: int, frontend: str, desk: bool = False, pad: str | None = None,
          keep_t: bool = False, filters: int | None = None) -> tuple[L, int] | None:
    """A Conv1D over ``t`` steps and its output steps (None: it would leave none). ``zpad``
    is a zero padding layer (ZeroPadding1D, F.pad, ONNX Pad) of ``(zl, zr)`` before a valid
    conv; ``causal`` in torch/ONNX is the conv padded both sides and its right end sliced
    off. ``keep_t``: a stride-1 conv that keeps the steps (in a residual block)."""
    k = draw(st.integers(1, 4))
    dil = draw(st.sampled_from([1, 1, 2, 3]))
    stride = 1 if dil > 1 or keep_t else draw(st.sampled_from([1, 1, 2, 3]))
    pad = pad or draw(st.sampled_from(["same", "causal", "zpad"] if keep_t else _pads(frontend, desk)))
    span = (k - 1) * dil
    if pad == "same" and (stride != 1 or (frontend == "onnx" and span % 2)):
        pad = "causal" if keep_t else "valid"
    if pad == "causal" and not frontend.startswith("keras"):
        stride = 1  # the slice that makes it causal follows a stride-1 conv
    p = draw(st.integers(1, 2)) if pad == "sym" else 0
    zl, zr = (span, 0) if keep_t else (draw(st.integers(0, 3)), draw(st.integers(0, 2)))
    if pad != "zpad":
        zl = zr = 0
    t_pad = t + {"valid": 0, "same": span, "causal": span, "sym": 2 * p, "zpad": zl + zr}[pad]
    t_out = (t_pad - span - 1) // stride + 1
    if t_out < 1:
        return None
    act = draw(st.sampled_from(["linear", "linear", "relu", "tanh"]))
    filters = filters or draw(st.integers(1, 6))
    return _layer("conv", filters=filters, k=k, stride=stride, dil=dil, pad=pad, sym=p, act=act,
                  **({"zl": zl, "zr": zr} if pad == "zpad" else {})), t_out


@st.composite
def _rnn(draw: Any, fe: str, desk: bool, seq: bool, bidir: bool | None = None,
         layers: int | None = None) -> L:
    """An LSTM/GRU; desk: bidirectional, torch's ``num_layers`` and ``batch_first``, how the
    last step is read (torch ``out[:, -1]`` or ``h_n[-1]``; ONNX ``Y_h`` or a Gather of ``Y``),
    ONNX's ``layout`` and GRU ``linear_before_reset``."""
    cell = draw(st.sampled_from(["lstm", "gru"]))
    reset_after = draw(st.booleans()) if cell == "gru" and (fe.startswith("keras") or fe == "onnx") else True
    p: dict[str, Any] = {"cell": cell, "units": draw(st.integers(1, 6)), "seq": seq, "reset_after": reset_after}
    if desk:
        p["bidir"] = draw(st.booleans()) if bidir is None else bidir
        if fe == "torch":
            p["layers"] = layers or draw(st.sampled_from([1, 1, 2, 3]))
            p["batch_first"] = draw(st.booleans())
        if not seq:
            p["last"] = "out" if p["bidir"] else draw(st.sampled_from(["out", "state"]))
    return _layer("rnn", **p)


def _divisors(c: int) -> list[int]:
    return [h for h in (1, 2, 3, 4) if c % h == 0]


@st.composite
def _attn(draw: Any, fe: str, c: int) -> L:
    """Self-attention over the window, output channels ``c`` (its input's); ``causal``: each
    step attends steps up to itself (Keras ``use_causal_mask=True``; torch ``is_causal=True``,
    with the square subsequent mask where ``nn.MultiheadAttention`` wants one)."""
    causal = draw(st.booleans())
    if fe.startswith("keras"):
        return _layer("attn", form="mha", heads=draw(st.integers(1, 3)), kd=draw(st.integers(1, 4)),
                      causal=causal)
    form = draw(st.sampled_from(["mha", "sdpa", "encoder"]))
    if form == "sdpa":
        return _layer("attn", form=form, heads=draw(st.integers(1, 3)), kd=draw(st.integers(1, 4)),
                      causal=causal)
    p: dict[str, Any] = {"form": form, "heads": draw(st.sampled_from(_divisors(c))), "causal": causal}
    if form == "mha":
        p["weights"] = draw(st.booleans())  # need_weights: torch computes the averaged weights
    else:
        p.update(norm_first=draw(st.booleans()), ff_act=draw(st.sampled_from(["relu", "gelu"])))
    return _layer("attn", **p)


@st.composite
def _residual(draw: Any, fe: str, t: int, c: int, flat: bool = False, ln_ok: bool = False) -> L:
    """A residual block keeping the shape (``t`` steps, ``c`` channels): a TCN block (conv →
    act → [conv] + skip, the skip a 1x1 conv where the channels change), a per-step MLP, an
    attention (``x + attn(x)``, pre-norm or not); over a flat vector a Dense MLP."""
    act = draw(_act(fe, True, draw(st.sampled_from(["relu", "tanh"] + (["gelu"] if fe != "onnx" else [])))))
    if flat:
        return _layer("res", body=(_layer("dense", units=draw(st.integers(1, 8)), act="linear"), act,
                                   _layer("dense", units=c, act="linear")), short=())
    kinds = ["tcn", "tcn", "mlp"] + (["attn"] if fe != "onnx" else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "mlp":
        body: tuple[L, ...] = (_layer("tdense", units=draw(st.integers(1, 8)), act="linear"), act,
                               _layer("tdense", units=c, act="linear"))
        return _layer("res", body=body, short=())
    if kind == "attn":
        a = draw(_attn(fe, c).filter(lambda lay: lay.get("form") != "encoder"))
        return _layer("res", body=((_layer("ln"), a) if ln_ok and draw(st.booleans()) else (a,)), short=())
    two = draw(st.booleans())
    out_c = draw(st.integers(1, 6))
    first = draw(_conv(t, fe, True, keep_t=True, filters=out_c if not two else None))[0]
    body = (first, act)
    if two:
        body += (draw(_conv(t, fe, True, keep_t=True, filters=out_c))[0],)
    if draw(st.booleans()) and fe != "onnx":
        body += (_layer("bn"),)
    short = (_layer("conv", filters=out_c, k=1, stride=1, dil=1, pad="valid", sym=0, act="linear"),) \
        if out_c != c or draw(st.booleans()) else ()
    return _layer("res", body=body, short=short)


_END = ("flatten", "gpool", "rnn", "slice")
#: the window layer kind each family forces
_FORCED = {"zpad": "conv", "causal": "conv", "layernorm": "ln", "gelu": "act", "stacked": "stacked",
           "residual": "res", "attention": "attn", "step_dense": "tdense", "bidirectional": "rnn",
           "slice": "slice"}


@dataclass
class _Window:
    """The drawn window's state: ``t`` steps of ``c`` channels; ``narrow``: the fewest
    channels any layer so far left (a layer norm over features that are functions of one
    or two values is ill-conditioned: float32 rounding, not the compiler, then decides
    the 1e-5 bound — the long run met one at 1.07e-5, a LayerNorm over a rank-1 input)."""

    t: int
    c: int
    narrow: int = 0

    def __post_init__(self) -> None:
        self.narrow = self.narrow or self.c

    def after_rnn(self, lay: L) -> L:
        self.c = lay.get("units") * (2 if lay.get("bidir") else 1)
        return lay


def _window_layer(draw: Any, kind: str, w: _Window, fe: str, desk: bool, family: str | None) -> list[L]:
    """The layers of one drawn window ``kind`` (``family`` when it is the forced one)."""
    if kind == "stacked":  # torch: num_layers; Keras/ONNX: two layers (nodes)
        out = [w.after_rnn(draw(_rnn(fe, desk, True, layers=draw(st.integers(2, 3)))))]
        return out + ([w.after_rnn(draw(_rnn(fe, desk, True)))] if fe != "torch" else [])
    if kind == "conv":
        got = draw(_conv(w.t, fe, desk, pad=family if family in ("zpad", "causal") else None))
        if got is None:
            return []
        w.t, w.c = got[1], got[0].get("filters")
        return [got[0]]
    if kind == "pool":
        size, stride = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        if size > w.t:
            return []
        w.t = (w.t - size) // stride + 1
        return [_layer("pool", op=draw(st.sampled_from(["max", "avg"])), size=size, stride=stride)]
    if kind == "ln":
        return [_layer("ln")] if w.narrow >= 3 else []  # see _Window
    if kind == "tdense":
        w.c = draw(st.integers(1, 8))
        return [_layer("tdense", units=w.c, act=draw(st.sampled_from(["linear", "relu", "tanh"])))]
    if kind == "bn":
        return [_layer("bn")]
    if kind == "act":
        act = draw(_act(fe, desk, "gelu" if family == "gelu" else None))
        w.narrow = 0 if _over_one(act.get("kind")) and w.c == 1 else w.narrow  # all ones
        return [act]
    if kind == "rnn":
        return [w.after_rnn(draw(_rnn(fe, desk, True, bidir=True if family == "bidirectional" else None)))]
    if kind == "res":
        res = draw(_residual(fe, w.t, w.c, ln_ok=w.narrow >= 3))
        w.c = w.c if res.get("short") == () else res.get("short")[0].get("filters")
        return [res]
    if kind == "attn":
        return [draw(_attn(fe, w.c))]
    if kind == "slice" and w.t > 1:
        a = draw(st.integers(0, w.t - 1))
        b = draw(st.integers(a + 1, w.t))
        w.t = b - a
        return [_layer("slice", start=a, stop=b, keep=True)]
    return []


def _window_end(draw: Any, fe: str, desk: bool, w: _Window) -> L:
    end = draw(st.sampled_from(_END if desk else ("flatten", "gpool", "rnn") if fe != "onnx"
                               else ("flatten", "gpool")))
    if end == "rnn":
        return w.after_rnn(draw(_rnn(fe, desk, False)))
    if end == "slice":  # one step, the time axis dropped
        return _layer("slice", start=draw(st.sampled_from([-1, w.t - 1, 0, w.t // 2])), keep=False)
    return _layer("flatten") if end == "flatten" else _layer("gpool", op=draw(st.sampled_from(["max", "avg"])))


def _flat_layers(draw: Any, fe: str, desk: bool, family: str | None, width: int, narrow: int) -> list[L]:
    """Dense/BN/activation (ONNX: a per-channel affine) and, desk, layer norms and residual
    MLP blocks over a flat vector of ``width`` features."""
    kinds = ["dense", "bn", "act"] if fe != "onnx" else ["dense", "act", "affine"]
    kinds += ["ln", "res"] if desk else []
    n = draw(st.integers(0, 3))
    forced = {"layernorm": "ln", "gelu": "act"}.get(family or "")
    at = (0 if forced == "ln" else draw(st.integers(0, n))) if forced else -1
    out: list[L] = []
    for i in range(n + (1 if forced else 0)):
        kind = forced if i == at else draw(st.sampled_from(kinds))
        if kind == "ln" and narrow < 3:  # see _Window
            continue
        if kind == "dense":
            width = draw(st.integers(1, 8))
            narrow = min(narrow, width)
            out.append(_layer("dense", units=width, act="linear"))
        elif kind == "act":
            out.append(draw(_act(fe, desk, "gelu" if i == at else None)))
            narrow = 0 if _over_one(out[-1].get("kind")) and width == 1 else narrow
        elif kind == "res":
            out.append(draw(_residual(fe, 0, width, flat=True)))
        else:
            out.append(_layer(kind))
    return out


@st.composite
def specs(draw: Any, frontend: str | None = None, *, family: str | None = None, desk: bool = True) -> Spec:
    """A random model spec for ``frontend`` (drawn when None); ``family`` (:data:`FAMILIES`)
    is put in it; ``desk=False`` leaves out the desk layers (see the module doc)."""
    fe = frontend or draw(st.sampled_from(FRONTENDS if family is None else FAMILIES[family]))
    if family is not None:
        assert fe in FAMILIES[family], (family, fe)
        desk = True
    window = True if family not in (None, "layernorm", "gelu") else draw(st.booleans())
    layers: list[L] = []
    if window:
        w = _Window(draw(st.integers(3, 10)), draw(st.integers(3 if family == "layernorm" else 1, 5)))
        shape: tuple[int, ...] = (w.t, w.c)
        kinds = ["conv", "conv", "pool", "bn", "act", "rnn"] if fe != "onnx" else ["conv", "conv", "pool", "act"]
        if desk:
            kinds += ["ln", "tdense", "res", "slice"] + (["rnn"] if fe == "onnx" else ["attn"])
        n = draw(st.integers(0, 4))
        forced = _FORCED.get(family or "")
        at = (0 if forced == "ln" else draw(st.integers(0, n))) if forced else -1
        for i in range(n + (1 if forced else 0)):
            kind = forced if i == at else draw(st.sampled_from(kinds))
            layers += _window_layer(draw, kind, w, fe, desk, family if i == at else None)
            w.narrow = min(w.narrow, w.c)
        layers.append(_window_end(draw, fe, desk, w))
        narrow = min(w.narrow, w.c)
    else:
        shape = (draw(st.integers(3 if family == "layernorm" else 1, 12)),)
        narrow = shape[0]
        if fe == "torch" and family != "layernorm" and draw(st.booleans()):  # nn.Sequential(Flatten, …)
            shape = (draw(st.integers(2, 6)), draw(st.integers(1, 4)))
            layers += [draw(_act(fe, desk))] if draw(st.booleans()) else []
            layers.append(_layer("flatten"))
            # a softmax over one channel is all ones: nothing left for a layer norm
            narrow = 0 if _over_one(layers[0].get("kind")) and shape[1] == 1 else int(np.prod(shape))
    width = _flat_width(shape, layers)
    layers += _flat_layers(draw, fe, desk, family if not window else None, width, min(narrow, width))
    head = draw(st.sampled_from(["linear", "linear", "tanh", "sigmoid", "softmax"]))
    layers.append(_layer("dense", units=draw(st.integers(1, 4)), act=head))
    cf_in = (fe in ("torch", "onnx") and len(shape) == 2 and layers[0].kind in ("conv", "pool", "bn")
             and draw(st.booleans()))
    return Spec(fe, shape[::-1] if cf_in else shape, tuple(layers), draw(st.integers(0, 2**16)),
                channels_first_flatten=draw(st.booleans()), channels_first_input=cf_in)


def _flat_width(shape: tuple[int, ...], layers: list[L]) -> int:
    """The features of the flat vector after ``layers`` (the window's end) over ``shape``."""
    if not layers:
        return shape[-1]
    t, c = shape if len(shape) == 2 else (0, shape[0])
    for lay in layers:
        g = lay.get
        if lay.kind == "conv":
            span = (g("k") - 1) * g("dil")
            t_pad = t + {"valid": 0, "same": span, "causal": span, "sym": 2 * g("sym"),
                         "zpad": (g("zl") or 0) + (g("zr") or 0)}[g("pad")]
            t, c = (t_pad - span - 1) // g("stride") + 1, g("filters")
        elif lay.kind == "pool":
            t = (t - g("size")) // g("stride") + 1
        elif lay.kind == "rnn":
            c = g("units") * (2 if g("bidir") else 1)
            t = t if g("seq") else 0
        elif lay.kind in ("tdense", "dense"):
            c = g("units")
        elif lay.kind == "res" and g("short"):
            c = g("short")[0].get("filters")
        elif lay.kind == "slice":
            t = g("stop") - g("start") if g("keep") else 0
        elif lay.kind == "gpool":
            t = 0
        elif lay.kind == "flatten":
            c, t = c * max(t, 1), 0
    return c


# -- Keras ------------------------------------------------------------------------------------
def _keras_one(spec: Spec, lay: L) -> list[Any]:
    """The Keras layers of one chain layer (not ``res``/``slice``/``attn``)."""
    import keras
    kl = keras.layers
    g = lay.get
    if lay.kind == "conv":
        pad = {"sym": "valid", "zpad": "valid"}.get(g("pad"), g("pad"))
        conv = kl.Conv1D(g("filters"), g("k"), strides=g("stride"), padding=pad,
                         dilation_rate=g("dil"), activation=None if g("act") == "linear" else g("act"))
        return ([kl.ZeroPadding1D((g("zl"), g("zr")))] if g("pad") == "zpad" else []) + [conv]
    if lay.kind == "pool":
        cls = kl.MaxPooling1D if g("op") == "max" else kl.AveragePooling1D
        return [cls(g("size"), strides=g("stride"))]
    if lay.kind == "gpool":
        return [kl.GlobalMaxPooling1D() if g("op") == "max" else kl.GlobalAveragePooling1D()]
    if lay.kind == "bn":
        return [kl.BatchNormalization()]
    if lay.kind == "ln":
        return [kl.LayerNormalization(epsilon=[1e-3, 1e-5][spec.seed % 2])]
    if lay.kind == "act":
        kind = g("kind")
        return [kl.LeakyReLU(negative_slope=g("alpha")) if kind == "leaky_relu" else
                kl.Softmax() if kind == "softmax" and spec.seed % 2 else
                kl.ReLU() if kind == "relu" and spec.seed % 2 else
                kl.PReLU() if kind == "prelu" else
                kl.ELU(alpha=0.7) if kind == "elu" and spec.seed % 2 else
                kl.ReLU(max_value=6.0) if kind == "relu6" and spec.seed % 2 else
                kl.Activation({"exp": "exponential"}.get(kind, kind))] if kind != "exp" else \
            [kl.Activation("tanh"), kl.Activation("exponential")]
    if lay.kind == "rnn":
        if g("cell") == "lstm":
            rnn = kl.LSTM(g("units"), return_sequences=g("seq"))
        else:
            rnn = kl.GRU(g("units"), return_sequences=g("seq"), reset_after=g("reset_after"))
        return [kl.Bidirectional(rnn) if g("bidir") else rnn]
    if lay.kind == "flatten":
        return [kl.Flatten()]
    if lay.kind in ("dense", "tdense"):
        return [kl.Dense(g("units"), activation=None if g("act") == "linear" else g("act"))]
    raise ValueError(f"no Keras layer for {lay.kind}")


def _keras_layers(spec: Spec) -> list[Any]:
    return [k for lay in spec.layers for k in _keras_one(spec, lay)]


def _keras_apply(spec: Spec, layers: tuple[L, ...], y: Any) -> Any:
    """``layers`` applied to the Keras tensor ``y`` (functional): residual adds, slices of
    time, self-attention."""
    import keras
    kl = keras.layers
    for lay in layers:
        g = lay.get
        if lay.kind == "res":
            y = kl.Add()([_keras_apply(spec, g("body"), y), _keras_apply(spec, g("short"), y)])
        elif lay.kind == "slice":
            y = y[:, g("start"):g("stop")] if g("keep") else y[:, g("start")]
        elif lay.kind == "attn":
            y = kl.MultiHeadAttention(g("heads"), g("kd"))(y, y, use_causal_mask=bool(g("causal")))
        else:
            for layer in _keras_one(spec, lay):
                y = layer(y)
    return y


def build_keras(spec: Spec) -> Any:
    import keras
    keras.utils.set_random_seed(spec.seed)
    if spec.frontend == "keras_functional" or not _chain_only(spec):
        inp = keras.Input(spec.input_shape)
        km = keras.Model(inp, _keras_apply(spec, spec.layers, inp))
    else:
        km = keras.Sequential([keras.Input(spec.input_shape), *_keras_layers(spec)])
    rng = np.random.default_rng(spec.seed)
    for layer in km.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.get_weights()[0].shape[0]
            layer.set_weights([rng.uniform(0.5, 2.0, n), rng.normal(0, 0.5, n),
                               rng.normal(0, 0.5, n), rng.uniform(0.2, 3.0, n)])
        elif isinstance(layer, keras.layers.LayerNormalization):
            n = layer.get_weights()[0].shape[0]
            layer.set_weights([rng.uniform(0.5, 2.0, n), rng.normal(0, 0.5, n)])
        elif isinstance(layer, keras.layers.PReLU):  # zeros at init; one slope per channel
            a = layer.get_weights()[0]
            layer.set_weights([np.broadcast_to(rng.uniform(-0.5, 0.9, a.shape[-1]), a.shape)])
        elif isinstance(layer, keras.layers.MultiHeadAttention):  # biases are zeros at init
            layer.set_weights([w + rng.normal(0, 0.3, w.shape) if w.ndim < 3 else w
                               for w in layer.get_weights()])
    return km


# -- torch ------------------------------------------------------------------------------------
def _torch_sequential_ok(spec: Spec) -> bool:
    """A chain nn.Sequential can hold: flat layers, after at most an activation and a Flatten."""
    seen_flat = len(spec.input_shape) == 1
    for lay in spec.layers:
        if lay.kind == "flatten":
            seen_flat = True
        elif lay.kind not in ("dense", "bn", "act", "ln") or (not seen_flat and lay.kind != "act"):
            return False
        elif not seen_flat and _over_one(lay.get("kind")):
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
    if kind == "exp":
        return nn.Sequential(nn.Tanh(), _Elementwise(kind))
    if kind == "neg":
        return _Elementwise(kind)
    return {"relu": nn.ReLU(), "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid(), "linear": nn.Identity(),
            "softmax": nn.Softmax(dim=dim), "gelu": nn.GELU(),
            "gelu_tanh": nn.GELU(approximate="tanh"), "elu": nn.ELU(0.7), "selu": nn.SELU(),
            "softplus": nn.Softplus(), "log_softmax": nn.LogSoftmax(dim=dim), "relu6": nn.ReLU6(),
            "hard_sigmoid": nn.Hardsigmoid(),
            "prelu": nn.PReLU(1, 0.25)}.get(kind) or nn.LeakyReLU(lay.get("alpha"))


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
        elif lay.kind == "ln":
            mods.append(nn.LayerNorm(n, eps=[1e-5, 1e-3][spec.seed % 2]))
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
            elif isinstance(mod, nn.LayerNorm):
                k = mod.normalized_shape[0]
                mod.weight.copy_(torch.rand(k, generator=g) * 1.5 + 0.5)
                mod.bias.copy_(torch.randn(k, generator=g) * 0.5)
            elif isinstance(mod, nn.MultiheadAttention):  # its biases are zeros at init
                mod.in_proj_bias.copy_(torch.randn(mod.in_proj_bias.shape, generator=g) * 0.3)
                mod.out_proj.bias.copy_(torch.randn(mod.out_proj.bias.shape, generator=g) * 0.3)
    return m


try:  # the module classes need torch at import; the fuzz skips torch models without it
    from torch import nn as _nn
except ImportError:  # pragma: no cover
    _nn = None

#: which layout (channels-first?) each kind wants in torch/ONNX; None: either
_CF_NEED = {"conv": True, "pool": True, "bn": True, "gpool": True, "rnn": False, "ln": False,
            "tdense": False, "attn": False}


def _need(lay: L, cff: bool) -> bool | None:
    if lay.kind == "res":
        return next((n for n in (_need(x, cff) for x in lay.get("body")) if n is not None), None)
    return cff if lay.kind == "flatten" else _CF_NEED.get(lay.kind)


if _nn is not None:
    class _Elementwise(_nn.Module):
        """``torch.exp`` / ``torch.neg`` as a module (torch has none)."""

        def __init__(self, fn: str) -> None:
            super().__init__()
            self.fn = fn

        def extra_repr(self) -> str:  # the torch fingerprint is repr + weights
            return self.fn

        def forward(self, x: Any) -> Any:
            import torch
            return getattr(torch, self.fn)(x)

    class _Attention(_nn.Module):
        """Self-attention over a channels-last (batch, time, c) tensor, one of torch's ways:
        ``nn.MultiheadAttention`` (``need_weights`` either way), ``F.scaled_dot_product_attention``
        over per-head views of three Linears and an output Linear, or an eval-mode
        ``nn.TransformerEncoderLayer`` (a whole block: residuals, norms, feed-forward)."""

        def __init__(self, lay: L, t: int, c: int) -> None:
            super().__init__()
            g = lay.get
            self.form, self.t, self.heads = g("form"), t, g("heads")
            self.weights, self.causal = bool(g("weights")), bool(g("causal"))
            # nn.MultiheadAttention's is_causal is a hint that needs the mask itself
            self.register_buffer("mask", _nn.Transformer.generate_square_subsequent_mask(t))
            if self.form == "mha":
                self.mha = _nn.MultiheadAttention(c, self.heads, batch_first=True)
            elif self.form == "sdpa":
                self.d = g("kd")
                hd = self.heads * self.d
                self.q, self.k, self.v, self.o = (_nn.Linear(c, hd), _nn.Linear(c, hd), _nn.Linear(c, hd),
                                                  _nn.Linear(hd, c))
            else:
                self.enc = _nn.TransformerEncoderLayer(c, self.heads, 2 * c, dropout=0.0, batch_first=True,
                                                       norm_first=bool(g("norm_first")),
                                                       activation=g("ff_act"))

        def forward(self, x: Any) -> Any:
            import torch.nn.functional as F  # noqa: N812
            mask = self.mask if self.causal else None
            if self.form == "mha":
                return self.mha(x, x, x, need_weights=self.weights, attn_mask=mask,
                                is_causal=self.causal)[0]
            if self.form == "encoder":
                return self.enc(x, src_mask=mask, is_causal=self.causal)

            def split(y: Any) -> Any:
                return y.view(y.shape[0], self.t, self.heads, self.d).transpose(1, 2)

            o = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)),
                                               is_causal=self.causal)
            return self.o(o.transpose(1, 2).reshape(x.shape[0], self.t, self.heads * self.d))

    class _Recurrent(_nn.Module):
        """An nn.LSTM/GRU (``num_layers``, ``bidirectional``, batch-first or not) over a
        channels-last window; the sequence, or its last step as ``out[:, -1]`` or ``h_n[-1]``."""

        def __init__(self, lay: L, c: int) -> None:
            super().__init__()
            g = lay.get
            cls = _nn.LSTM if g("cell") == "lstm" else _nn.GRU
            self.batch_first = g("batch_first") is not False
            self.seq, self.last = g("seq"), g("last") or "out"
            self.rnn = cls(c, g("units"), num_layers=g("layers") or 1, bidirectional=bool(g("bidir")),
                           batch_first=self.batch_first)

        def forward(self, x: Any) -> Any:
            y, h = self.rnn(x if self.batch_first else x.transpose(0, 1))
            if not self.seq and self.last == "state":
                return (h[0] if isinstance(h, tuple) else h)[-1]
            y = y if self.batch_first else y.transpose(0, 1)
            return y if self.seq else y[:, -1]

    class FuzzNet(_nn.Module):
        """A spec as a module with its own ``forward``: convolutions, pooling and batch norm
        channels-first (transposes around them), LSTM/GRU, layer norms, per-step Linears and
        attention channels-last, residual blocks as ``body(x) + shortcut(x)`` in one layout."""

        def __init__(self, spec: Spec):
            super().__init__()
            self.spec = spec
            self.mods = _nn.ModuleList()
            t, c = spec.window()
            self.ops, *_ = self._plan(spec.layers, t, c, spec.channels_first_input)

        def _add(self, ops: list, op: str, mod: Any) -> None:
            ops.append((op, len(self.mods)))
            self.mods.append(mod)

        def _conv(self, ops: list, lay: L, t: int, c: int) -> tuple[int, int]:
            """A Conv1d (after an ``F.pad``; causal: padded both sides, the right end cut)."""
            g = lay.get
            span = (g("k") - 1) * g("dil")
            pad = {"same": "same", "valid": 0, "sym": g("sym"), "zpad": 0, "causal": span}[g("pad")]
            if g("pad") == "zpad":
                ops.append(("pad", (g("zl"), g("zr"))))
            self._add(ops, "mod", _nn.Conv1d(c, g("filters"), g("k"), stride=g("stride"),
                                             padding=pad, dilation=g("dil")))
            if g("pad") == "causal" and span:
                ops.append(("cut", span))
            if g("act") != "linear":
                self._add(ops, "mod", _torch_act(lay, 1))
            t_pad = t + {"same": span, "causal": span, "valid": 0, "sym": 2 * g("sym"),
                         "zpad": (g("zl") or 0) + (g("zr") or 0)}[g("pad")]
            return (t_pad - span - 1) // g("stride") + 1, g("filters")

        def _res(self, ops: list, lay: L, t: int, c: int, cf: bool) -> tuple[int, int]:
            """``body(x) + shortcut(x)``, each branch back in the layout it started in."""
            body, tb, cb, cfb = self._plan(lay.get("body"), t, c, cf)
            short, _, _, cfs = self._plan(lay.get("short"), t, c, cf)
            body += [("transpose", None)] if cfb != cf else []
            short += [("transpose", None)] if cfs != cf else []
            ops.append(("res", (body, short)))
            return tb, cb

        def _plan(self, layers: tuple[L, ...], t: int, c: int, cf: bool) -> tuple[list, int, int, bool]:
            """The ops of ``layers`` over ``t`` steps (0: flat) of ``c`` channels laid out
            channels-first (``cf``) or not; the ops and the state after them."""
            ops: list[Any] = []
            for lay in layers:
                g = lay.get
                need = _need(lay, self.spec.channels_first_flatten)
                if t and need is not None and need != cf:
                    ops.append(("transpose", None))
                    cf = need
                if lay.kind == "conv":
                    t, c = self._conv(ops, lay, t, c)
                elif lay.kind == "pool":
                    cls = _nn.MaxPool1d if g("op") == "max" else _nn.AvgPool1d
                    self._add(ops, "mod", cls(g("size"), g("stride")))
                    t = (t - g("size")) // g("stride") + 1
                elif lay.kind in ("gpool", "flatten"):
                    ops.append(("flatten", None) if lay.kind == "flatten" else
                               ("gmax" if g("op") == "max" else "gmean", None))
                    c, t = (c * max(t, 1) if lay.kind == "flatten" else c), 0
                elif lay.kind == "bn":
                    self._add(ops, "mod", _nn.BatchNorm1d(c))
                elif lay.kind == "ln":
                    self._add(ops, "mod", _nn.LayerNorm(c, eps=[1e-5, 1e-3][self.spec.seed % 2]))
                elif lay.kind == "act":
                    self._add(ops, "mod", _torch_act(lay, 1 if cf and t else -1))
                elif lay.kind == "rnn":
                    self._add(ops, "mod", _Recurrent(lay, c))
                    c = g("units") * (2 if g("bidir") else 1)
                    t = t if g("seq") else 0
                elif lay.kind == "attn":
                    self._add(ops, "mod", _Attention(lay, t, c))
                elif lay.kind == "slice":
                    ops.append(("slice", (g("start"), g("stop"), g("keep"), cf)))
                    t = g("stop") - g("start") if g("keep") else 0
                elif lay.kind == "res":
                    t, c = self._res(ops, lay, t, c, cf)
                elif lay.kind in ("dense", "tdense"):
                    self._add(ops, "mod", _nn.Linear(c, g("units")))
                    if g("act") != "linear":
                        self._add(ops, "mod", _torch_act(lay, -1))
                    c = g("units")
            return ops, t, c, cf

        def forward(self, x: Any) -> Any:
            return self._run(self.ops, x)

        def _run(self, ops: list, x: Any) -> Any:
            import torch
            import torch.nn.functional as F  # noqa: N812
            for op, i in ops:
                if op == "transpose":
                    x = x.transpose(1, 2)
                elif op == "mod":
                    x = self.mods[i](x)
                elif op == "pad":
                    x = F.pad(x, i)
                elif op == "cut":
                    x = x[:, :, :-i]
                elif op == "slice":
                    a, b, keep, cf = i
                    if cf:
                        x = x[..., a:b] if keep else (x[..., a] if a % 2 else x[:, :, a])
                    else:
                        x = x[:, a:b] if keep else x[:, a]
                elif op == "res":
                    x = self._run(i[0], x) + self._run(i[1], x)
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
_ONNX_ELEMENTWISE = {"elu": "Elu", "selu": "Selu", "softplus": "Softplus", "neg": "Neg",
                     "hard_sigmoid": "HardSigmoid", "softsign": "Softsign"}


class _OnnxWriter:
    """A spec as ONNX nodes (opset 17): the (batch, time, channels) input transposed to
    channels-first for Conv/pooling/Pad, flattened in either layout, Gemm or MatMul+Add
    (MatMul per time step), per-channel Mul+Add (an affine), activations, LayerNormalization,
    LSTM/GRU nodes (time-major or ``layout=1``, forward or bidirectional, the directions
    merged by Transpose + Reshape, the last step as ``Y_h`` or a Gather), Gather/Slice of
    time, residual Adds of two branches from one tensor."""

    def __init__(self, spec: Spec):
        self.spec, self.rng = spec, np.random.default_rng(spec.seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.cur = "x"
        self.t, self.c = spec.window()
        self.cf = spec.channels_first_input

    def new(self, op: str, ins: list[str], n_out: int = 1, **attrs: Any) -> str:
        from onnx import helper
        out = f"{op.lower()}_{len(self.nodes)}"
        outs = [out] + [f"{out}_{i}" for i in range(1, n_out)]
        self.nodes.append(helper.make_node(op, ins, outs, name=out, **attrs))
        self.cur = out
        return out

    def const(self, a: Any, dtype: Any = np.float32) -> str:
        from onnx import numpy_helper
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(a, dtype), name))
        return name

    def ints(self, a: Any) -> str:
        return self.const(a, np.int64)

    def act(self, kind: str, alpha: float, axis: int) -> None:
        if kind == "leaky_relu":
            self.new("LeakyRelu", [self.cur], alpha=alpha)
        elif kind in ("softmax", "log_softmax"):
            self.new("Softmax" if kind == "softmax" else "LogSoftmax", [self.cur], axis=axis)
        elif kind == "exp":
            self.new("Exp", [self.new("Tanh", [self.cur])])
        elif kind in _ONNX_ELEMENTWISE:
            self.new(_ONNX_ELEMENTWISE[kind], [self.cur], **({"alpha": 0.7} if kind == "elu" else {}))
        elif kind == "relu6":
            self.new("Clip", [self.cur, self.const(0.0), self.const(6.0)])
        elif kind == "prelu":  # one slope per channel, on the channel axis
            s = self.rng.uniform(-0.5, 0.9, self.c)
            self.new("PRelu", [self.cur, self.const(s.reshape(-1, 1) if self.cf and self.t else s)])
        elif kind != "linear":
            self.new({"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}[kind], [self.cur])

    def to_layout(self, cf: bool) -> None:
        if self.t and cf != self.cf:
            self.new("Transpose", [self.cur], perm=[0, 2, 1])
            self.cf = cf

    def layer(self, lay: L) -> None:
        need = _need(lay, self.spec.channels_first_flatten)
        if need is not None:
            self.to_layout(need)
        getattr(self, f"_{lay.kind}")(lay)

    def _conv(self, lay: L) -> None:
        g, rng, c = lay.get, self.rng, self.c
        k, s, d = g("k"), g("stride"), g("dil")
        span = (k - 1) * d
        pads = {"valid": [0, 0], "same": [span // 2, span - span // 2], "sym": [g("sym")] * 2,
                "zpad": [0, 0], "causal": [span, span]}[g("pad")]
        if g("pad") == "zpad":
            self.new("Pad", [self.cur, self.ints([0, 0, g("zl"), 0, 0, g("zr")])])
            self.t += g("zl") + g("zr")
        w = rng.normal(0, 1 / np.sqrt(k * c), (g("filters"), c, k))
        self.new("Conv", [self.cur, self.const(w), self.const(rng.normal(0, 0.1, g("filters")))],
                 kernel_shape=[k], strides=[s], dilations=[d], pads=pads)
        self.t, self.c = (self.t + sum(pads) - span - 1) // s + 1, g("filters")
        if g("pad") == "causal" and span:
            self.new("Slice", [self.cur, self.ints([0]), self.ints([-span]), self.ints([2])])
            self.t -= span
        self.act(g("act"), 0.0, 1)

    def _pool(self, lay: L) -> None:
        g = lay.get
        self.new("MaxPool" if g("op") == "max" else "AveragePool", [self.cur],
                 kernel_shape=[g("size")], strides=[g("stride")])
        self.t = (self.t - g("size")) // g("stride") + 1

    def _gpool(self, lay: L) -> None:
        self.new("GlobalMaxPool" if lay.get("op") == "max" else "GlobalAveragePool", [self.cur])
        self.new("Flatten", [self.cur], axis=1)
        self.t = 0

    def _flatten(self, lay: L) -> None:
        self.new("Flatten", [self.cur], axis=1)
        self.c, self.t = self.c * max(self.t, 1), 0

    def _act(self, lay: L) -> None:
        self.act(lay.get("kind"), lay.get("alpha"), 1 if self.cf and self.t else -1)

    def _affine(self, lay: L) -> None:
        self.new("Mul", [self.cur, self.const(self.rng.uniform(0.5, 2.0, self.c))])
        self.new("Add", [self.cur, self.const(self.rng.normal(0, 0.5, self.c))])

    def _ln(self, lay: L) -> None:
        c = self.c
        self.new("LayerNormalization", [self.cur, self.const(self.rng.uniform(0.5, 2.0, c)),
                                        self.const(self.rng.normal(0, 0.5, c))],
                 axis=-1, epsilon=[1e-5, 1e-3][self.spec.seed % 2])

    def _dense(self, lay: L) -> None:
        g, c = lay.get, self.c
        w, b = self.rng.normal(0, 1 / np.sqrt(c), (c, g("units"))), self.rng.normal(0, 0.1, g("units"))
        if self.spec.seed % 2 and not self.t:
            self.new("Gemm", [self.cur, self.const(w), self.const(b)])
        else:
            self.new("Add", [self.new("MatMul", [self.cur, self.const(w)]), self.const(b)])
        self.c = g("units")
        self.act(g("act"), 0.0, -1)

    _tdense = _dense

    def _slice(self, lay: L) -> None:
        g, axis = lay.get, 2 if self.cf else 1
        if g("keep"):
            self.new("Slice", [self.cur, self.ints([g("start")]), self.ints([g("stop")]), self.ints([axis])])
            self.t = g("stop") - g("start")
        else:
            self.new("Gather", [self.cur, self.ints(g("start"))], axis=axis)
            self.t = 0

    def _res(self, lay: L) -> None:
        fork, cf, t, c = self.cur, self.cf, self.t, self.c
        ends = []
        for branch in (lay.get("body"), lay.get("short")):
            self.cur, self.cf, self.t, self.c = fork, cf, t, c
            for sub in branch:
                self.layer(sub)
            self.to_layout(cf)
            ends.append(self.cur)
        self.new("Add", ends)

    def _rnn(self, lay: L) -> None:
        """One LSTM/GRU node over (batch, time, channels) channels-last, back to that layout."""
        g, rng, c = lay.get, self.rng, self.c
        u, gates = g("units"), 4 if g("cell") == "lstm" else 3
        dirs = 2 if g("bidir") else 1
        layout = False  # layout=1 (batch-first): ONNX Runtime refuses it, so no reference
        x = self.cur if layout else self.new("Transpose", [self.cur], perm=[1, 0, 2])
        ws = [self.const(rng.normal(0, 1 / np.sqrt(max(c, u)), (dirs, gates * u, n))) for n in (c, u)]
        attrs: dict[str, Any] = {"hidden_size": u, "direction": "bidirectional" if dirs == 2 else "forward"}
        if layout:
            attrs["layout"] = 1
        if g("cell") == "gru":
            attrs["linear_before_reset"] = int(bool(g("reset_after")))
        node = self.new(g("cell").upper(), [x, *ws, self.const(rng.normal(0, 0.3, (dirs, 2 * gates * u)))],
                        n_out=2, **attrs)
        self.c = u * dirs
        if not g("seq") and g("last") == "state":  # Y_h: (dirs=1, batch, units)
            self.new("Squeeze", [f"{node}_1", self.ints([1 if layout else 0])])
            self.t = 0
            return
        if dirs == 1:
            self.new("Squeeze", [node, self.ints([2 if layout else 1])])
            if not layout:
                self.new("Transpose", [self.cur], perm=[1, 0, 2])
        else:  # Y (T, 2, N, u) or (N, T, 2, u) → (N, T, 2·u)
            if not layout:
                self.new("Transpose", [node], perm=[2, 0, 1, 3])
            self.new("Reshape", [self.cur, self.ints([0, 0, -1])])
        if not g("seq"):
            self.new("Gather", [self.cur, self.ints(-1)], axis=1)
            self.t = 0


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
