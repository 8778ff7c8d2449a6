"""``gpu.torch``: a PyTorch model on an NVIDIA GPU, ``torch.compile``d and replayed as a CUDA
graph.

Compile (child): ``torch.export`` with the static batch, in the variant's precision (fp16 is
exported from a half copy of the model with an fp16 example, so the program's weights and
every tensor it creates are fp16) → ``model.pt2`` (the artifact; an exported program is
portable across GPUs, the compiled kernels are not, so they are made at load). Load:
``torch.export.passes.move_to_device_pass`` moves the *program* to the GPU — ``torch.export``
specializes on device, so tensors the graph creates itself (an LSTM's zero state) carry
``device=cpu`` and ``.module().to("cuda")`` would leave them there (pytorch#151010) — then
``torch.compile(mode="max-autotune-no-cudagraphs", dynamic=False, fullgraph=True)`` on the
GPU, warm-up on a side stream, then the whole forward pass (cast of the fp32 input to the
program's dtype included) is captured once in a ``torch.cuda.CUDAGraph`` over fixed device
buffers.
Per call: copy into a pinned host buffer, one async H2D copy, ``graph.replay()``, one async
D2H copy into pinned memory, one stream sync, copy out. No allocation, no kernel launches
from Python beyond the graph.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hwbackends.contract import (
    Artifact,
    Availability,
    CompileOptions,
    Executor,
    Target,
    TensorSpec,
    UnavailableError,
    UnsupportedError,
)

from .._nvidia import gpu_info, torch_cuda_reason
from .._util import version

ARTIFACT = "model.pt2"
MODES = ("max-autotune-no-cudagraphs", "default", "none")

def static_program(obj: Any, input_shape: Any, precision: str = "fp32") -> Any:
    """``torch.export`` of the model with every dimension static (batch included), in
    ``precision``: fp16 exports a half copy with an fp16 example (the caller's model is not
    touched), so the program computes in fp16 end to end. ``input_shape`` is one batched
    shape, or a list with one per input (a model with several inputs)."""
    import torch

    dtype = torch.float16 if precision == "fp16" else torch.float32
    if isinstance(obj, torch.export.ExportedProgram):
        # The unlifted module of an exported program refuses .eval() (NotImplementedError
        # "Calling eval() is not supported yet."); it already carries the mode it was
        # exported in.
        module = obj.module()
    else:
        module = obj
        if hasattr(module, "eval"):
            module.eval()
    if dtype != torch.float32:
        module = copy.deepcopy(module).to(dtype)
    shapes = input_shape if isinstance(input_shape[0], (tuple, list)) else [input_shape]
    examples = tuple(torch.zeros(tuple(s), dtype=dtype) for s in shapes)
    with torch.no_grad():
        return torch.export.export(module, examples)


def program_on(path: Path, device: str) -> tuple[Any, Any]:
    """The saved program moved to ``device`` with ``move_to_device_pass`` (parameters,
    buffers, constants *and* the device of every tensor the graph creates), as a module, with
    the dtype of its input."""
    import torch
    from torch.export.passes import move_to_device_pass

    ep = move_to_device_pass(torch.export.load(str(path)), device)
    spec = next(s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT")
    node = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name)
    return ep.module(), node.meta["val"].dtype


class _Graphed:
    """The loaded program's forward pass over fixed buffers, shared by the one-tensor and the
    several-tensor executor: pinned host buffers (with numpy views), device inputs, the
    device outputs the forward pass (or the captured CUDA graph) writes, ``replay`` and
    ``sync``. ``device="cpu", cuda_graph=False`` runs the same path on the CPU."""

    def __init__(self, path: Path, in_shapes: list[tuple[int, ...]],
                 out_shapes: list[tuple[int, ...]], precision: str, mode: str, cuda_graph: bool,
                 device: str, warmup: int):
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise UnavailableError("gpu.torch: torch.cuda.is_available() is False at load "
                                   "(GPU lost or CUDA_VISIBLE_DEVICES hides it)")
        self.device = torch.device(device)
        # The program's own dtype (fp16 programs are exported as fp16); an fp16 artifact
        # holding an fp32 program (written by an earlier target version) is cast here.
        module, dtype = program_on(path, device)
        if precision == "fp16" and dtype == torch.float32:
            module, dtype = module.to(torch.float16), torch.float16
        self.dtype = dtype
        if mode != "none":
            module = torch.compile(module, mode=None if mode == "default" else mode,
                                   dynamic=False, fullgraph=True)
        n_out = len(out_shapes)

        def forward(*xs32: Any) -> tuple[Any, ...]:  # the casts to fp16 and back run in the graph
            ys = module(*(x.to(dtype) for x in xs32))
            ys = tuple(ys) if isinstance(ys, (tuple, list)) else (ys,)
            return tuple(y.float() for y in ys[:n_out])

        pin = device == "cuda"
        self.hx_t = [torch.zeros(s, dtype=torch.float32, pin_memory=pin) for s in in_shapes]
        self.hy_t = [torch.zeros(s, dtype=torch.float32, pin_memory=pin) for s in out_shapes]
        self.hx = [t.numpy() for t in self.hx_t]  # views: no copy per call
        self.hy = [t.numpy() for t in self.hy_t]
        self.dx = [torch.zeros(s, dtype=torch.float32, device=self.device) for s in in_shapes]
        self.graph = None
        self._torch, self._forward = torch, forward
        with torch.inference_mode():
            if device == "cuda":
                self._capture(warmup, cuda_graph)
            else:
                for _ in range(max(warmup, 1)):
                    self.dy = forward(*self.dx)
                self.sync = lambda: None
        got = [tuple(y.shape) for y in self.dy]
        if len(self.dy) != n_out or got != [tuple(s) for s in out_shapes]:
            raise UnsupportedError(f"gpu.torch: the model returns {got}, declared "
                                   f"{[tuple(s) for s in out_shapes]}")
        self.replay = self.graph.replay if self.graph is not None else self._eager

    def _capture(self, warmup: int, cuda_graph: bool) -> None:
        torch, forward = self._torch, self._forward
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: compile, autotune, cuDNN/cuBLAS init
            for _ in range(max(warmup, 1)):
                self.dy = forward(*self.dx)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if cuda_graph:
            self.graph = torch.cuda.CUDAGraph()
            # Capture on the warm-up stream: per-stream library state (cuBLAS/cuBLASLt
            # workspaces and handles) is then created before capture, not during it
            # (what torch.cuda.make_graphed_callables does too).
            with torch.cuda.graph(self.graph, stream=side):
                self.dy = forward(*self.dx)  # static output buffers owned by the graph
            self.graph.replay()
            torch.cuda.synchronize()
        self.sync = torch.cuda.current_stream().synchronize

    def _eager(self) -> None:
        with self._torch.inference_mode():
            self.dy = self._forward(*self.dx)


class TorchCudaExecutor(Executor):
    """One pinned host buffer and one device buffer per tensor, one graph replay, one sync per
    call. ``device="cuda"`` is the product; ``device="cpu", cuda_graph=False`` runs the same
    load/compile path on the CPU so it can be exercised without a GPU (never reported as a
    GPU result: the target is unavailable there)."""

    def __init__(self, path: Path, batch: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], precision: str,
                 mode: str = "max-autotune-no-cudagraphs", cuda_graph: bool = True,
                 device: str = "cuda", warmup: int = 3):
        self._init_io(inputs, outputs, batch)
        g = _Graphed(path, list(self._xshapes), list(self._yshapes), precision, mode,
                     cuda_graph, device, warmup)
        self._g, self.graph, self.dtype, self.device = g, g.graph, g.dtype, g.device
        self._ins = list(zip(g.hx, g.hx_t, g.dx, strict=True))

    def _run(self, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        g = self._g
        for x, (hx, hx_t, dx) in zip(xs, self._ins, strict=True):
            hx[...] = x
            dx.copy_(hx_t, non_blocking=True)
        g.replay()
        for hy_t, dy in zip(g.hy_t, g.dy, strict=True):  # g.dy: read per call (eager replaces it)
            hy_t.copy_(dy, non_blocking=True)
        g.sync()
        for o, hy in zip(outs, g.hy, strict=True):
            o[...] = hy


class TorchCudaTarget(Target):
    name = "gpu.torch"
    family = "gpu"
    precisions = ("fp32", "fp16")
    formats = ("torch",)
    multi_io = True
    install = "hwbackends[torch]"
    description = "PyTorch on an NVIDIA GPU: torch.compile + CUDA-graph replay, pinned buffers"
    option_docs = {
        "mode": "torch.compile mode: 'max-autotune-no-cudagraphs' (default), 'default', or "
                "'none' (eager kernels, still graph-captured)",
        "cuda_graph": "true (default): capture the forward pass once and replay it per call",
    }

    def probe(self) -> Availability:
        reason = torch_cuda_reason()
        if reason:
            return Availability.unavailable(reason)
        info = gpu_info()
        return Availability.hardware(info.name if info else "CUDA GPU",
                                     "torch.compile + CUDA graph on the GPU")

    def toolchain(self) -> dict[str, str]:
        info = gpu_info()
        gpu = info.as_dict() if info else {"gpu": "none"}
        # Compiled kernels are made at load, so the GPU is informative here, not binding.
        return {"torch": version("torch"), **gpu}

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        import torch

        mode = options.extra.get("mode", MODES[0])
        if mode not in MODES:
            raise UnsupportedError(f"gpu.torch option mode must be one of {', '.join(MODES)}; got {mode!r}")
        shapes = [s.batched(options.batch_size) for s in model.inputs]
        try:
            ep = static_program(model.obj, shapes, options.precision)
        except Exception as exc:
            shown = shapes[0] if len(shapes) == 1 else shapes
            raise UnsupportedError(f"gpu.torch cannot export {model.name!r} with torch.export at "
                                   f"static shape {shown}: "
                                   f"{type(exc).__name__}: {str(exc)[:500]}") from exc
        torch.export.save(ep, workdir / ARTIFACT)
        ops = sorted({str(n.target) for n in ep.graph.nodes if n.op == "call_function"})
        return {"file": ARTIFACT, "bytes": (workdir / ARTIFACT).stat().st_size, "aten_ops": ops,
                "exported_dtype": "float16" if options.precision == "fp16" else "float32",
                "mode": mode, "cuda_graph": bool(options.extra.get("cuda_graph", True))}

    def load(self, artifact: Artifact, options: CompileOptions) -> Executor:
        reason = torch_cuda_reason()
        if reason:
            raise UnavailableError(f"gpu.torch cannot load here: {reason}")
        return TorchCudaExecutor(artifact.file(ARTIFACT), artifact.batch_size, artifact.inputs,
                                 artifact.outputs, artifact.precision,
                                 mode=options.extra.get("mode", MODES[0]),
                                 cuda_graph=bool(options.extra.get("cuda_graph", True)))
