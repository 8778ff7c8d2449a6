"""``fpga.hls4ml``: hls4ml HLS designs for FPGAs.

Without a board the design runs as hls4ml's bit-accurate C-simulation, built once with g++
and cached in the artifact store (mode *emulated*). Precisions: ``auto`` (default: per-layer
fixed-point types that meet a fidelity target on calibration data, as narrow as it allows)
or any explicit ``ap_fixed<W,I>``. See docs/targets-fpga.md."""
from __future__ import annotations

from hwbackends.contract import hookimpl

from .target import Hls4mlTarget


@hookimpl
def hwb_targets():
    return [Hls4mlTarget()]


@hookimpl
def hwb_cli_commands(subparsers):
    from .cli import add  # the CLI helpers it uses are light, but only `hwb` needs them

    add(subparsers)


@hookimpl
def hwb_report_sections(results):
    from .report import sections

    return sections(results)
