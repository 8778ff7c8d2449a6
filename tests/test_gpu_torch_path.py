"""gpu.torch's export-and-move path without a GPU: the same static_program → torch.export.save →
program_on (move_to_device_pass) steps the target runs, moved to "meta" (every tensor the
program owns or creates must follow, which is what fails on CUDA when a graph keeps a
device=cpu constant), and the executor on the CPU. Checks the plumbing; not a GPU result."""
from __future__ import annotations

import numpy as np
import pytest

MODELS = ("mlp_torch", "lstm_torch")
BATCH = 2


@pytest.fixture
def saved(tmp_path, zoo_model):
    """``saved(name, precision)`` → (model, path of the exported program), as compile() writes it."""
    import torch

    from hwb_plugins.gpu_torch.target import ARTIFACT, static_program

    def save(name: str, precision: str):
        m = zoo_model(name)
        path = tmp_path / f"{name}-{precision}-{ARTIFACT}"
        torch.export.save(static_program(m.obj, m.input.batched(BATCH), precision), path)
        return m, path
    return save


def _devices(module) -> set[str]:
    tensors = [*module.parameters(), *module.buffers()]
    tensors += [v for v in vars(module).values() if hasattr(v, "device")]
    return {t.device.type for t in tensors}


def _graph_devices(module) -> set[str]:
    """Devices named in the graph's own calls (``aten.zeros(..., device=cpu)`` and the like)."""
    import torch

    found = set()
    for n in module.graph.nodes:
        if n.op != "call_function":
            continue
        for v in [*n.args, *n.kwargs.values()]:
            if isinstance(v, torch.device):
                found.add(v.type)
        dev = n.kwargs.get("device")  # a string once the program was saved and loaded
        if isinstance(dev, str):
            found.add(torch.device(dev).type)
    return found


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("precision", ("fp32", "fp16"))
def test_program_moves_whole_to_another_device(saved, name, precision):
    import torch

    from hwb_plugins.gpu_torch.target import program_on

    m, path = saved(name, precision)
    cpu_module, dtype = program_on(path, "cpu")
    assert dtype == (torch.float16 if precision == "fp16" else torch.float32)
    assert {p.dtype for p in cpu_module.parameters()} == {dtype}, "fp16 is exported as fp16"
    if name == "lstm_torch":  # the LSTM's zero state is created in the graph, on the export device
        assert _graph_devices(cpu_module) == {"cpu"}
    module, _ = program_on(path, "meta")
    assert _devices(module) == {"meta"}
    assert _graph_devices(module) <= {"meta"}, "a device=cpu call survived the move"
    y = module(torch.zeros(m.input.batched(BATCH), dtype=dtype, device="meta"))
    y = y[0] if isinstance(y, (tuple, list)) else y
    assert y.device.type == "meta" and y.dtype == dtype
    assert tuple(y.shape) == m.output.batched(BATCH)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("precision,atol", (("fp32", 1e-6), ("fp16", 5e-3)))
def test_executor_runs_the_moved_program_on_the_cpu(saved, name, precision, atol):
    from hwb_plugins.gpu_torch.target import TorchCudaExecutor

    m, path = saved(name, precision)
    ex = TorchCudaExecutor(path, BATCH, m.input, m.output, precision, mode="none",
                           cuda_graph=False, device="cpu")
    x = m.representative(BATCH, seed=2)
    out = np.zeros(m.output.batched(BATCH), np.float32)
    ex.predict_into(x, out)
    np.testing.assert_allclose(out, m.reference(x), atol=atol)
    if precision == "fp16":
        assert not np.array_equal(out, m.reference(x)), "fp16 must not silently run fp32"


def test_fp16_export_leaves_the_callers_model_alone(zoo_model):
    from hwb_plugins.gpu_torch.target import static_program

    m = zoo_model("mlp_torch")
    static_program(m.obj, m.input.batched(1), "fp16")
    assert {str(p.dtype) for p in m.obj.parameters()} == {"torch.float32"}
