"""The ``fpga.hls4ml`` target: hls4ml HLS designs, run as bit-accurate C-simulation."""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from hwbackends.contract import (
    Artifact,
    Availability,
    CacheError,
    CompileError,
    CompileOptions,
    Target,
    UnsupportedError,
)

from .._shared.fpga_summary import bits_lines, report_meta
from .._util import cpu_name, importable, version
from .build import GXX_ADVICE, build, gxx, gxx_version, patch_bridge, trace
from .csim import CsimExecutor, CsimLibrary

# The compile-side modules (convert, precision, synth, bitstreams, pynq_exec: ~150 ms together
# on a loaded machine) are imported in the functions that use them, not here: `hwb targets`
# imports this module for every command (the light-import rule, hwbackends.target.Target).

#: ``ap_fixed<W,I>`` (C++ spelling) or ``fixed<W,I>`` (hls4ml's), optionally with modes.
_FIXED = re.compile(r"^(ap_)?(u?fixed)<\s*(\d+)\s*,\s*(-?\d+)\s*(,\s*[A-Z_]+\s*)*>$")
LIB = "csim/libmyproject.so"
WEIGHTS = "csim/weights"


def parse_fixed(p: str) -> str | None:
    """hls4ml's spelling (``fixed<16,6>``) of an explicit precision, or None."""
    m = _FIXED.match(p.strip())
    if not m:
        return None
    width, integer = int(m.group(3)), int(m.group(4))
    if not 1 <= width <= 64 or integer > width:
        return None
    return p.strip().removeprefix("ap_")


def _synth_tool(backend: str) -> str | None:
    return shutil.which("vitis_hls" if backend == "Vitis" else "vivado_hls")


