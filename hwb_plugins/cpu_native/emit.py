"""The layer IR (hwbackends/layer_ir/) → one C file with the weights as constants.

Why a direct emitter (docs/performance.md has the measured comparison with keras2c and
emlearn): the whole model becomes one function over fixed shapes, which the compiler inlines,
unrolls and vectorises with every size known; intermediate tensors live on the stack (no heap,
thread-safe, reentrant). Loops are written so GCC vectorises them without ``-ffast-math``:

* a Dense/Conv1D/recurrent matmul with many outputs is an *axpy* (``y[j] += x[i]·W[i][j]``
  over ``j``), vectorised across outputs with no reassociation;
* one with few outputs (< 8, the signal head) is a dot product per output whose sum is an
  ``omp simd reduction`` (``-fopenmp-simd``: the compiler may split the sum into lanes);
* an LSTM's input projections of all steps are one register-tiled matrix product before
  the time loop (:meth:`Emitter.input_gemm`), so each step reads only the recurrent kernel;
* exp/tanh/sigmoid are inline branch-free polynomials (``hwb_exp``), so the gate loops of
  an LSTM vectorise too, where libm's scalar ``expf``/``tanhf`` calls would not.

Weights are written as C99 hex-float literals: exact, whatever the locale or printf.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from hwbackends import layer_ir as ir
from hwbackends.contract import UnsupportedError

from . import winograd

#: (vector width in floats, vectors accumulated in registers at once, split chains included)
#: per ISA: AVX-512 has 32 zmm registers (16 accumulators leave room for broadcasts and
#: weights); AVX2's 16 ymm take 8 accumulators; NEON/SSE split an 8-float vector in two.
VECTORS = {"avx512": (16, 16), "default": (8, 8)}
#: Stack bytes the generated function may use for intermediate tensors. Threads other than
#: the main one often get 2–8 MiB stacks; beyond this the model is no "tiny net" either.
MAX_STACK_BYTES = 1 << 20

#: The fixed C every model.c starts with, after its vector width: its own header, then the
#: vector types and branch-free math of hwb_prelude.h (a real header beside this module,
#: found by build.py's -I).
_PRELUDE = '#include "hwb_model.h"\n#include "hwb_prelude.h"'


def _load(ptr: str, j: int, n: int, vw: int) -> str:
    """A vector of ``ptr[j:j+vw]`` (lanes past ``n`` are zero and never stored)."""
    if j + vw <= n:
        return f"*(const vfu *)({ptr} + {j})"
    return f"hwb_load_part({ptr} + {j}, {n - j})"


def _store(ptr: str, j: int, n: int, vec: str, vw: int) -> str:
    """Store ``vec`` into ``ptr[j:min(j+vw, n)]``."""
    if j + vw <= n:
        return f"*(vfu *)({ptr} + {j}) = {vec};"
    return f"__builtin_memcpy({ptr} + {j}, &{vec}, {4 * (n - j)});"


#: One constant array of generated C: ``static const TYPE NAME[N] A64 = {...};`` on one line.
_CONST_LINE = re.compile(r"static const (\w+) (\w+)\[(\d+)\]( A64)? = (\{.*\});")


def share_constants(code: str) -> str:
    """``code`` with every constant array whose type, size, alignment and values repeat an
    earlier one's written as ``#define NAME EARLIER``: the model function and its sliding
    window read the same weights (LSTM_A's 320k floats twice: 8 MB of C, twice the parse and
    twice the library), and a name is all their code uses of them."""
    seen: dict[tuple[str, str, str, str], str] = {}
    out = []
    for line in code.split("\n"):
        m = _CONST_LINE.fullmatch(line)
        if m is not None:
            typ, name, n, align, body = m.groups()
            first = seen.setdefault((typ, n, align or "", body), name)
            if first != name:
                line = f"#define {name} {first}"
        out.append(line)
    return "\n".join(out)


def c_floats(a: np.ndarray) -> str:
    """A C initializer list of ``a``'s float32 values as exact hex-float literals."""
    vals = np.asarray(a, np.float32).ravel()
    return ",".join(f"{float(v).hex()}f" if np.isfinite(v) else _nonfinite(v) for v in vals)


def _nonfinite(v: float) -> str:
    raise UnsupportedError(f"cpu.native: the model's weights hold a non-finite value ({v})")


@dataclass
class Source:
    """What :func:`emit_fp32` writes: the C text and facts about it for the metadata."""

    code: str
    stack_bytes: int
    #: how many matmuls were written as explicit vector code
    matvecs: int = 0
    #: the int8 matmul kernel (vnni-512, vnni-256, portable), "" for fp32
    int8_kernel: str = ""
    consts: list[str] = field(default_factory=list)
    #: the Conv2D layers computed by Winograd (winograd.py): name, kernel, output rows per tile
    winograd: list[dict] = field(default_factory=list)


