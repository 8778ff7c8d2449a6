"""cpu.native's ``push_weights`` option: the weights the sliding window's push reads stored in
bf16 (AVX512_BF16) or int8 (AVX512_VNNI) instead of fp32, and the gate that checks the push's
answers before such a variant is kept.

**What is reduced.** Only the products on the push's critical path that multiply the newest
inputs: the first layer's input projection ``K₁·x_t`` and each later layer's ``K_l·h_{l-1}``
(hwb_plugins/cpu_native/sliding.py's ``hwb_inq`` / ``hwb_cellq<l>``). Everything the prepare does
stays fp32, the input projection of ``x_t`` that it shares with the windows in flight
included (it recomputes it in fp32 from a copy of ``x_t``), and so does the stream. So a
window's first ``T-1`` steps are exactly fp32 and only its last step's input products are
rounded: the answer moves by that one step's rounding, not by ``T`` steps of it.

**Why the push.** Those products stream their weights from L2 (LSTM_A's shape: 2 × 160 KiB of
fp32); bf16 halves the bytes and the multiply-add instructions, int8 quarters them.

* ``bf16``: weights rounded to bf16 (nearest even) in the layout ``vdpbf16ps`` reads (the two
  weights of consecutive inputs for one output paired in one 32-bit lane, ``[input/2][output]
  [2]``); the input vector is rounded to bf16 on the push (``vcvtne2ps2bf16``); products
  summed in fp32. Gated as the ``bf16`` precision family (``half``): both operands carry bf16's
  8-bit significand, the error class of a bf16 variant.
* ``int8``: symmetric per-output-channel int8 weights (``[input/4][output][4]``, emit.py's
  ``vnni_dot`` layout); the input vector quantised to u8 (``q + 128``) with a scale measured
  on that vector on each push (``max|v| / 127``: no calibration data reaches an fp32 compile,
  and a per-tick scale never clips); ``vpdpbusd`` into int32, the ``128·Σw`` correction,
  dequantised by ``scale × channel scale``. Gated as ``int8`` (``quantized``). A NaN or
  infinity in the input makes every output of the product NaN (the bytes cannot carry it).
  The scale is one per vector: features whose scales differ by orders of magnitude (no
  normalisation before the LSTM) leave the small ones a fraction of a step, and the gate
  refuses such a model (tests/test_sliding_push_weights.py builds one); bf16 has no such limit.

The sliding answers of a reduced push are no longer ``predict_into``'s bit for bit;
:func:`gate` measures them against the same library's fp32 full-window answers (which the
compile's usual fidelity check holds to the source model at fp32 tolerance) on seeded N(0, 1)
ticks and refuses the variant when they miss the family's tolerance.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hwbackends.contract import UnsupportedError

from .emit import broadcast_dot

#: The option's values; ``fp32`` (the default) is the exact push.
CHOICES = ("fp32", "bf16", "int8")
#: ``push_gates``' values: emit.py's exact LSTM gates, or :data:`GATES_C` (the default with
#: reduced weights, an opt-in for fp32).
GATES = ("exact", "fast")
#: The CPU features (``/proc/cpuinfo`` names) each reduced kernel (and the fast gates) executes.
NEEDS = {"bf16": ("avx512f", "avx512_bf16"), "int8": ("avx512f", "avx512bw", "avx512_vnni"),
         "fast": ("avx512f",)}
#: The bound on an fp32 push with fast gates: max |push - window| over the answers' scale
#: (max(1, max |answer|)), the conformance kit's bound for an fp32 incremental form.
FP32_BOUND = 1e-5
#: The precision whose family tolerance gates each (hwbackends/fidelity.py TOLERANCES).
GATE_PRECISION = {"bf16": "bf16", "int8": "int8"}
#: Ticks :func:`gate` pushes (and full windows it recomputes).
GATE_TICKS = 600
#: float32 lanes per AVX-512 vector; accumulators a kernel keeps in registers at most.
_LANES, _ACC = 16, 16


def choice(extra: dict[str, Any]) -> str:
    """The ``push_weights`` option of a compile's ``extra`` options (``fp32`` when absent)."""
    return str(extra.get("push_weights", "fp32"))


