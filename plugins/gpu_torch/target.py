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
from typing import Any

import numpy as np

from hwbackends.errors import UnavailableError, UnsupportedError
from hwbackends.specs import Availability, TensorSpec
from hwbackends.target import Artifact, CompileOptions, Executor, Target

from .._nvidia import gpu_info, torch_cuda_reason
from .._util import version

ARTIFACT = "model.pt2"
MODES = ("max-autotune-no-cudagraphs", "default", "none")

def static_program(obj: Any, input_shape: tuple[int, ...], precision: str = "fp32") -> Any:
    """``torch.export`` of the model with every dimension static (batch included), in
    ``precision``: fp16 exports a half copy with an fp16 example (the caller's model is not
    touched), so the program computes in fp16 end to end."""
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
    example = torch.zeros(input_shape, dtype=dtype)
    with torch.no_grad():
        return torch.export.export(module, (example,))


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


class TorchCudaExecutor(Executor):
    """``device="cuda"`` is the product; ``device="cpu", cuda_graph=False`` runs the same
    load/compile path on the CPU so it can be exercised without a GPU (never reported as a
    GPU result: the target is unavailable there)."""

    def __init__(self, path: Path, batch: int, inp: TensorSpec, out: TensorSpec, precision: str,
                 mode: str = "max-autotune-no-cudagraphs", cuda_graph: bool = True,
                 device: str = "cuda", warmup: int = 3):
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise UnavailableError("gpu.torch: torch.cuda.is_available() is False at load "
                                   "(GPU lost or CUDA_VISIBLE_DEVICES hides it)")
        self._init_io(inp, out, batch)
        self.device = torch.device(device)
        # The program's own dtype (fp16 programs are exported as fp16); an artifact from
        # before fp16 export is an fp32 program, cast here as it used to be.
        module, dtype = program_on(path, device)
        if precision == "fp16" and dtype == torch.float32:
            module, dtype = module.to(torch.float16), torch.float16
        self.dtype = dtype
        if mode != "none":
            module = torch.compile(module, mode=None if mode == "default" else mode,
                                   dynamic=False, fullgraph=True)

        def forward(x32: Any) -> Any:  # the cast to fp16 and back runs inside the graph
            y = module(x32.to(dtype))
            return (y[0] if isinstance(y, (tuple, list)) else y).float()

        pin = device == "cuda"
        shape_x, shape_y = inp.batched(batch), out.batched(batch)
        self._hx_t = torch.zeros(shape_x, dtype=torch.float32, pin_memory=pin)
        self._hy_t = torch.zeros(shape_y, dtype=torch.float32, pin_memory=pin)
        self._hx, self._hy = self._hx_t.numpy(), self._hy_t.numpy()  # views: no copy per call
        self._dx = torch.zeros(shape_x, dtype=torch.float32, device=self.device)
        self.graph = None
        with torch.inference_mode():
            if device == "cuda":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up: compile, autotune, cuDNN/cuBLAS init
                    for _ in range(max(warmup, 1)):
                        self._dy = forward(self._dx)
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                if cuda_graph:
                    self.graph = torch.cuda.CUDAGraph()
                    # Capture on the warm-up stream: per-stream library state (cuBLAS/cuBLASLt
                    # workspaces and handles) is then created before capture, not during it
                    # (what torch.cuda.make_graphed_callables does too).
                    with torch.cuda.graph(self.graph, stream=side):
                        self._dy = forward(self._dx)  # static output buffer owned by the graph
                    self.graph.replay()
                    torch.cuda.synchronize()
                self._stream = torch.cuda.current_stream()
                self._sync = self._stream.synchronize
            else:
                for _ in range(max(warmup, 1)):
                    self._dy = forward(self._dx)
                self._sync = lambda: None
        if tuple(self._dy.shape) != tuple(shape_y):
            raise UnsupportedError(f"gpu.torch: the model returns {tuple(self._dy.shape)}, "
                                   f"declared {shape_y}")
        self._forward = forward
        self._replay = self.graph.replay if self.graph is not None else self._eager
        self._copy_in = self._dx.copy_
        self._copy_out = self._hy_t.copy_
        self._torch = torch

    def _eager(self) -> None:
        with self._torch.inference_mode():
            self._dy = self._forward(self._dx)

    def _run(self, x: np.ndarray, out: np.ndarray) -> None:
        self._hx[...] = x
        self._copy_in(self._hx_t, non_blocking=True)
        self._replay()
        self._copy_out(self._dy, non_blocking=True)
        self._sync()
        out[...] = self._hy


class TorchCudaTarget(Target):
    name = "gpu.torch"
    family = "gpu"
    precisions = ("fp32", "fp16")
    formats = ("torch",)
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
        try:
            ep = static_program(model.obj, model.input.batched(options.batch_size),
                                options.precision)
        except Exception as exc:
            raise UnsupportedError(f"gpu.torch cannot export {model.name!r} with torch.export at "
                                   f"static shape {model.input.batched(options.batch_size)}: "
                                   f"{type(exc).__name__}: {str(exc)[:500]}") from exc
        torch.export.save(ep, workdir / ARTIFACT)
        ops = sorted({str(n.target) for n in ep.graph.nodes if n.op == "call_function"})
        return {"file": ARTIFACT, "bytes": (workdir / ARTIFACT).stat().st_size, "aten_ops": ops,
                "exported_dtype": "float16" if options.precision == "fp16" else "float32",
                "mode": mode, "cuda_graph": bool(options.extra.get("cuda_graph", True))}

    def load(self, artifact: Artifact, options: CompileOptions) -> TorchCudaExecutor:
        reason = torch_cuda_reason()
        if reason:
            raise UnavailableError(f"gpu.torch cannot load here: {reason}")
        return TorchCudaExecutor(artifact.file(ARTIFACT), artifact.batch_size, artifact.inputs[0],
                                 artifact.outputs[0], artifact.precision,
                                 mode=options.extra.get("mode", MODES[0]),
                                 cuda_graph=bool(options.extra.get("cuda_graph", True)))
