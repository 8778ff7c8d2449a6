"""C-synthesis reports (Vivado HLS / Vitis HLS ``csynth.xml``) → :class:`SynthReport`.

Only what the tool wrote is reported: a field the report lacks stays ``None``. Nothing here
estimates anything (see estimate.py for the clearly labelled analytic estimate).
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SynthReport:
    """The headline numbers of one C-synthesis run (source: the tool's report)."""

    tool_version: str | None = None
    part: str | None = None
    top: str | None = None
    clock_target_ns: float | None = None
    clock_estimated_ns: float | None = None
    latency_min_cycles: int | None = None
    latency_max_cycles: int | None = None
    latency_min_ns: float | None = None
    latency_max_ns: float | None = None
    interval_min: int | None = None
    interval_max: int | None = None
    lut: int | None = None
    ff: int | None = None
    dsp: int | None = None
    bram_18k: int | None = None
    uram: int | None = None
    available: dict[str, int] = field(default_factory=dict)
    source: str = "csynth.xml"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != {}}


def _num(text: str | None, kind: type = float) -> Any:
    if text is None:
        return None
    m = re.search(r"-?\d+(\.\d+)?", text)
    if not m:  # "undef", "-", "?" for designs whose latency the tool cannot bound
        return None
    return kind(float(m.group(0))) if kind is int else kind(m.group(0))


def _ns(text: str | None) -> float | None:
    """'45.000 ns' / '0.450 us' → ns."""
    if text is None:
        return None
    v = _num(text)
    if v is None:
        return None
    unit = text.strip().split()[-1].lower() if " " in text.strip() else "ns"
    return v * {"ns": 1.0, "us": 1e3, "ms": 1e6, "sec": 1e9, "s": 1e9}.get(unit, 1.0)


def parse_csynth_report(xml_text: str) -> SynthReport:
    """Parse a Vivado HLS / Vitis HLS ``csynth.xml`` (the ``<profile>`` document)."""
    root = ET.fromstring(xml_text)
    if root.tag != "profile":
        raise ValueError(f"not a csynth report: root element <{root.tag}>, expected <profile>")

    def t(path: str) -> str | None:
        el = root.find(path)
        return el.text.strip() if el is not None and el.text else None

    lat = "PerformanceEstimates/SummaryOfOverallLatency/"
    res = "AreaEstimates/Resources/"
    lat_min, lat_max = _num(t(lat + "Best-caseLatency"), int), _num(t(lat + "Worst-caseLatency"), int)
    clock = _num(t("UserAssignments/TargetClockPeriod"))
    est = _num(t("PerformanceEstimates/SummaryOfTimingAnalysis/EstimatedClockPeriod"))
    ns_min = _ns(t(lat + "Best-caseRealTimeLatency"))
    ns_max = _ns(t(lat + "Worst-caseRealTimeLatency"))
    # Older Vivado HLS reports carry cycles only: ns = cycles × target clock, as the tool does.
    if ns_min is None and lat_min is not None and clock:
        ns_min = lat_min * clock
    if ns_max is None and lat_max is not None and clock:
        ns_max = lat_max * clock
    avail = {}
    for el in root.findall("AreaEstimates/AvailableResources/*"):
        v = _num(el.text, int)
        if v is not None:
            avail[el.tag] = v
    return SynthReport(
        tool_version=t("ReportVersion/Version"), part=t("UserAssignments/Part"),
        top=t("UserAssignments/TopModelName"), clock_target_ns=clock, clock_estimated_ns=est,
        latency_min_cycles=lat_min, latency_max_cycles=lat_max,
        latency_min_ns=ns_min, latency_max_ns=ns_max,
        interval_min=_num(t(lat + "Interval-min"), int), interval_max=_num(t(lat + "Interval-max"), int),
        lut=_num(t(res + "LUT"), int), ff=_num(t(res + "FF"), int),
        # Vitis HLS says DSP, Vivado HLS DSP48E.
        dsp=_num(t(res + "DSP") or t(res + "DSP48E"), int),
        bram_18k=_num(t(res + "BRAM_18K"), int), uram=_num(t(res + "URAM"), int),
        available=avail)


def find_report(project: Path, top: str = "myproject") -> Path | None:
    """The top function's csynth.xml under an hls4ml project after ``build(synth=True)``."""
    for pattern in (f"**/syn/report/{top}_csynth.xml", "**/syn/report/csynth.xml"):
        hits = sorted(project.glob(pattern))
        if hits:
            return hits[0]
    return None
