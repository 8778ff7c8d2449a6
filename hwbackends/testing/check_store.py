"""Target-level checks of the artifact: stored as files, cached, verified, and built in the
isolated worker."""
from __future__ import annotations

import os
import pickle

import numpy as np

from .context import Conformance, ConformanceError, io_arrays


def check_store_roundtrip(ctx: Conformance) -> str:
    """The artifact holds files; a second compile is a cached load with identical outputs; a
    corrupted artifact file is detected and rebuilt, with identical outputs again. Uses the
    context's own store, so the first build is the one the per-variant checks share (the
    variant is ``ctx.store_variant`` when set: :meth:`~.context.Conformance.round_trip_variant`)."""
    v = ctx.round_trip_variant()
    first = ctx.compiled(v)
    files = [p for p in first.artifact.path.rglob("*") if p.is_file() and p.name != "manifest.json"]
    if not files:
        raise ConformanceError(f"{ctx.target_name}.compile() wrote no file into workdir: the "
                               f"artifact must hold what load() needs, so it can be cached")
    x, y1 = io_arrays(first)
    first.predict_into(x, y1)
    second = ctx.compile_variant(v, ctx.store, fidelity=False)
    if not second.artifact.cached or second.artifact.key != first.artifact.key:
        raise ConformanceError(f"the second identical compile was not served from the store "
                               f"(cached={second.artifact.cached}): is toolchain() deterministic?")
    y2 = np.full_like(y1, np.nan)
    second.predict_into(x, y2)
    if not np.array_equal(y1, y2):
        raise ConformanceError(f"the cached artifact predicts differently from the first build "
                               f"(max diff {np.nanmax(np.abs(y1 - y2)):.3g})")
    second.close()
    victim = max(files, key=lambda p: p.stat().st_size)
    blob = bytearray(victim.read_bytes())
    if blob:
        blob[len(blob) // 2] ^= 0xFF
    else:
        blob = bytearray(b"corrupt")
    # A new file replaces the old one (never write in place): a loaded executor may have the
    # old file mapped (TFLite mmaps its model, ctypes its .so), and must keep its intact copy.
    tmp = victim.with_name(victim.name + ".hwb-corrupt")
    tmp.write_bytes(bytes(blob))
    os.replace(tmp, victim)
    third = ctx.compile_variant(v, ctx.store, fidelity=False)
    if third.artifact.cached:
        raise ConformanceError(f"a corrupted artifact file ({victim.name}) was loaded as cached")
    y3 = np.full_like(y1, np.nan)
    third.predict_into(x, y3)
    if not np.array_equal(y1, y3):
        raise ConformanceError("the rebuilt artifact predicts differently from the first build")
    third.close()
    return (f"{v.id}: cached load, corrupted {victim.name} detected and rebuilt "
            f"({len(files)} file(s), {first.artifact.size_bytes():,} bytes)")


def check_compile_isolated(ctx: Conformance) -> str:
    """The target pickles (it travels to the worker) and ``compile()`` runs in the worker
    process, never in the caller's (a crashing toolchain cannot take the caller down).
    Every compile made through the kit is watched; if none was a fresh build yet, one is made."""
    t = ctx.target
    try:
        clone = pickle.loads(pickle.dumps(t))
    except Exception as exc:
        raise ConformanceError(f"{t.name} cannot be pickled ({type(exc).__name__}: {exc}); the "
                               f"Target instance travels to the compile worker: keep only plain "
                               f"data on it (no open handles, lambdas or loaded libraries)") from exc
    if getattr(clone, "name", None) != t.name:
        raise ConformanceError(f"{t.name} unpickles as {clone!r}")
    if not ctx.fresh_builds:
        v = ctx.round_trip_variant()
        if not ctx.fresh_builds:  # everything was cached: force one build
            ctx.compile_variant(v, ctx.store, fidelity=False, rebuild=True).close()
    if ctx.inprocess_compiles:
        raise ConformanceError(f"{t.name}.compile() ran in the caller's process "
                               f"({len(ctx.inprocess_compiles)} time(s)): compiles must run in the "
                               f"isolated worker (hwbackends.isolate)")
    return (f"{len(ctx.fresh_builds)} build(s) ({', '.join(ctx.fresh_builds)}) ran in the "
            f"compile worker, none in the caller (pid {os.getpid()}); the target pickles")
