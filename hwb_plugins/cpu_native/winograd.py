"""Winograd (Toom-Cook) convolution along the rows for cpu.native's fp32 Conv2D with a
``(r, 1)`` kernel, stride 1, dilation 1: DeepLOB's (4, 1) and its inception's (3, 1) and
(5, 1) convs.

``F(m, r)`` computes ``m`` output rows of one column from ``α = m + r - 1`` input rows with
``α`` products per (input, output) channel pair where the direct form takes ``m·r``:

    Y = Aᵀ [ (G g) ⊙ (Bᵀ d) ]   summed over the input channels,

so per block of tiles (a tile is ``m`` rows of one column) the work is an input transform
(``Bᵀ d``, vectorised over the channels), ``α`` register-tiled matrix products
``V_a (tiles × c_in) · U_a (c_in × c_out)`` (the weights pre-transformed at code generation,
``U = G g``), and an output transform (``Aᵀ``) with the bias and a following ReLU/LeakyReLU
fused before the store.

Every ``r`` uses ``α = 8`` and the points 0, ±1, ±2, ±1/2 and ∞ (``m = 9 - r``): every
constant of ``Aᵀ`` and ``Bᵀ`` (the transforms applied at run time, in fp32) is a small
integer or a power of two, exact in float32; ``G``'s fractions are applied in float64 to the
weights before they are rounded once to float32. The points come in pairs ±p, so the
transforms are written as even and odd parts shared by both points of a pair (``Bᵀ``'s rows
for ±p are ``E ± O``; ``Aᵀ``'s columns for ±p differ in the sign of the odd powers). The
matrices are built exactly, in rationals (:func:`transforms`). Rounding differs from the direct sum's: the fuzz and DeepLOB
tests bound the answers at 1e-5 of the output's scale (measured errors in docs/targets.md).

The rows past the last whole tile are a padded last tile: a tile reaching into the zero
padding or past the input's last row reads a copy of its ``α`` rows with those rows zero
(the others read the input in place: no padded copy of the tensor), and only the output
rows that exist are stored.
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from hwbackends import layer_ir as ir

#: Output rows per tile by kernel height: α = m + r - 1 = 8 for every r.
ROWS = {2: 7, 3: 6, 4: 5, 5: 4, 6: 3}
#: The interpolation points besides ∞ (α - 1 = 7 of them), each -p right after its p.
POINTS = (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2), Fraction(1, 2),
          Fraction(-1, 2))
#: Input channels from which ``auto`` takes Winograd: with fewer the input transform (per
#: input channel, α·α terms) costs more than the products saved. Measured (C harness, the
#: best of 2000 calls, (100, 10, c_in) → c_out, AVX-512 and AVX2 alike): c_in 1 → 32 and
#: 2 → 16 are slower by Winograd (3.5 → 4.9 µs, 2.9 → 3.6), c_in 8 is faster for every c_out
#: from 1 to 16 and r from 2 to 4 (8 → 8, r 4: 8.3 → 5.6 µs; 8 → 1, r 2: 5.1 → 4.1).
MIN_IN_CHANNELS = 8


def _inverse(a: list[list[Fraction]]) -> list[list[Fraction]]:
    """The exact inverse of a square rational matrix (Gauss-Jordan)."""
    n = len(a)
    rows = [row[:] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(a)]
    for c in range(n):
        p = next(r for r in range(c, n) if rows[r][c] != 0)
        rows[c], rows[p] = rows[p], rows[c]
        pv = rows[c][c]
        rows[c] = [v / pv for v in rows[c]]
        for r in range(n):
            if r != c and rows[r][c] != 0:
                f = rows[r][c]
                rows[r] = [x - f * y for x, y in zip(rows[r], rows[c], strict=True)]
    return [row[n:] for row in rows]


@lru_cache(maxsize=None)
def transforms(m: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(Aᵀ, G, Bᵀ)`` of the correlation ``y_i = Σ_j g_j d_{i+j}`` (i < m, j < r), float64:
    ``Aᵀ`` (m × α), ``G`` (α × r), ``Bᵀ`` (α × α), such that ``y = Aᵀ ((G g) ⊙ (Bᵀ d))``.

    The transpose of Toom-Cook's linear convolution: evaluation at :data:`POINTS` and ∞ (the
    Vandermonde matrices ``V_r``, ``V_m``, ``V_α``), ``Aᵀ = V_mᵀ``, ``G = V_r``,
    ``Bᵀ = (V_α⁻¹)ᵀ``; each row of ``Bᵀ`` is scaled to coprime integers and that row of
    ``G`` divided by the same factor (the product is unchanged)."""
    a = m + r - 1
    pts = POINTS[:a - 1]
    if len(pts) != a - 1:
        raise ValueError(f"F({m}, {r}) needs {a - 1} points; {len(POINTS)} are defined")

    def vandermonde(n: int) -> list[list[Fraction]]:
        rows = [[p ** j for j in range(n)] for p in pts]
        return rows + [[Fraction(int(j == n - 1)) for j in range(n)]]  # ∞: the leading coefficient

    vg, vm, inv = vandermonde(r), vandermonde(m), _inverse(vandermonde(a))
    bt = [[inv[j][k] for j in range(a)] for k in range(a)]
    g = [row[:] for row in vg]
    for k in range(a):
        lcm = math.lcm(*(x.denominator for x in bt[k]))
        gcd = math.gcd(*(int(x * lcm) for x in bt[k] if x != 0))
        s = Fraction(lcm, gcd)
        bt[k] = [x * s for x in bt[k]]
        g[k] = [x / s for x in g[k]]
    at = [[vm[k][i] for k in range(a)] for i in range(m)]
    return (np.array(at, np.float64), np.array(g, np.float64), np.array(bt, np.float64))


