"""A ``torch.export`` program → the ``nn.Sequential`` it came from, for the FPGA targets.

Torch models reach the isolated compile worker as ``torch.export`` programs (the core's
transport format, :meth:`hwbackends.models.Model.save`). Converters that read modules
(hls4ml's FX tracer, da4ml's layer list) cannot take one: the unlifted module's parameters
are renamed and its children are gone. A chain of aten ops that each consume the previous
one's output is rebuilt as the ``nn.Sequential`` of the matching modules, with the exported
weights; any other op is refused naming the user's module it belongs to (its path and class,
from the program's ``nn_module_stack``; for an op of ``forward`` itself, the source line).
"""
from __future__ import annotations

from typing import Any

from hwbackends.contract import UnsupportedError

#: The modules a chain may hold, as the refusal lists them.
REBUILT = "Linear, ReLU, Tanh, Sigmoid, Softmax, BatchNorm1d (eval), Dropout (eval), Flatten"
#: What ``conv=True`` adds.
REBUILT_CONV = "Conv1d over (batch, channels, time), BatchNorm1d and Flatten over its channels"


def as_sequential(obj: Any, target: str, advice: str, conv: bool = False) -> Any:
    """``obj`` itself when it is not an ``ExportedProgram``, else the ``nn.Sequential`` its
    graph is (eval mode). ``target`` and ``advice`` (what to do instead) go into the
    :class:`UnsupportedError` raised for a graph that branches or holds another op.
    ``conv``: Conv1d over a channels-first ``(batch, channels, time)`` input and the Flatten
    of its output are rebuilt too (:data:`REBUILT_CONV`), for a target whose converter reads
    that layout."""
    import torch
    if not isinstance(obj, torch.export.ExportedProgram):
        return obj
    from torch import nn

    sig = obj.graph_signature
    params = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    state = obj.state_dict
    acts = {"aten.relu.default": nn.ReLU, "aten.tanh.default": nn.Tanh,
            "aten.sigmoid.default": nn.Sigmoid}
    rebuilt = REBUILT + (f"; {REBUILT_CONV}" if conv else "")
    layers: list[Any] = []
    prev = None
    for n in obj.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        op, args = str(n.target), list(n.args)
        if op == "aten.sym_size.int":
            continue  # a read of the (dynamic) batch size: what uses it is judged
        if prev is not None and (not args or args[0] is not prev):
            raise UnsupportedError(f"{target} cannot build {where(n)} of the PyTorch model: the "
                                   f"model's graph branches there (it reads another value than "
                                   f"the previous layer's output; op {op}), and only sequential "
                                   f"chains of {rebuilt} are rebuilt from the exported program. "
                                   f"{advice}")
        if op == "aten.linear.default":
            layers.append(_rebuilt(_linear, op, n, args, state, params, target, advice))
        elif op in acts:
            layers.append(acts[op]())
        elif op == "aten.softmax.int" and args[1] in (-1, 1):
            layers.append(nn.Softmax(dim=-1))
        elif op == "aten.batch_norm.default" and not args[5]:
            layers.append(_rebuilt(_batch_norm, op, n, args, state, params, target, advice))
        elif op == "aten.dropout.default" and not args[2]:
            pass  # eval-mode dropout is the identity
        elif op == "aten.flatten.using_ints" and _rank(args[0]) == 2:
            pass  # flattening a (batch, features) tensor is the identity
        elif conv and op == "aten.conv1d.default":
            layers.append(_rebuilt(_conv1d, op, n, args, state, params, target, advice))
        elif (conv and op == "aten.flatten.using_ints" and _rank(args[0]) == 3
              and list(args[1:]) in ([1, -1], [1, 2], [1])):
            layers.append(nn.Flatten())  # (batch, channels, time) → channels-first features
        else:
            raise UnsupportedError(f"{target} cannot build {where(n)} of the PyTorch model: it "
                                   f"rebuilds the exported program as an nn.Sequential of "
                                   f"{rebuilt} modules only (its op {op} is none of them). "
                                   f"{advice}")
        prev = n
    return nn.Sequential(*layers).eval()


def where(node: Any) -> str:
    """The user's module an exported node belongs to, the outermost one the model holds first:
    ``layer 'enc' (TransformerEncoderLayer, in its 'enc.self_attn': MultiheadAttention)``; for
    an op of the model's own ``forward``, that forward's class and source line (``the forward
    of Net, at `return self.head(y[:, -1])```)."""
    stack = [(path, cls.rsplit(".", 1)[-1]) for path, cls in
             (node.meta.get("nn_module_stack") or {}).values() if not path.startswith("_empty")]
    mods = [(p, c) for p, c in stack if p]
    if mods:
        (path, cls), inner = mods[0], mods[1:]
        return f"layer {path!r} ({cls}" + (f", in its {inner[-1][0]!r}: {inner[-1][1]}" if inner else "") + ")"
    owner = f"the forward of {stack[0][1]}" if stack else "the model's forward"
    line = _last_line(node.meta.get("stack_trace") or "")
    return owner + (f", at `{line}`" if line else "")


def _last_line(trace: str) -> str:
    """The source line of a traceback's first frame (the model's own code)."""
    lines = [ln.strip() for ln in trace.splitlines()]
    return lines[1] if len(lines) > 1 and lines[0].startswith("File ") else ""


def _rebuilt(make: Any, op: str, node: Any, args: list[Any], state: dict[str, Any],
             params: dict[str, str], target: str, advice: str) -> Any:
    """``make(args, state, params)``, or an UnsupportedError naming the user's layer, the op
    and node when its weights are not the program's parameters or buffers (a tensor
    constant, a computed weight: the module cannot be rebuilt from them)."""
    try:
        return make(args, state, params)
    except (KeyError, AttributeError, IndexError, TypeError) as exc:
        raise UnsupportedError(f"{target} cannot build {where(node)} of the PyTorch model: its "
                               f"op {op} (node {node.name!r}) takes a weight that is not one of "
                               f"its parameters or buffers ({type(exc).__name__}: {exc}); only "
                               f"modules whose weights are nn.Parameters or registered buffers "
                               f"are rebuilt (register the tensor with nn.Parameter or "
                               f"register_buffer). {advice}") from None


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


def _conv1d(args: list[Any], state: dict[str, Any], params: dict[str, str]) -> Any:
    """``aten.conv1d(x, weight, bias, stride, padding, dilation, groups)`` as its Conv1d."""
    import torch
    from torch import nn

    w = state[params[args[1].name]]
    bias = len(args) > 2 and args[2] is not None
    given = [args[3 + i] if len(args) > 3 + i else d for i, d in enumerate(([1], [0], [1]))]
    ints = [list(a) if isinstance(a, (list, tuple)) else [a] for a in given]  # stride, padding, dilation
    groups = int(args[6]) if len(args) > 6 else 1
    if not all(isinstance(v, int) for v in sum(ints, [])):
        raise TypeError(f"stride/padding/dilation {ints} are not integers")
    conv = nn.Conv1d(w.shape[1] * groups, w.shape[0], w.shape[2], stride=ints[0][0],
                     padding=ints[1][0], dilation=ints[2][0], groups=groups, bias=bias)
    with torch.no_grad():
        conv.weight.copy_(w)
        if bias:
            conv.bias.copy_(state[params[args[2].name]])
    return conv.eval()


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