class Emitter:
    def __init__(self, net: ir.Network, vw: int, acc: int, conv_algorithm: str = "direct"):
        self.net, self.vw, self.acc = net, vw, acc
        #: the fp32 Conv2D algorithm (target.CONV_ALGORITHMS): direct, winograd where eligible, or
        #: auto (winograd where eligible and it pays); the sliding window's emitters keep direct
        self.conv_algorithm = conv_algorithm
        #: what winograd.emit wrote, per layer (the artifact's ``meta["winograd"]``)
        self.winograd: list[dict] = []
        self.consts: list[str] = []
        self.body: list[str] = []
        self.stack = 0
        self.n = 0
        self.matvecs = 0
        #: buffers of recurrent state (bounded by 1 in magnitude)
        self.state: set[str] = set()
        #: index of the layer being emitted
        self.cur = 0
        #: index of an Act layer already applied by the layer before it (a conv's epilogue)
        self.fused = -1
        #: the chain being emitted (the network's, or a residual's branch): ``cur`` indexes it
        self.seq: list[ir.Layer] = net.layers
        #: (name, floats) of the stack buffer :meth:`input_gemm` writes: shared by every
        #: recurrent layer, each of which consumes it in its own time loop before the next
        #: layer's product is written (one buffer on the stack, not one per layer)
        self.gemm_scratch: tuple[str, int] | None = None
        #: intermediate tensors as pointers into one stack array, laid out by lifetime
        #: (:meth:`lay_out_arena`) instead of one array each: :func:`emit` sets it for a model
        #: whose tensors would not fit the stack all at once (DeepLOB's feature maps)
        self.arena = False
        #: the top-level layer being emitted (a buffer's lifetime is counted in these)
        self.step = 0
        #: per stack buffer: [floats, step made, index of its declaration in ``body``]
        self.bufs: dict[str, list[int]] = {}
        #: buffers read again by later layers than the one after their maker (input_gemm's scratch)
        self.keep: set[str] = set()

    def const(self, stem: str, a: np.ndarray) -> str:
        name = f"{stem}{len(self.consts)}"
        self.consts.append(f"static const float {name}[{max(a.size, 1)}] A64 = {{{c_floats(a) or '0'}}};")
        return name

    def buf(self, size: int) -> str:
        self.n += 1
        name = f"t{self.n}"
        self.stack += 4 * size
        self.bufs[name] = [size, self.step, len(self.body)]
        self.body.append(f"    float {name}[{size}] A64;")
        return name

    def lay_out_arena(self, last_read: dict[str, int]) -> None:
        """Put every stack buffer in one 64-byte-aligned array ``hwb_arena``, sharing space
        between buffers whose lifetimes do not meet: a buffer lives from the top-level layer
        that makes it to the last one reading it (``last_read``: the step whose input it is;
        the maker's own step otherwise; :attr:`keep` ones to the end). First fit by birth;
        :attr:`stack` becomes the array's size."""
        end = max([b[1] for b in self.bufs.values()] + list(last_read.values()) + [0]) + 1
        placed: list[tuple[int, int, int, int]] = []  # (offset, floats, born, dies)
        offsets: dict[str, int] = {}
        for name, (size, born, _) in sorted(self.bufs.items(), key=lambda kv: (kv[1][1], kv[1][2])):
            dies = end if name in self.keep else max(born, last_read.get(name, born))
            size = -(-size // 16) * 16
            off = 0
            for o, n, _b, _d in sorted(p for p in placed if not (p[3] < born or p[2] > dies)):
                if off + size <= o:
                    break
                off = max(off, o + n)
            placed.append((off, size, born, dies))
            offsets[name] = off
        for name, (_, _, line) in self.bufs.items():
            self.body[line] = f"    float *const {name} = hwb_arena + {offsets[name]};"
        total = max([o + n for o, n, _, _ in placed] + [16])
        self.body.insert(0, f"    float hwb_arena[{total}] A64;")
        self.stack = 4 * total

    def line(self, s: str) -> None:
        self.body.append("    " + s)

    def writable(self, src: str, size: int) -> str:
        """A stack copy of the ``size`` floats at ``src`` (the read-only input ``x``), for a
        layer that works in place."""
        dst = self.buf(size)
        self.line(f"for (int i = 0; i < {size}; i++) {dst}[i] = {src}[i];")
        return dst

    # -- building blocks ---------------------------------------------------------------------
    def matvec(self, segs: list[tuple[str, int]], dst: str, n_out: int, w: np.ndarray,
               bias: np.ndarray | None, accumulate: bool = False) -> None:
        """``dst[0:n_out] (+)= concat(segments) @ w (+ bias)``; ``w`` is (sum of the segment
        lengths, n_out) and ``segs`` are ``(C pointer expression, length)`` of the inputs.

        Explicit 8-float vectors (GCC/Clang vector extensions, portable across SSE, AVX2,
        AVX-512 and NEON): the outputs are taken in blocks of up to :data:`ACC` vectors held in
        registers, each input element broadcast into an FMA per vector (an axpy: no
        reassociation needed), and the input range split into interleaved chains so the FMA
        latency is hidden (``split`` accumulators per vector, summed at the end)."""
        n_in = sum(n for _, n in segs)
        self.matvecs += 1
        assert w.shape == (n_in, n_out), (w.shape, n_in, n_out)
        vw, acc = self.vw, self.acc
        nv = -(-n_out // vw)
        wp = np.zeros((n_in, nv * vw), np.float32)
        wp[:, :n_out] = w
        wn = self.const("W", wp)
        bn = None
        if bias is not None:
            bp = np.zeros(nv * vw, np.float32)
            bp[:n_out] = bias
            bn = self.const("B", bp)
        for b0 in range(0, nv, acc):
            nb = min(acc, nv - b0)
            split = max(1, min(acc // nb, 8, n_in))
            lines = []
            for k in range(nb):
                j = (b0 + k) * vw
                if accumulate:
                    first = _load(dst, j, n_out, vw)
                elif bn is not None:
                    first = f"*(const vf *)({bn} + {j})"
                else:
                    first = "(vf){0}"
                lines.append(f"vf a{k}_0 = {first};")
                lines += [f"vf a{k}_{s} = (vf){{0}};" for s in range(1, split)]
            self.line(" ".join(["{", *lines]))
            row = 0
            for src, n in segs:
                body = []
                for s in range(split):
                    body.append(f"const float v{s} = {src}[i + {s}]; "
                                f"const vf *w{s} = (const vf *)({wn} + ({row} + i + {s}) * {nv * vw}) + {b0};")
                    body += [f"a{k}_{s} += v{s} * w{s}[{k}];" for k in range(nb)]
                full = n - n % split
                if full:
                    self.line(f"  for (int i = 0; i < {full}; i += {split}) {{ " + " ".join(body) + " }")
                for t in range(full, n):  # the tail, one element per chain
                    s = t - full
                    self.line(f"  {{ const float v = {src}[{t}]; const vf *wr = (const vf *)({wn} + "
                              f"{row + t} * {nv * vw}) + {b0}; " +
                              " ".join(f"a{k}_{s} += v * wr[{k}];" for k in range(nb)) + " }")
                row += n
            for k in range(nb):
                chains = [f"a{k}_{s}" for s in range(split)]
                while len(chains) > 1:  # pairwise: a short dependency tree
                    nxt = []
                    for i in range(0, len(chains) - 1, 2):
                        self.line(f"  {chains[i]} += {chains[i + 1]};")
                        nxt.append(chains[i])
                    if len(chains) % 2:
                        nxt.append(chains[-1])
                    chains = nxt
                self.line("  " + _store(dst, (b0 + k) * vw, n_out, f"a{k}_0", vw))
            self.line("}")

    def act(self, kind: str, alpha: float, buf: str, size: int, last: int, beta: float = 0.0,
            slope: np.ndarray | None = None) -> None:
        def h(v: float) -> str:  # a float literal (inf as the largest float: -ffinite-math safe)
            v = float(np.clip(v, -3.4028234e38, 3.4028234e38))
            return f"{float(np.float32(v)).hex()}f"

        a, b = h(alpha), h(beta)
        f = {"relu": "v > 0.0f ? v : 0.0f", "leaky_relu": f"v > 0.0f ? v : {float(alpha).hex()}f * v",
             "tanh": "hwb_tanh(v)", "sigmoid": "hwb_sigmoid(v)", "gelu": "hwb_gelu(v)",
             "gelu_tanh": "0.5f * v * (1.0f + hwb_tanh(0x1.988454p-1f * (v + 0x1.6e4a8cp-5f * v * v * v)))",
             "elu": f"{b} * (v > 0.0f ? v : {a} * (hwb_exp(v < 0.0f ? v : 0.0f) - 1.0f))",
             "softplus": f"({a} * v > {b} ? v : (({a} * v > 0.0f ? {a} * v : 0.0f) + hwb_log1p01("
                         f"hwb_exp({a} * v > 0.0f ? -{a} * v : {a} * v))) / {a})",
             "clip": f"v < {a} ? {a} : (v > {b} ? {b} : v)",
             "hard_sigmoid": f"({a} * v + {b}) < 0.0f ? 0.0f : (({a} * v + {b}) > 1.0f ? 1.0f : {a} * v + {b})",
             "exp": "hwb_exp(v)", "neg": "-v", "sqrt": "__builtin_sqrtf(v)",
             "softsign": "v / (1.0f + (v < 0.0f ? -v : v))",
             }.get(kind)
        if kind == "prelu":
            s = np.asarray(slope, np.float32).ravel()
            if s.size == 1:
                f = f"v > 0.0f ? v : {h(s[0])} * v"
            else:
                if s.size != last:
                    raise UnsupportedError(f"cpu.native: a PReLU of {s.size} slopes over {last} channels")
                sn = self.const("P", s)
                self.line(f"for (int i = 0; i < {size}; i++) {{ const float v = {buf}[i]; "
                          f"{buf}[i] = v > 0.0f ? v : {sn}[i % {last}] * v; }}")
                return
        if f is not None:
            self.line(f"for (int i = 0; i < {size}; i++) {{ const float v = {buf}[i]; {buf}[i] = {f}; }}")
        elif kind == "softmax":
            self.line(f"for (int r = 0; r < {size // last}; r++) {{ float *q = {buf} + r * {last}; "
                      f"float m = q[0]; for (int i = 1; i < {last}; i++) m = q[i] > m ? q[i] : m; "
                      f"float s = 0.0f; for (int i = 0; i < {last}; i++) {{ q[i] = hwb_exp(q[i] - m); s += q[i]; }} "
                      f"const float inv = 1.0f / s; for (int i = 0; i < {last}; i++) q[i] *= inv; }}")
        elif kind == "log_softmax":  # z - log Σ e^z, z = x - max: the sum is >= 1
            self.line(f"for (int r = 0; r < {size // last}; r++) {{ float *q = {buf} + r * {last}; "
                      f"float m = q[0]; for (int i = 1; i < {last}; i++) m = q[i] > m ? q[i] : m; "
                      f"float s = 0.0f; for (int i = 0; i < {last}; i++) s += hwb_exp(q[i] - m); "
                      f"const float ls = hwb_log_ge1(s); for (int i = 0; i < {last}; i++) q[i] = (q[i] - m) - ls; }}")
        elif kind != "linear":
            raise UnsupportedError(f"cpu.native: activation {kind!r} has no C form")

    def transpose(self, src: str, shape: tuple[int, ...], o: str) -> str:
        """``(a, b) -> (b, a)``: a channels-first input as the IR's (time, channels)."""
        a, b = shape
        self.line(f"for (int i = 0; i < {a}; i++) for (int j = 0; j < {b}; j++) "
                  f"{o}[j * {a} + i] = {src}[i * {b} + j];")
        return o

    def permute(self, src: str, shape: tuple[int, ...], o: str, perm: tuple[int, ...]) -> str:
        """Output axis ``k`` is input axis ``perm[k]`` (a channels-first ``(C, H, W)`` input as
        the IR's ``(H, W, C)``, and back): nested loops over the output, read by strides."""
        strides = [int(np.prod(shape[a + 1:])) for a in range(len(shape))]
        dims = [shape[p] for p in perm]
        loops = " ".join(f"for (int i{k} = 0; i{k} < {d}; i{k}++)" for k, d in enumerate(dims))
        out_idx = " + ".join(f"i{k} * {int(np.prod(dims[k + 1:]))}" for k in range(len(dims)))
        in_idx = " + ".join(f"i{k} * {strides[p]}" for k, p in enumerate(perm))
        self.line(f"{loops} {o}[{out_idx}] = {src}[{in_idx}];")
        return o

    # -- layers --------------------------------------------------------------------------------
    def layer(self, layer: ir.Layer, src: str, shape: tuple[int, ...], dst: str | None,
              out_shape: tuple[int, ...]) -> str:
        """Emit ``layer`` reading ``src``; returns the buffer holding its output (``dst`` when
        the layer produces a new tensor and ``dst`` is given, else a new stack buffer, or
        ``src`` itself for in-place layers)."""
        size = int(np.prod(out_shape))

        def out() -> str:
            return dst if dst is not None else self.buf(size)

        if isinstance(layer, (ir.Act, ir.Affine)) and src == "x" and self.fused != self.cur:
            src = self.writable(src, size)  # element-wise layers work in place; x is read-only
        if isinstance(layer, ir.Act):
            if self.fused == self.cur:
                return src
            self.act(layer.kind, layer.alpha, src, size, out_shape[-1], layer.beta, layer.slope)
            return src
        if isinstance(layer, (ir.Flatten, ir.Reshape)) or _moves_ones(layer, shape):
            return self.same_floats(src, dst, size)
        if isinstance(layer, ir.Affine):
            # an affine rescales: recurrent state after it is no longer bounded by 1 (int8)
            self.state.discard(src)
            s, h = self.const("S", layer.scale), self.const("H", layer.shift)
            c = shape[-1]
            self.line(f"for (int r = 0; r < {size // c}; r++) for (int i = 0; i < {c}; i++) "
                      f"{src}[r * {c} + i] = {src}[r * {c} + i] * {s}[i] + {h}[i];")
            return src
        if isinstance(layer, ir.Dense) and len(shape) == 2:  # per time step
            return self.per_step(src, shape, out(), layer.w, layer.b)
        if isinstance(layer, ir.Dense):
            o = out()
            self.matvec([(src, shape[0])], o, out_shape[0], layer.w, layer.b)
            return o
        if isinstance(layer, ir.Conv1D):
            return self.conv(layer, src, shape, out(), out_shape)
        if isinstance(layer, ir.Pool1D):
            o, c = out(), shape[1]
            op = "m = v > m ? v : m;" if layer.kind == "max" else "m += v;"
            fin = "m" if layer.kind == "max" else f"m / {float(layer.size).hex()}f"
            first = f"{src}[(t * {layer.stride}) * {c} + ch]"
            self.line(f"for (int t = 0; t < {out_shape[0]}; t++) for (int ch = 0; ch < {c}; ch++) {{ "
                      f"float m = {first}; for (int k = 1; k < {layer.size}; k++) {{ "
                      f"const float v = {src}[(t * {layer.stride} + k) * {c} + ch]; {op} }} "
                      f"{o}[t * {c} + ch] = {fin}; }}")
            return o
        if isinstance(layer, ir.GlobalPool1D):
            o, (t_len, c) = out(), shape
            op = f"{o}[ch] = v > {o}[ch] ? v : {o}[ch];" if layer.kind == "max" else f"{o}[ch] += v;"
            self.line(f"for (int ch = 0; ch < {c}; ch++) {o}[ch] = {src}[ch];")
            self.line(f"for (int t = 1; t < {t_len}; t++) for (int ch = 0; ch < {c}; ch++) "
                      f"{{ const float v = {src}[t * {c} + ch]; {op} }}")
            if layer.kind == "avg":
                self.line(f"for (int ch = 0; ch < {c}; ch++) {o}[ch] /= {float(t_len).hex()}f;")
            return o
        if isinstance(layer, ir.Recurrent):
            return self.recurrent(layer, src, shape, out())
        if isinstance(layer, _DESK):
            return self.desk(layer, src, shape, out(), out_shape)
        raise UnsupportedError(f"cpu.native cannot emit layer {layer.name!r} ({type(layer).__name__})")

    def same_floats(self, src: str, dst: str | None, size: int) -> str:
        """A layer that keeps the floats in their order (Flatten, Reshape, a Transpose of
        size-1 axes): ``src`` itself, or copied into ``dst`` (the model's output)."""
        if dst is None or src == dst:
            return src
        self.line(f"for (int i = 0; i < {size}; i++) {dst}[i] = {src}[i];")
        return dst

    def conv(self, layer: ir.Conv1D, src: str, shape: tuple[int, ...], o: str,
             out_shape: tuple[int, ...]) -> str:
        """Per output step one matvec over the window: channels-last, so with dilation 1 the
        window ``x[t·s : t·s+k]`` is ``k·c_in`` contiguous floats and the kernel, flattened to
        ``(k·c_in, c_out)``, is a Dense's weights; with dilation, one segment per tap."""
        t_in, ci = shape
        k, _, co = layer.w.shape
        left, right = layer.pad
        if left or right:  # a zero-padded copy of the input, so the loop below has no edges
            padded = self.buf((t_in + left + right) * ci)
            self.line(f"for (int i = 0; i < {(t_in + left + right) * ci}; i++) {padded}[i] = 0.0f;")
            self.line(f"for (int i = 0; i < {t_in * ci}; i++) {padded}[{left * ci} + i] = {src}[i];")
            src = padded
        base = f"({src} + t * {layer.stride * ci}"
        start = 0
        if layer.dilation == 1:
            segs = [(base + ")", k * ci)]
            start = self.conv_tiles(layer, src, o, out_shape)
        else:
            segs = [(base + f" + {j * layer.dilation * ci})", ci) for j in range(k)]
        if start >= out_shape[0]:
            return o
        self.line(f"for (int t = {start}; t < {out_shape[0]}; t++) {{")
        self.matvec(segs, f"({o} + t * {co})", co, layer.w.reshape(k * ci, co), layer.b)
        self.line("}")
        return o

    def conv_tiles(self, layer: ir.Conv1D, src: str, o: str, out_shape: tuple[int, ...]) -> int:
        """Register tiling over time: ``tb`` output steps share each weight vector load, each
        with its own accumulators (``tb`` independent FMA chains per output vector, where one
        step alone is one chain of ``k·c_in`` dependent FMAs). ``tb`` is chosen so the steps
        split into tiles of near-equal size (30 steps: 2 × 15, not 3 × 8 and a tail of 6 run
        one by one), and a following ReLU/LeakyReLU is applied before the store (the
        activation's own pass over the tensor is skipped: :attr:`fused`). Returns the first
        step left for the one-step loop (none here unless tiling does not pay)."""
        k, ci, co = layer.w.shape
        vw = self.vw
        nv = -(-co // vw)
        t_out = out_shape[0]
        # accumulators per tile: one vector each, a register left for the weights
        tmax = min(15, self.acc // nv if nv > 1 else self.acc - 1)
        if tmax < 2 or t_out < 2:
            return 0
        ntiles = -(-t_out // tmax)
        tb = -(-t_out // ntiles)
        n = k * ci
        wp = np.zeros((n, nv * vw), np.float32)
        wp[:, :co] = layer.w.reshape(n, co)
        bp = np.zeros(nv * vw, np.float32)
        bp[:co] = layer.b
        wn, bn = self.const("W", wp), self.const("B", bp)
        self.matvecs += 1
        nxt = self.seq[self.cur + 1] if self.cur + 1 < len(self.seq) else None
        epi = ""
        if isinstance(nxt, ir.Act) and nxt.kind in ("relu", "leaky_relu"):
            self.fused = self.cur + 1
            epi = ("{0} = hwb_vrelu({0});" if nxt.kind == "relu"
                   else f"{{0}} = hwb_vleaky({{0}}, {float(nxt.alpha).hex()}f);")
        step = layer.stride * ci
        full = t_out - t_out % tb
        for t0, cnt, nb in ((0, full, tb), (full, t_out - full, t_out - full)):
            if cnt <= 0:
                continue
            loop = f"for (int t = {t0}; t < {t0 + cnt}; t += {nb})" if cnt > nb else f"{{ const int t = {t0};"
            self.line(f"{loop} {{ " + " ".join(
                f"vf a{r}_{j} = *(const vf *)({bn} + {j * vw});" for r in range(nb) for j in range(nv)))
            self.line(f"  for (int i = 0; i < {n}; i++) {{ const vf *wr = (const vf *)({wn} + i * {nv * vw}); " +
                      " ".join(f"const float v{r} = {src}[(t + {r}) * {step} + i];" for r in range(nb)) + " " +
                      " ".join(f"a{r}_{j} += v{r} * wr[{j}];" for r in range(nb) for j in range(nv)) + " }")
            for r in range(nb):
                for j in range(nv):
                    name = f"a{r}_{j}"
                    if epi:
                        self.line("  " + epi.format(name))
                    self.line("  " + _store(f"({o} + (t + {r}) * {co})", j * vw, co, name, vw))
            self.line("}" if cnt > nb else "} }")
        return t_out

    # -- the layers over (rows, cols, channels), and a concatenation of branches -------------
    def spatial(self, layer: ir.Layer, src: str, shape: tuple[int, ...], o: str,
                out_shape: tuple[int, ...]) -> str:
        if isinstance(layer, ir.Conv2D):
            return self.conv2d(layer, src, shape, o, out_shape)
        if isinstance(layer, ir.Pool2D):
            return self.pool2d(layer, src, shape, o, out_shape)
        if isinstance(layer, ir.Pad2D):
            return self.pad2d(layer, src, shape, o, out_shape)
        assert isinstance(layer, ir.Concat)
        parts = [(self.chain(b, src, shape), ir_chain_shape(b, shape)) for b in layer.branches]
        rows, width, off = int(np.prod(out_shape[:-1])), out_shape[-1], 0
        for part, s in parts:
            c = s[-1]
            self.line(f"for (int r = 0; r < {rows}; r++) for (int i = 0; i < {c}; i++) "
                      f"{o}[r * {width} + {off} + i] = {part}[r * {c} + i];")
            off += c
        return o

    def padded_2d(self, src: str, shape: tuple[int, ...], pad: tuple[tuple[int, int], tuple[int, int]],
                  fill: str = "0.0f") -> tuple[str, int]:
        """``src`` in a copy with ``pad`` cells of ``fill`` around it (``src`` itself when there
        is no padding), so a window's loops have no edges; the buffer and its row width."""
        h, w, c = shape
        (pt, pb), (pl, pr) = pad
        wp = w + pl + pr
        if not (pt or pb or pl or pr):
            return src, w
        n = (h + pt + pb) * wp * c
        dst = self.buf(n)
        if pl or pr:
            self.line(f"for (int i = 0; i < {n}; i++) {dst}[i] = {fill};")
        else:  # rows only: the input is one run, the padding two
            self.line(f"for (int i = 0; i < {pt * wp * c}; i++) {dst}[i] = {fill};")
            self.line(f"for (int i = {(pt + h) * wp * c}; i < {n}; i++) {dst}[i] = {fill};")
        self.line(f"for (int r = 0; r < {h}; r++) for (int i = 0; i < {w * c}; i++) "
                  f"{dst}[((r + {pt}) * {wp} + {pl}) * {c} + i] = {src}[r * {w * c} + i];")
        return dst, wp

    @staticmethod
    def conv2d_taps(layer: ir.Conv2D, wp: int, ci: int) -> list[tuple[int, int, int]]:
        """The kernel as contiguous runs of the padded input: ``(offset in floats from a
        window's first cell, length, first row of the flattened kernel)``; with column dilation
        1 a kernel row's ``kw·c_in`` floats are one run."""
        kh, kw = layer.w.shape[:2]
        (dh, dw) = layer.dilation
        if dw == 1:
            return [(dy * dh * wp * ci, kw * ci, dy * kw * ci) for dy in range(kh)]
        return [((dy * dh * wp + dx * dw) * ci, ci, (dy * kw + dx) * ci) for dy in range(kh) for dx in range(kw)]

    def conv2d(self, layer: ir.Conv2D, src: str, shape: tuple[int, ...], o: str,
               out_shape: tuple[int, ...]) -> str:
        """Per output cell one matvec over its window (the kernel flattened to ``(kh·kw·c_in,
        c_out)``, one segment per contiguous run of the padded input: :meth:`conv2d_taps`),
        register-tiled over cells in fp32 (:meth:`conv2d_tiles`)."""
        if self.conv_algorithm != "direct" and winograd.eligible(layer) and (
                self.conv_algorithm == "winograd" or winograd.pays(layer, out_shape)):
            return winograd.emit(self, layer, src, shape, o, out_shape)
        ci = shape[2]
        kh, kw, _, co = layer.w.shape
        src, wp = self.padded_2d(src, shape, layer.pad)
        oh, ow, _ = out_shape
        taps = self.conv2d_taps(layer, wp, ci)
        start = self.conv2d_tiles(layer, src, o, out_shape, taps, wp, ci)
        cells = oh * ow
        if start >= cells:
            return o
        base = _cell_base("p", ow, layer.stride, wp, ci)
        self.line(f"for (int p = {start}; p < {cells}; p++) {{ const int b = {base};")
        self.matvec([(f"({src} + b + {off})", n) for off, n, _ in taps], f"({o} + p * {co})", co,
                    layer.w.reshape(kh * kw * ci, co), layer.b)
        self.line("}")
        return o

    def conv2d_tiles(self, layer: ir.Conv2D, src: str, o: str, out_shape: tuple[int, ...],
                     taps: list[tuple[int, int, int]], wp: int, ci: int) -> int:
        """Register tiling over output cells, as :meth:`conv_tiles` over steps: ``tb`` cells
        (consecutive in row-major order, each with its own window's first input cell) share
        each weight vector load, each with its own accumulators, the loops running over the
        kernel's contiguous runs; a following ReLU/LeakyReLU applied before the store. Returns
        the first cell left for the one-cell loop (none unless tiling does not pay)."""
        kh, kw, _, co = layer.w.shape
        vw = self.vw
        nv = -(-co // vw)
        oh, ow, _ = out_shape
        cells = oh * ow
        # AVX-512's 32 registers hold 24 accumulators beside the weight vectors and the
        # broadcasts (informal, DeepLOB's (4, 1) convs on a loaded SPR: 6-12 % faster than 16)
        acc = self.acc + 8 if self.vw == 16 else self.acc
        tmax = min(15, acc // nv if nv > 1 else acc - 1)
        if tmax < 2 or cells < 2:
            return 0
        ntiles = -(-cells // tmax)
        tb = -(-cells // ntiles)
        n = kh * kw * ci
        wpad = np.zeros((n, nv * vw), np.float32)
        wpad[:, :co] = layer.w.reshape(n, co)
        bp = np.zeros(nv * vw, np.float32)
        bp[:co] = layer.b
        wn, bn = self.const("W", wpad), self.const("B", bp)
        self.matvecs += 1
        nxt = self.seq[self.cur + 1] if self.cur + 1 < len(self.seq) else None
        epi = ""
        if isinstance(nxt, ir.Act) and nxt.kind in ("relu", "leaky_relu"):
            self.fused = self.cur + 1
            epi = ("{0} = hwb_vrelu({0});" if nxt.kind == "relu"
                   else f"{{0}} = hwb_vleaky({{0}}, {float(nxt.alpha).hex()}f);")
        # the kernel's runs as loops: per kernel row (and per column when columns are dilated)
        (dh, dw), run = layer.dilation, taps[0][1]
        if dw == 1:
            outer = f"for (int q = 0; q < {kh}; q++) {{ const int oq = q * {dh * wp * ci}; " \
                    f"const float *wq = {wn} + q * {kw * ci * nv * vw};"
        else:
            outer = (f"for (int q = 0; q < {kh * kw}; q++) {{ const int oq = (q / {kw}) * {dh * wp * ci} + "
                     f"(q % {kw}) * {dw * ci}; const float *wq = {wn} + q * {ci * nv * vw};")
        full = cells - cells % tb
        for p0, cnt, nb in ((0, full, tb), (full, cells - full, cells - full)):
            if cnt <= 0:
                continue
            loop = f"for (int p = {p0}; p < {p0 + cnt}; p += {nb})" if cnt > nb else f"{{ const int p = {p0};"
            self.line(f"{loop} {{ " + " ".join(
                f"const float *s{r} = {src} + {_cell_base(f'p + {r}', ow, layer.stride, wp, ci)};"
                for r in range(nb)) + " " + " ".join(
                f"vf a{r}_{j} = *(const vf *)({bn} + {j * vw});" for r in range(nb) for j in range(nv)))
            self.line("  " + outer)
            self.line(f"    for (int i = 0; i < {run}; i++) {{ const vf *wr = (const vf *)(wq + i * {nv * vw}); " +
                      " ".join(f"const float v{r} = s{r}[oq + i];" for r in range(nb)) + " " +
                      " ".join(f"a{r}_{j} += v{r} * wr[{j}];" for r in range(nb) for j in range(nv)) + " } }")
            for r in range(nb):
                for j in range(nv):
                    name = f"a{r}_{j}"
                    if epi:
                        self.line("  " + epi.format(name))
                    self.line("  " + _store(f"({o} + (p + {r}) * {co})", j * vw, co, name, vw))
            self.line("}" if cnt > nb else "} }")
        return cells

    def pool2d(self, layer: ir.Pool2D, src: str, shape: tuple[int, ...], o: str,
               out_shape: tuple[int, ...]) -> str:
        """Per output cell and channel the max or mean over the window's cells inside the input
        (padded cells skipped: they never win a max, and count in a mean only with
        ``count_pad``); the channel loop innermost, over contiguous floats."""
        h, w, c = shape
        oh, ow, _ = out_shape
        (kh, kw), (sh, sw), (dh, dw) = layer.size, layer.stride, layer.dilation
        (pt, _), (pl, _) = layer.pad
        mx = layer.kind == "max"
        init = "-__builtin_inff()" if mx else "0.0f"
        op = "q[ch] = v > q[ch] ? v : q[ch];" if mx else "q[ch] += v;"
        fin = ""
        if not mx:
            div = f"{float(np.float32(1.0 / (kh * kw))).hex()}f" if layer.count_pad else "1.0f / (float)cnt"
            fin = f" const float inv = {div}; for (int ch = 0; ch < {c}; ch++) q[ch] *= inv;"
        # (loop names other than x and y: those are the function's input and output)
        self.line(f"for (int oy = 0; oy < {oh}; oy++) for (int ox = 0; ox < {ow}; ox++) {{ "
                  f"float *q = {o} + (oy * {ow} + ox) * {c}; int cnt = 0; "
                  f"for (int ch = 0; ch < {c}; ch++) q[ch] = {init}; "
                  f"for (int i = 0; i < {kh}; i++) {{ const int iy = oy * {sh} - {pt} + i * {dh}; "
                  f"if (iy < 0 || iy >= {h}) continue; "
                  f"for (int j = 0; j < {kw}; j++) {{ const int ix = ox * {sw} - {pl} + j * {dw}; "
                  f"if (ix < 0 || ix >= {w}) continue; cnt++; const float *r = {src} + (iy * {w} + ix) * {c}; "
                  f"for (int ch = 0; ch < {c}; ch++) {{ const float v = r[ch]; {op} }} }} }}"
                  f"{fin} (void)cnt; }}")
        return o

    def pad2d(self, layer: ir.Pad2D, src: str, shape: tuple[int, ...], o: str,
              out_shape: tuple[int, ...]) -> str:
        """Constant padding: the value everywhere, then the input's rows; reflect / edge: each
        output cell copied from the input cell a table of rows and one of columns name."""
        h, w, c = shape
        hp, wp, _ = out_shape
        (pt, _), (pl, _) = layer.pad
        if layer.mode == "constant":
            v = f"{float(np.float32(layer.value)).hex()}f"
            self.line(f"for (int i = 0; i < {hp * wp * c}; i++) {o}[i] = {v};")
            self.line(f"for (int r = 0; r < {h}; r++) for (int i = 0; i < {w * c}; i++) "
                      f"{o}[((r + {pt}) * {wp} + {pl}) * {c} + i] = {src}[r * {w * c} + i];")
            return o
        mode = {"reflect": "reflect", "edge": "edge"}.get(layer.mode)
        if mode is None:
            raise UnsupportedError(f"cpu.native cannot emit layer {layer.name!r} (Pad2D): mode "
                                   f"{layer.mode!r} (constant, reflect or edge)")
        rows = np.pad(np.arange(h), layer.pad[0], mode=mode)
        cols = np.pad(np.arange(w), layer.pad[1], mode=mode)
        rn = self.const_index(rows)
        cn = self.const_index(cols)
        self.line(f"for (int r = 0; r < {hp}; r++) for (int k = 0; k < {wp}; k++) for (int i = 0; i < {c}; i++) "
                  f"{o}[(r * {wp} + k) * {c} + i] = {src}[({rn}[r] * {w} + {cn}[k]) * {c} + i];")
        return o

    def const_index(self, a: np.ndarray) -> str:
        name = f"I{len(self.consts)}"
        self.consts.append(f"static const int {name}[{max(a.size, 1)}] = {{{','.join(map(str, a.ravel().tolist())) or '0'}}};")
        return name

    def recurrent(self, layer: ir.Recurrent, src: str, shape: tuple[int, ...], o: str) -> str:
        """The window unrolled as a loop over time steps; per step the gate pre-activations
        are one matvec over ``[x_t, h]`` (kernel and recurrent kernel stacked), then the
        element-wise gate loop (vectorised by the compiler: ``hwb_exp`` is inline)."""
        t_len, ci = shape
        u = layer.units
        gates = 4 if layer.cell == "lstm" else 3
        # h lives in the output buffer when only the last state is returned
        h = self.buf(u) if layer.return_sequences else o
        self.state.add(h)  # |h| <= 1 (int8: a fixed scale)
        self.line(f"for (int j = 0; j < {u}; j++) {h}[j] = 0.0f;")
        z = self.buf(-(-gates * u // self.vw) * self.vw)  # whole vectors: input_gemm writes them
        xt = f"({src} + t * {ci})"
        if layer.cell == "lstm" and self.blocked_input(t_len):
            c = self.buf(u)
            self.line(f"for (int j = 0; j < {u}; j++) {c}[j] = 0.0f;")
            self.lstm_blocked(layer, src, t_len, ci, z, c, h, o)
            return o
        if layer.cell == "lstm":  # the int8 emitter: one quantised matvec over [x_t, h] per step
            c = self.buf(u)
            self.line(f"for (int j = 0; j < {u}; j++) {c}[j] = 0.0f;")
            self.line(f"for (int t = 0; t < {t_len}; t++) {{")
            self.matvec([(xt, ci), (h, u)], z, gates * u,
                        np.concatenate([layer.kernel, layer.recurrent]), layer.bias)
            self.lstm_gates(z, c, h, u)
        elif layer.reset_after:
            hz = self.buf(gates * u)
            self.line(f"for (int t = 0; t < {t_len}; t++) {{")
            self.matvec([(xt, ci)], z, 3 * u, layer.kernel, layer.bias[0])
            self.matvec([(h, u)], hz, 3 * u, layer.recurrent, layer.bias[1])
            self.line(f"  for (int j = 0; j < {u}; j++) {{ const float zg = hwb_sigmoid({z}[j] + {hz}[j]), "
                      f"rg = hwb_sigmoid({z}[{u} + j] + {hz}[{u} + j]), "
                      f"hh = hwb_tanh({z}[{2 * u} + j] + rg * {hz}[{2 * u} + j]); "
                      f"{h}[j] = zg * {h}[j] + (1.0f - zg) * hh; }}")
        else:  # the candidate's recurrent term reads r·h: a second matvec after the gates
            hz = self.buf(2 * u)
            rh = self.buf(u)
            self.state.add(rh)
            zero = np.zeros((u, u), np.float32)
            self.line(f"for (int t = 0; t < {t_len}; t++) {{")
            self.matvec([(xt, ci), (h, u)], z, 3 * u,
                        np.concatenate([layer.kernel,
                                        np.concatenate([layer.recurrent[:, :2 * u], zero], 1)]),
                        layer.bias)
            self.line(f"  for (int j = 0; j < {2 * u}; j++) {hz}[j] = hwb_sigmoid({z}[j]);")
            self.line(f"  for (int j = 0; j < {u}; j++) {rh}[j] = {hz}[{u} + j] * {h}[j];")
            self.matvec([(rh, u)], f"({z} + {2 * u})", u, np.ascontiguousarray(layer.recurrent[:, 2 * u:]),
                        None, accumulate=True)
            self.line(f"  for (int j = 0; j < {u}; j++) {{ const float zg = {hz}[j], "
                      f"hh = hwb_tanh({z}[{2 * u} + j]); {h}[j] = zg * {h}[j] + (1.0f - zg) * hh; }}")
        if layer.return_sequences:
            self.line(f"  for (int j = 0; j < {u}; j++) {o}[t * {u} + j] = {h}[j];")
        self.line("}")
        return o

    #: time steps per register tile of :meth:`input_gemm` (its output vectors: ``acc`` / this).
    #: Informally (rdtsc, LSTM_A's 50×100·100×400 on a loaded Zen 4): 8 steps × 2 vectors
    #: 97k TSC ticks, 4 × 4 118k, 2 × 8 117k; 97k is one 16-float FMA per core cycle.
    GEMM_STEPS = 8

    #: the most bytes of input products :meth:`lstm_blocked` holds at once (a chunk of steps)
    GEMM_CHUNK_BYTES = MAX_STACK_BYTES // 4

    def blocked_input(self, t_len: int) -> bool:
        """Whether an LSTM's input projections are blocked products over many steps
        (:meth:`lstm_blocked`): fp32 (the int8 emitter quantises per matvec) and more than
        one step."""
        return type(self).matvec is Emitter.matvec and t_len > 1

    def gemm_chunk(self, t_len: int, gp: int) -> int:
        """Steps per blocked input product: all ``t_len`` when their products (``gp`` floats a
        step) fit in :data:`GEMM_CHUNK_BYTES`, else the fewest chunks that do, of about equal
        length in whole register tiles (:data:`GEMM_STEPS`): rounded up where that still fits,
        else down."""
        most = max(1, self.GEMM_CHUNK_BYTES // (4 * gp))
        if t_len <= most:
            return t_len
        n = -(-t_len // most)
        steps = -(-t_len // n)
        tiled = -(-steps // self.GEMM_STEPS) * self.GEMM_STEPS
        if tiled > most:
            tiled = most // self.GEMM_STEPS * self.GEMM_STEPS
        return tiled or steps

    def lstm_blocked(self, layer: ir.Recurrent, src: str, t_len: int, ci: int, z: str, c: str,
                     h: str, o: str) -> None:
        """An LSTM's time loop with its input projections ``K·x_t + ...`` computed ahead as
        blocked products (:meth:`input_gemm`) over chunks of :meth:`gemm_chunk` steps, so each
        step's matvec reads only the recurrent kernel ``R``: a stacked ``[x_t, h]`` matvec
        would stream ``K`` and ``R`` every step (LSTM_B's 1.4 MB a step, past L2; ``R`` alone
        is 640 KB). z_t = (R·h + b) + K·x_t, both products :meth:`input_gemm`'s, summed as
        the sliding window's push and prepare sum them
        (hwb_plugins/cpu_native/sliding.py), so the two forms agree bit for bit; chunking does not
        change any sum. Chunks bound the products' stack buffer (LSTM_B's 100 steps × 800
        would take 320 KB)."""
        u, g = layer.units, 4 * layer.units
        gp = -(-g // self.vw) * self.vw
        chunk = self.gemm_chunk(t_len, gp)
        full = t_len - t_len % chunk
        if self.gemm_scratch is None or self.gemm_scratch[1] < chunk * gp:
            self.gemm_scratch = (self.buf(chunk * gp), chunk * gp)  # declared outside the loops
            self.keep.add(self.gemm_scratch[0])
        for t0, steps, loop in ((0, chunk, full > chunk), (full, t_len - full, False)):
            if steps == 0:
                continue
            if loop:
                self.line(f"for (int t0 = 0; t0 < {full}; t0 += {chunk}) {{")
                base = "t0"
            else:
                self.line("{")
                base = str(t0)
            zx, gp = self.input_gemm(f"({src} + {base} * {ci})", steps, ci, layer.kernel)
            self.line(f"for (int t = {base}; t < {base} + {steps}; t++) {{")
            self.input_gemm(h, 1, u, layer.recurrent, dst=z, bias=layer.bias)
            self.line(f"  for (int j = 0; j < {g}; j++) {z}[j] += {zx}[(t - {base}) * {gp} + j];")
            self.lstm_gates(z, c, h, u)
            if layer.return_sequences:
                self.line(f"  for (int j = 0; j < {u}; j++) {o}[t * {u} + j] = {h}[j];")
            self.line("} }")

    def input_gemm(self, src: str, t_len: int, ci: int, w: np.ndarray,
                   dst: str | None = None, *, bias: np.ndarray | None = None,
                   src_stride: int | None = None, dst_stride: int | None = None) -> tuple[str, int]:
        """``zx[t] = src[t] @ w (+ bias)`` for every step as one blocked matrix product: a
        register tile of :data:`GEMM_STEPS` steps × ``acc / GEMM_STEPS`` output vectors, so
        each weight vector loaded serves 8 steps and each broadcast input both vectors; the
        tile's slice of ``w`` (``ci`` rows × its vectors, 13 KiB for LSTM_A's shape) stays in
        L1 beside the input over the steps. Each output's sum starts from its bias (or 0) and
        runs over the inputs in order from 0 whatever the tile, so every tile shape gives the
        same bits: an LSTM's products ``K·x_t`` and ``R·h + b`` are this one code whether they
        run on one step (the full window's recurrence, the sliding push), on many steps (the
        full window's input projections) or on many windows' states at once (the sliding
        prepare). ``src_stride`` / ``dst_stride``: floats between rows of ``src`` / ``dst``
        (default ``ci`` / the padded output width). ``dst``: where to write (64-byte aligned,
        rows of whole vectors), else a new stack buffer. Returns the buffer and its row stride
        (a whole number of vectors)."""
        vw = self.vw
        n_out = w.shape[1]
        nv = -(-n_out // vw)
        gp = nv * vw
        wp = np.zeros((ci, gp), np.float32)
        wp[:, :n_out] = w
        wn = self.const("W", wp)
        bn = None
        if bias is not None:
            bp = np.zeros(gp, np.float32)
            bp[:n_out] = bias
            bn = self.const("B", bp)
        sx = ci if src_stride is None else src_stride
        if dst is not None:
            zx = dst
        elif self.gemm_scratch is not None and self.gemm_scratch[1] >= t_len * gp:
            zx = self.gemm_scratch[0]
        else:
            zx = self.buf(t_len * gp)
            self.gemm_scratch = (zx, t_len * gp)
            self.keep.add(zx)
        sy = gp if dst_stride is None else dst_stride
        assert sy >= gp and sy % vw == 0, (sy, gp, vw)
        ts = min(self.GEMM_STEPS, t_len)  # one step (the push): all accumulators on outputs
        per = max(1, self.acc // ts)
        full = t_len - t_len % ts

        def tile(t: str, steps: int, b0: int, nb: int) -> None:
            init = " ".join(f"vf a{s}_{k} = {'(vf){0}' if bn is None else f'*(const vf *)({bn} + {(b0 + k) * vw})'};"
                            for s in range(steps) for k in range(nb))
            xs = " ".join(f"const float x{s} = {src}[({t} + {s}) * {sx} + i];" for s in range(steps))
            fma = " ".join(f"a{s}_{k} += x{s} * wr[{k}];" for s in range(steps) for k in range(nb))
            st = " ".join(f"*(vf *)({zx} + ({t} + {s}) * {sy} + {(b0 + k) * vw}) = a{s}_{k};"
                          for s in range(steps) for k in range(nb))
            self.line(f"  {{ {init}")
            self.line(f"    for (int i = 0; i < {ci}; i++) {{ const vf *wr = (const vf *)({wn} + i * {gp}) + {b0}; "
                      f"{xs} {fma} }}")
            self.line(f"    {st} }}")

        for b0 in range(0, nv, per):
            nb = min(per, nv - b0)
            if full:
                self.line(f"for (int t = 0; t < {full}; t += {ts}) {{")
                tile("t", ts, b0, nb)
                self.line("}")
            if t_len > full:
                tile(str(full), t_len - full, b0, nb)
        return zx, gp

    def lstm_gates(self, z: str, c: str, h: str, u: int) -> None:
        """``c = σ(f)·c + σ(i)·tanh(g)``, ``h = σ(o)·tanh(c)`` with two divisions per unit,
        not five: σ(a) = 1/(1+e^-a), tanh(a) = sign·n/(1+e^-2|a|), so each product of such
        quotients is one quotient (a vector division costs several exp polynomials). The σ
        arguments are clamped at -40 (σ(-40) = 4e-18) so the products of three e^-a stay finite;
        near 0, tanh's numerator is its Taylor series times the denominator (no cancellation
        in 1 - e)."""
        def tanh_parts(v: str, p: str) -> str:
            return (f"const float {p}a = {v} < 0.0f ? -{v} : {v}, {p}e = hwb_exp_le88(-2.0f * {p}a), "
                    f"{p}d = 1.0f + {p}e, {p}q = {p}a * {p}a, {p}s = {p}a * (1.0f + {p}q * (-0.333333333f + "
                    f"{p}q * (0.133333333f + {p}q * -0.0539682540f))), "
                    f"{p}m = {p}a < 0.0625f ? {p}s * {p}d : 1.0f - {p}e, {p}n = {v} < 0.0f ? -{p}m : {p}m;")

        def e_neg(v: str) -> str:
            return f"hwb_exp_le88(-({v} < -40.0f ? -40.0f : {v}))"

        self.line(f"  for (int j = 0; j < {u}; j++) {{ const float di = 1.0f + {e_neg(f'{z}[j]')}, "
                  f"df = 1.0f + {e_neg(f'{z}[{u} + j]')}, do_ = 1.0f + {e_neg(f'{z}[{3 * u} + j]')}, "
                  f"zg = {z}[{2 * u} + j]; {tanh_parts('zg', 'g')} const float dig = di * gd; "
                  f"const float cc = ({c}[j] * dig + gn * df) / (df * dig); {c}[j] = cc; "
                  f"{tanh_parts('cc', 'c')} {h}[j] = cn / (do_ * cd); }}")


    # -- the desk layers: padding, slicing, residuals, layer norm, bidirectional, attention,
    # -- a channels-first input's transpose
    def desk(self, layer: ir.Layer, src: str, shape: tuple[int, ...], o: str,
             out_shape: tuple[int, ...]) -> str:
        if isinstance(layer, _SPATIAL):
            return self.spatial(layer, src, shape, o, out_shape)
        size, c = int(np.prod(out_shape)), shape[-1]
        if isinstance(layer, ir.Pad1D):
            left = layer.pad[0] * c
            self.line(f"for (int i = 0; i < {size}; i++) {o}[i] = 0.0f;")
            self.line(f"for (int i = 0; i < {int(np.prod(shape))}; i++) {o}[{left} + i] = {src}[i];")
        elif isinstance(layer, ir.TimeSlice):
            self.line(f"for (int i = 0; i < {size}; i++) {o}[i] = {src}[{layer.start * c} + i];")
        elif isinstance(layer, ir.LayerNorm):
            g, b = self.const("G", layer.gamma), self.const("H", layer.beta)
            self.line(f"for (int r = 0; r < {size // c}; r++) {{ const float *q = {src} + r * {c}; "
                      f"float m = 0.0f, v = 0.0f; for (int i = 0; i < {c}; i++) m += q[i]; m *= "
                      f"{float(np.float32(1.0 / c)).hex()}f; for (int i = 0; i < {c}; i++) {{ const float "
                      f"d = q[i] - m; v += d * d; }} const float inv = 1.0f / __builtin_sqrtf(v * "
                      f"{float(np.float32(1.0 / c)).hex()}f + {float(np.float32(layer.eps)).hex()}f); "
                      f"for (int i = 0; i < {c}; i++) {o}[r * {c} + i] = (q[i] - m) * inv * {g}[i] + {b}[i]; }}")
        elif isinstance(layer, ir.Residual):
            body = self.chain(layer.body, src, shape)
            short = self.chain(layer.shortcut, src, shape)
            self.line(f"for (int i = 0; i < {size}; i++) {o}[i] = {body}[i] + {short}[i];")
        elif isinstance(layer, ir.Bidirectional):
            self.bidirectional(layer, src, shape, o)
        elif isinstance(layer, ir.Transpose) and tuple(layer.perm) == (1, 0):
            self.transpose(src, shape, o)
        elif isinstance(layer, ir.Transpose):
            self.permute(src, shape, o, tuple(layer.perm))
        else:
            self.attention(layer, src, shape, o)  # type: ignore[arg-type]
        return o

    def chain(self, layers: list[ir.Layer], src: str, shape: tuple[int, ...]) -> str:
        """Emit a residual branch reading ``src`` (left intact: element-wise layers before the
        branch's first new tensor work on a copy); the buffer holding its output."""
        saved = (self.seq, self.cur, self.fused)
        self.seq, self.fused, cur = layers, -1, src
        for i, layer in enumerate(layers):
            if cur == src and isinstance(layer, (ir.Act, ir.Affine)):
                cur = self.writable(src, int(np.prod(shape)))
            self.cur = i
            out_shape = layer.out_shape(shape)
            cur = self.layer(layer, cur, shape, None, out_shape)
            shape = out_shape
        self.seq, self.cur, self.fused = saved
        return cur

    def per_step(self, src: str, shape: tuple[int, ...], o: str, w: np.ndarray, b: np.ndarray | None) -> str:
        """``o[t] = src[t] @ w + b`` for every time step (a Dense over (time, channels))."""
        t_len, ci = shape
        self.line(f"for (int t = 0; t < {t_len}; t++) {{")
        self.matvec([(f"({src} + t * {ci})", ci)], f"({o} + t * {w.shape[1]})", w.shape[1], w, b)
        self.line("}")
        return o

    def bidirectional(self, layer: ir.Bidirectional, src: str, shape: tuple[int, ...], o: str) -> None:
        """The forward layer over ``src``, the backward one over a time-reversed copy; the two
        outputs side by side (the backward sequence back in time order)."""
        t_len, ci = shape
        fw, bw = layer.forward, layer.backward
        rev = self.buf(t_len * ci)
        self.line(f"for (int t = 0; t < {t_len}; t++) for (int i = 0; i < {ci}; i++) "
                  f"{rev}[t * {ci} + i] = {src}[({t_len - 1} - t) * {ci} + i];")
        seq = fw.return_sequences
        n_f, n_b = (t_len if seq else 1) * fw.units, (t_len if seq else 1) * bw.units
        yf = self.recurrent(fw, src, shape, self.buf(n_f))
        yb = self.recurrent(bw, rev, shape, self.buf(n_b))
        uf, ub = fw.units, bw.units
        steps, back = (t_len, f"({t_len - 1} - t)") if seq else (1, "0")
        self.line(f"for (int t = 0; t < {steps}; t++) {{ for (int j = 0; j < {uf}; j++) "
                  f"{o}[t * {uf + ub} + j] = {yf}[t * {uf} + j]; for (int j = 0; j < {ub}; j++) "
                  f"{o}[t * {uf + ub} + {uf} + j] = {yb}[{back} * {ub} + j]; }}")

    def attention(self, layer: ir.Attention, src: str, shape: tuple[int, ...], o: str) -> None:
        """q, k, v per step (matvecs), then per head and query step the scaled scores over the
        window (causal: over steps 0..t only), their softmax, the weighted sum of v; the heads'
        outputs projected by ``wo``."""
        t_len, _ = shape
        hd = layer.wq.shape[1]
        d = hd // layer.heads
        q, k, v, a = (self.buf(t_len * hd) for _ in range(4))
        for buf, w, b in ((q, layer.wq, layer.bq), (k, layer.wk, layer.bk), (v, layer.wv, layer.bv)):
            self.per_step(src, shape, buf, w, b)
        p = self.buf(t_len)
        keys = "(t + 1)" if layer.causal else str(t_len)  # causal: keys 0..t
        scale = float(np.float32(1.0 / np.sqrt(d))).hex()
        self.line(f"for (int h = 0; h < {layer.heads}; h++) for (int t = 0; t < {t_len}; t++) {{ "
                  f"const float *qt = {q} + t * {hd} + h * {d}; float m = -3.0e38f; "
                  f"for (int s = 0; s < {keys}; s++) {{ const float *ks = {k} + s * {hd} + h * {d}; "
                  f"float z = 0.0f; for (int e = 0; e < {d}; e++) z += qt[e] * ks[e]; z *= {scale}f; "
                  f"{p}[s] = z; m = z > m ? z : m; }} float sum = 0.0f; "
                  f"for (int s = 0; s < {keys}; s++) {{ {p}[s] = hwb_exp({p}[s] - m); sum += {p}[s]; }} "
                  f"const float inv = 1.0f / sum; float *at = {a} + t * {hd} + h * {d}; "
                  f"for (int e = 0; e < {d}; e++) at[e] = 0.0f; for (int s = 0; s < {keys}; s++) {{ "
                  f"const float ps = {p}[s] * inv; const float *vs = {v} + s * {hd} + h * {d}; "
                  f"for (int e = 0; e < {d}; e++) at[e] += ps * vs[e]; }} }}")
        self.attention_out(a, (t_len, hd), o, layer)

    def attention_out(self, a: str, shape: tuple[int, ...], o: str, layer: ir.Attention) -> None:
        self.per_step(a, shape, o, layer.wo, layer.bo)


#: layers :meth:`Emitter.spatial` writes
_SPATIAL = (ir.Conv2D, ir.Pool2D, ir.Pad2D, ir.Concat)


def ir_chain_shape(layers: list[ir.Layer], shape: tuple[int, ...]) -> tuple[int, ...]:
    for layer in layers:
        shape = layer.out_shape(shape)
    return tuple(shape)


def _moves_ones(layer: ir.Layer, shape: tuple[int, ...]) -> bool:
    """A Transpose that moves only axes of size 1 (a one-channel image's channels-first
    input): the same floats in the same order."""
    if not isinstance(layer, ir.Transpose):
        return False
    big = [p for p in layer.perm if shape[p] > 1]
    return big == sorted(big)


def _cell_base(p: str, ow: int, stride: tuple[int, int], wp: int, ci: int) -> str:
    """The C offset of the first input cell of output cell ``p`` (row-major over ``ow``
    columns) in a padded input ``wp`` cells wide."""
    sh, sw = stride
    if ow == 1:
        return f"({p}) * {sh * wp * ci}"
    return f"(({p}) / {ow} * {sh * wp * ci} + ({p}) % {ow} * {sw * ci})"


#: layers :meth:`Emitter.desk` writes
_DESK = (ir.Pad1D, ir.TimeSlice, ir.LayerNorm, ir.Residual, ir.Bidirectional, ir.Attention,
         ir.Transpose, *_SPATIAL)


def vector_shape(requires: list[str]) -> tuple[int, int]:
    """``(vector width, accumulators)`` for a build whose CPU features are ``requires``."""
    return VECTORS["avx512" if "avx512f" in requires else "default"]


def broadcast_dot(groups: int, load: str, vt: str, set1: str, w: str, nvec: int, b0: int,
                  step: int, dot: str, nb: int) -> str:
    """The inner loop of a broadcast dot product over one block of ``nb`` accumulator
    vectors ``a0…``: per input group ``g`` the C statement ``load`` sets ``int x4`` (the
    group's packed inputs: 4 bytes for ``vpdpbusd``, a bf16 pair for ``vdpbf16ps``), ``set1``
    broadcasts it as a ``vt``, and ``dot`` multiplies it into the block's ``nb`` weight
    vectors, laid out ``[group][output vector][lanes]`` in ``w`` (``step`` elements per
    group's output vector)."""
    return (f"for (int g = 0; g < {groups}; g++) {{ {load} const {vt} xb = {set1}(x4); "
            f"const {vt} *wg = (const {vt} *)({w} + (g * {nvec} + {b0}) * {step}); "
            + " ".join(f"a{k} = {dot}(a{k}, xb, wg[{k}]);" for k in range(nb)) + " }")


class _Int8Emitter(Emitter):
    """int8: every matmul (Dense, Conv1D window, recurrent gates) quantises its input to
    int8 with a calibrated per-tensor scale (the recurrent state's too: calibrated over every
    step, with a margin, within its bound |h| <= 1 — a state that stays near 0 would get a
    handful of levels from the bound's scale 1/127), multiplies
    by symmetric per-output-channel int8 weights with int32 accumulation, and dequantises into
    float, where bias, activations, pooling and the LSTM/GRU gate arithmetic stay.

    The calibrated range is a floor, not a ceiling: each quantised input's max |v| is taken
    at run time, and where it exceeds the calibrated range that call quantises at the wider
    range instead of saturating (:meth:`quantise`). Min-max calibration on a few hundred
    samples sees less than the tail of fresh inputs (inputs 27 % past the calibrated max,
    clipped, moved a Dense(1) head by 0.21 of its range); inputs within the calibrated
    range get exactly the calibrated scale, so nothing else changes.

    The input is stored shifted to unsigned (q + 128) and each output's dot product corrected
    by 128·Σw: unsigned × signed bytes is the form CPUs multiply-accumulate in one instruction
    (VNNI ``vpdpbusd``; GCC's dot-product pattern emits it when the ISA has it)."""

    def __init__(self, net: ir.Network, vw: int, acc: int, in_amax: dict[int, float], requires: list[str],
                 state_amax: dict[int, float] | None = None,
                 centers: dict[int, tuple[np.ndarray, float]] | None = None):
        super().__init__(net, vw, acc)
        #: a Dense layer's input centre per feature and max |x - centre|, by ``id(layer)``
        #: (:func:`calibrated_ranges`)
        self.centers = centers or {}
        #: max |input| of every layer (residual branches' included), by ``id(layer)``
        self.in_amax = in_amax
        #: max |h| over every step of every recurrent layer, by ``id(layer)`` (:func:`calibrated_ranges`)
        self.state_amax = state_amax or {}
        #: the recurrent layer being emitted (its matvecs read its own state)
        self._rec: ir.Recurrent | None = None
        #: float input expression -> its already quantised bytes and widening ratio (a Conv1D window)
        self.prequant: dict[str, tuple[str, str]] = {}
        #: the VNNI kernel: (int32 lanes per vector, intrinsic prefix), or None (portable form)
        if {"avx512_vnni", "avx512bw", "avx512vl"} <= set(requires):
            self.vnni: tuple[int, str] | None = (16, "_mm512")
        elif "avx_vnni" in requires:
            self.vnni = (8, "_mm256")
        else:
            self.vnni = None

    def conv_tiles(self, layer: ir.Conv1D, src: str, o: str, out_shape: tuple[int, ...]) -> int:
        return 0  # every window goes through the int8 matmul

    def conv2d_tiles(self, layer: ir.Conv2D, src: str, o: str, out_shape: tuple[int, ...],
                     taps: list[tuple[int, int, int]], wp: int, ci: int) -> int:
        return 0  # every window goes through the int8 matmul, one segment per run

    def conv(self, layer: ir.Conv1D, src: str, shape: tuple[int, ...], o: str,
             out_shape: tuple[int, ...]) -> str:
        """The input is quantised once (zero padding is the byte 128, i.e. 0), and each output
        step's window (``k·c_in`` contiguous bytes with dilation 1) is read in place by the
        int8 matmul, instead of re-quantising every overlapping window."""
        if layer.dilation != 1:
            return super().conv(layer, src, shape, o, out_shape)
        t_in, ci = shape
        k, _, co = layer.w.shape
        left, right = layer.pad
        n = (t_in + left + right) * ci
        self.n += 1
        qin = f"qin{self.n}"
        # 16 spare bytes: a window's dot product reads up to its padded length (zero weights)
        self.line(f"uint8_t {qin}[{n + 16}] A64;")
        self.line(f"for (int i = 0; i < {n + 16}; i++) {qin}[i] = 128;")
        r = self.quantise(src, t_in * ci, f"({qin} + {left * ci})", self.in_range())
        window = f"({src} + t * {layer.stride * ci})"
        self.prequant[window] = (f"({qin} + t * {layer.stride * ci})", r)
        self.line(f"for (int t = 0; t < {out_shape[0]}; t++) {{")
        self.matvec([(window, k * ci)], f"({o} + t * {co})", co, layer.w.reshape(k * ci, co), layer.b)
        self.line("}")
        del self.prequant[window]
        return o

    def vnni_dot(self, q: str, npad: int, wt: np.ndarray, n_out: int, cn: str, mn: str, r: str,
                 dst: str, first: str) -> None:
        """int32 dot products of the unsigned input bytes ``q`` with ``wt`` (n_out, npad), 4
        bytes per lane per instruction: the weights of 4 consecutive inputs for one output sit
        in one int32 lane (layout ``[input/4][output][4]``), the 4 input bytes are broadcast,
        and one ``vpdpbusd`` accumulates them into every output of a vector at once (no
        horizontal sums); ``mn`` are the dequantisation multipliers at the calibrated scale,
        ``r`` the C name of this call's widening ratio (:meth:`quantise`)."""
        lanes, pre = self.vnni
        nvec = -(-n_out // lanes)
        groups = npad // 4
        wpad = np.zeros((nvec * lanes, npad), np.int8)
        wpad[:n_out] = wt
        layout = wpad.reshape(nvec * lanes, groups, 4).transpose(1, 0, 2)
        wv = self.const_i8(np.ascontiguousarray(layout))
        dp = "_mm512_dpbusd_epi32" if pre == "_mm512" else "_mm256_dpbusd_avx_epi32"
        vt = "__m512i" if pre == "_mm512" else "__m256i"
        self.n += 1
        ints = f"acc{self.n}"
        self.line(f"  int {ints}[{nvec * lanes}] A64;")
        for b0 in range(0, nvec, self.acc):
            nb = min(self.acc, nvec - b0)
            self.line("  { " + " ".join(f"{vt} a{k} = {pre}_setzero_si{lanes * 32}();" for k in range(nb)))
            self.line("    " + broadcast_dot(groups, f"int x4; __builtin_memcpy(&x4, {q} + 4 * g, 4);", vt,
                                            f"{pre}_set1_epi32", wv, nvec, b0, lanes * 4, dp, nb))
            self.line("    " + " ".join(f"{pre}_store_si{lanes * 32}(({vt} *)({ints} + {(b0 + k) * lanes}), a{k});"
                                        for k in range(nb)) + " }")
        self.line(f"  for (int j = 0; j < {n_out}; j++) {dst}[j] = {first} + (float)({ints}[j] - {cn}[j]) * ({r} * {mn}[j]);")

    def matvec(self, segs: list[tuple[str, int]], dst: str, n_out: int, w: np.ndarray,
               bias: np.ndarray | None, accumulate: bool = False) -> None:
        n_in = sum(n for _, n in segs)
        assert w.shape == (n_in, n_out), (w.shape, n_in, n_out)
        self.matvecs += 1
        amax = np.abs(w).max(axis=0)
        sw = np.where(amax > 0, amax / 127.0, 1.0)
        wq = np.clip(np.rint(w / sw), -127, 127).astype(np.int8)
        self.line("{")
        row = 0
        for k, (src, n) in enumerate(segs):
            cal = (self.state_range() if src in self.state and self._rec is not None
                   else self.in_range())
            center = self.centers.get(id(self.seq[self.cur]))
            if (center is not None and len(segs) == 1 and src not in self.state
                    and src not in self.prequant and center[0].size == n):
                cn_name, cal = self.const("Z", center[0].astype(np.float32)), center[1]
                # y = W·(x - c) + W·c: the offset W·c in float, the int8 product over x - c
                fold = (w[row:row + n].astype(np.float64).T @ center[0].astype(np.float32).astype(np.float64))
                fold_name: str | None = self.const("F", fold.astype(np.float32))
            else:
                cn_name, fold_name = None, None
            s_in = max(cal, 1e-30) / 127.0
            npad = -(-n // 16) * 16
            wt = np.zeros((n_out, npad), np.int8)
            wt[:, :n] = wq[row:row + n].T
            wn = "" if self.vnni else self.const_i8(wt)
            cn = self.const_i32(128 * wt.astype(np.int64).sum(axis=1))
            mn = self.const("M", (s_in * sw).astype(np.float32))
            if src in self.prequant:
                q, r = self.prequant[src]
            else:
                q = f"q{self.matvecs}_{k}"
                self.line(f"  uint8_t {q}[{npad}] A64;")
                r = self.quantise(src, n, q, cal, cn_name)
                if npad > n:
                    self.line(f"  for (int i = {n}; i < {npad}; i++) {q}[i] = 128;")
            if k == 0 and not accumulate:
                first = f"{self.const('B', bias)}[j]" if bias is not None else "0.0f"
            else:
                first = f"{dst}[j]"
            if fold_name is not None:
                first = f"({first} + {fold_name}[j])"
            if self.vnni:
                self.vnni_dot(q, npad, wt, n_out, cn, mn, r, dst, first)
            else:
                self.line(f"  for (int j = 0; j < {n_out}; j++) {{ const int8_t *wr = {wn} + j * {npad}; int s = 0; "
                          f"for (int i = 0; i < {npad}; i++) s += {q}[i] * wr[i]; "
                          f"{dst}[j] = {first} + (float)(s - {cn}[j]) * ({r} * {mn}[j]); }}")
            row += n
        self.line("}")

    def quantise(self, src: str, n: int, q: str, cal: float, center: str | None = None) -> str:
        """Emit the quantisation of ``src[0:n]`` into the unsigned bytes ``q`` (round to
        nearest, offset 128) at the calibrated range ``cal`` widened to this call's max |v|
        where that is larger; returns the C name of the widening ratio (>= 1, one float),
        by which the matvec scales its dequantisation multipliers. NaN is skipped by the
        max (the NaN rule answers NaN for a non-finite input anyway); an infinite or huge
        value widens to FLT_MAX, so the quantised bytes stay finite and in range. ``center``:
        the C name of per-element offsets subtracted first (a Dense layer's input centre)."""
        cal = max(cal, 1e-30)
        v = f"({src}[i] - {center}[i])" if center else f"{src}[i]"
        self.n += 1
        m, r, inv = f"qm{self.n}", f"qr{self.n}", f"qi{self.n}"
        c = f"{float(np.float32(cal)).hex()}f"
        self.line(f"  float {m} = {c}; for (int i = 0; i < {n}; i++) "
                  f"{{ const float a = __builtin_fabsf({v}); {m} = a > {m} ? a : {m}; }}")
        self.line(f"  {m} = {m} < 3.40282347e38f ? {m} : 3.40282347e38f;")
        self.line(f"  const float {r} = {m} > {c} ? {m} * {float(np.float32(1.0 / cal)).hex()}f : 1.0f, "
                  f"{inv} = {m} > {c} ? 127.0f / {m} : {float(np.float32(127.0 / cal)).hex()}f;")
        self.line(f"  for (int i = 0; i < {n}; i++) {{ float v = {v} * {inv}; "
                  f"v = v < -127.0f ? -127.0f : v; v = v > 127.0f ? 127.0f : v; "
                  f"v = (v + 12582912.0f) - 12582912.0f; {q}[i] = (uint8_t)((int)v + 128); }}")
        return r

    def in_range(self) -> float:
        """max |input| of the layer being emitted, over the calibration samples."""
        return self.in_amax[id(self.seq[self.cur])]

    def recurrent(self, layer: ir.Recurrent, src: str, shape: tuple[int, ...], o: str) -> str:
        self._rec = layer
        try:
            return super().recurrent(layer, src, shape, o)
        finally:
            self._rec = None

    def state_range(self) -> float:
        """The range the recurrent layer being emitted quantises its state with: max |h| over
        the calibration windows' steps with a 25 % margin (a wider state on other inputs is
        clipped, not wrapped), at most the bound 1; the bound where nothing was measured."""
        amax = self.state_amax.get(id(self._rec))
        return 1.0 if amax is None else min(1.0, max(1.25 * amax, 1e-6))

    def attention_out(self, a: str, shape: tuple[int, ...], o: str, layer: ir.Attention) -> None:
        """The heads' output projection in float: its input (the attention's output) has a
        range of its own that the per-layer calibration does not measure."""
        t_len, hd = shape
        self.line(f"for (int t = 0; t < {t_len}; t++) {{")
        Emitter.matvec(self, [(f"({a} + t * {hd})", hd)], f"({o} + t * {layer.wo.shape[1]})",
                        layer.wo.shape[1], layer.wo, layer.bo)
        self.line("}")

    def const_i8(self, a: np.ndarray) -> str:
        name = f"Q{len(self.consts)}"
        self.consts.append(f"static const int8_t {name}[{a.size}] A64 = {{{','.join(map(str, a.ravel().tolist()))}}};")
        return name

    def const_i32(self, a: np.ndarray) -> str:
        name = f"C{len(self.consts)}"
        self.consts.append(f"static const int {name}[{a.size}] A64 = {{{','.join(map(str, a.ravel().tolist()))}}};")
        return name


def calibrated_ranges(net: ir.Network, calibration: np.ndarray
                      ) -> tuple[dict[int, float], dict[int, float], dict[int, tuple[np.ndarray, float]]]:
    """Over the calibration samples (the IR's float reference), by ``id(layer)``: max |input|
    of every layer, max |h| over every step of every recurrent layer (run with the whole
    sequence returned) — residual and concatenated branches' and both directions' included —
    and, for every Dense layer, its input's centre per feature (the midpoint of its calibrated
    min and max) with max |x - centre|: a feature riding on a large offset keeps its resolution (a symmetric
    scale of max |x| would leave a signal 50x smaller than its offset a level or two)."""
    inputs: dict[int, float] = {}
    states: dict[int, float] = {}
    centers: dict[int, tuple[np.ndarray, float]] = {}

    def amax(a: np.ndarray) -> float:
        return float(np.abs(a).max()) if a.size else 0.0

    def walk(layers: list[ir.Layer], x: np.ndarray) -> np.ndarray:
        for layer in layers:
            inputs[id(layer)] = amax(x)
            if isinstance(layer, ir.Dense) and x.size:
                f = x.reshape(-1, x.shape[-1])
                mid = (f.min(axis=0) + f.max(axis=0)) / 2
                centers[id(layer)] = (mid, amax(f - mid))
            cells = ([(layer, x)] if isinstance(layer, ir.Recurrent) else
                     [(layer.forward, x), (layer.backward, x[:, ::-1])]
                     if isinstance(layer, ir.Bidirectional) else [])
            for cell, xc in cells:
                states[id(cell)] = amax(ir.apply(replace(cell, return_sequences=True), xc))
            if isinstance(layer, ir.Residual):
                walk(layer.body, x)
                walk(layer.shortcut, x)
            for branch in layer.branches if isinstance(layer, ir.Concat) else []:
                walk(branch, x)
            x = ir.apply(layer, x)
        return x

    walk(net.layers, np.asarray(calibration, np.float64))
    return inputs, states, centers


def emit(net: ir.Network, requires: list[str], precision: str = "fp32",
         calibration: np.ndarray | None = None, conv_algorithm: str = "auto") -> Source:
    """The model as C: ``hwb_model_predict_n`` and ``hwb_model_predict`` (declared in the
    generated header, build.header), vectorised for the CPU features ``requires``; int8
    calibrates its activation scales on ``calibration``. A model whose intermediate tensors
    exceed :data:`MAX_STACK_BYTES` side by side is emitted again with them in one stack array
    shared by lifetime (:meth:`Emitter.lay_out_arena`), and refused only if that exceeds it.
    ``conv_algorithm`` (target.CONV_ALGORITHMS) picks fp32 Conv2D's algorithm; int8 is direct."""
    ranges = None
    if precision == "int8":
        if calibration is None:
            raise UnsupportedError("cpu.native:int8 needs calibration data")
        ranges = calibrated_ranges(net, calibration)
    e = _emit_body(net, requires, ranges, arena=False, conv_algorithm=conv_algorithm)
    if e.stack > MAX_STACK_BYTES:
        e = _emit_body(net, requires, ranges, arena=True, conv_algorithm=conv_algorithm)
    if e.stack > MAX_STACK_BYTES:
        raise UnsupportedError(f"cpu.native: model {net.name!r} needs {e.stack >> 10} KiB of "
                               f"intermediate tensors (at most {MAX_STACK_BYTES >> 10} KiB on the "
                               f"stack); use cpu.litert or cpu.onnxruntime for a model this size")
    return _assemble(e, int(np.prod(net.input_shape)), int(np.prod(net.output_shape)))


def _emit_body(net: ir.Network, requires: list[str], ranges: tuple | None, arena: bool,
               conv_algorithm: str = "direct") -> Emitter:
    """The emitter holding ``hwb_one``'s body for ``net`` (int8 when ``ranges``, the
    calibration's :func:`calibrated_ranges`)."""
    vw, acc = vector_shape(requires)
    if ranges is not None:
        in_amax, state_amax, centers = ranges
        e: Emitter = _Int8Emitter(net, vw, acc, in_amax, requires, state_amax, centers)
    else:
        e = Emitter(net, vw, acc, conv_algorithm)
    e.arena = arena
    shapes = net.shapes()
    producing = [i for i, layer in enumerate(net.layers)
                 if not isinstance(layer, (ir.Act, ir.Flatten, ir.Affine, ir.Reshape))]
    last = producing[-1] if producing else -1
    if last < 0:  # only element-wise layers: they run on a copy of x in y
        e.line(f"for (int i = 0; i < {int(np.prod(net.input_shape))}; i++) y[i] = x[i];")
    cur, shape = ("x" if last >= 0 else "y"), tuple(net.input_shape)
    last_read: dict[str, int] = {}
    for i, (layer, out_shape) in enumerate(zip(net.layers, shapes, strict=True)):
        e.line(f"/* layer {i}: {type(layer).__name__} {shape} -> {out_shape} */")  # no model text
        e.cur, e.step = i, i
        last_read[cur] = i
        cur = e.layer(layer, cur, shape, "y" if i == last else None, out_shape)
        shape = out_shape
    if arena:
        e.lay_out_arena(last_read)
    return e


def emit_fixed(net: object, tabs: dict[str, np.ndarray], requires: list[str]) -> Source:
    """The ``fixed`` precision (hwb_plugins/cpu_native/fixed.py): hls4ml's graph ``net`` (an
    ``FxNet``) as integer C with the same ``hwb_one`` entry; ``tabs`` are its activation tables."""
    from .fixed import FixedEmitter

    e = FixedEmitter(net, tabs, vector_shape(requires)[0])  # type: ignore[arg-type]
    e.emit()
    if e.stack > MAX_STACK_BYTES:
        raise UnsupportedError(f"cpu.native: model {e.net.name!r} needs {e.stack >> 10} KiB of "
                               f"intermediate tensors (at most {MAX_STACK_BYTES >> 10} KiB)")
    n_out = e.net.layers[-1].n_out if e.net.layers else e.net.n_in
    return _assemble(e, e.net.n_in, n_out, nan_out=False)  # type: ignore[arg-type]


#: The NaN rule (docs/targets.md, "NaN and Inf"): a sample with a NaN or ±Inf anywhere in its
#: input gets NaN in every output, whatever its layers do with it (a ReLU's max or int8's
#: clamp would make it finite). Checked after the batch, off the model's dependency chain: one
#: vectorised compare per input float, read from cache.
_NAN_OUT = """\
    for (long i = 0; i < n; i++) {
        const float *xi = x + i * %(n_in)d;
        int bad = 0;
        for (int j = 0; j < %(n_in)d; j++) bad |= !(__builtin_fabsf(xi[j]) <= 3.40282347e38f);
        if (__builtin_expect(bad, 0))
            for (int j = 0; j < %(n_out)d; j++) y[i * %(n_out)d + j] = __builtin_nanf("");
    }"""


def _assemble(e: Emitter, n_in: int, n_out: int, nan_out: bool = True) -> Source:
    """The translation unit; ``nan_out``: apply the NaN rule (not for ``fixed``, which
    computes what hls4ml's C-simulation does with the same input)."""
    code = "\n".join([
        "/* generated by hwbackends cpu.native from the layer IR; do not edit */",
        f"#define HWB_VW {e.vw}", _PRELUDE, *e.consts, "",
        "/* One sample. x is read only before y is written only when the model has more than",
        "   one layer, so x and y must not overlap. */",
        "HWB_INLINE void hwb_one(const float *restrict x, float *restrict y) {",
        *e.body, "}", "",
        "int hwb_model_predict_n(const float *x, float *y, long n) {",
        f"    for (long i = 0; i < n; i++) hwb_one(x + i * {n_in}, y + i * {n_out});",
        *(_NAN_OUT % {"n_in": n_in, "n_out": n_out} if nan_out else "").splitlines(),
        "    return 0;", "}", "",
        "int hwb_model_predict(const float *x, float *y) {",
        "    return hwb_model_predict_n(x, y, HWB_MODEL_BATCH);", "}", "",
        "const char *hwb_model_fingerprint(void) { return HWB_MODEL_FINGERPRINT; }",
        "const char *hwb_model_isa(void) { return HWB_MODEL_ISA; }", ""])
    kernel = ""
    if isinstance(e, _Int8Emitter):
        kernel = f"vnni-{e.vnni[0] * 32}" if e.vnni else "portable"
    # (the fixed-point emitter, fixed.py, computes no conv by Winograd)
    return Source(code, e.stack, e.matvecs, kernel, e.consts, list(getattr(e, "winograd", [])))


#: The translation unit around an emitter's per-sample body, for the other emitters of this
#: plugin (emit_multi.py).
assemble = _assemble
