"""What ONNX Runtime's int8 quantiser needs from a graph, and its failures as HwbErrors.

The quantiser reads the graph's default-domain opset (``get_opset_version``) and raises a bare
``ValueError: Failed to find proper ai.onnx domain`` when there is none (an ONNX-ML graph,
e.g. a tree ensemble, whose only import is ``ai.onnx.ml``) or two (``""`` and ``"ai.onnx"``,
which name the same domain). The first two cases are repaired here; anything the quantiser
still raises becomes a :class:`CompileError` that names it, the graph's ops and what to do.
"""
from __future__ import annotations

from typing import Any

from hwbackends.contract import CompileError

#: The default-domain opset given to a graph that imports none: its nodes are all in other
#: domains (``ai.onnx.ml``, ``com.microsoft``), so the version only satisfies the quantiser.
DEFAULT_OPSET = 17

_DEFAULT = ("", "ai.onnx")


def with_default_domain(proto: Any) -> Any:
    """``proto`` with exactly one default-domain opset import, when that can be done without
    changing what any node means: none → one at :data:`DEFAULT_OPSET` when no node is in the
    default domain; ``""`` and ``"ai.onnx"`` at the same version → one. Imports that disagree
    (two versions) are left alone: the quantiser's refusal says so."""
    import onnx

    imports = list(proto.opset_import)
    default = [o for o in imports if o.domain in _DEFAULT]
    if not default:
        if any(n.domain in _DEFAULT for n in proto.graph.node):
            return proto
        proto.opset_import.append(onnx.helper.make_opsetid("", DEFAULT_OPSET))
    elif len(default) > 1 and len({o.version for o in default}) == 1:
        keep = [o for o in imports if o.domain not in _DEFAULT]
        del proto.opset_import[:]
        proto.opset_import.extend([*keep, onnx.helper.make_opsetid("", default[0].version)])
    return proto


def quantiser_error(name: str, precision: str, proto: Any, exc: BaseException) -> CompileError:
    """The quantiser's exception (its message, not its traceback) as a CompileError naming the
    converter, the graph's ops and domains, and what to do instead."""
    ops = sorted({f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in proto.graph.node})
    domains = ", ".join(f"{o.domain!r} {o.version}" for o in proto.opset_import)
    shown = ", ".join(ops[:20]) + (f", … ({len(ops)} in all)" if len(ops) > 20 else "")
    return CompileError(
        f"ONNX Runtime's int8 quantiser (onnxruntime.quantization, cpu.onnxruntime:{precision}) "
        f"failed on {name!r}: {type(exc).__name__}: {str(exc)[:500]}. The graph's ops: {shown}; "
        f"its opset imports: {domains}. What to do: compile it at cpu.onnxruntime:fp32, or at "
        f"int8 on another target (hwb targets lists them); if the graph is valid ONNX, report "
        f"it to ONNX Runtime (github.com/microsoft/onnxruntime/issues) with this message.",
        target="cpu.onnxruntime", precision=precision)
