"""The PyTorch reader: an ``nn.Module``, TorchScript or ``torch.export`` program as a
:class:`~.model.Model` (specs from an example call, fingerprint from the weights and the
torch calls of one batch-1 run, the reference the module itself in eval mode)."""
from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
from typing import Any

import numpy as np

from .. import batchdim, cost
from ..errors import ModelError
from ..specs import TensorSpec
from .common import clip, digest, static_shape
from .model import Model


def from_torch(obj: Any, name: str, path: Path | None, example: Any, input_shape: Any,
                lim: cost.Limits | None = None) -> Model:
    """A torch model: an ``nn.Module``/TorchScript module with ``example`` (one batch: a
    tensor, or a tuple with one tensor per ``forward`` argument) or ``input_shape``, or a
    ``torch.export`` program. Several inputs are named after ``forward``'s arguments, several
    outputs (a tuple return) ``output_0``, ``output_1``, … (a single one is ``input`` /
    ``output``, as in every format)."""
    import torch

    if isinstance(obj, torch.export.ExportedProgram):
        module, examples, in_names, fixed_batch = _exported_inputs(obj, name)
        arch = str(obj.graph).encode()
        arch_from_call = False  # the graph is the architecture
        state = obj.state_dict
    else:
        module, fixed_batch = obj, None
        examples = _torch_examples(example, input_shape, name)
        in_names = _torch_arg_names(obj, len(examples))
        # repr() shows the submodules, not what forward does with them (norm_first, an
        # activation chosen by a plain attribute): the torch calls of the example run are
        # part of the architecture too (_TorchCallTrace)
        arch = repr(obj).encode()
        arch_from_call = True
        state = obj.state_dict()
        if hasattr(module, "eval"):
            module.eval()
    lim = lim or cost.Limits.from_env()
    base = cost.torch_param_cost(state)
    lim.check(base, name)  # the weights, before the example call
    lim.check(cost.torch_input_cost(base, examples), name)  # the inputs, before the call
    with torch.no_grad(), cost.TorchProbe(module) as probe:
        try:
            result = module(*examples)
        except Exception as exc:
            raise _torch_shape_error(obj, name, examples, example is not None, exc) from exc
        ys = torch_outputs(result, name)
    if arch_from_call:
        arch += _batch1_trace(module, examples)
    c = probe.cost(base, examples, int(examples[0].shape[0]) if examples[0].dim() else 1)
    lim.check(c, name)
    multi = len(examples) > 1 or len(ys) > 1
    ins = [TensorSpec(n if multi else "input", static_shape(tuple(e.shape[1:]), "input", name))
           for n, e in zip(in_names, examples, strict=True)]
    out_names = [f"output_{i}" for i in range(len(ys))] if len(ys) > 1 else ["output"]
    outs = [TensorSpec(n, static_shape(tuple(y.shape[1:]), "output", name))
            for n, y in zip(out_names, ys, strict=True)]
    wb = [k.encode() + v.detach().cpu().contiguous().numpy().tobytes() for k, v in sorted(state.items())]
    # Single-IO fingerprints are unchanged from before multi-IO (cached artifacts stay valid);
    # a multi-IO one covers every output spec as well.
    specs = repr(ins).encode() + (repr(outs).encode() if multi else b"")
    fp = digest(b"torch", arch, specs, *wb)
    meta: dict[str, Any] = {"fixed_batch": fixed_batch} if fixed_batch is not None else {}
    meta["cost"] = c.to_dict()

    def ref(*xs: np.ndarray, m: Any = module) -> tuple[np.ndarray, ...]:  # one array per output
        with torch.no_grad():
            r = m(*(torch.from_numpy(x) for x in xs))
        return tuple(t.numpy() for t in torch_outputs(r, name))

    return Model(obj, "torch", ins, outs, fp, name, path, meta=meta, _ref=ref)


