"""A small ONNX → JAX interpreter for signal models: the graph becomes one pure JAX function.

Why ONNX and not the source frameworks: one path serves Keras (via tf2onnx, done by the
converter plugin in the compile child) *and* PyTorch (via torch.onnx), and needs neither
TensorFlow nor torch at load time. Keras-in-JAX needs the JAX Keras backend, which cannot be
switched on in a process that already loaded the TensorFlow backend; ``jax2tf.call_tf``
calls back into TensorFlow on every step (≈90 µs per call for the zoo LSTM against ≈20 µs
here, see docs/targets-accelerators.md).

Static shapes are known at trace time, so shape arithmetic (``Shape``, ``Gather`` on shapes,
``Concat``, ``Slice``, ``ConstantOfShape``, …) is evaluated in NumPy while tracing: a value
that is a ``numpy.ndarray`` is a trace-time constant, anything else is a JAX value. XLA sees
only the real computation, with the weights folded in as constants.

Unsupported ops raise :class:`UnsupportedError` naming every missing op and the target.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from hwbackends.contract import UnsupportedError

from .._shared.onnx_source import layer_of

Value = Any  # numpy.ndarray (trace-time constant) or a jax array / tracer


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _const(v: Value) -> bool:
    return isinstance(v, (np.ndarray, np.generic))


class _Ctx:
    """Per-trace state: the compute dtype and the array module for each op."""

    def __init__(self, compute: Any) -> None:
        import jax.numpy as jnp

        self.jnp = jnp
        self.compute = compute  # jnp.float32 or jnp.bfloat16
        self.env: dict[str, Value] = {}  # the scope the running node sees (Loop bodies read it)
        self.target = "tpu.xla"
        self.layers: dict[str, str] = {}  # node name → the user's layer it comes from (onnx_source)

    def xp(self, *vals: Value) -> Any:
        return np if all(_const(v) for v in vals if v is not None) else self.jnp

    def fcast(self, v: Value) -> Value:
        """Float constants enter the computation in the compute dtype."""
        if _const(v) and np.asarray(v).dtype.kind == "f":
            return self.jnp.asarray(v, dtype=self.compute)
        return v


# -- op implementations: f(ctx, inputs, attrs) -> list of outputs ----------------------------
def _unary(fn_name: str) -> Callable[..., list[Value]]:
    def op(c: _Ctx, i: list[Value], a: dict[str, Any]) -> list[Value]:
        return [getattr(c.xp(i[0]), fn_name)(i[0])]
    return op


def _binary(fn_name: str) -> Callable[..., list[Value]]:
    def op(c: _Ctx, i: list[Value], a: dict[str, Any]) -> list[Value]:
        x, y = i
        xp = c.xp(x, y)
        if xp is not np:
            x, y = c.fcast(x), c.fcast(y)
        return [getattr(xp, fn_name)(x, y)]
    return op


def _relu(c, i, a):
    return [c.jnp.maximum(i[0], 0)]


def _leaky(c, i, a):
    alpha = a.get("alpha", 0.01)
    return [c.jnp.where(i[0] >= 0, i[0], alpha * i[0])]


def _elu(c, i, a):
    import jax
    return [jax.nn.elu(i[0], a.get("alpha", 1.0))]


def _sigmoid(c, i, a):
    import jax
    return [jax.nn.sigmoid(i[0])]


def _hardsigmoid(c, i, a):
    return [c.jnp.clip(a.get("alpha", 0.2) * i[0] + a.get("beta", 0.5), 0, 1)]


def _softmax(c, i, a):
    import jax
    return [jax.nn.softmax(i[0], axis=a.get("axis", -1))]


def _logsoftmax(c, i, a):
    import jax
    return [jax.nn.log_softmax(i[0], axis=a.get("axis", -1))]


def _clip(c, i, a):
    lo = i[1] if len(i) > 1 and i[1] is not None else a.get("min")
    hi = i[2] if len(i) > 2 and i[2] is not None else a.get("max")
    return [c.jnp.clip(i[0], None if lo is None else c.fcast(lo), None if hi is None else c.fcast(hi))]


def _matmul(c, i, a):
    return [c.jnp.matmul(c.fcast(i[0]), c.fcast(i[1]))]


def _gemm(c, i, a):
    x, w = c.fcast(i[0]), c.fcast(i[1])
    if a.get("transA", 0):
        x = x.T
    if a.get("transB", 0):
        w = w.T
    y = a.get("alpha", 1.0) * (x @ w) if a.get("alpha", 1.0) != 1.0 else x @ w
    if len(i) > 2 and i[2] is not None:
        b = c.fcast(i[2])
        y = y + (a.get("beta", 1.0) * b if a.get("beta", 1.0) != 1.0 else b)
    return [y]


def _shape(c, i, a):
    shp = np.array(np.shape(i[0]), dtype=np.int64)
    return [shp[a.get("start", 0):a.get("end", None)]]


def _constant(c, i, a):
    from onnx import numpy_helper

    if "value" in a:
        return [numpy_helper.to_array(a["value"])]
    for k, dt in (("value_float", np.float32), ("value_int", np.int64)):
        if k in a:
            return [np.array(a[k], dtype=dt)]
    for k, dt in (("value_floats", np.float32), ("value_ints", np.int64)):
        if k in a:
            return [np.array(a[k], dtype=dt)]
    raise UnsupportedError(f"Constant with attributes {sorted(a)} is not supported")


def _constant_of_shape(c, i, a):
    from onnx import numpy_helper

    val = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
    return [np.full(tuple(int(d) for d in np.asarray(i[0])), val.reshape(-1)[0], dtype=val.dtype)]


def _gather(c, i, a):
    data, idx = i
    axis = a.get("axis", 0)
    if _const(data) and _const(idx):
        return [np.take(data, np.asarray(idx), axis=axis)]
    # indices computed from the input (an embedding's): negative ones count from the end,
    # as ONNX's; one out of range reads NaN (jnp.take's fill) where ONNX Runtime raises
    return [c.jnp.take(data, idx if not _const(idx) else np.asarray(idx), axis=axis)]


def _axes(i: list[Value], a: dict[str, Any]) -> list[int] | None:
    if len(i) > 1 and i[1] is not None:
        return [int(v) for v in np.asarray(i[1]).reshape(-1)]
    return list(a["axes"]) if "axes" in a else None


def _unsqueeze(c, i, a):
    x = i[0]
    axes = _axes(i, a)
    rank = np.ndim(x) + len(axes)
    for ax in sorted(ax % rank for ax in axes):
        x = c.xp(x).expand_dims(x, ax)
    return [x]


def _squeeze(c, i, a):
    axes = _axes(i, a)
    x = i[0]
    if axes is None:
        return [c.xp(x).squeeze(x)]
    return [c.xp(x).squeeze(x, axis=tuple(ax % np.ndim(x) for ax in axes))]


def _concat(c, i, a):
    xs = [v for v in i if v is not None and not (np.ndim(v) == 1 and np.size(v) == 0)]
    xp = c.xp(*xs)
    if xp is not np:
        xs = [c.fcast(v) for v in xs]
    return [xp.concatenate(xs, axis=a["axis"])]


def _transpose(c, i, a):
    perm = a.get("perm")
    return [c.xp(i[0]).transpose(i[0], perm)]


def _reshape(c, i, a):
    x, shape = i[0], [int(s) for s in np.asarray(i[1])]
    if not a.get("allowzero", 0):
        shape = [np.shape(x)[k] if s == 0 else s for k, s in enumerate(shape)]
    return [c.xp(x).reshape(x, shape)]


def _flatten(c, i, a):
    x = i[0]
    ax = a.get("axis", 1) % max(np.ndim(x), 1)
    lead = int(np.prod(np.shape(x)[:ax]))
    return [c.xp(x).reshape(x, (lead, -1))]


_ONNX_NP = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64,
            9: np.bool_, 10: np.float16, 11: np.float64}


def _cast(c, i, a):
    to = a["to"]
    x = i[0]
    if _const(x):
        if to not in _ONNX_NP:
            raise UnsupportedError(f"Cast to ONNX type {to} is not supported")
        return [np.asarray(x).astype(_ONNX_NP[to])]
    if to in (1, 10, 11, 16):  # any float: stay in the compute dtype
        return [x.astype(c.compute)]
    return [x.astype(_ONNX_NP[to])]


def _slice(c, i, a):
    x = i[0]
    starts, ends = np.asarray(i[1]).reshape(-1), np.asarray(i[2]).reshape(-1)
    axes = np.asarray(i[3]).reshape(-1) if len(i) > 3 and i[3] is not None else np.arange(len(starts))
    steps = np.asarray(i[4]).reshape(-1) if len(i) > 4 and i[4] is not None else np.ones(len(starts), np.int64)
    idx = [slice(None)] * np.ndim(x)
    for s, e, ax, st in zip(starts, ends, axes, steps, strict=True):
        # ONNX clamps huge sentinels (INT64_MAX); Python slicing does the same for in-range ints.
        dim = np.shape(x)[int(ax)]
        idx[int(ax)] = slice(int(max(min(s, dim), -dim - 1)), int(max(min(e, dim), -dim - 1)), int(st))
    return [x[tuple(idx)]]


def _expand(c, i, a):
    x, shape = i[0], tuple(int(s) for s in np.asarray(i[1]))
    out = np.broadcast_shapes(np.shape(x), shape)
    return [c.xp(x).broadcast_to(x, out)]


def _reduce(name: str) -> Callable[..., list[Value]]:
    def op(c, i, a):
        axes = _axes(i, a)
        keep = bool(a.get("keepdims", 1))
        x = i[0]
        ax = None if axes is None else tuple(axes)
        return [getattr(c.xp(x), name)(x, axis=ax, keepdims=keep)]
    return op


def _global_avg_pool(c, i, a):
    x = i[0]
    return [c.jnp.mean(x, axis=tuple(range(2, np.ndim(x))), keepdims=True)]


def _global_max_pool(c, i, a):
    x = i[0]
    return [c.jnp.max(x, axis=tuple(range(2, np.ndim(x))), keepdims=True)]


def _pads(a: dict[str, Any], nsp: int, in_sp: tuple[int, ...], k: list[int], s: list[int],
          d: list[int]) -> list[tuple[int, int]] | str:
    auto = _s(a.get("auto_pad", "NOTSET"))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for n, kk, ss, dd in zip(in_sp, k, s, d, strict=True):
            out = -(-n // ss)
            total = max((out - 1) * ss + (kk - 1) * dd + 1 - n, 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pads.append((lo, total - lo))
        return pads
    p = list(a.get("pads", [0] * (2 * nsp)))
    return [(p[j], p[j + nsp]) for j in range(nsp)]


def _conv(c, i, a):
    from jax import lax

    x, w = c.fcast(i[0]), c.fcast(i[1])
    nsp = np.ndim(w) - 2
    k = list(a.get("kernel_shape", np.shape(w)[2:]))
    s = list(a.get("strides", [1] * nsp))
    d = list(a.get("dilations", [1] * nsp))
    pads = _pads(a, nsp, tuple(np.shape(x)[2:]), k, s, d)
    sp = "DHW"[-nsp:] if nsp <= 3 else None
    if sp is None:
        raise UnsupportedError(f"Conv with {nsp} spatial dimensions is not supported")
    dn = (f"NC{sp}", f"OI{sp}", f"NC{sp}")
    y = lax.conv_general_dilated(x, w, s, pads, rhs_dilation=d, dimension_numbers=dn,
                                 feature_group_count=a.get("group", 1))
    if len(i) > 2 and i[2] is not None:
        y = y + c.fcast(i[2]).reshape((1, -1) + (1,) * nsp)
    return [y]


def _pool(kind: str) -> Callable[..., list[Value]]:
    def op(c, i, a):
        from jax import lax

        x = i[0]
        k = list(a["kernel_shape"])
        nsp = len(k)
        s = list(a.get("strides", [1] * nsp))
        d = list(a.get("dilations", [1] * nsp))
        pads = _pads(a, nsp, tuple(np.shape(x)[2:]), k, s, d)
        win, strides = (1, 1, *k), (1, 1, *s)
        padding = ((0, 0), (0, 0), *pads)
        if kind == "max":
            return [lax.reduce_window(x, -c.jnp.inf, lax.max, win, strides, padding)]
        total = lax.reduce_window(x, 0.0, lax.add, win, strides, padding)
        if a.get("count_include_pad", 0) or not any(p for pp in pads for p in pp):
            return [total / float(np.prod(k))]
        ones = c.jnp.ones(np.shape(x)[2:], x.dtype)[None, None]
        count = lax.reduce_window(ones, 0.0, lax.add, win, strides, padding)
        return [total / count]
    return op


def _batchnorm(c, i, a):
    x, scale, bias, mean, var = (c.fcast(v) for v in i[:5])
    shp = (1, -1) + (1,) * (np.ndim(x) - 2)
    inv = scale / c.jnp.sqrt(var + a.get("epsilon", 1e-5))
    return [x * inv.reshape(shp) + (bias - mean * inv).reshape(shp)]


def _layernorm(c, i, a):
    """ONNX LayerNormalization: normalize over the axes from ``axis`` on (torch.nn.LayerNorm,
    keras.layers.LayerNormalization); the optional Mean/InvStdDev outputs too."""
    jnp = c.jnp
    x = c.fcast(i[0])
    axis = a.get("axis", -1) % np.ndim(x)
    axes = tuple(range(axis, np.ndim(x)))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    inv = 1.0 / jnp.sqrt(jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True) + a.get("epsilon", 1e-5))
    y = (x - mean) * inv * c.fcast(i[1])
    if len(i) > 2 and i[2] is not None:
        y = y + c.fcast(i[2])
    return [y, mean, inv]


def _mod(c, i, a):
    x, y = i
    xp = c.xp(x, y)
    return [(xp.fmod if a.get("fmod", 0) else xp.mod)(x, y)]


def _pad(c, i, a):
    """ONNX Pad (pads as an input from opset 11, an attribute before; optional axes): a
    causal or 'same' convolution's padding (tf2onnx writes it for Keras Conv1D)."""
    x = i[0]
    rank = np.ndim(x)
    pads = [int(v) for v in (np.asarray(i[1]).reshape(-1) if len(i) > 1 and i[1] is not None
                             else a.get("pads", []))]
    axes = ([int(v) % rank for v in np.asarray(i[3]).reshape(-1)] if len(i) > 3 and i[3] is not None
            else list(range(rank)))
    width = [(0, 0)] * rank
    for k, ax in enumerate(axes):
        width[ax] = (pads[k], pads[k + len(axes)])
    if any(lo < 0 or hi < 0 for lo, hi in width):
        raise UnsupportedError(f"Pad with negative pads {pads} (a crop) is not supported")
    mode = _s(a.get("mode", "constant"))
    xp = c.xp(x)
    if mode == "constant":
        value = i[2] if len(i) > 2 and i[2] is not None else a.get("value", 0.0)
        return [xp.pad(x, width, mode="constant", constant_values=np.asarray(value).reshape(()).item())]
    if mode not in ("reflect", "edge", "wrap"):
        raise UnsupportedError(f"Pad mode {mode!r} is not supported")
    return [xp.pad(x, width, mode=mode)]


