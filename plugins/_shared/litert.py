"""The LiteRT executor, shared by ``cpu.litert`` and ``tpu.edgetpu`` (its CPU-interpreter and
delegate paths)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hwbackends.specs import TensorSpec
from hwbackends.target import BufferedExecutor, BufferedMultiExecutor

from .tflite import multi_io_tensors


class LiteRTExecutor(BufferedExecutor):
    """Zero-copy hot path: numpy views of the interpreter's own input/output buffers and the
    C++ ``Invoke`` called directly. This beats ``set_tensor``/``invoke``/``get_tensor`` (which
    copy, allocate and check reference counts on every call): see docs/performance.md."""

    def __init__(self, path: Path, threads: int, batch: int, inp: TensorSpec, out: TensorSpec,
                 delegates: list[Any] | None = None):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=threads,
                                       experimental_delegates=delegates)
        self.interpreter.allocate_tensors()
        self._init_io(inp, out, batch)
        self.input_details = self.interpreter.get_input_details()[0]
        self.output_details = self.interpreter.get_output_details()[0]
        # Views stay valid because allocate_tensors() is never called again.
        self._in = self.interpreter.tensor(self.input_details["index"])()
        self._out = self.interpreter.tensor(self.output_details["index"])()
        self._invoke = self.interpreter._interpreter.Invoke


class LiteRTMultiExecutor(BufferedMultiExecutor):
    """Several inputs/outputs: numpy views of the interpreter's buffers, one per tensor,
    found by name (see :func:`~plugins._shared.tflite.multi_io_tensors`), and the C++
    ``Invoke`` called directly, as in :class:`LiteRTExecutor`."""

    def __init__(self, path: Path, threads: int, batch: int, inputs: list[TensorSpec],
                 outputs: list[TensorSpec], delegates: list[Any] | None = None):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=threads,
                                       experimental_delegates=delegates)
        self.interpreter.allocate_tensors()
        self._init_multi(inputs, outputs, batch)
        idet, odet = self.interpreter.get_input_details(), self.interpreter.get_output_details()
        ins, outs = multi_io_tensors(idet, odet, inputs, outputs)
        by_index = {d["index"]: d for d in [*idet, *odet]}
        #: The interpreter's details of each input/output, in spec order (dtype, quantization).
        self.input_details = [by_index[i] for i in ins]
        self.output_details = [by_index[i] for i in outs]
        # Views stay valid because allocate_tensors() is never called again.
        self._ins = tuple(self.interpreter.tensor(i)() for i in ins)
        self._outs = tuple(self.interpreter.tensor(i)() for i in outs)
        self._invoke = self.interpreter._interpreter.Invoke
