"""``tpu.edgetpu``: full-int8 TFLite compiled by ``edgetpu_compiler`` and run through the
``libedgetpu`` delegate on a Coral Edge TPU (mode hardware); without compiler or device the
same int8 model runs on the CPU LiteRT interpreter (mode emulated, reason shown)."""
from __future__ import annotations

from hwbackends.contract import hookimpl

from .target import EdgeTpuTarget


@hookimpl
def hwb_targets():
    return [EdgeTpuTarget()]
