"""cpu.native's ``fixed`` precision: the model in hls4ml's fixed-point arithmetic, bit-exact
with the ``fpga.hls4ml`` C-simulation at the same precision string, at native speed.

Where the types come from: the *same* hls4ml conversion ``fpga.hls4ml`` makes (its
``config_from_keras_model(granularity='name', default_precision=...)`` and converter, after
the same BatchNormalization folding), so every layer's weight/bias/accumulator/result type,
activation table size and table type are hls4ml's own, ``auto`` accumulators included. The
weights are quantised as the C-simulation loads them: hls4ml prints each value with as many
decimals as its type has fractional bits, the C++ parses that as a double and converts it.

How it is computed: every ap_fixed value is its raw integer (``raw · 2^-frac``) in an
int32/int64. A Dense is hls4ml's ``dense_latency``: each product exact, cast to ``accum_t``;
the bias cast to ``accum_t``; the sum in ``accum_t``; then cast to ``result_t``. With a
wrapping accumulator whose fraction holds the products (hls4ml's inferred one), wrapping each
term and each partial sum equals wrapping once at the end (arithmetic modulo 2^W), so the sum
is a plain 64-bit integer dot product the compiler vectorises; a saturating accumulator is
summed term by term in hls4ml's order. sigmoid/tanh index hls4ml's tables exactly as
``nnet_activation.h`` does; the tables are generated at compile time by a small C program with
the expressions (float/double mix, libm call) of hls4ml's ``init_*_table``, so they hold what
the C-simulation computes on this machine.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hwbackends.contract import CompileError, UnsupportedError

from .._shared.fixed_point import OVF_MODES, QUANT_MODES, FxType
from .._shared.hls4ml_names import Renamed, rename_keras

#: ``ap_fixed<W,I[,Q,O[,N]]>`` (C++ spelling) or ``fixed<...>`` (hls4ml's), as fpga.hls4ml takes.
_FIXED = re.compile(r"^(ap_)?(u?fixed)<\s*(\d+)\s*,\s*(-?\d+)\s*(,\s*[A-Z_0-9]+\s*)*>$")
#: What ``fixed`` alone means: hls4ml's own default precision.
DEFAULT = "fixed<16,6>"
PRECISION_RULE = ("'fixed' (hls4ml's default, ap_fixed<16,6>) or any ap_fixed<W,I> / "
                  "fixed<W,I> with 1 ≤ W ≤ 64 and I ≤ W, with rounding/overflow modes "
                  "(ap_fixed<10,4,AP_RND,AP_SAT>): bit-exact with fpga.hls4ml's C-simulation")
ACTIVATIONS = ("linear", "relu", "tanh", "sigmoid")
SUPPORTED = ("Dense, BatchNormalization (folded into the Dense before or after it, or as hls4ml's "
             "own layer), the activations " + ", ".join(ACTIVATIONS)
             + " and a 1-D softmax (hls4ml's default 'stable' implementation)")


def hls_precision(precision: str) -> str | None:
    """hls4ml's spelling of a ``fixed`` precision (``fixed`` → hls4ml's default), or None."""
    p = precision.strip()
    if p == "fixed":
        return DEFAULT
    m = _FIXED.match(p)
    if not m:
        return None
    width, integer = int(m.group(3)), int(m.group(4))
    if not 1 <= width <= 64 or integer > width:
        return None
    return p.removeprefix("ap_")


@dataclass
class FxLayer:
    """One layer of hls4ml's graph, with its types and quantised constants."""

    name: str
    kind: str  # "dense" or one of ACTIVATIONS
    result: FxType
    n_out: int
    n_in: int = 0
    weight: np.ndarray | None = None  # raw, (n_in, n_out)
    weight_t: FxType | None = None
    bias: np.ndarray | None = None  # raw, (n_out,)
    bias_t: FxType | None = None
    accum: FxType | None = None
    table_t: FxType | None = None
    table_size: int = 0
    #: softmax (hls4ml's softmax_stable): types and table sizes of its config
    softmax: dict[str, Any] = field(default_factory=dict)
    #: how errors name it: the user's layer ("layer 'fc' (Dense)"); ``name`` is hls4ml's
    #: generated one, which keys the tables and means nothing to the user
    label: str = ""

    @property
    def shown(self) -> str:
        return self.label or f"layer {self.name!r}"