def gates_choice(extra: dict[str, Any]) -> str:
    """The ``push_gates`` option (absent: ``fast`` with reduced weights, ``exact`` in fp32)."""
    return str(extra.get("push_gates", "exact" if choice(extra) == "fp32" else "fast"))


def missing_features(kind: str, have: set[str] | list[str]) -> list[str]:
    """The CPU features ``kind``'s kernel (or the ``fast`` gates) needs that ``have`` lacks."""
    return missing_features_of(NEEDS.get(kind, ()), have)


def missing_features_of(needs: Any, have: set[str] | list[str]) -> list[str]:
    """The features of ``needs`` (in order, once each) that ``have`` lacks."""
    got = set(have)
    return [f for f in dict.fromkeys(needs) if f not in got]


def _blocks(nv: int) -> list[tuple[int, int]]:
    """``nv`` output vectors in near-equal blocks of at most :data:`_ACC` (25 → 13 + 12)."""
    n = -(-nv // _ACC)
    size = -(-nv // n)
    return [(b, min(size, nv - b)) for b in range(0, nv, size)]


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bf16 (nearest, ties to even), as the uint16 bit patterns."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bf16, back as float32 (what the kernel multiplies)."""
    return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def int8_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 of ``w`` (n_in, n_out): (the int8 weights, the
    channel scales) with ``w ≈ q · scale``."""
    amax = np.abs(w).max(axis=0)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale


@dataclass
class Kernels:
    """The reduced products of one artifact: their C (constants, then functions) and the
    constants the push reads, with their sizes in bytes (sliding.py's ``hwb_warm`` reads them)."""

    kind: str
    #: whether the push's LSTM gates are :data:`GATES_C`'s (else emit.py's exact ones)
    fast_gates: bool = True
    consts: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    push_consts: list[tuple[str, int]] = field(default_factory=list)
    #: products emitted so far (their functions' numbers)
    n: int = 0

    def _const(self, ctype: str, stem: str, a: np.ndarray) -> str:
        name = f"HWBPW{stem}{len(self.consts)}"
        if ctype == "float":
            from .emit import c_floats
            vals = c_floats(a)
        else:
            vals = ",".join(map(str, np.asarray(a).ravel().tolist()))
        self.consts.append(f"static const {ctype} {name}[{max(a.size, 1)}] A64 = {{{vals or '0'}}};")
        self.push_consts.append((name, a.nbytes))
        return name

    def product(self, w: np.ndarray, bias: np.ndarray | None) -> str:
        """A C function ``name(x, y)``: ``y[0:pad16(n_out)] = x @ w (+ bias)`` with ``w``'s
        reduced copy (``y`` 64-byte aligned, whole vectors: the padding lanes get 0 + 0);
        returns its name."""
        w = np.asarray(w, np.float32)
        n_in, n_out = w.shape
        nv = -(-n_out // _LANES)
        bp = np.zeros(nv * _LANES, np.float32)
        if bias is not None:
            bp[:n_out] = bias
        bn = self._const("float", "B", bp)
        self.n += 1
        name = f"hwb_pw{self.n}"
        body = self._bf16(w, nv, bn) if self.kind == "bf16" else self._int8(w, nv, bn)
        self.code += [f"static void {name}(const float *restrict x, float *restrict y) {{", *body, "}", ""]
        return name

    def _bf16(self, w: np.ndarray, nv: int, bn: str) -> list[str]:
        n_in, n_out = w.shape
        npad = -(-n_in // 32) * 32
        pairs = -(-n_in // 2)
        wp = np.zeros((2 * pairs, nv * _LANES), np.float32)
        wp[:n_in, :n_out] = w
        # [pair][output][2]: lane j of a vector holds (w[2p][j], w[2p+1][j])
        layout = wp.reshape(pairs, 2, nv * _LANES).transpose(0, 2, 1)
        wn = self._const("uint16_t", "W", bf16_bits(np.ascontiguousarray(layout)))
        lines = [f"    float xs[{npad}] A64; uint32_t xp[{npad // 2}] A64;",
                 f"    for (int i = 0; i < {n_in}; i++) xs[i] = x[i];",
                 f"    for (int i = {n_in}; i < {npad}; i++) xs[i] = 0.0f;",
                 f"    for (int i = 0; i < {npad}; i += 32) _mm512_store_si512((__m512i *)(xp + i / 2), "
                 "(__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(xs + i + 16), _mm512_load_ps(xs + i)));"]
        for b0, nb in _blocks(nv):
            lines.append("    { " + " ".join(f"__m512 a{k} = _mm512_load_ps({bn} + {(b0 + k) * _LANES});"
                                               for k in range(nb)))
            lines.append("      " + broadcast_dot(pairs, "const int x4 = (int)xp[g];", "__m512bh",
                                                  "(__m512bh)_mm512_set1_epi32", wn, nv, b0, 32,
                                                  "_mm512_dpbf16_ps", nb))
            lines.append("      " + " ".join(f"_mm512_store_ps(y + {(b0 + k) * _LANES}, a{k});"
                                             for k in range(nb)) + " }")
        return lines

    def _int8(self, w: np.ndarray, nv: int, bn: str) -> list[str]:
        n_in, n_out = w.shape
        npad = -(-n_in // 16) * 16
        groups = -(-n_in // 4)
        q, scale = int8_weights(w)
        wq = np.zeros((4 * groups, nv * _LANES), np.int8)
        wq[:n_in, :n_out] = q
        # [group][output][4]: lane j of a vector holds the 4 weights of 4 consecutive inputs
        wn = self._const("int8_t", "Q", np.ascontiguousarray(wq.reshape(groups, 4, nv * _LANES).transpose(0, 2, 1)))
        sp = np.zeros(nv * _LANES, np.float32)
        sp[:n_out] = scale
        sn = self._const("float", "S", sp)
        cn = self._const("int32_t", "C", (128 * wq.astype(np.int64).sum(axis=0)).astype(np.int32))
        lines = [f"    float xs[{npad}] A64; uint8_t q[{npad}] A64;",
                 f"    for (int i = 0; i < {n_in}; i++) xs[i] = x[i];",
                 f"    for (int i = {n_in}; i < {npad}; i++) xs[i] = 0.0f;",
                 # the scale of this vector; z is 0, or NaN when an input is NaN or infinite
                 "    __m512 m = _mm512_setzero_ps(), z = _mm512_setzero_ps();",
                 f"    for (int i = 0; i < {npad}; i += 16) {{ const __m512 v = _mm512_load_ps(xs + i); "
                 "m = _mm512_max_ps(m, _mm512_abs_ps(v)); z = _mm512_add_ps(z, _mm512_mul_ps(v, _mm512_setzero_ps())); }",
                 "    const float amax = _mm512_reduce_max_ps(m), nan = _mm512_reduce_add_ps(z);",
                 "    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f), "
                 "s = _mm512_set1_ps(amax * (1.0f / 127.0f)), vnan = _mm512_set1_ps(nan);",
                 f"    for (int i = 0; i < {npad}; i += 16) _mm_store_si128((__m128i *)(q + i), _mm512_cvtusepi32_epi8("
                 "_mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(xs + i), inv)), "
                 "_mm512_set1_epi32(128))));"]
        for b0, nb in _blocks(nv):
            lines.append("    { " + " ".join(f"__m512i a{k} = _mm512_setzero_si512();" for k in range(nb)))
            lines.append("      " + broadcast_dot(groups, "int x4; __builtin_memcpy(&x4, q + 4 * g, 4);", "__m512i",
                                                  "_mm512_set1_epi32", wn, nv, b0, 64, "_mm512_dpbusd_epi32", nb))
            for k in range(nb):
                j = (b0 + k) * _LANES
                lines.append(f"      _mm512_store_ps(y + {j}, _mm512_add_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps("
                             f"_mm512_sub_epi32(a{k}, _mm512_load_si512({cn} + {j}))), _mm512_mul_ps(s, "
                             f"_mm512_load_ps({sn} + {j})), _mm512_load_ps({bn} + {j})), vnan));")
            lines.append("    }")
        return lines

    def lstm_gates(self, r: str, zx: str, c: str, h: str, u: int) -> list[str]:
        """The push's LSTM gates (``hwb_pw_lstm16``, :data:`GATES_C`) over ``u`` units: the
        gate pre-activations ``r + zx`` (``r`` is read, not overwritten), the new ``c`` and
        ``h``; whole vectors of 16 units, then one masked vector for the rest."""
        full = u - u % _LANES
        lines = []
        if full:
            lines.append(f"    for (int j = 0; j < {full}; j += 16) hwb_pw_lstm16({r}, {zx}, {c}, {h}, {u}, j, 0xFFFF);")
        if u > full:
            lines.append(f"    hwb_pw_lstm16({r}, {zx}, {c}, {h}, {u}, {full}, 0x{(1 << (u - full)) - 1:X});")
        return lines

    def c(self) -> list[str]:
        """The constants and functions, after the ``#include`` the intrinsics need."""
        return ["#include <immintrin.h>", GATES_C, *self.consts, "", *self.code]


#: The push's LSTM gates in AVX-512 (with a reduced push; the prepare keeps emit.py's exact
#: ``lstm_gates``, so the windows in flight stay fp32). Every gate is ``σ(s·x) = 1/(1 + e)``
#: with ``e = 2^t``, ``t = -s·x·log2(e)`` split as ``n + f`` (``n`` the nearest integer, ``f``
#: by two FMAs with log2(e) in two parts), ``2^f`` a degree-5 polynomial on [-0.5, 0.5]
#: (relative error 1.7e-7, fitted here), ``2^n`` by ``vscalefps`` (no integer exponent
#: arithmetic, and it saturates to 0 / inf by itself), ``1/(1 + e)`` by ``vrcp14ps`` and one
#: Newton step (relative error ~1e-8, no division); ``tanh(x) = 2σ(2x) - 1`` (absolute error
#: ~1e-7 near 0, which is what the state and the answer see). ``x`` is clamped at ``-80/s``
#: so ``1 + e`` stays finite; ``max(-80/s, x)`` keeps a NaN (vmaxps returns its second operand).
#: About 95 vector operations per 16 units, against ~140 in the exact gates, and no scalar tail.
GATES_C = r"""
HWB_INLINE __m512 hwb_pw_sig(__m512 x, float s) {
    const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-80.0f / s), x);
    const __m512 hi = _mm512_set1_ps(-s * 0x1.715476p+0f), lo = _mm512_set1_ps(-s * 0x1.4ae0cp-26f);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, hi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_fmadd_ps(xc, lo, _mm512_fmsub_ps(xc, hi, n));
    __m512 p = _mm512_set1_ps(0x1.5a850ap-10f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.3cec2ap-7f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.c6baaap-5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.ebf9b6p-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.62e426p-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    const __m512 d = _mm512_add_ps(_mm512_scalef_ps(p, n), _mm512_set1_ps(1.0f));
    const __m512 r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
}
HWB_INLINE __m512 hwb_pw_tanh(__m512 x) { return _mm512_fmsub_ps(hwb_pw_sig(x, 2.0f), _mm512_set1_ps(2.0f), _mm512_set1_ps(1.0f)); }
/* units j..j+15 (lanes in m) of an LSTM of u units: gates i, f, g, o at r + zx (Keras' order) */
HWB_INLINE void hwb_pw_lstm16(const float *r, const float *zx, float *c, float *h, int u, int j, __mmask16 m) {
    const __m512 zi = _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + j), _mm512_maskz_loadu_ps(m, zx + j));
    const __m512 zf = _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + u + j), _mm512_maskz_loadu_ps(m, zx + u + j));
    const __m512 zg = _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + 2 * u + j), _mm512_maskz_loadu_ps(m, zx + 2 * u + j));
    const __m512 zo = _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + 3 * u + j), _mm512_maskz_loadu_ps(m, zx + 3 * u + j));
    const __m512 cc = _mm512_fmadd_ps(hwb_pw_sig(zf, 1.0f), _mm512_maskz_loadu_ps(m, c + j),
                                      _mm512_mul_ps(hwb_pw_sig(zi, 1.0f), hwb_pw_tanh(zg)));
    _mm512_mask_storeu_ps(c + j, m, cc);
    _mm512_mask_storeu_ps(h + j, m, _mm512_mul_ps(hwb_pw_sig(zo, 1.0f), hwb_pw_tanh(cc)));
}
"""


def reference_products(kind: str, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """What the ``kind`` kernel computes for ``x @ w`` (``x``: rows of inputs), in float64 from
    the same rounded operands: the arithmetic model a test checks the C against."""
    w = np.asarray(w, np.float32)
    x = np.asarray(x, np.float32)
    if kind == "bf16":
        return bf16_values(x).astype(np.float64) @ bf16_values(w).astype(np.float64)
    q, scale = int8_weights(w)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    a32 = amax.astype(np.float32)
    inv = np.divide(np.float32(127.0), a32, out=np.zeros_like(a32), where=a32 > 0)
    xq = np.clip(np.rint(x * inv), -127, 127)
    return (xq @ q.astype(np.float64)) * (amax / 127.0) * scale


def gate(module: Any, in_shape: tuple[int, ...], out_shape: tuple[int, ...], batch: int,
         kind: str, ticks: int = GATE_TICKS) -> dict[str, Any]:
    """The push's answers against the library's own fp32 full window on ``ticks`` seeded
    N(0, 1) ticks (the first ``T-1`` windows zero-filled): the ``Fidelity`` as a dict and the
    violations (empty: it passes) of the ``kind`` family's tolerance, or for ``fp32`` (fast
    gates) of :data:`FP32_BOUND`. ``module``: the freshly built extension; its window is reset
    before and after."""
    from hwbackends.contract import compare, gate_violations

    window, step = int(in_shape[0]), tuple(in_shape[1:])
    xs = np.random.default_rng(35).standard_normal((ticks, *step)).astype(np.float32)
    padded = np.concatenate([np.zeros((window - 1, *step), np.float32), xs])
    got = np.zeros((ticks, *out_shape), np.float32)
    module.reset()
    for i in range(ticks):
        module.step_into(xs[i], got[i])
    module.reset()
    predict = module.bind(lambda *a: None, np.ndarray, TypeError)
    want = np.zeros((ticks, *out_shape), np.float32)
    xb = np.zeros((batch, *in_shape), np.float32)
    yb = np.zeros((batch, *out_shape), np.float32)
    for i0 in range(0, ticks, batch):
        n = min(batch, ticks - i0)
        for k in range(n):
            xb[k] = padded[i0 + k:i0 + k + window]
        predict(xb, yb)
        want[i0:i0 + n] = yb[:n]
    f = compare(want, got)
    if kind == "fp32":
        err = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
        bad = [] if err <= FP32_BOUND else [f"max error {err:.3g} of the answers' scale > {FP32_BOUND:g}"]
        tol = f"fp32 sliding bound {FP32_BOUND:g}"
    else:
        bad, tol = gate_violations(GATE_PRECISION[kind], f), GATE_PRECISION[kind]
    return {"ticks": ticks, "data": "seeded N(0, 1) ticks", "against": "this library's fp32 full window",
            "tolerance": tol, "fidelity": f.to_dict(), "violations": bad}


def refuse(kind: str, result: dict[str, Any]) -> UnsupportedError:
    """The error for a reduced push that missed its family's tolerance."""
    if kind == "fp32":
        return UnsupportedError(
            f"cpu.native push_gates='fast': the sliding push's answers miss the "
            f"{result['tolerance']} against the fp32 full window ({'; '.join(result['violations'])} over "
            f"{result['ticks']} ticks): use push_gates='exact' for this model")
    return UnsupportedError(
        f"cpu.native push_weights={kind!r}: the sliding push's answers miss the "
        f"{result['tolerance']} tolerance against the fp32 full window ({'; '.join(result['violations'])}"
        f" over {result['ticks']} ticks): this model's push needs fp32 weights; compile it with "
        f"push_weights='fp32'" + (" or 'bf16'" if kind == "int8" else ""))
