"""The LiteRT executor, shared by ``cpu.litert`` and ``tpu.edgetpu`` (its CPU-interpreter and
delegate paths)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from hwbackends.contract import BufferedExecutor, TensorSpec

from .tflite import io_tensors


class LiteRTExecutor(BufferedExecutor):
    """Zero-copy hot path: numpy views of the interpreter's own input/output buffers (one per
    tensor, found by :func:`~hwb_plugins._shared.tflite.io_tensors`) and the C++ ``Invoke``
    called directly. This beats ``set_tensor``/``invoke``/``get_tensor`` (which copy, allocate
    and check reference counts on every call): see docs/performance.md."""

    def __init__(self, path: Path, threads: int, batch: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], delegates: list[Any] | None = None):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=threads,
                                       experimental_delegates=delegates)
        self.interpreter.allocate_tensors()
        self._init_io(inputs, outputs, batch)
        idet, odet = self.interpreter.get_input_details(), self.interpreter.get_output_details()
        ins, outs = io_tensors(idet, odet, self._in_specs, self._out_specs)
        by_index = {d["index"]: d for d in [*idet, *odet]}
        #: The interpreter's details of each input/output, in spec order (dtype, quantization).
        self.input_details = [by_index[i] for i in ins]
        self.output_details = [by_index[i] for i in outs]
        # Views stay valid because allocate_tensors() is never called again.
        self._buffers([self.interpreter.tensor(i)() for i in ins],
                      [self.interpreter.tensor(i)() for i in outs],
                      self.interpreter._interpreter.Invoke)
