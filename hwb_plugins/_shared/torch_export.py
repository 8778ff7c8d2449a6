"""A ``torch.export`` program → the ``nn.Sequential`` it came from, for the FPGA targets.

Torch models reach the isolated compile worker as ``torch.export`` programs (the core's
transport format, :meth:`hwbackends.models.Model.save`). Converters that read modules
(hls4ml's FX tracer, da4ml's layer list) cannot take one: the unlifted module's parameters
are renamed and its children are gone. A chain of aten ops that each consume the previous
one's output is rebuilt as the ``nn.Sequential`` of the matching modules, with the exported
weights; any other op is refused by name.
"""
from __future__ import annotations

from typing import Any

from hwbackends.contract import UnsupportedError

#: The modules a chain may hold, as the refusal lists them.
REBUILT = "Linear, ReLU, Tanh, Sigmoid, Softmax, BatchNorm1d (eval), Dropout (eval), Flatten"


def as_sequential(obj: Any, target: str, advice: str) -> Any:
    """``obj`` itself when it is not an ``ExportedProgram``, else the ``nn.Sequential`` its
    graph is (eval mode). ``target`` and ``advice`` (what to do instead) go into the
    :class:`UnsupportedError` raised for a graph that branches or holds another op."""
    import torch
    if not isinstance(obj, torch.export.ExportedProgram):
        return obj
    from torch import nn

    sig = obj.graph_signature
    params = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    state = obj.state_dict
    acts = {"aten.relu.default": nn.ReLU, "aten.tanh.default": nn.Tanh,
            "aten.sigmoid.default": nn.Sigmoid}
    layers: list[Any] = []
    prev = None
    for n in obj.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        op, args = str(n.target), list(n.args)
        if prev is not None and (not args or args[0] is not prev):
            raise UnsupportedError(f"{target}: the exported PyTorch graph branches at op {op} "
                                   f"(node {n.name!r}); only sequential chains ({REBUILT}) are "
                                   f"rebuilt from torch.export programs. {advice}")
        if op == "aten.linear.default":
            layers.append(_rebuilt(_linear, op, n.name, args, state, params, target, advice))
        elif op in acts:
            layers.append(acts[op]())
        elif op == "aten.softmax.int" and args[1] in (-1, 1):
            layers.append(nn.Softmax(dim=-1))
        elif op == "aten.batch_norm.default" and not args[5]:
            layers.append(_rebuilt(_batch_norm, op, n.name, args, state, params, target, advice))
        elif op == "aten.dropout.default" and not args[2]:
            pass  # eval-mode dropout is the identity
        elif op == "aten.flatten.using_ints" and _rank(args[0]) == 2:
            pass  # flattening a (batch, features) tensor is the identity
        else:
            raise UnsupportedError(f"{target}: op {op} (node {n.name!r}) of the exported PyTorch "
                                   f"model cannot be rebuilt as a module (sequential chains of "
                                   f"{REBUILT} only). {advice}")
        prev = n
    return nn.Sequential(*layers).eval()


def _rebuilt(make: Any, op: str, node: str, args: list[Any], state: dict[str, Any],
             params: dict[str, str], target: str, advice: str) -> Any:
    """``make(args, state, params)``, or an UnsupportedError naming the op and node when its
    weights are not the program's parameters or buffers (a tensor constant, a computed
    weight: the module cannot be rebuilt from them)."""
    try:
        return make(args, state, params)
    except (KeyError, AttributeError, IndexError, TypeError) as exc:
        raise UnsupportedError(f"{target}: op {op} (node {node!r}) of the exported PyTorch model "
                               f"takes a weight that is not one of its parameters or buffers "
                               f"({type(exc).__name__}: {exc}); only modules whose weights are "
                               f"nn.Parameters or registered buffers are rebuilt (register the "
                               f"tensor with nn.Parameter or register_buffer). {advice}") from None


def _linear(args: list[Any], state: dict[str, Any], params: dict[str, str]) -> Any:
    import torch
    from torch import nn

    w = state[params[args[1].name]]
    bias = len(args) > 2 and args[2] is not None
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias:
            lin.bias.copy_(state[params[args[2].name]])
    return lin


def _batch_norm(args: list[Any], state: dict[str, Any], params: dict[str, str]) -> Any:
    """``aten.batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps,
    cudnn)`` in eval mode as the ``BatchNorm1d`` it came from."""
    import torch
    from torch import nn

    mean, var = (state[params[a.name]] for a in args[3:5])
    bn = nn.BatchNorm1d(mean.shape[0], eps=float(args[7]), affine=args[1] is not None)
    with torch.no_grad():
        bn.running_mean.copy_(mean)
        bn.running_var.copy_(var)
        if args[1] is not None:
            bn.weight.copy_(state[params[args[1].name]])
            bn.bias.copy_(state[params[args[2].name]])
    return bn.eval()


def _rank(node: Any) -> int | None:
    val = getattr(node, "meta", {}).get("val")
    return val.dim() if val is not None and hasattr(val, "dim") else None