def eligible(layer: ir.Layer) -> bool:
    """A Conv2D this path computes: kernel ``(r, 1)`` with r in :data:`ROWS`, stride and
    dilation 1 (any zero padding)."""
    if not isinstance(layer, ir.Conv2D):
        return False
    kh, kw = layer.w.shape[:2]
    return kw == 1 and kh in ROWS and tuple(layer.stride) == (1, 1) and tuple(layer.dilation) == (1, 1)


def pays(layer: ir.Conv2D, out_shape: tuple[int, ...]) -> bool:
    """Whether ``auto`` takes Winograd: enough input channels that the products saved
    outweigh the transforms (:data:`MIN_IN_CHANNELS`), and at least one whole tile of rows."""
    return layer.w.shape[2] >= MIN_IN_CHANNELS and out_shape[0] >= ROWS[layer.w.shape[0]]


def _combo(coefs: np.ndarray, names: list[str]) -> str:
    """``Σ coefs[k]·names[k]`` as a C expression, zero terms left out, ±1 as a sign, every
    constant an exact float literal."""
    terms = []
    for c, n in zip(coefs, names, strict=True):
        if c == 0:
            continue
        sign = "-" if c < 0 else "+"
        mag = abs(float(c))
        terms.append(f"{sign} {n}" if mag == 1 else f"{sign} {np.float32(mag).item().hex()}f * {n}")
    if not terms:
        return "0.0f"
    first = terms[0]
    return " ".join([first[2:] if first[0] == "+" else f"-{first[2:]}", *terms[1:]])


def _pairs(alpha: int) -> dict[int, int]:
    """Index of ``p`` -> index of ``-p`` among the first ``α - 1`` points (0 and ∞ unpaired)."""
    pts = POINTS[:alpha - 1]
    return {k: pts.index(-p) for k, p in enumerate(pts) if p > 0 and -p in pts}


def input_transform(bt: np.ndarray, d: list[str], out: list[str]) -> str:
    """C statements ``out[a] = (Bᵀ d)[a]``; a pair's rows as ``E + O`` and ``E - O`` (its
    even and odd coefficients) with ``E·d`` and ``O·d`` computed once."""
    alpha = bt.shape[0]
    odd = np.arange(alpha) % 2 == 1
    lines, done = [], set()
    for a, b in _pairs(alpha).items():
        ev, od = np.where(odd, 0.0, bt[a]), np.where(odd, bt[a], 0.0)
        for sign in (1, -1):
            if np.array_equal(bt[b], sign * (ev - od)):
                first, second = ("pe", "po") if sign == 1 else ("po", "pe")
                lines += [f"const float pe{a} = {_combo(ev, d)};", f"const float po{a} = {_combo(od, d)};",
                          f"{out[a]} = pe{a} + po{a};", f"{out[b]} = {first}{a} - {second}{a};"]
                done |= {a, b}
                break
    lines += [f"{out[a]} = {_combo(bt[a], d)};" for a in range(alpha) if a not in done]
    return " ".join(lines)