_ACT = {"Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "relu"}


def _lstm(c, i, a):
    """ONNX LSTM (gates i, o, f, c; layout 0 = [seq, batch, feature]) as an unrolled loop over
    the static window: XLA fuses the gate math; a ``scan`` would cost a while-loop per call."""
    import jax

    jnp = c.jnp
    x, W, R = c.fcast(i[0]), c.fcast(i[1]), c.fcast(i[2])
    B = c.fcast(i[3]) if len(i) > 3 and i[3] is not None else None
    if len(i) > 4 and i[4] is not None and not _const(i[4]):
        raise UnsupportedError("LSTM with a runtime sequence_lens input is not supported")
    if len(i) > 7 and i[7] is not None:
        raise UnsupportedError("LSTM with peephole weights (P) is not supported")
    if a.get("input_forget", 0) or a.get("clip") is not None:
        raise UnsupportedError("LSTM with input_forget or clip is not supported")
    layout = a.get("layout", 0)
    if layout:
        x = jnp.swapaxes(x, 0, 1)
    H = int(a["hidden_size"])
    direction = _s(a.get("direction", "forward"))
    ndir = 2 if direction == "bidirectional" else 1
    acts = [_s(v) for v in a.get("activations", [b"Sigmoid", b"Tanh", b"Tanh"] * ndir)]
    fns = {"Sigmoid": jax.nn.sigmoid, "Tanh": jnp.tanh, "Relu": jax.nn.relu}
    for name in acts:
        if name not in fns:
            raise UnsupportedError(f"LSTM activation {name} is not supported")
    seq, batch = np.shape(x)[0], np.shape(x)[1]
    h0 = i[5] if len(i) > 5 and i[5] is not None else None
    c0 = i[6] if len(i) > 6 and i[6] is not None else None
    ys, hs, cs = [], [], []
    for dnum in range(ndir):
        f, g, hact = (fns[n] for n in acts[3 * dnum:3 * dnum + 3])
        w, r = W[dnum], R[dnum]
        # Input projection for every step at once: one matmul instead of seq small ones.
        xw = jnp.einsum("sbi,gi->sbg", x, w)
        if B is not None:
            xw = xw + B[dnum][:4 * H] + B[dnum][4 * H:]
        h = c.fcast(h0[dnum]) if h0 is not None else jnp.zeros((batch, H), c.compute)
        cc = c.fcast(c0[dnum]) if c0 is not None else jnp.zeros((batch, H), c.compute)
        steps = range(seq - 1, -1, -1) if (direction == "reverse" or dnum == 1) else range(seq)
        out = [None] * seq
        rt = r.T
        for t in steps:
            z = xw[t] + h @ rt
            ig, og, fg, cg = (z[:, k * H:(k + 1) * H] for k in range(4))
            cc = f(fg) * cc + f(ig) * g(cg)
            h = f(og) * hact(cc)
            out[t] = h
        ys.append(jnp.stack(out))        # [seq, batch, H]
        hs.append(h)
        cs.append(cc)
    y = jnp.stack(ys, axis=1)            # [seq, num_dir, batch, H]
    yh, yc = jnp.stack(hs), jnp.stack(cs)
    if layout:
        y = jnp.transpose(y, (2, 0, 1, 3))
        yh, yc = jnp.swapaxes(yh, 0, 1), jnp.swapaxes(yc, 0, 1)
    return [y, yh, yc]


def _gru(c, i, a):
    """ONNX GRU (gates z, r, h; layout 0), forward or reverse, unrolled like the LSTM."""
    import jax

    jnp = c.jnp
    x, W, R = c.fcast(i[0]), c.fcast(i[1]), c.fcast(i[2])
    B = c.fcast(i[3]) if len(i) > 3 and i[3] is not None else None
    direction = _s(a.get("direction", "forward"))
    if direction == "bidirectional" or a.get("layout", 0) or (len(i) > 4 and i[4] is not None and not _const(i[4])):
        raise UnsupportedError("GRU: only forward/reverse, layout 0, static lengths are supported")
    H = int(a["hidden_size"])
    lbr = a.get("linear_before_reset", 0)
    seq, batch = np.shape(x)[0], np.shape(x)[1]
    w, r = W[0], R[0]
    wb = B[0][:3 * H] if B is not None else 0.0
    rb = B[0][3 * H:] if B is not None else jnp.zeros(3 * H, c.compute)
    xw = jnp.einsum("sbi,gi->sbg", x, w) + wb
    h = c.fcast(i[5][0]) if len(i) > 5 and i[5] is not None else jnp.zeros((batch, H), c.compute)
    out = [None] * seq
    for t in (range(seq - 1, -1, -1) if direction == "reverse" else range(seq)):
        xz, xr, xh = (xw[t][:, k * H:(k + 1) * H] for k in range(3))
        hz = h @ r[:H].T + rb[:H]
        hr = h @ r[H:2 * H].T + rb[H:2 * H]
        z, rr = jax.nn.sigmoid(xz + hz), jax.nn.sigmoid(xr + hr)
        if lbr:
            hh = jnp.tanh(xh + rr * (h @ r[2 * H:].T + rb[2 * H:]))
        else:
            hh = jnp.tanh(xh + (rr * h) @ r[2 * H:].T + rb[2 * H:])
        h = (1 - z) * hh + z * h
        out[t] = h
    return [jnp.stack(out)[:, None], h[None]]


def _split(c, i, a):
    x = i[0]
    axis = a.get("axis", 0)
    n_out = c.n_outputs
    if len(i) > 1 and i[1] is not None:
        sizes = [int(v) for v in np.asarray(i[1]).reshape(-1)]
    elif "split" in a:
        sizes = list(a["split"])
    else:
        dim = np.shape(x)[axis]
        n = a.get("num_outputs", n_out)
        step = -(-dim // n)
        sizes = [min(step, dim - k * step) for k in range(n)]
    bounds = np.cumsum(sizes)[:-1].tolist()
    return list(c.xp(x).split(x, bounds, axis=axis))


#: A Loop is unrolled at trace time; beyond this many iterations it is refused.
MAX_UNROLL = 4096


def _loop(c, i, a):
    """ONNX Loop with a trip count and condition known at trace time (tf2onnx's form of a Keras
    GRU/SimpleRNN over a static window), unrolled: XLA then fuses across steps."""
    from onnx import numpy_helper

    body = a["body"]
    trip, cond = i[0], i[1] if len(i) > 1 else None
    if (trip is not None and not _const(trip)) or (cond is not None and not _const(cond)):
        raise UnsupportedError("Loop whose trip count or condition is only known at run time")
    limit = int(np.asarray(trip).reshape(-1)[0]) if trip is not None else None
    go = bool(np.asarray(cond).reshape(-1)[0]) if cond is not None else True
    carried = list(i[2:])
    nodes = _prep(body)
    inits = {t.name: numpy_helper.to_array(t) for t in body.initializer}
    ins = [v.name for v in body.input]
    outs = [v.name for v in body.output]
    outer = c.env
    scans: list[list[Value]] = []
    it = 0
    while go and (limit is None or it < limit):
        if it >= MAX_UNROLL:
            raise UnsupportedError(f"Loop runs more than {MAX_UNROLL} iterations")
        env = dict(outer)
        env.update(inits)
        env[ins[0]] = np.array(it, np.int64)
        env[ins[1]] = np.array(go)
        env.update(zip(ins[2:], carried, strict=True))
        _run(c, nodes, env)
        res = [env[n] for n in outs]
        if not _const(res[0]):
            raise UnsupportedError("Loop whose condition depends on the input values")
        go = bool(np.asarray(res[0]).reshape(-1)[0])
        carried = res[1:1 + len(carried)]
        scans.append(res[1 + len(carried):])
        it += 1
    c.env = outer
    n_scan = len(outs) - 1 - len(carried)
    stacked = [c.xp(*[s[k] for s in scans]).stack([s[k] for s in scans]) for k in range(n_scan)] if scans else []
    return carried + stacked


def _prep(graph: Any) -> list[tuple[str, list[str], list[str], dict[str, Any], str]]:
    return [(n.op_type, list(n.input), list(n.output), _attrs(n), n.name) for n in graph.node]


def _run(c: _Ctx, nodes: list[tuple[str, list[str], list[str], dict[str, Any], str]],
         env: dict[str, Value]) -> None:
    """Evaluate ``nodes`` in order, reading and writing ``env``."""
    for op, ins, outs, attrs, name in nodes:
        args = [env[n] if n else None for n in ins]
        c.env, c.n_outputs = env, len(outs)
        try:
            res = OPS[op](c, args, attrs)
        except UnsupportedError as exc:
            if str(exc).startswith(c.target):
                raise
            where = c.layers.get(name, "")
            raise UnsupportedError(f"{c.target}: " + (f"{where}, " if where else "")
                                   + f"node {name or op} ({op}): {exc}. {ADVICE}") from None
        # Not strict: an op may return optional outputs the node leaves unnamed.
        for n, v in zip(outs, res, strict=False):
            if n:
                env[n] = v


OPS: dict[str, Callable[..., list[Value]]] = {
    "Identity": lambda c, i, a: [i[0]],
    "Dropout": lambda c, i, a: [i[0]],
    "Constant": _constant, "ConstantOfShape": _constant_of_shape, "Shape": _shape,
    "Gather": _gather, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Concat": _concat,
    "Transpose": _transpose, "Reshape": _reshape, "Flatten": _flatten, "Cast": _cast,
    "Slice": _slice, "Expand": _expand,
    "MatMul": _matmul, "Gemm": _gemm,
    "Add": _binary("add"), "Sub": _binary("subtract"), "Mul": _binary("multiply"),
    "Div": _binary("divide"), "Pow": _binary("power"), "Max": _binary("maximum"),
    "Min": _binary("minimum"),
    "Relu": _relu, "LeakyRelu": _leaky, "Elu": _elu, "Sigmoid": _sigmoid,
    "HardSigmoid": _hardsigmoid, "Tanh": _unary("tanh"), "Exp": _unary("exp"),
    "Log": _unary("log"), "Sqrt": _unary("sqrt"), "Abs": _unary("abs"), "Neg": _unary("negative"),
    "Softmax": _softmax, "LogSoftmax": _logsoftmax, "Clip": _clip,
    "ReduceMean": _reduce("mean"), "ReduceSum": _reduce("sum"), "ReduceMax": _reduce("max"),
    "GlobalAveragePool": _global_avg_pool, "GlobalMaxPool": _global_max_pool,
    "MaxPool": _pool("max"), "AveragePool": _pool("avg"),
    "Conv": _conv, "BatchNormalization": _batchnorm, "LSTM": _lstm, "GRU": _gru,
    "LayerNormalization": _layernorm, "Mod": _mod, "Pad": _pad,
    "Split": _split, "Loop": _loop,
    "Less": _binary("less"), "Greater": _binary("greater"), "Equal": _binary("equal"),
    "LessOrEqual": _binary("less_equal"), "GreaterOrEqual": _binary("greater_equal"),
    "And": _binary("logical_and"), "Or": _binary("logical_or"), "Not": _unary("logical_not"),
}


def _all_ops(graph: Any) -> set[tuple[str, str]]:
    ops = set()
    for n in graph.node:
        ops.add((n.op_type, n.domain))
        for a in n.attribute:
            if a.g is not None and a.g.node:
                ops |= _all_ops(a.g)
            for sub in a.graphs:
                ops |= _all_ops(sub)
    return ops


def _all_nodes(graph: Any) -> list[Any]:
    nodes = []
    for n in graph.node:
        nodes.append(n)
        for a in n.attribute:
            for sub in ([a.g] if a.g is not None and a.g.node else []) + list(a.graphs):
                nodes.extend(_all_nodes(sub))
    return nodes


#: What to do with a model whose layers tpu.xla has no lowering for.
ADVICE = ("Compile it for cpu.onnxruntime, which runs every standard ONNX op, or replace the "
          "layer")


def check_ops(proto: Any, target: str) -> None:
    """Raise UnsupportedError naming every op of the graph (and its subgraphs) this
    interpreter lacks: by the user's layers it comes from where the converter recorded them
    (:mod:`hwb_plugins._shared.onnx_source`), else by ONNX node and op (a graph written as
    ONNX: its nodes are the user's)."""
    missing = sorted({op for op, dom in _all_ops(proto.graph) if op not in OPS or dom not in ("", "ai.onnx")})
    if not missing:
        return
    nodes = [n for n in _all_nodes(proto.graph) if n.op_type in missing]
    layers: dict[str, set[str]] = {}
    for n in nodes:
        layers.setdefault(layer_of(n), set()).add(n.op_type)
    if "" not in layers:  # every missing op comes from a layer the user wrote
        named = "; ".join(f"{where} (its ONNX op {', '.join(sorted(ops))})" for where, ops in
                          list(layers.items())[:4]) + (f"; and {len(layers) - 4} more" if len(layers) > 4 else "")
        raise UnsupportedError(f"{target} cannot compile {named}: no JAX lowering for "
                               f"{', '.join(missing)} in hwb_plugins/tpu_xla/onnx_jax.py. {ADVICE}")
    raise UnsupportedError(f"{target} cannot compile ONNX op(s) {', '.join(missing)} (no JAX "
                           f"lowering in hwb_plugins/tpu_xla/onnx_jax.py); supported: "
                           f"{', '.join(sorted(OPS))}. {ADVICE}.")


def to_jax(proto: Any, compute: str = "fp32",
           target: str = "tpu.xla") -> Callable[..., tuple[Any, ...]]:
    """The ONNX graph as ``f(*xs) -> (y0, y1, …)``, weights closed over: one argument per
    graph input (graph order, initializers excluded) and one float32 result per graph output,
    a tuple however many there are. ``compute='bf16'`` runs every float op in bfloat16;
    inputs and outputs stay float32."""
    import jax.numpy as jnp
    from onnx import numpy_helper

    check_ops(proto, target)
    g = proto.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    in_names = [v.name for v in g.input if v.name not in inits]
    out_names = [o.name for o in g.output]
    nodes = _prep(g)
    dtype = jnp.bfloat16 if compute == "bf16" else jnp.float32
    layers = {n.name: layer_of(n) for n in _all_nodes(g) if n.name}

    def f(*xs: Any) -> tuple[Any, ...]:
        ctx = _Ctx(dtype)
        ctx.target, ctx.layers = target, layers
        env: dict[str, Value] = dict(inits)
        for name, x in zip(in_names, xs, strict=True):
            env[name] = x.astype(dtype)
        _run(ctx, nodes, env)
        return tuple(jnp.asarray(env[n]).astype(jnp.float32) for n in out_names)

    return f
