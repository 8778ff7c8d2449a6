"""Which ONNX graph tensor is which model input/output (ONNX Runtime and TensorRT bind by name)."""
from __future__ import annotations

from typing import Any, Sequence


def graph_inputs(proto: Any) -> list[str]:
    """The graph's real inputs, in graph order (initializers listed as inputs left out)."""
    inits = {i.name for i in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in inits]


def graph_outputs(proto: Any) -> list[str]:
    return [o.name for o in proto.graph.output]


def spec_order(names: Sequence[str], specs: Sequence[Any]) -> list[str]:
    """The graph's tensor names in spec order: by name when the specs carry the graph's names
    (ONNX models), else by position (converted models keep their source's names: tf2onnx
    names a Keras model's outputs ``Identity:0``, ``Identity_1:0``, … in output order)."""
    if sorted(names) == sorted(s.name for s in specs):
        return [s.name for s in specs]
    return list(names)
