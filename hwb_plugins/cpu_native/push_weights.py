"""cpu.native's ``push_weights`` option: the weights the sliding window's push reads stored in
bf16, IEEE half (f16) or int8 instead of fp32, and the gate that checks the push's answers
before such a variant is kept.

**What is reduced.** Only the products on the push's critical path that multiply the newest
inputs: the first layer's input projection ``K₁·x_t`` and each later layer's ``K_l·h_{l-1}``
(hwb_plugins/cpu_native/sliding.py's ``hwb_inq`` / ``hwb_cellq<l>``). Everything the prepare does
stays fp32, the input projection of ``x_t`` that it shares with the windows in flight
included (it recomputes it in fp32 from a copy of ``x_t``), and so does the stream. So a
window's first ``T-1`` steps are exactly fp32 and only its last step's input products are
rounded: the answer moves by that one step's rounding, not by ``T`` steps of it.

**Why the push.** Those products stream their weights from L2 (LSTM_A's shape: 2 × 160 KiB of
fp32); 16-bit weights halve the bytes, int8 quarters them (and bf16 / int8 the multiply-add
instructions too).

**Which kernel.** Each kind has one or more forms (:data:`FORMS`, preferred first), each the
CPU features it executes; the artifact's ``-march`` (its ``isa`` option, hence its
``requires``) picks the first form it enables (:func:`kernel`), and the C carries every form
under ``#if`` of those features' predefined macros, so the compiler builds the same one. An
AVX2 CPU without AVX-512 (Zen 3, ``isa=x86-64-v3``) gets ``f16`` and ``int8`` in 8-lane ymm
and the fast gates in AVX2; ``bf16`` stays AVX-512 only (``vdpbf16ps``).

* ``bf16`` (AVX512_BF16): weights rounded to bf16 (nearest even) in the layout ``vdpbf16ps``
  reads (the two weights of consecutive inputs for one output paired in one 32-bit lane,
  ``[input/2][output][2]``); the input vector is rounded to bf16 on the push
  (``vcvtne2ps2bf16``); products summed in fp32. Gated as the ``bf16`` precision family
  (``half``): both operands carry bf16's 8-bit significand, the error class of a bf16 variant.
* ``f16`` (F16C with AVX2 + FMA, or AVX-512F): weights rounded to IEEE half (nearest even,
  ``[input][output]``), widened on load (``vcvtph2ps``) and multiplied into fp32 FMAs with the
  fp32 input, so only the weights carry half's 11-bit significand: more accurate than bf16,
  and gated as ``fp16`` (the same ``half`` family). A weight beyond half's range (|w| > 65504)
  is refused at compile (:class:`UnsupportedError` naming it); weights below 2⁻¹⁴ ≈ 6.1e-5 are
  half subnormals, kept to an absolute 2⁻²⁴ ≈ 6e-8, which the gate judges with the rest.
* ``int8``: symmetric per-output-channel int8 weights (``[input/4][output][4]``, emit.py's
  ``vnni_dot`` layout); the input vector quantised to int8 ``q`` (-127..127) with a scale
  measured on that vector on each push (``max|v| / 127``: no calibration data reaches an
  fp32 compile, and a per-tick scale never clips); the int32 sums ``Σ q·w`` dequantised by
  ``scale × channel scale``. Three forms, the same sums exactly (one :func:`reference_products`):
  AVX512_VNNI ``vpdpbusd`` on zmm and AVX-VNNI ``vpdpbusd`` on ymm (Alder Lake+, Zen 5) take
  the input as ``q + 128`` (u8) and subtract the ``128·Σw`` correction; plain AVX2 has only
  ``vpmaddubsw`` (u8 × s8 pairs summed into a *saturating* s16) + ``vpmaddwd``: it multiplies
  ``|q|`` (u8, ≤ 127) by ``w`` carrying ``q``'s sign (``vpsignb``), so a pair's sum is at most
  2·127·127 = 32258 < 32767 and never saturates, with the input kept at the full 8 bits (no
  7-bit input, no split). Gated as ``int8`` (``quantized``). A NaN or infinity in the input
  makes every output of the product NaN (the bytes cannot carry it). The scale is one per
  vector: features whose scales differ by orders of magnitude (no normalisation before the
  LSTM) leave the small ones a fraction of a step, and the gate refuses such a model
  (tests/test_sliding_push_weights.py builds one); bf16 and f16 have no such limit.

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

#: The option's values; ``fp32`` (the default) is the exact push.
CHOICES = ("fp32", "bf16", "f16", "int8")
#: ``push_gates``' values: emit.py's exact LSTM gates, or :data:`HEADER`'s fast ones (the
#: default with reduced weights, an opt-in for fp32).
GATES = ("exact", "fast")
#: The push's fixed vector code (the fast gates, the AVX2 int8 helpers), a real header beside
#: this module (build.py's -I), its parts chosen by the macros :meth:`Kernels.c` defines.
HEADER = "hwb_push.h"
#: Each reduced kernel's (and the fast gates') forms, preferred first: (the form's name, the
#: CPU features (``/proc/cpuinfo`` names) it executes). :func:`kernel` picks one from the
#: artifact's ``requires``; the C has each under ``#if`` of the same features (:func:`_cond`).
FORMS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "bf16": (("avx512_bf16", ("avx512f", "avx512_bf16")),),
    "f16": (("avx512f", ("avx512f", "f16c")), ("avx2", ("avx2", "fma", "f16c"))),
    "int8": (("avx512_vnni", ("avx512f", "avx512bw", "avx512_vnni")),
             ("avx_vnni", ("avx2", "fma", "avx_vnni")), ("avx2", ("avx2", "fma"))),
    "fast": (("avx512f", ("avx512f",)), ("avx2", ("avx2", "fma"))),
}
#: The bound on an fp32 push with fast gates: max |push - window| over the answers' scale
#: (max(1, max |answer|)), the conformance kit's bound for an fp32 incremental form.
FP32_BOUND = 1e-5
#: The precision whose family tolerance gates each (hwbackends/fidelity.py TOLERANCES).
GATE_PRECISION = {"bf16": "bf16", "f16": "fp16", "int8": "int8"}
#: Half's largest finite value: a weight beyond it is refused with ``f16``.
F16_MAX = 65504.0
#: Ticks :func:`gate` pushes (and full windows it recomputes).
GATE_TICKS = 600
#: float32 lanes per AVX-512 vector; accumulators a kernel keeps in registers at most (of 32
#: zmm); the same for AVX2's ymm (of 16: the broadcast input and a temporary need 2 or 3).
_LANES, _ACC = 16, 16
_LANES2, _ACC2 = 8, 12


def choice(extra: dict[str, Any]) -> str:
    """The ``push_weights`` option of a compile's ``extra`` options (``fp32`` when absent)."""
    return str(extra.get("push_weights", "fp32"))


