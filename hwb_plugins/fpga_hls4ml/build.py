"""Build hls4ml's C++ project into a C-simulation shared library with g++.

hls4ml's own ``build_lib.sh`` bakes the absolute path of the project's ``firmware/weights``
into the library (``-D WEIGHTS_DIR=...``), so a library copied into the artifact store would
read its weights from a directory that no longer exists. We therefore run the same g++
commands (same flags: ``-O3 -fPIC``, the newest ``-std`` the compiler takes,
``-fno-gnu-unique``) with two differences:

* ``WEIGHTS_DIR`` expands to a call, ``hwb_weights_dir()``, whose value the loader sets with
  ``hwb_set_weights_dir()`` right after ``dlopen`` (hls4ml reads the weights once, on the
  first call). Weights travel as hls4ml's ``.txt`` files: compiling them in as C++ headers
  takes ~60 s per build instead of ~4 s on this machine's 2 cores (measured), which matters
  because the automatic precision search builds several candidates.
* the bridge gets ``hwb_predict_batch(x, y, n)``: a C loop over samples around hls4ml's own
  ``myproject_float`` entry point, so the hot path is one ctypes call for any batch size.

A library built before from the same preprocessed sources, flags and compiler comes from the
store's build cache (:mod:`hwbackends.store.build_cache`) instead of g++.

Most of a build is g++ parsing ap_types and nnet_utils and instantiating their templates, the
same headers for every candidate of a precision search. They are compiled once into a
precompiled header (``hwb_pch.h.gch``, kept in the build cache by its preprocessed text), which
both translation units force-include: a cached PCH halves the firmware's compile and takes the
bridge from ~2.5 s to under 1 s, and g++ writes identical object files with and without it.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hwbackends.contract import CompileError, UnavailableError, build_cache

#: Declaration g++ force-includes (``-include``) so that ``WEIGHTS_DIR`` can be a call.
WEIGHTS_HEADER = 'extern "C" const char *hwb_weights_dir();\n'

BRIDGE_EXTRA = r"""
// ---- added by hwbackends (hwb_plugins/fpga_hls4ml/build.py) --------------------------------
#include <cstring>
static char hwb_weights_dir_buf[4096] = "weights";
extern "C" {
const char *hwb_weights_dir() { return hwb_weights_dir_buf; }
void hwb_set_weights_dir(const char *d) {
    std::strncpy(hwb_weights_dir_buf, d, sizeof(hwb_weights_dir_buf) - 1);
    hwb_weights_dir_buf[sizeof(hwb_weights_dir_buf) - 1] = '\0';
}
int hwb_n_in() { return %(n_in)d; }
int hwb_n_out() { return %(n_out)d; }
// One call per batch: the per-sample loop runs in C, not in Python (hls4ml's predict loops
// in Python and allocates per sample).
void hwb_predict_batch(float *x, float *y, long n) {
    for (long i = 0; i < n; ++i) %(fn)s_float(x + i * %(n_in)d, y + i * %(n_out)d);
}
}
"""


@dataclass(frozen=True)
class BuiltLib:
    """A built C-sim library and where its weights are."""

    lib: Path
    weights_dir: Path
    seconds: float
    #: Taken from the store's build cache (:mod:`hwbackends.store.build_cache`), not compiled.
    cached: bool = False


def gxx() -> str | None:
    """The C++ compiler: ``HWB_CXX`` when set (None if that is not an executable), else g++."""
    explicit = os.environ.get("HWB_CXX")
    if explicit:
        return shutil.which(explicit)
    return shutil.which("g++")


@functools.lru_cache(maxsize=None)
def gxx_version() -> str:
    cc = gxx()
    if not cc:
        return ""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.splitlines()[0].strip() if out else ""


@functools.lru_cache(maxsize=None)
def _flags(cc: str) -> tuple[str, ...]:
    """hls4ml's build_lib.sh flags: -O3 -fPIC, -std=c++23 if accepted, -fno-gnu-unique if accepted."""
    def accepts(flag: str) -> bool:
        r = subprocess.run([cc, "-Werror", "-fsyntax-only", flag, "-xc++", "-", "-o", "/dev/null"],
                           input="", capture_output=True, text=True)
        return r.returncode == 0
    flags = ["-O3", "-fPIC", "-std=c++23" if accepts("-std=c++23") else "-std=c++11"]
    if accepts("-fno-gnu-unique"):
        flags.append("-fno-gnu-unique")
    return tuple(flags)


