"""``fpga.da4ml``: da4ml distributed-arithmetic RTL for FPGAs, with open tools only.

A Keras/PyTorch dense network becomes a fixed-point, multiplier-free pipelined Verilog design
(da4ml), runs as a cycle-accurate, bit-exact Verilator model (mode *emulated*: RTL
simulation), and is sized by yosys. ``describe()["hardware_estimate"]`` carries the
*modelled* cycles, II, resources and ns. See docs/targets-fpga.md."""
from __future__ import annotations

from hwbackends.contract import hookimpl

from .target import Da4mlTarget


@hookimpl
def hwb_targets():
    return [Da4mlTarget()]


@hookimpl
def hwb_report_sections(results):
    from .report import sections

    return sections(results)