class Hls4mlTarget(Target):
    name = "fpga.hls4ml"
    family = "fpga"
    # Listed: only "auto" (what a sweep over precisions should build); accepted: also any
    # explicit ap_fixed<W,I>, e.g. hls4ml's default "ap_fixed<16,6>".
    precisions = ("auto",)
    precision_rule = ("any ap_fixed<W,I> / fixed<W,I> with 1 ≤ W ≤ 64 and I ≤ W (also ufixed, "
                      "and rounding/saturation modes: ap_fixed<16,6,AP_RND,AP_SAT>)")

    calibrated = ("auto",)
    formats = ("keras", "torch")
    install = "hwbackends[fpga]"
    description = ("hls4ml HLS design; bit-accurate g++ C-simulation on the CPU (emulated); "
                   "precision auto or any ap_fixed<W,I>")
    option_docs = {
        "backend": "hls4ml backend: Vitis (default) or Vivado (C-sim builds for both; "
                   "Quartus/oneAPI/Catapult are refused with the reason)",
        "io_type": "io_parallel (default: every layer's whole tensor at once, the lowest "
                   "latency for small models) or io_stream (layers joined by FIFOs, one time "
                   "step per beat: less area for Conv1D/LSTM stacks; the C-simulation answers "
                   "are the same)",
        "strategy": "Latency (default) or Resource",
        "reuse_factor": "hls4ml ReuseFactor, integer ≥ 1 (default 1: fully parallel)",
        "clock_period": "target clock period in ns (default 5)",
        "part": "FPGA part (default: the backend's, xcvu13p-flga2577-2-e for Vitis)",
        "fidelity": "auto-precision target, dict of corr_min (0.999), rel_err (0.01 = max abs "
                    "error / output range), sign_min (0.995), argmax_min (0.995)",
        "synth": "true: run C-synthesis and store the parsed report (needs vitis_hls/vivado_hls "
                 "on PATH; otherwise the report records why it is absent)",
    }
    compile_timeout = 900.0
    version = "2"  # 2: hls4ml sees generated layer names
    batch_independent = True  # the C-simulation loops over samples; load() sizes the executor

    def accepts(self, precision: str) -> bool:
        return precision in self.precisions or parse_fixed(precision) is not None

    # -- availability -----------------------------------------------------------------------
    def probe(self) -> Availability:
        if not importable("hls4ml"):
            return Availability.unavailable("hls4ml not installed (pip install hls4ml==1.3.0)")
        if not gxx():
            return Availability.unavailable("g++ not on PATH (or HWB_CXX not executable): hls4ml's "
                                            "C-simulation needs a C++ compiler (apt-get install g++)")
        synth = _synth_tool("Vitis")
        board = ("pynq importable; a matching bitstream selects the board at load"
                 if importable("pynq") else "no FPGA board: pynq not importable")
        return Availability.emulated(
            f"CPU ({cpu_name()}) running hls4ml C-simulation",
            f"bit-accurate fixed-point C-simulation (g++); {board}; synthesis "
            + ("available (" + synth + ")" if synth else "unavailable: vitis_hls not on PATH"),
            synthesis=bool(synth), board=importable("pynq"))

    def toolchain(self) -> dict[str, str]:
        return {"hls4ml": version("hls4ml"), "g++": gxx_version(), "keras": version("keras"),
                "torch": version("torch")}

    def check_options(self, options: CompileOptions) -> None:
        """Option values, and ``synth=true`` without the vendor tool, refused before a build."""
        from . import convert

        opts = convert.HlsOptions.from_extra(options.extra)
        if opts.synth and not _synth_tool(opts.backend):
            tool = "vitis_hls" if opts.backend == "Vitis" else "vivado_hls"
            raise UnsupportedError(f"fpga.hls4ml option synth=true runs C-synthesis with {tool}, "
                                   f"which is not on PATH: install Vitis HLS and put {tool} on "
                                   f"PATH, or drop -O synth=true to build the C-simulation only "
                                   f"(no cycles or resources without it)")

    # -- compile (isolated child process) -------------------------------------------------
    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        from hwbackends.contract import compare

        from . import convert
        from . import precision as P

        opts = convert.HlsOptions.from_extra(options.extra)
        target = P.FidelityTarget.from_option(opts.fidelity)
        calib = options.calibration if options.calibration is not None else model.representative(256)
        calib = np.ascontiguousarray(calib, dtype=np.float32)
        ref = model.reference(calib)
        model = convert.for_hls4ml(model)  # BatchNormalization folded, torch rebuilt: refusals first
        names = convert.renaming(model)  # hls4ml sees generated names; the meta shows the user's
        # Scratch inside the staged artifact directory: removed below on success, and with
        # the staging directory by the core when the worker is killed (timeout, crash).
        builder = _Builder(model, opts, workdir / ".hwb-build")
        t0 = time.perf_counter()
        try:
            if options.precision == "auto":
                cfg, tag, search_meta = _auto_precision(builder, target, calib, ref)
            else:
                fx = parse_fixed(options.precision)
                if fx is None:
                    raise UnsupportedError(f"fpga.hls4ml precision must be 'auto' or ap_fixed<W,I>; "
                                           f"got {options.precision!r}")
                cfg, tag, search_meta = convert.hls_config(model, opts, fx), "fixed", {}
                builder.make(cfg, tag)
            hm, project, built = builder.builds[tag]
            lib = CsimLibrary(built.lib, built.weights_dir, builder.n_in, builder.n_out)
            fid = compare(ref, lib.run(calib).reshape(ref.shape))
            self._store(workdir, project, built)
            return {
                "mode": "emulated: hls4ml C-simulation (g++), bit-accurate for the fixed-point types",
                "n_in": builder.n_in, "n_out": builder.n_out, "lib": LIB, "weights": WEIGHTS,
                "hls4ml_config": _jsonable(cfg), "options": opts.to_dict(),
                "layer_names": names.names,  # the config's generated names → the user's
                "types": names.user_keys(_types(hm)), "bits": _user_bits(P.design_bits(hm), names),
                "calibration_fidelity": fid.to_dict(),
                "meets_target": not target.tolerance(P.SEARCH_MARGIN if search_meta else 1.0).violations(fid),
                "search": _user_ranges(search_meta, names), "builds": len(builder.builds),
                "builds_cached": sum(b[2].cached for b in builder.builds.values()),
                "build_seconds": round(sum(b[2].seconds for b in builder.builds.values()), 2),
                "compile_seconds": round(time.perf_counter() - t0, 2),
                "synthesis": _synthesis(hm, opts, workdir),
            }
        finally:
            shutil.rmtree(builder.scratch, ignore_errors=True)

    @staticmethod
    def _store(workdir: Path, project: Path, built: Any) -> None:
        """The library and its weights (what load() needs), and the HLS project (what
        synthesis needs), into the artifact directory the store content-addresses."""
        (workdir / "csim").mkdir(parents=True, exist_ok=True)
        shutil.copy2(built.lib, workdir / LIB)
        shutil.copytree(built.weights_dir, workdir / WEIGHTS,
                        ignore=lambda d, names: [n for n in names if not n.endswith(".txt")])
        shutil.copytree(project, workdir / "project",
                        ignore=shutil.ignore_patterns("*.so", "*.o", "*.gch", "*.tar.gz"))

    # -- load (parent process) --------------------------------------------------------------
    def load(self, artifact: Artifact, options: CompileOptions) -> Any:
        meta = artifact.meta
        lib_path = artifact.file(meta.get("lib", LIB))
        if not lib_path.exists():
            raise CacheError(f"artifact {artifact.key[:12]} has no C-sim library; it will be rebuilt")
        lib = CsimLibrary(lib_path, artifact.file(meta.get("weights", WEIGHTS)),
                          int(meta["n_in"]), int(meta["n_out"]))
        hw = _hardware_executor(artifact)
        if hw is not None:
            return hw
        return CsimExecutor(lib, artifact.batch_size, artifact.inputs[0], artifact.outputs[0])

    # -- what the core shows of a build (parent process, light) ------------------------------
    def summary_lines(self, meta: dict[str, Any]) -> list[str]:
        """Synthesis (the parsed report, or why there is none), then the bits."""
        return _synthesis_lines(meta) + bits_lines(meta)

    def report_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        return report_meta(meta)