def patch_bridge(project: Path, name: str, n_in: int, n_out: int) -> None:
    """Append the hwbackends entry points to hls4ml's generated bridge (idempotent)."""
    bridge = project / f"{name}_bridge.cpp"
    text = bridge.read_text()
    marker = "// ---- added by hwbackends"
    if marker in text:
        text = text[:text.index(marker)]
    bridge.write_text(text + BRIDGE_EXTRA % {"n_in": n_in, "n_out": n_out, "fn": name})
    (project / "hwb_weights_dir.h").write_text(WEIGHTS_HEADER)


#: The header both translation units force-include (``-include``): the PCH's source.
PCH_HEADER = "hwb_pch.h"
#: Headers of hls4ml's project that never change with the design: what the PCH holds.
#: ``nnet_code_gen.h`` is generated per design (hls4ml's writer fills it in), so it stays out.
_PCH_INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)


def _pch_header(project: Path, name: str) -> str:
    """``hwb_pch.h``: the weights-dir declaration, then every system header, ap_types/hls
    header and nnet_utils header (except the generated nnet_code_gen.h) that the firmware, its
    header and the bridge include, paths resolved from the project's root. Include guards make
    the TUs' own includes of them no-ops afterwards."""
    files = [project / "firmware" / f"{name}.h", project / "firmware" / "defines.h",
             project / "firmware" / "parameters.h", project / "firmware" / f"{name}.cpp",
             project / f"{name}_bridge.cpp"]
    system: list[str] = []
    local: list[str] = []
    for f in files:
        if not f.exists():
            continue
        for kind, inc in _PCH_INCLUDE.findall(f.read_text()):
            if kind == "<":
                line = f"#include <{inc}>"
                if line not in system:
                    system.append(line)
                continue
            base = inc.removeprefix("firmware/")
            if base.endswith("nnet_code_gen.h") or not (
                    base.startswith("nnet_utils/") or re.fullmatch(r"(ap|hls)_\w+\.h", base)):
                continue
            path = f"firmware/{base}" if base.startswith("nnet_utils/") else base
            line = f'#include "{path}"'
            if line not in local:
                local.append(line)
    ap = [ln for ln in local if "nnet_utils/" not in ln]
    nnet = [ln for ln in local if "nnet_utils/" in ln]
    return "\n".join(['#include "hwb_weights_dir.h"', *system, *ap, *nnet, ""])


def _precompile_header(project: Path, common: list[str]) -> None:
    """``hwb_pch.h.gch`` beside ``hwb_pch.h``: from the build cache, else compiled (and put
    there). Only an accelerator: if it cannot be built, or ``HWB_HLS4ML_PCH=0``, g++ reads
    ``hwb_pch.h`` as text (the same objects, slower)."""
    if os.environ.get("HWB_HLS4ML_PCH", "1").strip() == "0":
        return
    cc, flags = common[0], [f for f in common[1:] if f not in ("-include", PCH_HEADER)]
    gch = project / f"{PCH_HEADER}.gch"
    cache, key = build_cache.current(), None
    if cache is not None:
        r = subprocess.run([cc, *flags, "-E", "-P", "-x", "c++-header", PCH_HEADER], cwd=project,
                           capture_output=True)
        if r.returncode == 0:
            key = build_cache.digest("pch", gxx_version(), " ".join(flags), r.stdout)
            if cache.fetch(key, gch):
                return
    r = subprocess.run([cc, *flags, "-x", "c++-header", PCH_HEADER, "-o", gch.name], cwd=project,
                       capture_output=True, text=True)
    if r.returncode != 0:
        gch.unlink(missing_ok=True)
        return
    if cache is not None and key is not None:
        cache.put(key, gch)


#: What to do when the generated project does not build (the g++ lines follow it).
GXX_ADVICE = ("What to do: try another precision (auto, or a wider ap_fixed<W,I>), "
              "-O io_type=io_stream for convolutions, or another target; if it persists, report "
              "it to hls4ml (github.com/fastmachinelearning/hls4ml/issues) with this message")


