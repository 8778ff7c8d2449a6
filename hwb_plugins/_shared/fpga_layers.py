"""The FPGA targets' layer-support section of ``docs/targets-fpga.md``, written from what the
targets' own checks accept (``fpga_hls4ml.convert.accepted_keras_layers`` and
``supported_layers``, ``fpga_da4ml.network.SUPPORTED``), so the table cannot drift from the
code. ``tests/test_fpga_layers.py`` fails when the section is stale.

    python -m hwb_plugins._shared.fpga_layers           # rewrite the section
    python -m hwb_plugins._shared.fpga_layers --check   # exit 1 if it is stale
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

BEGIN = ("<!-- BEGIN GENERATED FPGA LAYERS: written by `python -m hwb_plugins._shared.fpga_layers` "
         "from the targets' own checks; edit those, not this section -->")
END = "<!-- END GENERATED FPGA LAYERS -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "targets-fpga.md"


def render() -> str:
    """The section's Markdown: one row per target and model format, then the refused settings."""
    from hwbackends.layer_ir import batchnorm

    from ..fpga_da4ml.network import SUPPORTED
    from ..fpga_hls4ml import convert
    from .torch_export import REBUILT, REBUILT_CONV

    rows = [("fpga.hls4ml", "Keras", ", ".join(convert.accepted_keras_layers())),
            ("fpga.hls4ml", "PyTorch", f"{REBUILT}; {REBUILT_CONV} (the input read as the "
             f"model holds it): what it rebuilds from the torch.export program every isolated "
             f"compile receives (a sequential chain, as nn.Sequential); "
             f"hls4ml's own list ({', '.join(convert.supported_layers('torch'))}) only for an "
             f"nn.Module compiled in process (isolate_compile=False)"),
            ("fpga.da4ml", "Keras, PyTorch", SUPPORTED)]
    lines = ["| target | format | layers accepted |", "|---|---|---|"]
    lines += [f"| {t} | {f} | {layers} |" for t, f, layers in rows]
    lines += ["", f"Keras BatchNormalization on fpga.hls4ml (and cpu.native `fixed`): {batchnorm.FOLDS}.",
              "", "Refused by name although hls4ml lists the layer:", ""]
    lines += [f"* {what}: {why}" for what, why in convert.REFUSED_SETTINGS.items()]
    return "\n".join(lines) + "\n"


def splice(text: str, body: str) -> str:
    """``text`` with the section between :data:`BEGIN` and :data:`END` replaced by ``body``
    (the docs' one splice, :func:`hwbackends.docgen.splice`)."""
    from hwbackends.contract import splice as splice_section

    return splice_section(text, body.rstrip("\n"), BEGIN, END)


def is_current(path: Path = DOC) -> bool:
    text = path.read_text()
    return splice(text, render()) == text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hwb_plugins._shared.fpga_layers",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the section is stale")
    a = ap.parse_args(argv)
    if a.check:
        if not is_current():
            print(f"{DOC}: the FPGA layer section is stale; run python -m "
                  f"hwb_plugins._shared.fpga_layers", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(splice(DOC.read_text(), render()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
