"""The C toolchain of ``cpu.native``: the compiler (``HWB_CC``), the ISA levels and the CPU
features each needs, the generated header, the per-artifact CPython extension and the build.

Every function here is light (standard library only): ``toolchain()`` and the load-time ISA
check run in the caller's process.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from hwbackends.contract import NATIVE_INCLUDE, CompileError, c_string

#: ``isa`` option values → the ``-march`` each builds with.
ISAS = {"native": "native", "x86-64-v2": "x86-64-v2", "x86-64-v3": "x86-64-v3",
        "x86-64-v4": "x86-64-v4"}
#: Flags of the model code (the generated function). ``-fopenmp-simd`` honours the emitter's
#: ``omp simd reduction`` pragmas only (no OpenMP runtime); ``-fno-math-errno`` keeps libm-free
#: code free of errno stores; ``-fno-trapping-math`` lets the vectoriser compute both arms of
#: a ``?:`` (the LSTM gates' loop): without it GCC 12 if-converts such loops only where the
#: ISA has masked stores (AVX-512) and left them scalar on AVX2 (an AMD EPYC, znver3). Results
#: are unchanged: FP exceptions are never trapped here. No ``-ffast-math``: the emitter writes
#: vectorisable loops itself, so results stay IEEE (NaN in, NaN out).
MODEL_FLAGS = ("-O3", "-fPIC", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math",
               "-fno-semantic-interposition")
#: The extension's own code only checks and dispatches: built for the baseline ISA, warned on
#: (the compiler's warnings come back with a failed build's error).
EXT_FLAGS = ("-O2", "-fPIC", "-Wall")
#: Where the load-time check reads this CPU's features (a module attribute, so a test can
#: point it at another CPU's flags).
CPUINFO = "/proc/cpuinfo"

#: GCC/Clang predefined macros → the /proc/cpuinfo flag of the same feature. The compiler says
#: which macros an ``-march`` defines, so the features an artifact needs are the compiler's
#: own answer for its flags, not a table of ISA levels kept by hand.
_MACRO_FLAGS = {
    "__SSE3__": "pni", "__SSSE3__": "ssse3", "__SSE4_1__": "sse4_1", "__SSE4_2__": "sse4_2",
    "__POPCNT__": "popcnt", "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma",
    "__F16C__": "f16c", "__BMI__": "bmi1", "__BMI2__": "bmi2", "__LZCNT__": "abm",
    "__MOVBE__": "movbe", "__AVX512F__": "avx512f", "__AVX512CD__": "avx512cd",
    "__AVX512DQ__": "avx512dq", "__AVX512BW__": "avx512bw", "__AVX512VL__": "avx512vl",
    "__AVX512IFMA__": "avx512ifma", "__AVX512VBMI__": "avx512vbmi",
    "__AVX512VBMI2__": "avx512_vbmi2", "__AVX512BITALG__": "avx512_bitalg",
    "__AVX512VPOPCNTDQ__": "avx512_vpopcntdq", "__AVX512VNNI__": "avx512_vnni",
    "__AVX512BF16__": "avx512_bf16", "__AVX512FP16__": "avx512_fp16", "__AVXVNNI__": "avx_vnni",
    "__GFNI__": "gfni", "__VAES__": "vaes", "__VPCLMULQDQ__": "vpclmulqdq",
    "__AMX_TILE__": "amx_tile", "__AMX_INT8__": "amx_int8", "__AMX_BF16__": "amx_bf16",
    "__ARM_NEON": "asimd", "__ARM_FEATURE_DOTPROD": "asimddp", "__ARM_FEATURE_SVE": "sve",
    "__ARM_FEATURE_SVE2": "sve2", "__ARM_FEATURE_MATMUL_INT8": "i8mm",
}


def compiler() -> str:
    """The C compiler command: ``HWB_CC``, default ``cc``."""
    return os.environ.get("HWB_CC", "cc")


def compiler_path() -> str | None:
    """The resolved compiler executable, or None when it cannot be found."""
    return shutil.which(compiler())


@functools.lru_cache(maxsize=8)
def _version(path: str) -> str:
    try:
        res = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unusable ({exc})"
    return (res.stdout.splitlines() or ["?"])[0].strip()


def compiler_version() -> str:
    """``cc --version``'s first line (cached per compiler path), or why there is none."""
    path = compiler_path()
    return _version(path) if path else f"missing ({compiler()!r} not found)"


def march(isa: str) -> str:
    return ISAS[isa]