class _Builder:
    """Builds C-simulation libraries of one model for several hls4ml configurations, each in
    a scratch directory of its own, and keeps every build (the search compares many)."""

    def __init__(self, model: Any, opts: Any, scratch: Path):
        self.model, self.opts, self.scratch = model, opts, scratch
        self.n_in, self.n_out = int(np.prod(model.input.shape)), int(np.prod(model.output.shape))
        self.builds: dict[str, tuple[Any, Path, Any]] = {}
        scratch.mkdir(parents=True, exist_ok=True)

    def make(self, cfg: dict[str, Any], tag: str) -> CsimLibrary:
        """Convert with ``cfg``, build, and load the library (recorded under ``tag``)."""
        from . import convert

        outdir = self.scratch / tag
        hm = convert.convert(self.model, cfg, self.opts, outdir)
        try:
            hm.write()
        except Exception as exc:
            raise CompileError(f"hls4ml {version('hls4ml')} could not write the HLS project "
                               f"({type(exc).__name__}: {str(exc)[:500]}). {GXX_ADVICE}") from None
        patch_bridge(outdir, convert.PROJECT, self.n_in, self.n_out)
        built = build(outdir, convert.PROJECT, tag)
        self.builds[tag] = (hm, outdir, built)
        return CsimLibrary(built.lib, built.weights_dir, self.n_in, self.n_out)


def _auto_precision(builder: _Builder, target: Any, calib: np.ndarray,
                    ref: np.ndarray) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """precision='auto': trace the layer ranges, search the fewest fractional bits that meet
    ``target``, then narrow the weights'. Returns (hls4ml config, build tag, search record)."""
    from . import convert, emulate
    from . import precision as P

    model, opts = builder.model, builder.opts
    base = convert.hls_config(model, opts, "fixed<16,6>")
    tcfg = convert.hls_config(model, opts, P.TRACE_PRECISION)
    tcfg["Model"]["TraceOutput"] = True
    for lc in tcfg.get("LayerName", {}).values():
        lc["Trace"] = True
    t1 = time.perf_counter()
    thm = convert.convert(model, tcfg, opts, builder.scratch / "trace")
    # Ranges from the float model where the hls4ml graph is the layer IR's chain one for one
    # (every zoo model, the LSTM included: the types assigned were identical to the C-sim
    # trace's); else from a C-simulation build of the traced design. The traced graph is
    # converted either way: measure_ranges reads its layers.
    net = emulate.network(model)  # the layer IR, read once for the ranges and the first guess
    floats = emulate.float_trace(net, thm, calib)
    ranges = P.measure_ranges(thm, calib, (lambda x: (None, floats)) if floats is not None
                              else (lambda x: trace(thm, builder.scratch / "trace", x)))
    trace_s = time.perf_counter() - t1
    predicted = emulate.first_bits(net, calib, ref, target)
    start = predicted[0] if predicted else P.first_guess(target, float(np.ptp(ref)))
    evaluate = P.evaluate_fn(lambda f: (builder.make(P.assign(base, ranges, f), f"f{f}"), None),
                             calib, ref)
    best, trials = P.search(evaluate, target, start)
    if best is None:
        closest = trials[-1]
        raise CompileError(
            f"precision='auto' found no fixed-point design meeting {target.to_dict()} "
            f"with up to {P.F_MAX} fractional bits (best: {closest.fidelity}; "
            f"{'; '.join(closest.violations)}). Loosen option fidelity, or compile an "
            f"explicit precision such as ap_fixed<32,12>")
    evaluate_weights = P.evaluate_fn(
        lambda fw: (builder.make(P.assign(base, ranges, best, fw), f"f{best}w{fw}"), None), calib, ref)
    # The weights' guess is the model's for the chosen f (the same f it predicted, or the
    # search moved away from it: then no guess, the coarse f-4 / f-2).
    w_first = predicted[1] if predicted and predicted[0] == best else None
    best_w, wtrials = P.narrow_weights(evaluate_weights, target, best, first=w_first)
    tag = f"f{best}" if best_w == best else f"f{best}w{best_w}"
    search = {"frac_bits": best, "weight_frac_bits": best_w, "start": start,
              "predicted": ({"frac_bits": predicted[0], "weight_frac_bits": predicted[1],
                             "by": "float model of the design's rounding and tables "
                                   "(hwb_plugins/fpga_hls4ml/emulate.py)"} if predicted else None),
              "trace_seconds": round(trace_s, 2),
              "ranges_from": ("float model (layer IR)" if floats is not None
                              else "hls4ml C-simulation trace at " + P.TRACE_PRECISION),
              "trials": [p.__dict__ for p in trials],
              "weight_trials": [p.__dict__ for p in wtrials], "target": target.to_dict(),
              "ranges": {k: list(v) for k, v in ranges.results.items()}}
    return P.assign(base, ranges, best, best_w), tag, search