@dataclass
class FxNet:
    name: str
    input_t: FxType
    n_in: int
    layers: list[FxLayer] = field(default_factory=list)
    precision: str = DEFAULT


def _unsupported(precision: str, what: str) -> UnsupportedError:
    return UnsupportedError(
        f"cpu.native precision {precision!r} (bit-exact emulation of hls4ml's fixed point) does "
        f"not support {what}; it supports {SUPPORTED}. Compile this model at precision fp32 or "
        f"int8 on cpu.native (every layer of the layer IR), or with fpga.hls4ml for hls4ml's "
        f"C-simulation")


def _type(p: Any, precision: str, where: str) -> FxType:
    if not hasattr(p, "width"):
        raise _unsupported(precision, f"the type {p} of {where} (not fixed point)")
    t = FxType.from_hls4ml(p)
    why = t.unsupported()
    if why:
        raise _unsupported(precision, f"{where} typed {t}: {why}")
    return t


def hls_graph(model: Any, hls_prec: str, scratch: Path) -> tuple[Any, Renamed]:
    """hls4ml's ``ModelGraph`` of ``model`` at ``hls_prec``, converted as fpga.hls4ml does
    with its default options (Vitis, io_parallel, Latency, reuse 1), from a rebuild with
    generated layer names as fpga.hls4ml's (:mod:`.._shared.hls4ml_names`); and the user's
    names of its layers. Not written or built."""
    import hls4ml

    from hwbackends.layer_ir import batchnorm

    from .._shared.torch_export import as_sequential

    kw: dict[str, Any] = dict(output_dir=str(scratch), project_name="myproject", backend="Vitis",
                              io_type="io_parallel", clock_period=5.0, write_weights_txt=True)
    if model.format == "keras":
        names = rename_keras(batchnorm.fold_keras(model.obj, "cpu.native"), "cpu.native")
        cfg = hls4ml.utils.config_from_keras_model(names.obj, granularity="name", backend="Vitis",
                                                   default_precision=hls_prec, default_reuse_factor=1)
        cfg["Model"]["Strategy"], cfg["Model"]["ReuseFactor"] = "Latency", 1
        try:
            return hls4ml.converters.convert_from_keras_model(names.obj, allow_da_fallback=False,
                                                              hls_config=cfg, **kw), names
        except UnsupportedError:
            raise
        except Exception as exc:
            raise _unsupported(hls_prec, f"this model (hls4ml cannot convert it: "
                                         f"{type(exc).__name__}: {str(exc)[:300]})") from exc
    if model.format == "torch":
        mod = as_sequential(model.obj, "cpu.native", "Pass the Keras twin of the model")
        try:
            cfg = hls4ml.utils.config_from_pytorch_model(
                mod, tuple(model.input.shape), granularity="name", backend="Vitis",
                default_precision=hls_prec, default_reuse_factor=1)
            cfg["Model"]["Strategy"], cfg["Model"]["ReuseFactor"] = "Latency", 1
            return hls4ml.converters.convert_from_pytorch_model(mod, hls_config=cfg, **kw), Renamed(mod)
        except UnsupportedError:
            raise
        except Exception as exc:
            raise _unsupported(hls_prec, f"this model (hls4ml cannot convert it: "
                                         f"{type(exc).__name__}: {str(exc)[:300]})") from exc
    raise _unsupported(hls_prec, f"a {model.format} model (hls4ml converts keras and torch)")


