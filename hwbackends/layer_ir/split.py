"""A model with several inputs or outputs cut into single-chain parts, each read by the
format's own reader (:mod:`.multi` has the shape they form).

The cut is the one merge of the inputs: the Keras layer, ONNX node or torch op that
concatenates (last axis) or adds values each computed from a different set of the model's
inputs, those sets covering them all (an ``Add`` inside one input's chain, a residual, reads
one input only and is not the merge). Each input's part runs from it to its operand of the
merge; each output's part from the merge's result (the one input, when there is one) to that
output. The parts are sub-models of the model itself — a Keras functional model between two
tensors, an ONNX graph of the nodes between two values, a ``torch.export`` program of the
nodes between two — so the readers take them unchanged. A part that reads anything besides
its one value (an output that reads an input past the merge, two merges) is refused naming
it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from hwbackends.contract import UnsupportedError

from .ir import Layer, chain_shape

_SHAPE_HINT = ("the shapes compiled: each input through its own chain, one Concatenate (last "
               "axis) or Add of them, a shared trunk, one chain per output")


@dataclass
class Parts:
    merge: str  # concat | add | none
    branches: list[tuple[int, list[Layer]]]  # (model input index, chain) in merge order
    outputs: list[list[Layer]]  # per model output, the chain from the merge to it


def parts(model: Any, target: str, in_shapes: list[tuple[int, ...]]) -> Parts:
    if model.format == "keras":
        return _keras(model, target, in_shapes)
    if model.format == "onnx":
        return _onnx(model, target, in_shapes)
    if model.format == "torch":
        return _torch(model, target, in_shapes)
    raise UnsupportedError(f"{target} reads Keras, PyTorch or ONNX models; got format {model.format!r}")


def _find_merge(target: str, candidates: list[tuple[str, str, list[Any]]], reach: Callable[[Any], frozenset],
                n_inputs: int) -> tuple[str, str, list[Any], list[int]] | None:
    """The merge among ``candidates`` ``(name, kind, operands)``: operands reached from
    disjoint, non-empty sets of inputs covering all ``n_inputs``; with the input index of each
    operand. None for a model with one input; refused when the inputs never meet so."""
    if n_inputs == 1:
        return None
    near = ""
    for name, kind, ops in _flatten(candidates, reach):
        sets = [reach(o) for o in ops]
        if any(len(s) != 1 for s in sets) or len({next(iter(s)) for s in sets}) != len(sets):
            if not near and len(frozenset().union(*sets)) == n_inputs:
                near = (f" (the {'concatenation' if kind == 'concat' else 'add'} that meets them "
                        f"has operands reading inputs {[sorted(s) for s in sets]} by position: "
                        f"each operand must come from one input alone, a different one each)")
            continue
        if len(sets) == n_inputs:
            return name, kind, ops, [next(iter(s)) for s in sets]
    raise UnsupportedError(f"{target}: the model's {n_inputs} inputs do not meet in one "
                           f"Concatenate (last axis) or Add of one chain per input{near}; "
                           f"{_SHAPE_HINT}")


def _flatten(candidates: list[tuple[Any, str, list[Any]]], reach: Callable[[Any], frozenset]
             ) -> list[tuple[Any, str, list[Any]]]:
    """Each candidate with the operands that are themselves merges of the same kind over
    several inputs replaced by theirs: ``(a + b) + c`` (how torch and ONNX write an add of
    three) is one add of three, ``cat(cat(a, b), c)`` one concatenation."""
    by_result = {_key(name): (kind, ops) for name, kind, ops in candidates}

    def expand(v: Any, kind: str) -> list[Any]:
        out, todo = [], [v]  # depth first, operands in order, without recursion
        while todo:
            x = todo.pop()
            got = by_result.get(_key(x))
            if got is None or got[0] != kind or len(reach(x)) < 2:
                out.append(x)
            else:
                todo.extend(reversed(got[1]))
        return out

    return [(name, kind, [x for o in ops for x in expand(o, kind)]) for name, kind, ops in candidates]


def _key(v: Any) -> Any:
    """A value's identity: a name (ONNX), or the object (a torch node, a Keras tensor)."""
    return v if isinstance(v, str) else id(v)


