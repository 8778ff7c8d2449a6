"""ONNX graph inputs and outputs that are not float32 (an embedding's int64 indices, a
float64 graph, an int64 result), made float32 at the graph's edge so they pass through the
one float32 predict interface: a ``Cast`` from float32 to the declared type after each such
input, a ``Cast`` to float32 before each such output. Every target sees the cast graph.

Integers (and bools) reach the graph exactly when they are integers of magnitude below
2**24 (float32's exact range); a fractional value is truncated toward zero by ``Cast``. A
float64 input is rounded to float32 first. Strings, complex numbers and 8-bit floats have
no float32 form: such a graph is refused naming the tensor."""
from __future__ import annotations

from typing import Any, Iterator

from ..errors import ModelError

#: ONNX element types a float32 tensor is cast to and from at the graph's edge.
CASTABLE = ("DOUBLE", "FLOAT16", "BFLOAT16", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16",
            "UINT32", "UINT64", "BOOL")
#: Of those, the types whose values are integers (synthetic inputs for them are whole numbers).
INTEGRAL = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "BOOL")


def _type_name(elem: int) -> str:
    from onnx import TensorProto
    return TensorProto.DataType.Name(elem)


def _subgraphs(graph: Any) -> Iterator[Any]:
    from onnx import AttributeProto

    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.GRAPH:
                yield a.g
            elif a.type == AttributeProto.GRAPHS:
                yield from a.graphs


def _names(graph: Any, into: set[str]) -> set[str]:
    """Every tensor name ``graph`` and its subgraphs use."""
    into.update(v.name for v in [*graph.input, *graph.output, *graph.value_info])
    into.update(i.name for i in graph.initializer)
    for node in graph.node:
        into.update(node.input)
        into.update(node.output)
    for sub in _subgraphs(graph):
        _names(sub, into)
    return into


def _defines(graph: Any, name: str) -> bool:
    return (any(v.name == name for v in graph.input) or any(i.name == name for i in graph.initializer)
            or any(name in n.output for n in graph.node))


def _rename_reads(graph: Any, old: str, new: str) -> None:
    """Every read of ``old`` in ``graph`` (and the subgraphs that see it from outside) as ``new``."""
    for node in graph.node:
        for i, n in enumerate(node.input):
            if n == old:
                node.input[i] = new
    for sub in _subgraphs(graph):
        if not _defines(sub, old):
            _rename_reads(sub, old, new)
            for o in sub.output:  # a subgraph may return the outer tensor itself
                if o.name == old:
                    o.name = new


def _unique(base: str, used: set[str]) -> str:
    name, k = base, 1
    while name in used:
        name, k = f"{base}_{k}", k + 1
    used.add(name)
    return name


def _tensor_elem(vi: Any) -> int | None:
    return vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else None


def float_io(proto: Any, name: str) -> tuple[Any, dict[str, dict[str, str]] | None]:
    """``proto`` with every non-float32 tensor input and output cast at the edge (a copy;
    ``proto`` itself when every one is float32), and what was cast: ``{"inputs": {name:
    type}, "outputs": {name: type}}`` (None: nothing). Raises :class:`ModelError` naming a
    tensor whose type has no float32 form. ``proto``'s default-domain opset is 6 or later
    (where ``Cast`` takes its type as a number)."""
    import onnx
    from onnx import TensorProto

    g = proto.graph
    inits = {i.name for i in g.initializer}
    ins = [vi for vi in g.input if vi.name not in inits]
    odd = [(kind, vi) for kind, vis in (("input", ins), ("output", g.output)) for vi in vis
           if _tensor_elem(vi) not in (None, TensorProto.FLOAT)]
    if not odd:
        return proto, None
    for kind, vi in odd:
        t = _type_name(_tensor_elem(vi))
        if t not in CASTABLE:
            raise ModelError(
                f"ONNX model {name!r}: {kind} {vi.name!r} is a {t.lower()} tensor, which has no "
                f"float32 form; hwbackends feeds and returns float32 numbers (integer, bool and "
                f"other float {kind}s are cast in the graph). Encode it as numbers outside the "
                f"model and export the numeric part")
    new = onnx.ModelProto()
    new.CopyFrom(proto)
    used = _names(new.graph, set())
    cast_in, front = _cast_inputs(new.graph, inits, used)
    cast_out, back = _cast_outputs(new.graph, cast_in, used)
    nodes = [*front, *new.graph.node, *back]
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    return new, {k: v for k, v in (("inputs", cast_in), ("outputs", cast_out)) if v}


def _cast_inputs(g: Any, inits: set[str], used: set[str]) -> tuple[dict[str, str], list[Any]]:
    """Each non-float32 input of ``g`` made float32, its readers reading a ``Cast`` of it to
    its type: (input → type, the Cast nodes to put first)."""
    from onnx import TensorProto, helper

    cast, nodes = {}, []
    for vi in g.input:
        elem = _tensor_elem(vi)
        if vi.name in inits or elem in (None, TensorProto.FLOAT):
            continue
        t = _type_name(elem).lower()
        inner = _unique(f"{vi.name}_{t}", used)
        _rename_reads(g, vi.name, inner)
        nodes.append(helper.make_node("Cast", [vi.name], [inner], to=elem, name=_unique(f"cast_{inner}", used)))
        vi.type.tensor_type.elem_type = TensorProto.FLOAT
        cast[vi.name] = t
    return cast, nodes


def _cast_outputs(g: Any, cast_in: dict[str, str], used: set[str]) -> tuple[dict[str, str], list[Any]]:
    """Each non-float32 output of ``g`` made a ``Cast`` to float32 of the tensor it was (renamed
    inside): (output → type, the Cast nodes to put last)."""
    from onnx import TensorProto, helper

    cast, nodes = {}, []
    for vi in g.output:
        elem = _tensor_elem(vi)
        if elem in (None, TensorProto.FLOAT):
            continue
        if vi.name in cast_in:  # an input passed straight through: now float32 itself
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
            continue
        if any(i.name == vi.name for i in g.input):  # an IR-3 initializer listed as an input
            continue
        t = _type_name(elem).lower()
        inner = _unique(f"{vi.name}_{t}", used)
        for node in g.node:
            node.output[:] = [inner if n == vi.name else n for n in node.output]
        _rename_reads(g, vi.name, inner)
        for v in [*g.value_info, *g.initializer]:  # its inferred shape; an output that is a constant
            if v.name == vi.name:
                v.name = inner
        nodes.append(helper.make_node("Cast", [inner], [vi.name], to=TensorProto.FLOAT,
                                      name=_unique(f"cast_{vi.name}", used)))
        vi.type.tensor_type.elem_type = TensorProto.FLOAT
        cast[vi.name] = t
    return cast, nodes