def describe(hm: Any, precision: str, name: str, names: Renamed | None = None) -> FxNet:
    """The chain of layers of hls4ml graph ``hm`` with their types and quantised weights.
    Errors name the user's layers (``names``, from :func:`hls_graph`); the layers keep
    hls4ml's (generated) names, which key the tables and never reach the C."""
    user = names.user if names is not None else str
    layers = list(hm.get_layers())
    if not layers or layers[0].class_name != "Input":
        raise _unsupported(precision, "a graph that does not start with one input")
    first = layers[0]
    net = FxNet(name, _type(first.get_output_variable().type.precision, precision, "the input"),
                int(np.prod(first.get_output_variable().shape)), precision=precision)
    prev = first
    for layer in layers[1:]:
        cls = layer.class_name
        act = str(layer.get_attr("activation") or "").lower()
        what = f"layer {user(layer.name)!r} ({cls}{', ' + act if act and cls != 'Dense' else ''})"
        if list(layer.inputs) != list(prev.outputs):
            raise _unsupported(precision, f"{what}: the model is not a chain of layers")
        out = layer.get_output_variable()
        res = _type(out.type.precision, precision, f"{what}'s result")
        n_out = int(np.prod(out.shape))
        if _zero_threshold_relu(layer):
            act = "relu"  # `x > 0 ? x : 0`, nnet::thresholded_relu at θ = 0 is nnet::relu
        if cls == "Dense":
            fl = FxLayer(layer.name, "dense", res, n_out, n_in=int(layer.get_attr("n_in")))
            fl.weight_t, fl.weight = _weights(layer, "weight", precision, what)
            fl.weight = fl.weight.reshape(fl.n_in, n_out)
            fl.bias_t, fl.bias = _weights(layer, "bias", precision, what)
            fl.accum = _type(layer.types["accum_t"].precision, precision, f"{what}'s accumulator")
        elif cls in ("Activation", "ReLU", "ParametrizedActivation") and act in ACTIVATIONS:
            fl = FxLayer(layer.name, act, res, n_out, n_in=n_out)
            if act in ("tanh", "sigmoid"):
                fl.table_t = _type(layer.types["table_t"].precision, precision, f"{what}'s table")
                fl.table_size = int(layer.get_attr("table_size"))
                div = 8 if act == "tanh" else 16
                if fl.table_size % div or fl.table_size < div:
                    raise _unsupported(precision, f"{what} with table size {fl.table_size} (not a "
                                                  f"multiple of {div})")
        elif cls == "BatchNormalization":  # one hls4ml keeps (torch: not after a Linear)
            fl = FxLayer(layer.name, "batchnorm", res, n_out, n_in=n_out)
            fl.weight_t, fl.weight = _weights(layer, "scale", precision, what)
            fl.bias_t, fl.bias = _weights(layer, "bias", precision, what)
            fl.weight, fl.bias = fl.weight.reshape(-1), fl.bias.reshape(-1)
            if not fl.weight.size or n_out % fl.weight.size or fl.bias.size != fl.weight.size:
                raise _unsupported(precision, f"{what} with {fl.weight.size} scales over "
                                              f"{n_out} values")
        elif cls == "Softmax":
            fl = FxLayer(layer.name, "softmax", res, n_out, n_in=n_out,
                         softmax=_softmax_config(layer, precision, what))
        else:
            raise _unsupported(precision, what)
        fl.label = what
        net.layers.append(fl)
        prev = layer
    return net


def _zero_threshold_relu(layer: Any) -> bool:
    """Whether ``layer`` is hls4ml's ThresholdedReLU at θ = 0: what hls4ml 1.3's Keras 3
    handler makes of every ``keras.layers.ReLU()`` (it sets relu, then overrides it), and
    the same function as relu (``x > θ ? x : 0``, cast to the result type)."""
    if layer.class_name != "ParametrizedActivation":
        return False
    if str(layer.get_attr("activation") or "").lower() != "thresholdedrelu":
        return False
    return float(layer.get_attr("activ_param") or 0.0) == 0.0


def _weights(layer: Any, key: str, precision: str, what: str) -> tuple[FxType, np.ndarray]:
    """The raw values of weight ``key`` as the C-simulation loads them: hls4ml's text (the
    variable's own formatting, ``{:.<frac>f}``) parsed as a double, converted to the type."""
    var = layer.weights[key]
    t = _type(var.type.precision, precision, f"{what}'s {key}")
    raw = np.array([t.from_double(float(s)) for s in var], dtype=np.int64)
    return t, raw


_CFG_TYPE = re.compile(r"typedef\s+ap_(u?)fixed<\s*(\d+)\s*,\s*(-?\d+)\s*((?:,\s*[A-Z_0-9]+\s*)*)>\s+inp_norm_t;")