def _hardware_executor(artifact: Artifact) -> Any:
    """A PYNQ overlay executor when pynq is importable and a bitstream for this model's
    fingerprint and the detected board exists; else None (the C-sim serves)."""
    if not importable("pynq"):
        return None
    from .bitstreams import BitstreamStore, detect_board
    from .pynq_exec import PynqExecutor

    board = detect_board()
    if board is None:
        return None
    entry = BitstreamStore().find(board, artifact.fingerprint)
    if entry is None:
        return None
    return PynqExecutor(entry, artifact.batch_size, artifact.inputs[0], artifact.outputs[0])


def _synthesis(hm: Any, opts: Any, workdir: Path) -> dict[str, Any]:
    """Run C-synthesis when asked and the vendor tool exists; never invent numbers."""
    tool = _synth_tool(opts.backend)
    if not opts.synth:
        return {"requested": False,
                "available": bool(tool), "reason": "" if tool else
                f"{'vitis_hls' if opts.backend == 'Vitis' else 'vivado_hls'} not on PATH"}
    if not tool:
        return {"requested": True, "available": False,
                "reason": f"{'vitis_hls' if opts.backend == 'Vitis' else 'vivado_hls'} not on PATH: "
                          f"no synthesis report (nothing estimated in its place)"}
    from .synth import find_report, parse_csynth_report

    proj = workdir / "project"
    hm.config.config["OutputDir"] = str(proj)
    hm.build(csim=False, synth=True, vsynth=False)
    rpt = find_report(proj)
    if rpt is None:
        return {"requested": True, "available": True, "reason": "synthesis ran but wrote no report"}
    return {"requested": True, "available": True, "tool": tool,
            "report": parse_csynth_report(rpt.read_text()).to_dict(), "report_file": str(rpt.relative_to(workdir))}


def _synthesis_lines(meta: dict[str, Any]) -> list[str]:
    """``hwb compile``'s synthesis line: the report's scalar figures, or that only the
    C-simulation ran (and why), from :func:`_synthesis`'s dict. None for a build that models
    its own ``hardware_estimate`` (that says more)."""
    syn = meta.get("synthesis")
    if not isinstance(syn, dict) or meta.get("hardware_estimate"):
        return []
    if syn.get("report"):
        r = syn["report"]
        return [f"  synthesis {syn.get('tool')}: " + ", ".join(
            f"{k} {v}" for k, v in r.items() if not isinstance(v, (dict, list)))[:300]]
    return ["  synthesis " + ("not requested" if not syn.get("requested") else "not run")
            + (f" ({syn['reason']})" if syn.get("reason") else "")
            + ": C-simulation only, no cycles or resources"]


def _types(hm: Any) -> dict[str, dict[str, str]]:
    """Each layer's types as hls4ml built them: result, weights, and the tables and
    accumulators (``table``, ``exp_table``, ``inv_table``, ``inv_inp``, ``accum``)."""
    from .precision import CONFIG_TYPES

    out: dict[str, dict[str, str]] = {}
    for layer in hm.get_layers():
        d = {"result": str(layer.get_output_variable().type.precision)}
        for k, w in layer.weights.items():
            d[k] = str(w.type.precision)
        for k in (*CONFIG_TYPES, "accum"):
            t = layer.get_attr(f"{k}_t")
            if t is not None and hasattr(t, "precision"):
                d[k] = str(t.precision)
        out[layer.name] = d
    return out


def _user_bits(bits: dict[str, Any], names: Any) -> dict[str, Any]:
    """:func:`.precision.design_bits` with the per-layer widths under the user's names."""
    return {**bits, "result_widths": names.user_keys(bits.get("result_widths", {}))}


def _user_ranges(search: dict[str, Any], names: Any) -> dict[str, Any]:
    """The search record with its per-layer ranges under the user's names."""
    if not search.get("ranges"):
        return search
    return {**search, "ranges": names.user_keys(search["ranges"])}


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))