def host_flags(path: str | None = None) -> set[str]:
    """This CPU's feature flags (``flags``/``Features`` of /proc/cpuinfo)."""
    try:
        with open(path or CPUINFO) as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def required_flags(cc: str, isa: str) -> list[str]:
    """The /proc/cpuinfo features code built with ``-march=<isa>`` may use: the compiler's own
    predefined macros for those flags, mapped to the kernel's names."""
    res = subprocess.run([cc, f"-march={march(isa)}", "-dM", "-E", "-x", "c", os.devnull],
                         capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise CompileError(f"cpu.native: {cc} refuses -march={march(isa)}: {res.stderr.strip()[:400]}")
    macros = {line.split()[1] for line in res.stdout.splitlines() if line.startswith("#define ")}
    return sorted({flag for m, flag in _MACRO_FLAGS.items() if m in macros})


def python_abi() -> str:
    """The extension's ABI: the interpreter's extension suffix (CPython version, platform);
    from importlib.machinery, which (unlike sysconfig) imports nothing."""
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def python_include() -> Path:
    """Where Python.h is (sysconfig's posix scheme, computed without importing its data
    module: probe() must stay light)."""
    v = sys.version_info
    return Path(sys.base_prefix) / "include" / f"python{v.major}.{v.minor}{sys.abiflags}"


def arch() -> str:
    return platform.machine()


# -- the generated header and extension --------------------------------------------------------
def header(*, name: str, fingerprint: str, isa: str, requires: list[str], precision: str,
           batch: int, stack: int, in_shape: tuple[int, ...], out_shape: tuple[int, ...],
           extra: str = "") -> str:
    """``hwb_model.h``: the stable C ABI of one artifact (ABI version 1); ``extra``: more
    declarations, each part with its own ``extern "C"`` (the sliding window's,
    hwb_plugins/cpu_native/sliding.py)."""
    n_in, n_out = _prod(in_shape), _prod(out_shape)

    def dims(s: tuple[int, ...]) -> str:
        return "{" + ", ".join(str(d) for d in s) + "}"

    return f"""/* hwb_model.h: generated by hwbackends cpu.native; do not edit.
   Stable C ABI, version 1: link libhwb_model.so and call hwb_model_predict. The functions are
   reentrant and thread-safe (no global state, no allocation; intermediate tensors are on the
   caller's stack, at most {stack} bytes per sample). The library was compiled with -march={march(isa)}:
   check HWB_MODEL_REQUIRES against the CPU before calling (an absent feature is SIGILL). */
#ifndef HWB_MODEL_H
#define HWB_MODEL_H
#include <stddef.h>
#include <stdint.h>

#define HWB_MODEL_ABI 1
#define HWB_MODEL_NAME {c_string(name)}
#define HWB_MODEL_FINGERPRINT {c_string(fingerprint)}
#define HWB_MODEL_PRECISION {c_string(precision)}
#define HWB_MODEL_ISA {c_string(isa)}
/* the /proc/cpuinfo flags this build needs */
#define HWB_MODEL_REQUIRES "{','.join(requires)}"
/* samples per hwb_model_predict call (the compiled batch size) */
#define HWB_MODEL_BATCH {batch}
/* per sample, C order, float32 */
#define HWB_MODEL_INPUT_RANK {len(in_shape)}
#define HWB_MODEL_INPUT_SHAPE {dims(in_shape)}
#define HWB_MODEL_INPUT_SIZE {n_in}
#define HWB_MODEL_OUTPUT_RANK {len(out_shape)}
#define HWB_MODEL_OUTPUT_SHAPE {dims(out_shape)}
#define HWB_MODEL_OUTPUT_SIZE {n_out}

#ifdef __cplusplus
extern "C" {{
#endif
/* x: HWB_MODEL_BATCH * HWB_MODEL_INPUT_SIZE floats; y: HWB_MODEL_BATCH * HWB_MODEL_OUTPUT_SIZE
   floats (must not overlap x). Returns 0. */
int hwb_model_predict(const float *x, float *y);
/* the same for any number n of samples */
int hwb_model_predict_n(const float *x, float *y, long n);
const char *hwb_model_fingerprint(void);
const char *hwb_model_isa(void);
#ifdef __cplusplus
}}
#endif
{extra}#endif
"""


def _prod(s: tuple[int, ...]) -> int:
    n = 1
    for d in s:
        n *= int(d)
    return n


#: The fixed part of every artifact's extension, a real C header (package data):
#: predict_into, bind, info and the native entry. The generated ext.c includes it.
RUNTIME_DIR = Path(__file__).resolve().parent
RUNTIME_HEADER = "hwb_ext.h"
#: The fixed part of every sliding window (windows as handles), included by model.c.
WINDOW_HEADER = "hwb_window.h"
#: The extension's sliding-window entries (one window, and sets of handles), included by ext.c.
EXT_WINDOW_HEADER = "hwb_ext_window.h"
#: The rest of the fixed C a model.c includes or its hwb_model.h copies: the vector types and
#: math (emit.py), the ap_fixed emulation (fixed.py), the reduced push's vector code
#: (push_weights.py) and the window's declarations (sliding.py).
MODEL_HEADERS = ("hwb_prelude.h", "hwb_fixed.h", "hwb_push.h", "hwb_model_window.h")


@functools.cache
def runtime_digest() -> str:
    """A digest of the fixed C every artifact compiles against (:data:`RUNTIME_HEADER`,
    :data:`WINDOW_HEADER`, :data:`EXT_WINDOW_HEADER`, :data:`MODEL_HEADERS` and hwb_native.h):
    part of the target's toolchain, so a changed runtime is a cache miss and a stored artifact
    never carries an older entry ABI than the server reads."""
    h = hashlib.sha256()
    for f in (RUNTIME_DIR / RUNTIME_HEADER, RUNTIME_DIR / WINDOW_HEADER, RUNTIME_DIR / EXT_WINDOW_HEADER,
              *(RUNTIME_DIR / n for n in MODEL_HEADERS), NATIVE_INCLUDE / "hwb_native.h"):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def extension_source(module: str, batch: int, in_shape: tuple[int, ...],
                     out_shape: tuple[int, ...], extra: tuple[str, str] = ("", "")) -> str:
    """The extension's generated ``ext.c``: this artifact's shapes and module name around
    :data:`RUNTIME_HEADER` (the fixed C); ``extra``: more definitions and method-table
    entries (the sliding window's, hwb_plugins/cpu_native/sliding.py), which may use the
    placeholders ``@XSHAPE@ @YSHAPE@ @XND@ @YND@ @BATCH@ @MOD@`` and the header's ``XSHAPE``,
    ``YSHAPE`` and ``shape_is``."""
    if not module.isidentifier() or not module.isascii():
        raise CompileError(f"cpu.native: extension module name {module!r} is not a C identifier")
    xs, ys = (batch, *in_shape), (batch, *out_shape)
    subs = {"@XSHAPE@": ", ".join(map(str, xs)), "@YSHAPE@": ", ".join(map(str, ys)),
            "@XND@": str(len(xs)), "@YND@": str(len(ys)), "@BATCH@": str(batch), "@MOD@": module}
    defs, methods = extra
    for k, v in subs.items():
        defs, methods = defs.replace(k, v), methods.replace(k, v)
    return f"""/* The CPython entry of one cpu.native artifact ({module}): {RUNTIME_HEADER}'s predict_into,
   bind, info and native entry for this artifact's shapes. Generated; do not edit. */
#define HWB_EXT_XSHAPE {subs["@XSHAPE@"]}
#define HWB_EXT_YSHAPE {subs["@YSHAPE@"]}
#include "{RUNTIME_HEADER}"
{defs}
static PyMethodDef methods[] = {{
    HWB_EXT_METHODS{methods}
    {{NULL, NULL, 0, NULL}}}};

static struct PyModuleDef moddef = {{PyModuleDef_HEAD_INIT, .m_name = "{module}", .m_size = -1,
                                    .m_methods = methods}};

PyMODINIT_FUNC PyInit_{module}(void) {{ return hwb_ext_module(&moddef); }}
"""


def module_name(*texts: str) -> str:
    """A module name unique to the code: two artifacts loaded in one process never share an
    extension module (CPython caches them by name and path)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
    return f"hwb_native_{h.hexdigest()[:16]}"


def run(cmd: list[str], cwd: Path) -> str:
    """Run one compiler command in ``cwd``; raise CompileError with its output if it fails."""
    try:
        res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    except OSError as exc:
        raise CompileError(f"cpu.native: cannot run the C compiler {cmd[0]!r} ({exc}); install "
                           f"gcc or clang, or set HWB_CC to one") from exc
    if res.returncode != 0:
        raise CompileError(f"cpu.native: `{' '.join(cmd)}` failed:\n{(res.stderr or res.stdout)[-3000:]}")
    return res.stderr


def build(workdir: Path, cc: str, isa: str, module: str) -> dict[str, object]:
    """Compile ``model.c`` once (to ``model.o``) and link it twice: ``libhwb_model.so`` (the C
    ABI, what ``export("c")`` ships) and the extension ``<module><EXT_SUFFIX>``, so Python and
    C++ run the same machine code. Returns facts for the metadata (vectorised loop count)."""
    import sysconfig

    include = sysconfig.get_paths()["include"]
    vec = workdir / "vec.txt"
    # -I: the fixed C model.c includes (hwb_prelude.h, hwb_fixed.h, hwb_push.h, hwb_window.h)
    run([cc, *MODEL_FLAGS, f"-march={march(isa)}", f"-fopt-info-vec-optimized={vec.name}",
         f"-I{RUNTIME_DIR}", "-c", "model.c", "-o", "model.o"], workdir)
    run([cc, "-shared", "model.o", "-o", "libhwb_model.so", "-Wl,-soname,libhwb_model.so"], workdir)
    # -Bsymbolic: the extension's calls into the model code bind inside it, whatever else the
    # process has loaded.
    # -I: the artifact's own hwb_model.h first, then the fixed runtime and hwb_native.h.
    run([cc, *EXT_FLAGS, "-shared", "-I.", f"-I{RUNTIME_DIR}", f"-I{NATIVE_INCLUDE}", f"-I{include}",
         "ext.c", "model.o", "-Wl,-Bsymbolic",
         "-o", module + python_abi()], workdir)
    loops = sum(1 for line in vec.read_text().splitlines() if "loop vectorized" in line) if vec.exists() else 0
    vec.unlink(missing_ok=True)
    (workdir / "model.o").unlink()
    return {"vectorized_loops": loops}