def _softmax_config(layer: Any, precision: str, what: str) -> dict[str, Any]:
    """hls4ml's softmax config: the table types from the layer, ``inp_norm_t``, the table
    sizes and ``exp_scale`` from the config struct hls4ml writes (they exist only there)."""
    impl = str(layer.get_attr("implementation") or "stable").lower()
    if impl != "stable":
        raise _unsupported(precision, f"{what} with implementation {impl!r} (emulated: 'stable', "
                                      f"hls4ml's default)")
    if int(layer.get_attr("n_outer") or 1) != 1 or int(layer.get_attr("n_inner") or 1) != 1 \
            or layer.get_attr("skip"):
        raise _unsupported(precision, f"{what} over more than one axis, or skipped")
    cpp = str(layer.get_attr("config_cpp") or "")
    m = _CFG_TYPE.search(cpp)
    sizes = {k: re.search(rf"{k}\s*=\s*(\d+)", cpp) for k in ("exp_table_size", "inv_table_size")}
    scale = re.search(r"exp_scale\s*=\s*([-+0-9.eE]+)", cpp)
    if m is None or scale is None or not all(sizes.values()):
        raise _unsupported(precision, f"{what}: hls4ml's softmax config lacks inp_norm_t, the "
                                      f"table sizes or exp_scale")
    modes = [x.strip() for x in m.group(4).split(",") if x.strip()]
    norm = FxType(int(m.group(2)), int(m.group(3)), m.group(1) != "u",
                  modes[0].replace("AP_", "") if modes else "TRN",
                  modes[1].replace("AP_", "") if len(modes) > 1 else "WRAP")
    cfg: dict[str, Any] = {"inp_norm": norm, "exp_scale": float(np.float32(float(scale.group(1))))}
    for key in ("exp_table", "inv_table", "accum", "inv_inp"):
        cfg[key] = _type(layer.types[f"{key}_t"].precision, precision, f"{what}'s {key}_t")
    for key, mm in sizes.items():
        cfg[key] = int(mm.group(1))  # type: ignore[union-attr]
    why = norm.unsupported()
    if why:
        raise _unsupported(precision, f"{what}'s inp_norm_t {norm}: {why}")
    for key, t in (("exp_table_size", norm), ("inv_table_size", cfg["inv_inp"])):
        n = cfg[key]
        if n & (n - 1) or n.bit_length() - 1 > t.width:
            raise _unsupported(precision, f"{what}: {key} {n} (a power of two ≤ 2^W of the "
                                          f"type indexing it)")
    return cfg


# -- C ---------------------------------------------------------------------------------------
#: The ap_fixed emulation (raw integers, the modes as compile-time constants): the real header
#: hwb_fixed.h beside this module, included by the model code and the table generators.
FX_DIR = Path(__file__).resolve().parent
FX_INCLUDE = '#include "hwb_fixed.h"'

#: hls4ml's init_tanh_table / init_sigmoid_table (nnet_activation.h), value by value: the
#: index → x expression mixes float and double as the C++ does; tanh(float) binds to the float
#: overload there (<cmath>), sigmoid_fcn_float is 1.0 / (1 + std::exp(float)) returned as float.
_TABLEGEN = r"""
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include "hwb_fixed.h"
int main(void) {
    for (int ii = 0; ii < %(n)d; ii++) {
        float in_val = 2 * %(span)s * (ii - (float)(%(n)d) / 2.0) / (float)(%(n)d);
        float v = %(fn)s;
        printf("%%lld\n", (long long)fx_from_float(v, %(sc)s, %(q)s));
    }
    return 0;
}
"""


def _mode(t: FxType) -> str:
    """The C arguments ``q, w, sgn, o`` of a cast into ``t``."""
    return f"FX_{t.quant}, {t.width}, {int(t.signed)}, FX_{t.ovf}"


def _scale(frac: int) -> str:
    return float(2.0 ** frac).hex()