def _reacher(seeds: dict[Any, int], parents: Callable[[Any], list[Any]]) -> Callable[[Any], frozenset]:
    """``reach(v)``: the inputs (``seeds``: a value's key → input index) value ``v`` is
    computed from, walking ``parents`` without recursion (a deep graph is no stack overflow;
    a cycle adds nothing)."""
    memo: dict[Any, frozenset] = {}

    def reach(v: Any) -> frozenset:
        stack, open_ = [(v, False)], set()
        while stack:
            x, done = stack.pop()
            k = _key(x)
            if k in memo:
                continue
            if k in seeds:
                memo[k] = frozenset({seeds[k]})
            elif done:
                open_.discard(k)
                memo[k] = frozenset().union(*(memo.get(_key(p), frozenset()) for p in parents(x)))
            elif k not in open_:
                open_.add(k)
                stack.append((x, True))
                stack.extend((p, False) for p in parents(x) if _key(p) not in memo and _key(p) not in open_)
        return memo.get(_key(v), frozenset())

    return reach


def _chain_to(target: str, what: str, read: Callable[[], list[Layer]]) -> list[Layer]:
    try:
        return read()
    except UnsupportedError as exc:
        raise UnsupportedError(f"{exc} (in the part of the model for {what})") from None


# -- Keras -------------------------------------------------------------------------------------
def _keras(model: Any, target: str, in_shapes: list[tuple[int, ...]]) -> Parts:
    import keras

    from .from_keras import read_keras

    km = model.obj
    if isinstance(km, keras.Sequential):
        raise UnsupportedError(f"{target}: a Sequential model has one input and one output")
    ins, outs = list(km.inputs), list(km.outputs)

    def parents(t: Any) -> list[Any]:
        hist = getattr(t, "_keras_history", None)
        if hist is None:
            return []
        op, node_index = hist[0], hist[1]
        return [x for x in op._inbound_nodes[node_index].input_tensors if x is not None]

    reach = _reacher({id(t): i for i, t in enumerate(ins)}, parents)
    cands = _keras_merges(km)
    found = _find_merge(target, [(c[3], c[1], c[2]) for c in cands], reach, len(ins))

    def sub(t: Any, u: Any, what: str) -> list[Layer]:
        if t is u:
            return []
        try:
            part = keras.Model(inputs=t, outputs=u)
        except Exception as exc:  # Keras raises ValueError for an output that needs other inputs
            raise UnsupportedError(f"{target}: {what} is not computed from one value alone "
                                   f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                                   f"{_SHAPE_HINT}") from None
        if len(part.inputs) != 1:
            raise UnsupportedError(f"{target}: {what} reads {len(part.inputs)} values; {_SHAPE_HINT}")
        return _chain_to(target, what, lambda: read_keras(part, target))

    if found is None:
        start, kind, branches = ins[0], "none", [(0, [])]
    else:
        start, kind, ops, idx = found
        branches = [(i, sub(ins[i], o, f"input {model.inputs[i].name!r}")) for i, o in zip(idx, ops, strict=True)]
    outputs = [sub(start, u, f"output {model.outputs[k].name!r}") for k, u in enumerate(outs)]
    return Parts(kind, branches, outputs)


def _keras_merges(km: Any) -> list[tuple[str, str, list[Any], Any]]:
    """Every Concatenate of the last axis and every Add: (name, kind, operands, result)."""
    cands = []
    for op in km.operations:
        cls = type(op).__name__
        if cls not in ("Concatenate", "Add"):
            continue
        for node in op._inbound_nodes:
            if cls == "Concatenate":
                axis = op.get_config().get("axis", -1)
                rank = len(node.input_tensors[0].shape)
                if axis not in (-1, rank - 1):
                    continue
            cands.append((op.name, "concat" if cls == "Concatenate" else "add",
                          list(node.input_tensors), node.output_tensors[0]))
    return cands