def gates_choice(extra: dict[str, Any]) -> str:
    """The ``push_gates`` option (absent: ``fast`` with reduced weights, ``exact`` in fp32)."""
    return str(extra.get("push_gates", "exact" if choice(extra) == "fp32" else "fast"))


def kernel(kind: str, have: set[str] | list[str]) -> str | None:
    """The form of ``kind``'s kernel (or of the ``fast`` gates) that CPU features ``have``
    (an artifact's ``requires``) run: the first of :data:`FORMS` whose features they all
    include; None when none (and ``None`` for a kind without forms: ``fp32``, ``exact``)."""
    got = set(have)
    return next((name for name, needs in FORMS.get(kind, ()) if got.issuperset(needs)), None)


def missing_features(kind: str, have: set[str] | list[str]) -> list[str]:
    """The CPU features ``kind``'s kernel (or the ``fast`` gates) needs that ``have`` lacks:
    none when one of its forms runs on ``have``, else those its most widely available form
    (the last) lacks."""
    forms = FORMS.get(kind, ())
    if not forms or kernel(kind, have) is not None:
        return []
    return missing_features_of(forms[-1][1], have)


def missing_features_of(needs: Any, have: set[str] | list[str]) -> list[str]:
    """The features of ``needs`` (in order, once each) that ``have`` lacks."""
    got = set(have)
    return [f for f in dict.fromkeys(needs) if f not in got]