#: hls4ml's init_exp_table / init_invert_table (softmax_stable): the index is the top N bits
#: of the addressing type (softmax_real_val_from_idx), read back as a float.
_SOFTMAX_GEN = r"""
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include "hwb_fixed.h"
int main(void) {
    for (int i = 0; i < %(n)d; i++) {
        int64_t raw = (int64_t)((uint64_t)i << %(shift)d);
        raw = %(signed)d ? (int64_t)((uint64_t)raw << (64 - %(w)d)) >> (64 - %(w)d) : raw;
        float x = (float)((double)raw * %(unit)s);
        float v = %(fn)s;
        printf("%%lld\n", (long long)fx_from_float(v, %(sc)s, %(q)s));
    }
    return 0;
}
"""


def _gen_softmax(addr: FxType, n: int, fn: str, out_t: FxType) -> str:
    bits = n.bit_length() - 1
    return _SOFTMAX_GEN % {"n": n, "shift": addr.width - bits,
                           "signed": int(addr.signed), "w": addr.width, "unit": _scale(-addr.frac),
                           "fn": fn, "sc": _scale(out_t.frac), "q": _mode(out_t)}


def _sources(layer: FxLayer) -> dict[str, tuple[str, int]]:
    """Generator programs of ``layer``'s tables: table key → (C source, entries)."""
    if layer.kind == "softmax":
        c = layer.softmax
        exp = f"expf(-(x * {float(c['exp_scale']).hex()}f))"
        return {"exp": (_gen_softmax(c["inp_norm"], c["exp_table_size"], exp, c["exp_table"]),
                        c["exp_table_size"]),
                "inv": (_gen_softmax(c["inv_inp"], c["inv_table_size"], "1 / x", c["inv_table"]),
                        c["inv_table_size"])}
    if layer.table_t is None:
        return {}
    fn = "tanhf(in_val)" if layer.kind == "tanh" else "(float)(1.0 / (1 + expf(-in_val)))"
    return {"": (_TABLEGEN % {"n": layer.table_size, "fn": fn,
                              "span": "4.0" if layer.kind == "tanh" else "8.0",
                              "sc": _scale(layer.table_t.frac), "q": _mode(layer.table_t)},
                 layer.table_size)}


def tables(net: FxNet, cc: str, workdir: Path) -> dict[str, np.ndarray]:
    """The raw tables of every sigmoid/tanh/softmax layer (key ``name`` or ``name:exp`` /
    ``name:inv``), computed by hls4ml's own expressions."""
    out: dict[str, np.ndarray] = {}
    for layer in net.layers:
        for key, (src, size) in _sources(layer).items():
            name = f"{layer.name}:{key}" if key else layer.name
            out[name] = _run_gen(src, size, layer, cc, workdir)
    return out


def _run_gen(src: str, size: int, layer: FxLayer, cc: str, workdir: Path) -> np.ndarray:
    if True:
        c, exe = workdir / "tablegen.c", workdir / "tablegen"
        c.write_text(src)
        try:
            subprocess.run([cc, "-O1", f"-I{FX_DIR}", str(c), "-o", str(exe), "-lm"], check=True,
                           capture_output=True, text=True, timeout=60)
            res = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            raise CompileError(f"cpu.native fixed: building the {layer.kind} table of "
                               f"{layer.shown} failed: {detail[-2000:]}") from exc
        finally:
            c.unlink(missing_ok=True)
            exe.unlink(missing_ok=True)
        tab = np.array([int(v) for v in res.stdout.split()], dtype=np.int64)
        if tab.size != size:
            raise CompileError(f"cpu.native fixed: the {layer.kind} table of {layer.shown} has "
                               f"{tab.size} entries, expected {size}")
        return tab


def _ctype(t: FxType) -> str:
    """The narrowest C integer that holds the type's raw values: 16-bit data and weights make
    a Dense a 16×16→32-bit dot product (pmaddwd / vpdpwssd), twice the lanes of 32-bit."""
    return {2: "int16_t", 4: "int32_t", 8: "int64_t"}[_bytes(t)]


def _bytes(t: FxType) -> int:
    bits = t.width + (0 if t.signed else 1)  # an unsigned raw needs a spare sign bit
    return 2 if bits <= 16 else (4 if bits <= 32 else 8)