# -- ONNX --------------------------------------------------------------------------------------
def _onnx(model: Any, target: str, in_shapes: list[tuple[int, ...]]) -> Parts:
    from .from_onnx import read_onnx

    proto = model.obj
    g = proto.graph
    inits = {i.name for i in g.initializer}
    inputs = [i.name for i in g.input if i.name not in inits]
    made = {o: n for n in g.node for o in n.output}
    reach = _reacher({n: i for i, n in enumerate(inputs)},
                     lambda v: [i for i in made[v].input if i] if v in made else [])

    cands, axes = [], {}
    for n in g.node:
        data = [i for i in n.input if i and reach(i)]
        if n.op_type == "Concat" and len(data) == len(n.input):
            # the axis is checked against the operands' rank once they are read
            axes[n.output[0]] = next((int(a.i) for a in n.attribute if a.name == "axis"), None)
            cands.append((n.output[0], "concat", data))
        elif n.op_type in ("Add", "Sum") and len(data) == len(n.input) >= 2:
            cands.append((n.output[0], "add", data))
    found = _find_merge(target, cands, reach, len(inputs))

    def sub(t: str, u: str, shape: tuple[int, ...], what: str) -> list[Layer]:
        if t == u:
            return []
        part = _onnx_part(proto, t, u, shape, inputs, target, what)
        return _chain_to(target, what, lambda: read_onnx(part, target))

    if found is None:
        start, kind, branches = inputs[0], "none", [(0, [])]
        merged = in_shapes[0]
    else:
        start, kind, ops, idx = found
        branches = [(i, sub(inputs[i], o, in_shapes[i], f"input {model.inputs[i].name!r}"))
                    for i, o in zip(idx, ops, strict=True)]
        outs = [chain_shape(c, in_shapes[i]) for i, c in branches]
        if kind == "concat" and axes[start] not in (-1, len(outs[0])):
            raise UnsupportedError(f"{target}: the inputs meet in a Concat on axis {axes[start]} of "
                                   f"a rank-{len(outs[0]) + 1} tensor; it compiles a concatenation "
                                   f"of the last (feature) axis. {_SHAPE_HINT}")
        merged = (*outs[0][:-1], sum(s[-1] for s in outs)) if kind == "concat" else outs[0]
    outputs = [sub(start, o.name, merged, f"output {model.outputs[k].name!r}")
               for k, o in enumerate(g.output)]
    return Parts(kind, branches, outputs)


def _onnx_part(proto: Any, t: str, u: str, shape: tuple[int, ...], inputs: list[str],
               target: str, what: str) -> Any:
    """The ONNX model of the nodes that compute ``u`` from ``t`` (of per-sample ``shape``)."""
    import onnx
    from onnx import helper

    g = proto.graph
    made = {o: n for n in g.node for o in n.output}
    inits = {i.name: i for i in g.initializer}
    need: set[int] = set()
    used_inits: set[str] = set()
    todo = [u]
    seen: set[str] = set()
    while todo:
        v = todo.pop()
        if v in seen or v == t or not v:
            continue
        seen.add(v)
        if v in inits:
            used_inits.add(v)
        elif v in made:
            need.add(id(made[v]))
            todo.extend(made[v].input)
        elif v in inputs:
            raise UnsupportedError(f"{target}: {what} reads input {v!r} besides {t!r}; {_SHAPE_HINT}")
    nodes = [n for n in g.node if id(n) in need]
    x = helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, ["N", *shape])
    y = next((o for o in g.output if o.name == u), None) or \
        helper.make_tensor_value_info(u, onnx.TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, f"{g.name}_part", [x], [y],
                              initializer=[inits[i] for i in sorted(used_inits)])
    part = helper.make_model(graph, opset_imports=list(proto.opset_import))
    part.ir_version = proto.ir_version
    return part