class _TorchCallTrace:
    """Every torch function the example call ran, with its non-tensor arguments and the
    shapes and dtypes of its tensors (a ``TorchFunctionMode``): what the module's ``forward``
    did, which ``repr`` does not show, as a digest for the fingerprint."""

    def __init__(self) -> None:
        import torch

        trace = self
        self._h = hashlib.sha256()

        class Mode(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                trace._h.update(f"{_func_name(func)}{_call_shape(args)}"
                                f"{_call_shape(kwargs)};".encode())
                return func(*args, **kwargs)

        self._mode = Mode()

    def __enter__(self) -> _TorchCallTrace:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def digest(self) -> bytes:
        return self._h.digest()


def _batch1_trace(module: Any, examples: tuple[Any, ...]) -> bytes:
    """The digest of one more call, on the examples' first rows, under :class:`_TorchCallTrace`
    (batch 1 whatever batch the example has, so its shapes and the ints a forward derives from
    them are the same however the model was loaded; no cost hooks attached). Empty when that
    call fails (the example call itself succeeded: ``repr`` and the weights still key it)."""
    import torch

    rows = tuple(e[:1] if e.dim() else e for e in examples)  # sliced outside the trace
    one = _TorchCallTrace()
    try:
        with torch.no_grad(), one:
            module(*rows)
    except Exception:
        return b""
    return one.digest()


def _func_name(func: Any) -> str:
    """A torch function's name without its object address (the same in every process)."""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    owner = getattr(getattr(func, "__objclass__", None), "__name__", "")
    return f"{owner}.{name}" if name else type(func).__name__


def _call_shape(a: Any, depth: int = 0) -> str:
    """A torch call's arguments as text: tensors by shape and dtype, containers item by item,
    plain values by repr (bounded: a model's call arguments are small)."""
    import torch

    if isinstance(a, torch.Tensor):
        return f"T{tuple(a.shape)}{a.dtype}"
    if depth > 4:
        return "…"
    if isinstance(a, (list, tuple)):
        return "(" + ",".join(_call_shape(v, depth + 1) for v in a[:64]) + ")"
    if isinstance(a, dict):
        return "{" + ",".join(f"{k}:{_call_shape(v, depth + 1)}" for k, v in list(a.items())[:64]) + "}"
    if isinstance(a, (int, float, bool, str, type(None), slice, torch.dtype, torch.device)):
        return repr(a)[:200]
    return type(a).__name__


def _torch_shape_error(obj: Any, name: str, examples: tuple[Any, ...], given: bool,
                       exc: Exception) -> ModelError:
    """The torch model did not run on the example batch: almost always an input shape that
    is not the one its forward takes. Name the shape tried, the first layer's, and the fix."""
    shapes = ", ".join(str(tuple(e.shape)) for e in examples)
    how = ("example_input" if given else
           "input_shape= (per sample; --input-shape D[,D...] on the command line)")
    first = next((m for m in getattr(obj, "modules", lambda: [])()
                  if hasattr(m, "in_features") or hasattr(m, "input_size")
                  or hasattr(m, "in_channels")), None)
    wants = ""
    if first is not None:
        n = next(getattr(first, a) for a in ("in_features", "input_size", "in_channels")
                 if hasattr(first, a))
        wants = f"; its first layer, {type(first).__name__}, takes {n} features/channels"
    return ModelError(f"torch model {name!r} does not run on a batch of shape {shapes} made from "
                      f"{how.split(' ')[0]} ({type(exc).__name__}: {clip(str(exc), 200)}){wants}. "
                      f"Pass the per-sample shape its forward takes as {how}")


def _exported_inputs(ep: Any, name: str) -> tuple[Any, tuple[Any, ...], list[str], int | None]:
    """A ``torch.export`` program's module, one zero example per user input (batch 1 when the
    batch is symbolic), the inputs' names (``forward``'s arguments) and its fixed batch."""
    import torch

    names = list(ep.graph_signature.user_inputs)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    examples, batches = [], set()
    for n in names:
        val = placeholders[n].meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() < 1:
            raise ModelError(f"torch.export program {name!r}: input {n!r} is not a tensor with "
                             f"a batch dimension ({type(val).__name__}); every input must be a "
                             f"float tensor of shape (batch, ...)")
        dims = val.shape
        batches.add(None if isinstance(dims[0], torch.SymInt) else int(dims[0]))
        examples.append(torch.zeros(tuple(1 if isinstance(s, torch.SymInt) else int(s) for s in dims)))
    if len(batches) > 1:
        raise ModelError(f"torch.export program {name!r} has inputs with different batch "
                         f"dimensions ({sorted(map(str, batches))}); export every input with "
                         f"the same batch Dim: {batchdim.reexport_advice('torch')}")
    fixed = batches.pop()
    if fixed is not None:  # a fixed-batch program runs only at its batch
        examples = [torch.zeros((fixed, *e.shape[1:])) for e in examples]
    return ep.module(), tuple(examples), [str(n) for n in names], fixed


def _torch_examples(example: Any, input_shape: Any, name: str) -> tuple[Any, ...]:
    """One float32 example batch per input: ``example`` (a tensor or a tuple/list of them),
    else zeros of ``input_shape`` (one shape, or one per input)."""
    import torch

    if example is None:
        if input_shape is None:
            raise ModelError(f"a torch model needs example_input= (one batch: a tensor, or a tuple "
                             f"with one per forward argument) or input_shape= (per sample; a list "
                             f"of shapes for several inputs; on the command line --input-shape, "
                             f"once per input) to know its inputs; got neither for {name!r}")
        shapes = input_shape if is_shape_list(input_shape) else [input_shape]
        return tuple(torch.zeros((1, *s), dtype=torch.float32) for s in shapes)
    items = example if isinstance(example, (tuple, list)) else (example,)
    try:
        return tuple(torch.as_tensor(e, dtype=torch.float32) for e in items)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ModelError(f"example_input for {name!r} must be a tensor or array of one batch, "
                         f"or a tuple with one per forward argument; got {type(example).__name__} "
                         f"({exc})") from exc


def is_shape_list(shape: Any) -> bool:
    """Whether ``shape`` is a list of per-input shapes (``[(16,), (4,)]``), not one shape."""
    return (isinstance(shape, (tuple, list)) and len(shape) > 0
            and all(isinstance(s, (tuple, list)) for s in shape))


def _torch_arg_names(module: Any, n: int) -> list[str]:
    """The names of ``forward``'s first ``n`` arguments (TorchScript: from its schema), or
    ``input_0``, … when they cannot be read. A single input is ``input`` anyway."""

    names: list[str] = []
    schema = getattr(getattr(module, "forward", None), "schema", None)
    if schema is not None:  # TorchScript
        names = [a.name for a in schema.arguments if a.name != "self"]
    else:
        try:
            params = inspect.signature(module.forward).parameters.values()
            names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError, AttributeError):
            names = []
    if len(names) < n:
        return [f"input_{i}" for i in range(n)]
    return names[:n]


def torch_outputs(y: Any, name: str) -> tuple[Any, ...]:
    """A torch model's result as a tuple of tensors: one tensor, or a flat tuple/list of them."""
    import torch

    ys = tuple(y) if isinstance(y, (tuple, list)) else (y,)
    bad = [type(t).__name__ for t in ys if not isinstance(t, torch.Tensor)]
    if bad or not ys:
        raise ModelError(f"torch model {name!r} returns {type(y).__name__} "
                         f"({', '.join(bad) or 'empty'}); expected a tensor or a flat tuple of "
                         f"tensors, one per output (not dicts or nested tuples)")
    return ys