class FixedEmitter:
    """Writes the body of ``hwb_one`` for an :class:`FxNet` (float in, float out)."""

    def __init__(self, net: FxNet, tabs: dict[str, np.ndarray], vw: int):
        self.net, self.tabs, self.vw = net, tabs, vw
        self.consts: list[str] = [FX_INCLUDE]
        self.body: list[str] = []
        self.stack = 0
        self.n = 0
        self.matvecs = 0

    def line(self, s: str) -> None:
        self.body.append("    " + s)

    def const(self, stem: str, ctype: str, a: np.ndarray) -> str:
        name = f"{stem}{len(self.consts)}"
        vals = ",".join(str(int(v)) + ("LL" if ctype == "int64_t" else "") for v in a.ravel())
        self.consts.append(f"static const {ctype} {name}[{max(a.size, 1)}] A64 = {{{vals or '0'}}};")
        return name

    def buf(self, t: FxType, size: int) -> str:
        self.n += 1
        name = f"t{self.n}"
        self.stack += _bytes(t) * size
        self.body.append(f"    {_ctype(t)} {name}[{size}] A64;")
        return name

    def emit(self) -> None:
        net = self.net
        t_in = net.input_t
        # Every cast shifts by the difference of two fractions (product fractions included);
        # the C shifts are defined up to 62 bits.
        fracs, typ = [t_in.frac], t_in
        for layer in net.layers:
            ts = [layer.result, layer.weight_t, layer.bias_t, layer.accum, layer.table_t,
                  *layer.softmax.values()]
            fracs += [t.frac for t in ts if isinstance(t, FxType)]
            if layer.weight_t is not None:
                fracs.append(typ.frac + layer.weight_t.frac)
            if layer.softmax:
                fracs.append(layer.softmax["accum"].frac + layer.softmax["inv_table"].frac)
            typ = layer.result
        if max(fracs) - min(fracs) > 62:
            raise _unsupported(net.precision, f"types whose fractional bits span "
                                              f"{min(fracs)}..{max(fracs)} (casts over 62 bits)")
        cur = self.buf(t_in, net.n_in)
        self.line(f"for (int i = 0; i < {net.n_in}; i++) {cur}[i] = ({_ctype(t_in)})"
                  f"fx_from_float(x[i], {_scale(t_in.frac)}, {_mode(t_in)});")
        typ = t_in
        for k, layer in enumerate(net.layers):
            self.line(f"/* layer {k}: {layer.kind} */")  # no model text in generated code
            kind = layer.kind if layer.kind in ("dense", "softmax", "batchnorm") else "act"
            cur = getattr(self, kind)(layer, cur, typ)
            typ = layer.result
        self.line(f"for (int j = 0; j < {net.layers[-1].n_out if net.layers else net.n_in}; j++) "
                  f"y[j] = (float)((double){cur}[j] * {_scale(-typ.frac)});")

    def dense(self, layer: FxLayer, src: str, t_x: FxType) -> str:
        """hls4ml's dense_latency: acc = accum(bias); acc = accum(acc + accum(x·w)); result(acc)."""
        wt, at, rt = layer.weight_t, layer.accum, layer.result
        assert wt is not None and at is not None and layer.weight is not None and layer.bias is not None
        assert layer.bias_t is not None
        n_in, n_out = layer.n_in, layer.n_out
        if t_x.width + wt.width > 63:
            raise _unsupported(self.net.precision, f"{layer.shown}: {t_x} × {wt} products "
                                                   f"over 63 bits")
        self.matvecs += 1
        fp = t_x.frac + wt.frac  # the exact product's fraction
        k = at.frac - fp  # > 0: the product shifts left into the accumulator; < 0: quantised
        w = self.const("W", _ctype(wt), np.ascontiguousarray(layer.weight.T))  # out-major rows
        b = self.const("B", "int64_t", np.array([at.cast_raw(int(v), layer.bias_t.frac)
                                                 for v in layer.bias], dtype=np.int64))
        o = self.buf(rt, n_out)
        prod = f"(int64_t){src}[i] * {w}[j * {n_in} + i]"
        res = f"fx_cast(acc, {at.frac - rt.frac}, {_mode(rt)})"
        # The largest |Σ x·w| any input of type t_x can give with these weights: below 2^31
        # the exact sum fits an int32, so it is summed in 32-bit lanes (no wrap can occur).
        xmax = max(abs(t_x.lo), t_x.hi)
        bound = xmax * int(np.abs(layer.weight).sum(axis=0).max(initial=0))
        if at.ovf == "WRAP" and k >= 0 and bound < 2 ** 31:
            shift = f" << {k}" if k > 0 else ""
            self.line(f"for (int j = 0; j < {n_out}; j++) {{ int32_t s = 0; "
                      f"for (int i = 0; i < {n_in}; i++) s += (int32_t){src}[i] * (int32_t){w}[j * {n_in} + i]; "
                      f"const int64_t acc = fx_ovf((int64_t)((uint64_t){b}[j] + ((uint64_t)(int64_t)s{shift})), "
                      f"{at.width}, {int(at.signed)}, FX_{at.ovf}); {o}[j] = ({_ctype(rt)}){res}; }}")
        elif at.ovf == "WRAP":
            # modulo 2^W: wrapping each term and partial sum = wrapping the exact sum once
            term = f"(uint64_t)({prod})" if k >= 0 else f"(uint64_t)fx_shr({prod}, {-k}, FX_{at.quant})"
            shift = f" << {k}" if k > 0 else ""
            self.line(f"for (int j = 0; j < {n_out}; j++) {{ uint64_t s = 0; "
                      f"for (int i = 0; i < {n_in}; i++) s += {term}; "
                      f"const int64_t acc = fx_ovf((int64_t)((uint64_t){b}[j] + (s{shift})), "
                      f"{at.width}, {int(at.signed)}, FX_{at.ovf}); {o}[j] = ({_ctype(rt)}){res}; }}")
        else:  # saturating accumulator: term by term, in hls4ml's order
            self.line(f"for (int j = 0; j < {n_out}; j++) {{ int64_t acc = {b}[j]; "
                      f"for (int i = 0; i < {n_in}; i++) {{ const int64_t p = fx_cast({prod}, {-k}, "
                      f"{_mode(at)}); acc = fx_ovf(acc + p, {at.width}, {int(at.signed)}, FX_{at.ovf}); }} "
                      f"{o}[j] = ({_ctype(rt)}){res}; }}")
        return o

    def batchnorm(self, layer: FxLayer, src: str, t_x: FxType) -> str:
        """hls4ml's ``normalize``: ``res = result(x·scale + bias)``; the product and the sum
        are exact ap_fixed arithmetic (one common fraction), cast once to ``result_t``."""
        st, bt, rt = layer.weight_t, layer.bias_t, layer.result
        assert st is not None and bt is not None and layer.weight is not None and layer.bias is not None
        fp = t_x.frac + st.frac  # the exact product's fraction
        f = max(fp, bt.frac)
        if max(t_x.width + st.width + f - fp, bt.width + f - bt.frac) + 1 > 63:
            raise _unsupported(self.net.precision, f"{layer.shown}: {t_x} × {st} + {bt} over 63 bits")
        n, m = layer.n_out, layer.weight.size
        sc = self.const("S", "int64_t", layer.weight.astype(np.int64))
        bi = self.const("B", "int64_t", np.array([int(v) << (f - bt.frac) for v in layer.bias],
                                                 dtype=np.int64))
        o = self.buf(rt, n)
        self.line(f"for (int i = 0; i < {n}; i++) {o}[i] = ({_ctype(rt)})fx_cast("
                  f"((int64_t){src}[i] * {sc}[i % {m}]) * INT64_C({1 << (f - fp)}) + {bi}[i % {m}], "
                  f"{f - rt.frac}, {_mode(rt)});")
        return o

    def act(self, layer: FxLayer, src: str, t_x: FxType) -> str:
        rt, n = layer.result, layer.n_out
        o = self.buf(rt, n)
        cast = f"fx_cast({src}[i], {t_x.frac - rt.frac}, {_mode(rt)})"
        ct = _ctype(rt)
        if layer.kind == "linear":
            self.line(f"for (int i = 0; i < {n}; i++) {o}[i] = ({ct}){cast};")
        elif layer.kind == "relu":
            self.line(f"for (int i = 0; i < {n}; i++) {o}[i] = {src}[i] > 0 ? ({ct}){cast} : 0;")
        else:
            tt = layer.table_t
            assert tt is not None
            size = layer.table_size
            span = 8 if layer.kind == "tanh" else 16
            if t_x.integer + size.bit_length() > 31:
                raise _unsupported(self.net.precision, f"{layer.shown}: a {t_x} input "
                                                       f"indexing a {size}-entry table")
            tab = self.const("T", _ctype(tt), self.tabs[layer.name])
            # data_round = (int)(x * size / span): exact in ap_fixed, then toward zero
            f = t_x.frac
            scaled = f"(int64_t){src}[i] * {size // span}"
            rnd = f"({scaled}) / INT64_C({1 << f})" if f > 0 else f"({scaled}) * {1 << -f}"
            self.line(f"for (int i = 0; i < {n}; i++) {{ int64_t idx = {rnd} + {size // 2}; "
                      f"idx = idx < 0 ? 0 : (idx > {size - 1} ? {size - 1} : idx); "
                      f"{o}[i] = ({ct})fx_cast({tab}[idx], {tt.frac - rt.frac}, {_mode(rt)}); }}")
        return o

    def softmax(self, layer: FxLayer, src: str, t_x: FxType) -> str:
        """hls4ml's softmax_stable: d = inp_norm(max - x); e = accum(exp_table[top bits of d]);
        sum = inv_inp(tree sum of e in accum_t, hls4ml's reduce); res = e · inv_table[top bits]."""
        c, rt, n = layer.softmax, layer.result, layer.n_out
        norm, acc, inv_in, et, it = c["inp_norm"], c["accum"], c["inv_inp"], c["exp_table"], c["inv_table"]
        if acc.width + it.width > 63:
            raise _unsupported(self.net.precision, f"{layer.shown}: softmax products over 63 bits")
        exp = self.const("T", "int64_t", self.tabs[f"{layer.name}:exp"])
        inv = self.const("T", "int64_t", self.tabs[f"{layer.name}:inv"])
        o = self.buf(rt, n)
        self.n += 1
        e, k = f"e{self.n}", self.n
        ne, ni = c["exp_table_size"].bit_length() - 1, c["inv_table_size"].bit_length() - 1
        self.line(f"{{ int64_t m{k} = {src}[0]; for (int i = 1; i < {n}; i++) "
                  f"m{k} = {src}[i] > m{k} ? {src}[i] : m{k};")
        self.line(f"  int64_t {e}[{n}];")
        self.line(f"  for (int i = 0; i < {n}; i++) {{ const int64_t d = fx_cast(m{k} - {src}[i], "
                  f"{t_x.frac - norm.frac}, {_mode(norm)}); const uint64_t idx = ((uint64_t)d & "
                  f"{hex((1 << norm.width) - 1)}ULL) >> {norm.width - ne}; {e}[i] = fx_cast({exp}[idx], "
                  f"{et.frac - acc.frac}, {_mode(acc)}); }}")

        def tree(lo: int, cnt: int) -> str:  # nnet::reduce's balanced tree, Op_add in accum_t
            if cnt == 1:
                return f"{e}[{lo}]"
            left = 1 << ((cnt - 1).bit_length() - 1)
            return (f"fx_cast({tree(lo, left)} + {tree(lo + left, cnt - left)}, 0, {_mode(acc)})")
        self.line(f"  const int64_t s{k} = fx_cast({tree(0, n)}, {acc.frac - inv_in.frac}, {_mode(inv_in)});")
        self.line(f"  const int64_t r{k} = {inv}[((uint64_t)s{k} & {hex((1 << inv_in.width) - 1)}ULL) >> "
                  f"{inv_in.width - ni}];")
        self.line(f"  for (int i = 0; i < {n}; i++) {o}[i] = ({_ctype(rt)})fx_cast({e}[i] * r{k}, "
                  f"{acc.frac + it.frac - rt.frac}, {_mode(rt)}); }}")
        return o


assert len(QUANT_MODES) == 7 and len(OVF_MODES) == 3  # the C enums above, in this order