def build(project: Path, name: str, tag: str) -> BuiltLib:
    """Compile ``project`` (written by hls4ml, bridge patched) into ``firmware/<name>-<tag>.so``.

    Both translation units compile in parallel (the machine has 2 cores). Runs inside the
    isolated compile worker: a timeout kills the worker's process group, g++ included."""
    cc = gxx()
    if not cc:
        raise UnavailableError("no C++ compiler: g++ not on PATH (or HWB_CXX not executable); "
                               "hls4ml's C-simulation needs one (apt-get install g++)")
    (project / PCH_HEADER).write_text(_pch_header(project, name))
    common = [cc, *_flags(cc), "-Ifirmware/ap_types/", "-include", PCH_HEADER,
              "-DWEIGHTS_DIR=hwb_weights_dir()"]
    t0 = time.perf_counter()
    objs = [f"{name}.hwb.o", f"{name}_bridge.hwb.o"]
    srcs = [f"firmware/{name}.cpp", f"{name}_bridge.cpp"]
    lib = project / "firmware" / f"{name}-{tag}.so"
    cache, key = build_cache.current(), None
    if cache is not None:
        key = _cache_key(project, common, srcs)
        if key is not None and cache.fetch(key, lib):
            return BuiltLib(lib, project / "firmware" / "weights", time.perf_counter() - t0, cached=True)
    _precompile_header(project, common)
    procs = [subprocess.Popen([*common, "-c", s, "-o", o], cwd=project, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for s, o in zip(srcs, objs, strict=True)]
    logs = [p.communicate()[0] for p in procs]
    for p, s, log in zip(procs, srcs, logs, strict=True):
        if p.returncode != 0:
            errors = [ln for ln in log.splitlines() if "error" in ln.lower()] or log.splitlines()[-20:]
            raise CompileError(f"g++ failed on hls4ml's {s} (exit {p.returncode}): hls4ml "
                               f"generated C++ its own headers do not compile. {GXX_ADVICE}\n"
                               + "\n".join(errors[:15])[:3000], log=log)
    r = subprocess.run([*common, "-shared", *objs, "-o", str(lib)], cwd=project,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise CompileError(f"linking the C-sim library failed. {GXX_ADVICE}\n"
                           f"{r.stdout[-2000:]}{r.stderr[-2000:]}", log=r.stderr)
    for o in (*objs, f"{PCH_HEADER}.gch"):
        (project / o).unlink(missing_ok=True)
    if cache is not None and key is not None:
        cache.put(key, lib)
    return BuiltLib(lib, project / "firmware" / "weights", time.perf_counter() - t0)


def _cache_key(project: Path, common: list[str], srcs: list[str]) -> str | None:
    """What the library is built from, as the compiler sees it: both translation units
    preprocessed (``-E -P``, ~0.1 s each against ~4 s to compile), the flags and the
    compiler's version. The weights' values are not in it (hls4ml reads their ``.txt`` at run
    time; the initialisers sit behind ``__SYNTHESIS__``), so a retrained model whose search
    lands on the same types reuses the library. ``None`` (no caching) if preprocessing fails:
    the build then reports the error."""
    parts: list[bytes | str] = [gxx_version(), " ".join(common[1:])]
    procs = [subprocess.Popen([*common, "-E", "-P", s], cwd=project, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL) for s in srcs]
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            return None
        parts.append(out)
    return build_cache.digest(*parts)


def trace(hm: Any, project: Path, x: np.ndarray) -> tuple[Any, dict[str, np.ndarray]]:
    """hls4ml's ``ModelGraph.trace(x)`` (every traced layer's output, fixed-point, per sample)
    on a library built by :func:`build` -- both translation units at once, and from the
    store's build cache when the same design was traced before -- instead of hls4ml's
    ``build_lib.sh``, which compiles them one after the other. ``project``: ``hm``'s output
    directory."""
    from .convert import PROJECT
    from .csim import CsimLibrary

    hm.config.trace_output = True
    hm.write()
    n_in, n_out = (int(np.prod(v[0].shape)) for v in (hm.get_input_variables(), hm.get_output_variables()))
    patch_bridge(project, PROJECT, n_in, n_out)
    built = build(project, PROJECT, "trace")
    lib = CsimLibrary(built.lib, built.weights_dir, n_in, n_out)
    hm._top_function_lib = lib.cdll
    hm.compile = lambda: None  # trace() compiles first: the library above is that build
    return hm.trace(x)