def _cond(needs: tuple[str, ...]) -> str:
    """The C preprocessor test that ``-march`` enables the CPU features ``needs``: the
    compiler's predefined macro of each (``avx512_vnni`` → ``__AVX512VNNI__``; build.py maps
    them back to these names for ``requires``)."""
    return " && ".join(f"defined(__{f.upper().replace('_', '')}__)" for f in needs)


def _by_form(kind: str, bodies: dict[str, list[str]]) -> list[str]:
    """C lines that keep, of ``bodies`` (form name → lines), the one for the first of
    ``kind``'s forms that the ``-march`` enables; any other ``-march`` is a build error naming
    the features (target.py refuses it before a build)."""
    lines, kw = [], "#if"
    for name, needs in FORMS[kind]:
        lines += [f"{kw} {_cond(needs)}", *bodies[name]]
        kw = "#elif"
    need = " or ".join("+".join(n) for _, n in FORMS[kind])
    return [*lines, "#else", f'#error "push_weights/push_gates {kind} needs {need}"', "#endif"]


def _blocks(nv: int, acc: int = _ACC) -> list[tuple[int, int]]:
    """``nv`` output vectors in near-equal blocks of at most ``acc`` (25, 16 → 13 + 12)."""
    n = -(-nv // acc)
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
    #: whether the push's LSTM gates are :data:`HEADER`'s fast ones (else emit.py's exact ones)
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
        reduced copy (``y`` 64-byte aligned, whole vectors: the padding lanes get 0 + 0), in
        each of the kind's forms (:func:`_by_form`); returns its name."""
        w = np.asarray(w, np.float32)
        n_in, n_out = w.shape
        nv = -(-n_out // _LANES)
        bp = np.zeros(nv * _LANES, np.float32)
        if bias is not None:
            bp[:n_out] = bias
        bn = self._const("float", "B", bp)
        self.n += 1
        name = f"hwb_pw{self.n}"
        if self.kind == "bf16":
            bodies = {"avx512_bf16": self._bf16(w, nv, bn)}
        elif self.kind == "f16":
            wn = self._f16_weights(w, nv)
            bodies = {"avx512f": self._f16(n_in, nv, bn, wn, 512), "avx2": self._f16(n_in, nv, bn, wn, 256)}
        else:
            bodies = self._int8(w, nv, bn)
        self.code += [f"static void {name}(const float *restrict x, float *restrict y) {{",
                      *_by_form(self.kind, bodies), "}", ""]
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
            lines.append("      " + _broadcast_dot(pairs, "const int x4 = (int)xp[g];", "__m512bh",
                                                  "(__m512bh)_mm512_set1_epi32", wn, nv, b0, 32,
                                                  "_mm512_dpbf16_ps", nb))
            lines.append("      " + " ".join(f"_mm512_store_ps(y + {(b0 + k) * _LANES}, a{k});"
                                             for k in range(nb)) + " }")
        return lines

    def _f16_weights(self, w: np.ndarray, nv: int) -> str:
        """``w`` as IEEE half bit patterns, ``[input][output]`` (outputs padded to whole
        16-lane vectors); refuses a weight beyond half's range, naming it."""
        n_in, n_out = w.shape
        big = np.argwhere(~(np.abs(w) <= F16_MAX))  # NaN too: it would not survive either
        if big.size:
            i, j = (int(v) for v in big[0])
            raise UnsupportedError(
                f"cpu.native push_weights='f16': weight [{i}, {j}] = {float(w[i, j]):g} of the kernel of "
                f"recurrent layer {self.n} (the push's product {self.n}, inputs × gate outputs) is "
                f"beyond half's range ±{F16_MAX:g} ({len(big)} weight(s) are): compile with "
                f"push_weights='fp32' or 'bf16' (bf16 keeps fp32's range)")
        wp = np.zeros((n_in, nv * _LANES), np.float16)
        wp[:, :n_out] = w.astype(np.float16)
        return self._const("uint16_t", "H", wp.view(np.uint16))

    @staticmethod
    def _f16(n_in: int, nv: int, bn: str, wn: str, bits: int) -> list[str]:
        """The f16 product in zmm (``bits`` 512: 16 halves widened per load) or ymm (256:
        8): per input, its value broadcast and FMA'd into each accumulator of a block with
        that input's row of widened weights."""
        lanes, acc = (_LANES, _ACC) if bits == 512 else (_LANES2, _ACC2)
        p, hv = ("_mm512", "__m256i") if bits == 512 else ("_mm256", "__m128i")
        load = "_mm256_load_si256" if bits == 512 else "_mm_load_si128"
        nvl = nv * _LANES // lanes
        lines = []
        for b0, nb in _blocks(nvl, acc):
            lines.append("    { " + " ".join(f"__m{bits} a{k} = {p}_load_ps({bn} + {(b0 + k) * lanes});"
                                               for k in range(nb)))
            lines.append(f"      for (int i = 0; i < {n_in}; i++) {{ const __m{bits} xb = {p}_set1_ps(x[i]); "
                         f"const {hv} *wi = (const {hv} *)({wn} + (i * {nvl} + {b0}) * {lanes}); "
                         + " ".join(f"a{k} = {p}_fmadd_ps({p}_cvtph_ps({load}(wi + {k})), xb, a{k});"
                                    for k in range(nb)) + " }")
            lines.append("      " + " ".join(f"{p}_store_ps(y + {(b0 + k) * lanes}, a{k});"
                                             for k in range(nb)) + " }")
        return lines

    def _int8(self, w: np.ndarray, nv: int, bn: str) -> dict[str, list[str]]:
        """The int8 product's three forms over one set of constants (module docstring)."""
        n_in, n_out = w.shape
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
        return {"avx512_vnni": self._int8_512(n_in, nv, groups, wn, sn, cn, bn),
                "avx_vnni": self._int8_256(n_in, nv, groups, wn, sn, cn, bn, vnni=True),
                "avx2": self._int8_256(n_in, nv, groups, wn, sn, None, bn, vnni=False)}

    @staticmethod
    def _int8_512(n_in: int, nv: int, groups: int, wn: str, sn: str, cn: str, bn: str) -> list[str]:
        npad = -(-n_in // 16) * 16
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
            lines.append("      " + _broadcast_dot(groups, "int x4; __builtin_memcpy(&x4, q + 4 * g, 4);", "__m512i",
                                                  "_mm512_set1_epi32", wn, nv, b0, 64, "_mm512_dpbusd_epi32", nb))
            for k in range(nb):
                j = (b0 + k) * _LANES
                lines.append(f"      _mm512_store_ps(y + {j}, _mm512_add_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps("
                             f"_mm512_sub_epi32(a{k}, _mm512_load_si512({cn} + {j}))), _mm512_mul_ps(s, "
                             f"_mm512_load_ps({sn} + {j})), _mm512_load_ps({bn} + {j})), vnan));")
            lines.append("    }")
        return lines

    @staticmethod
    def _int8_256(n_in: int, nv: int, groups: int, wn: str, sn: str, cn: str | None, bn: str,
                  vnni: bool) -> list[str]:
        """The 8-lane int8 forms: AVX-VNNI ``vpdpbusd`` on ymm (``vnni``: u8 ``q + 128`` and the
        ``cn`` correction), or AVX2's ``hwb_pw_dots8`` (sign-carried ``vpmaddubsw``, no
        correction); the same quantisation as :meth:`_int8_512` (:data:`HEADER`'s AVX2 helpers)."""
        npad = -(-n_in // 32) * 32
        nv8 = nv * _LANES // _LANES2
        lines = [f"    float xs[{npad}] A64; int8_t q[{npad}] A64;",
                 f"    for (int i = 0; i < {n_in}; i++) xs[i] = x[i];",
                 f"    for (int i = {n_in}; i < {npad}; i++) xs[i] = 0.0f;",
                 # the scale of this vector; z is 0, or NaN when an input is NaN or infinite
                 "    __m256 m = _mm256_setzero_ps(), z = _mm256_setzero_ps();",
                 f"    for (int i = 0; i < {npad}; i += 8) {{ const __m256 v = _mm256_load_ps(xs + i); "
                 "m = _mm256_max_ps(m, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v)); "
                 "z = _mm256_add_ps(z, _mm256_mul_ps(v, _mm256_setzero_ps())); }",
                 "    const float amax = hwb_pw_hmax8(m), nan = hwb_pw_hsum8(z);",
                 "    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f), "
                 "s = _mm256_set1_ps(amax * (1.0f / 127.0f)), vnan = _mm256_set1_ps(nan);",
                 f"    for (int i = 0; i < {npad}; i += 32) hwb_pw_q32(xs + i, inv, q + i);"]
        load = "int x4; __builtin_memcpy(&x4, q + 4 * g, 4);"
        if vnni:  # s8 q as u8 q + 128: flip each byte's top bit
            load += " x4 = (int)((unsigned)x4 ^ 0x80808080u);"
        dot = "_mm256_dpbusd_avx_epi32" if vnni else "hwb_pw_dots8"
        for b0, nb in _blocks(nv8, _ACC2 if vnni else _ACC2 - 2):  # dots8 holds |x|, 1s and a temporary
            lines.append("    { " + " ".join(f"__m256i a{k} = _mm256_setzero_si256();" for k in range(nb)))
            lines.append("      " + _broadcast_dot(groups, load, "__m256i", "_mm256_set1_epi32", wn, nv8, b0, 32,
                                                  dot, nb))
            for k in range(nb):
                j = (b0 + k) * _LANES2
                acc = f"_mm256_sub_epi32(a{k}, _mm256_load_si256((const __m256i *)({cn} + {j})))" if vnni else f"a{k}"
                lines.append(f"      _mm256_store_ps(y + {j}, _mm256_add_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps({acc}), "
                             f"_mm256_mul_ps(s, _mm256_load_ps({sn} + {j})), _mm256_load_ps({bn} + {j})), vnan));")
            lines.append("    }")
        return lines

    def lstm_gates(self, r: str, zx: str, c: str, h: str, u: int) -> list[str]:
        """The push's LSTM gates (:data:`HEADER`'s ``hwb_pw_lstm16``: AVX-512, or AVX2 as two
        8-lane halves) over ``u`` units: the gate pre-activations ``r + zx`` (``r`` is
        read, not overwritten), the new ``c`` and ``h``; whole vectors of 16 units, then one
        masked vector for the rest."""
        full = u - u % _LANES
        lines = []
        if full:
            lines.append(f"    for (int j = 0; j < {full}; j += 16) hwb_pw_lstm16({r}, {zx}, {c}, {h}, {u}, j, 0xFFFF);")
        if u > full:
            lines.append(f"    hwb_pw_lstm16({r}, {zx}, {c}, {h}, {u}, {full}, 0x{(1 << (u - full)) - 1:X});")
        return lines

    def c(self) -> list[str]:
        """The constants and functions, after :data:`HEADER` with the parts of it this push
        uses chosen: the fast gates (when used) and the 8-lane int8 helpers, each in the form
        ``-march`` builds."""
        gates = (_by_form("fast", {"avx512f": ["#define HWB_PW_FAST_GATES 512"],
                                   "avx2": ["#define HWB_PW_FAST_GATES 256"]}) if self.fast_gates else [])
        helpers = ([f"#if {_cond(FORMS['int8'][-1][1])}", "#define HWB_PW_INT8_AVX2 1", "#endif"]
                   if self.kind == "int8" else [])
        return [*gates, *helpers, f'#include "{HEADER}"', *self.consts, "", *self.code]


def reference_products(kind: str, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """What the ``kind`` kernel computes for ``x @ w`` (``x``: rows of inputs), in float64 from
    the same rounded operands: the arithmetic model a test checks the C against (one model
    per kind: its forms compute the same products, up to the order of the fp32 sums)."""
    w = np.asarray(w, np.float32)
    x = np.asarray(x, np.float32)
    if kind == "bf16":
        return bf16_values(x).astype(np.float64) @ bf16_values(w).astype(np.float64)
    if kind == "f16":
        return x.astype(np.float64) @ w.astype(np.float16).astype(np.float64)
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
        f"push_weights='fp32'" + (" or 'f16'" if kind == "int8" else ""))


def _broadcast_dot(*args: Any, **kwargs: Any) -> str:
    """:func:`.emit.broadcast_dot`, imported at the first emit: the target's import (what
    ``hwb targets`` and ``probe()`` cost) never loads the emitter."""
    from .emit import broadcast_dot

    return broadcast_dot(*args, **kwargs)