def output_transform(at: np.ndarray, mv: list[str], bias: str, y: list[str]) -> str:
    """C statements ``y[i] = bias + (Aᵀ m)[i]``; a pair's columns ``p^i`` and ``(-p)^i`` read
    ``m_p + m_-p`` (even i) or ``m_p - m_-p`` (odd i), each sum formed once."""
    m, alpha = at.shape
    pairs = _pairs(alpha)
    lines, names, cols = [], [], []
    paired = set(pairs) | set(pairs.values())
    for k in range(alpha):
        if k not in paired:
            names.append(mv[k])
            cols.append(at[:, k])
    even = np.arange(m) % 2 == 0
    for a, b in pairs.items():
        assert np.array_equal(at[:, b], np.where(even, at[:, a], -at[:, a]))
        lines += [f"const float ps{a} = {mv[a]} + {mv[b]};", f"const float pd{a} = {mv[a]} - {mv[b]};"]
        names += [f"ps{a}", f"pd{a}"]
        cols += [np.where(even, at[:, a], 0.0), np.where(even, 0.0, at[:, a])]
    coefs = np.stack(cols, axis=1)
    lines += [f"float {y[i]} = {bias} + ({_combo(coefs[i], names)});" for i in range(m)]
    return " ".join(lines)


def emit(e: Any, layer: ir.Conv2D, src: str, shape: tuple[int, ...], o: str,
         out_shape: tuple[int, ...]) -> str:
    """``layer`` (:func:`eligible`) reading ``src`` (rows, cols, c_in) into ``o``, written
    into ``e``, the fp32 ``emit.Emitter`` (its buffers, constants and body; this module does
    not import emit.py, which imports it)."""
    h, w, ci = shape
    r, _, _, co = layer.w.shape
    m = ROWS[r]
    at, g, bt = transforms(m, r)
    alpha = m + r - 1
    oh, ow, _ = out_shape
    (pt, pb), (pl, pr) = layer.pad
    nty = -(-oh // m)
    vw = e.vw
    nv = -(-co // vw)
    cop = nv * vw
    # the products: column blocks of nvb vectors, tb tiles each (tb·nvb accumulators). With
    # c_in-long sums (32, 64) fewer accumulators than the direct path's win (C harness, best
    # of 2000 calls, the (100, 20, 32 -> 32) (4, 1) conv, A/B alternated): AVX-512 16 of
    # them 47.6 us, 24 50.0 us; AVX2 12 of them 83-94 us, 8 90-102 us
    acc = 16 if vw == 16 else 12
    nvb = min(nv, 2)
    tiles = nty * ow
    tmax = max(1, min(12, acc // nvb))
    tb = -(-tiles // -(-tiles // tmax))
    u = np.einsum("ak,kio->aio", g, layer.w[:, 0].astype(np.float64))  # (α, c_in, c_out)
    up = np.zeros((alpha, ci, cop), np.float32)
    up[:, :, :co] = u
    bp = np.zeros(cop, np.float32)
    bp[:co] = layer.b
    un, bn = e.const("U", up), e.const("B", bp)
    vs, ms = tb * ci, tb * cop  # per-α strides of the transformed input and the products
    v, mb, stg = e.buf(alpha * vs), e.buf(alpha * ms), e.buf(alpha * ci)
    e.matvecs += 1
    nxt = e.seq[e.cur + 1] if e.cur + 1 < len(e.seq) else None
    epi = ""
    if isinstance(nxt, ir.Act) and nxt.kind in ("relu", "leaky_relu"):
        e.fused = e.cur + 1
        epi = ("u{0} = u{0} > 0.0f ? u{0} : 0.0f;" if nxt.kind == "relu"
               else f"u{{0}} = u{{0}} > 0.0f ? u{{0}} : {float(nxt.alpha).hex()}f * u{{0}};")
    os_ = ow * co  # the output's row stride
    ds = [f"d{k}" for k in range(alpha)]
    ms_names = [f"m{k}" for k in range(alpha)]
    full = tiles - tiles % tb
    for p0, cnt, nb in ((0, full, tb), (full, tiles - full, tiles - full)):
        if cnt <= 0:
            continue
        e.line(f"for (int p = {p0}; p < {p0 + cnt}; p += {nb}) {{" if cnt > nb else f"{{ const int p = {p0};")
        # input transform: V[a][rr][i] = Σ_k Bᵀ[a][k] d[rr + k rows][i]
        # (a tile whose α rows are all inside the input reads them in place; one reaching into
        # the zero padding, or past the last row, reads a copy with those rows zero)
        e.line(f"  for (int rr = 0; rr < {nb}; rr++) {{ const int t = p + rr; "
               f"const int row = (t / {ow}) * {m} - {pt}, col = t % {ow} - {pl}; "
               f"const float *s = {src} + (row * {w} + col) * {ci}; int rs = {w * ci}; "
               f"if (row < 0 || row + {alpha} > {h} || col < 0 || col >= {w}) {{ "
               f"for (int k = 0; k < {alpha}; k++) {{ const int ok = row + k >= 0 && row + k < {h} && "
               f"col >= 0 && col < {w}; for (int i = 0; i < {ci}; i++) {stg}[k * {ci} + i] = ok ? "
               f"{src}[((row + k) * {w} + col) * {ci} + i] : 0.0f; }} s = {stg}; rs = {ci}; }} "
               f"float *vr = {v} + rr * {ci};")
        e.line(f"    for (int i = 0; i < {ci}; i++) {{ " +
               " ".join(f"const float d{k} = s[{k} * rs + i];" for k in range(alpha)) + " " +
               input_transform(bt, ds, [f"vr[{a * vs} + i]" for a in range(alpha)]) + " } }")
        # the α products, register-tiled: nb tiles × nvb vectors of outputs per pass
        e.line(f"  for (int a = 0; a < {alpha}; a++) {{ const float *va = {v} + a * {vs}; "
               f"const float *ua = {un} + a * {ci * cop}; float *ma = {mb} + a * {ms};")
        for j0 in range(0, nv, nvb):
            jn = min(nvb, nv - j0)
            e.line("    { " + " ".join(f"vf a{rr}_{j} = (vf){{0}};" for rr in range(nb) for j in range(jn)))
            e.line(f"      for (int i = 0; i < {ci}; i++) {{ const vf *wr = (const vf *)(ua + i * {cop} + "
                   f"{j0 * vw}); " + " ".join(f"const float v{rr} = va[{rr * ci} + i];" for rr in range(nb))
                   + " " + " ".join(f"a{rr}_{j} += v{rr} * wr[{j}];" for rr in range(nb) for j in range(jn))
                   + " }")
            e.line("      " + " ".join(f"*(vf *)(ma + {rr * cop + (j0 + j) * vw}) = a{rr}_{j};"
                                       for rr in range(nb) for j in range(jn)) + " }")
        e.line("  }")
        # output transform, bias, activation; the last tile row stores only the rows that exist
        tail = oh % m
        lim = f"const int lim = (t / {ow}) == {nty - 1} ? {tail} : {m}; " if tail else ""
        e.line(f"  for (int rr = 0; rr < {nb}; rr++) {{ const int t = p + rr; {lim}"
               f"float *q = {o} + ((t / {ow}) * {m * ow} + t % {ow}) * {co}; "
               f"const float *mr = {mb} + rr * {cop};")
        stores = []
        for i in range(m):
            st = f"q[{i * os_} + j] = u{i};"
            stores.append(f"if ({i} < lim) {st}" if tail and i >= tail else st)
        e.line(f"    for (int j = 0; j < {co}; j++) {{ " +
               " ".join(f"const float m{k} = mr[{k * ms} + j];" for k in range(alpha)) + " " +
               output_transform(at, ms_names, f"{bn}[j]", [f"u{i}" for i in range(m)]) + " " +
               (" ".join(epi.format(i) for i in range(m)) + " " if epi else "") +
               " ".join(stores) + " } }")
        e.line("}")
    e.winograd.append({"layer": layer.name, "kernel": [int(r), 1], "tile_rows": m})
    return o