# -- torch -------------------------------------------------------------------------------------
def _torch(model: Any, target: str, in_shapes: list[tuple[int, ...]]) -> Parts:
    import torch

    from .from_torch import read_torch

    gm = _torch_program(model.obj, target, in_shapes).module()
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outs_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(outs_node.args[0]) if isinstance(outs_node.args[0], (list, tuple)) else [outs_node.args[0]]
    if len(places) != len(in_shapes) or len(outs) != len(model.outputs):
        raise UnsupportedError(f"{target}: the torch program takes {len(places)} tensors and gives "
                               f"{len(outs)}; the model declares {len(in_shapes)} inputs and "
                               f"{len(model.outputs)} outputs")
    reach = _reacher({id(n): i for i, n in enumerate(places)},
                     lambda v: [a for a in v.all_input_nodes if str(a.target) not in _TORCH_META])

    found = _find_merge(target, _torch_merges(gm), reach, len(places))

    def sub(t: Any, u: Any, shape: tuple[int, ...], what: str) -> list[Layer]:
        if t is u:
            return []
        part = _torch_part(gm, t, u, places, target, what)
        try:
            ep = torch.export.export(part, (torch.zeros((2, *shape)),))
        except Exception as exc:
            why = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise UnsupportedError(f"{target}: torch.export cannot trace the part for {what} "
                                   f"({type(exc).__name__}: {why})") from None
        return _chain_to(target, what, lambda: read_torch(ep, target, shape))

    if found is None:
        start, kind, branches, merged = places[0], "none", [(0, [])], in_shapes[0]
    else:
        start, kind, ops, idx = found
        branches = [(i, sub(places[i], o, in_shapes[i], f"input {model.inputs[i].name!r}"))
                    for i, o in zip(idx, ops, strict=True)]
        shp = [chain_shape(c, in_shapes[i]) for i, c in branches]
        merged = (*shp[0][:-1], sum(s[-1] for s in shp)) if kind == "concat" else shp[0]
    outputs = [sub(start, u, merged, f"output {model.outputs[k].name!r}") for k, u in enumerate(outs)]
    return Parts(kind, branches, outputs)


_TORCH_META = {"aten.sym_size.int", "aten.sym_numel.default"}


def _torch_program(obj: Any, target: str, in_shapes: list[tuple[int, ...]]) -> Any:
    """``obj`` as a ``torch.export`` program over a batch of 2 of each input."""
    import torch

    if isinstance(obj, torch.export.ExportedProgram):
        return obj
    if not isinstance(obj, torch.nn.Module) or isinstance(obj, torch.jit.ScriptModule):
        raise UnsupportedError(f"{target} reads torch models through torch.export; a "
                               f"{type(obj).__name__} cannot be exported: pass the nn.Module")
    try:
        return torch.export.export(obj.eval(), tuple(torch.zeros((2, *s)) for s in in_shapes))
    except Exception as exc:  # torch.export raises a family of its own types
        why = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise UnsupportedError(f"{target}: torch.export cannot trace module {type(obj).__name__} "
                               f"({type(exc).__name__}: {why})") from None


def _torch_merges(gm: Any) -> list[tuple[Any, str, list[Any]]]:
    """Every ``cat`` of the last dim and every add of two tensors: (node, kind, operands)."""
    cands = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        op = str(n.target)
        if op == "aten.cat.default":
            dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
            ops = list(n.args[0])
            r = len(ops[0].meta["val"].shape) if "val" in ops[0].meta else None
            if dim == -1 or (r is not None and dim == r - 1):
                cands.append((n, "concat", ops))
        elif op == "aten.add.Tensor" and len(n.args) == 2 and all(hasattr(a, "op") for a in n.args):
            cands.append((n, "add", list(n.args)))
    return cands


def _torch_part(gm: Any, t: Any, u: Any, places: list[Any], target: str, what: str) -> Any:
    """A GraphModule over ``gm``'s weights computing ``u`` from ``t``: the nodes ``u`` needs;
    the batch size read from another input (``a.shape[0]``) is read from ``t``."""
    import torch

    need: set[Any] = set()
    todo = [u]
    while todo:
        v = todo.pop()
        if v in need or v is t:
            continue
        if v.op == "placeholder":
            raise UnsupportedError(f"{target}: {what} reads input {v.name!r} besides {t.name!r}; "
                                   f"{_SHAPE_HINT}")
        need.add(v)
        if v.op == "call_function" and str(v.target) in _TORCH_META and v.args[0].op == "placeholder" \
                and len(v.args) > 1 and v.args[1] == 0:
            continue  # the batch size: the same on every input
        todo.extend(v.all_input_nodes)
    g = torch.fx.Graph()
    env: dict[Any, Any] = {t: g.placeholder("x")}
    for n in gm.graph.nodes:
        if n not in need:
            continue
        if n.op == "call_function" and str(n.target) in _TORCH_META and n.args[0].op == "placeholder" \
                and n.args[0] is not t:
            env[n] = g.call_function(n.target, (env[t], *n.args[1:]))
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[u])
    return torch.fx.GraphModule(gm, g)
