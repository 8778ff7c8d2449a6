"""PyTorch models with several inputs and outputs: an ``nn.Module`` with
``forward(features, state)`` returning two heads, loaded as a module, a ``torch.export``
``.pt2`` file and TorchScript; compiled on ref, cpu.onnxruntime and tpu.xla from Python and
through ``hwb compile``/``hwb predict``, every output checked against torch itself."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import hwbackends as hwb

TARGETS = ("ref", "cpu.onnxruntime", "tpu.xla")
N = 10  # not a multiple of the compiled batch (4): predict pads and chunks


def _two_head():
    import torch

    class TwoHead(torch.nn.Module):
        """features (16,) + state (4,) → signal (1,) tanh and confidence (3,) softmax."""

        def __init__(self) -> None:
            super().__init__()
            self.f = torch.nn.Linear(16, 12)
            self.s = torch.nn.Linear(4, 6)
            self.signal = torch.nn.Linear(18, 1)
            self.conf = torch.nn.Linear(18, 3)

        def forward(self, features, state):
            z = torch.cat([torch.relu(self.f(features)), torch.tanh(self.s(state))], dim=1)
            return torch.tanh(self.signal(z)), torch.softmax(self.conf(z), dim=1)

    torch.manual_seed(3)
    return TwoHead().eval()


@pytest.fixture(scope="module")
def module():
    return _two_head()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    return (rng.standard_normal((N, 16)).astype(np.float32),
            rng.standard_normal((N, 4)).astype(np.float32))


@pytest.fixture(scope="module")
def want(module, data):
    """torch's own outputs, computed here (not through hwbackends)."""
    import torch

    with torch.no_grad():
        ys = module(*(torch.from_numpy(a) for a in data))
    return tuple(y.numpy() for y in ys)


@pytest.fixture(scope="module")
def pt2(module, tmp_path_factory) -> Path:
    """A dynamic-batch torch.export program of the module, saved as users save it."""
    import torch

    batch = torch.export.Dim("batch", min=1, max=4096)
    ep = torch.export.export(module, (torch.zeros(3, 16), torch.zeros(3, 4)),
                             dynamic_shapes=({0: batch}, {0: batch}))
    path = tmp_path_factory.mktemp("pt2") / "two_head.pt2"
    torch.export.save(ep, path)
    return path


def _close(got, want, atol=1e-5) -> None:
    assert isinstance(got, tuple) and len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=atol)


def _specs(m) -> tuple[list, list]:
    return ([(s.name, s.shape) for s in m.inputs], [(s.name, s.shape) for s in m.outputs])


SPECS = ([("features", (16,)), ("state", (4,))], [("output_0", (1,)), ("output_1", (3,))])


def test_module_loads_one_spec_per_tensor(module, data, want):
    import torch

    m = hwb.load_model(module, example_input=(torch.zeros(2, 16), torch.zeros(2, 4)))
    assert m.multi_io and m.format == "torch"
    assert _specs(m) == SPECS  # inputs named after forward's arguments
    _close(m.reference(data), want, atol=0)
    _close(m.reference(list(data)), want, atol=0)
    # input_shape= with one shape per input gives the same model
    same = hwb.load_model(module, input_shape=[(16,), (4,)])
    assert _specs(same) == SPECS and same.fingerprint == m.fingerprint
    with pytest.raises(hwb.ModelError, match="takes 2 inputs"):
        m.reference((data[0], data[1], data[1]))


def test_fingerprint_covers_every_tensor_and_weight(module):
    import copy

    import torch

    base = hwb.load_model(module, input_shape=[(16,), (4,)]).fingerprint
    other = copy.deepcopy(module)
    with torch.no_grad():
        other.conf.bias[2] += 1e-3  # a weight of the second head only
    assert hwb.load_model(other, input_shape=[(16,), (4,)]).fingerprint != base
    wider = copy.deepcopy(module)
    wider.conf = torch.nn.Linear(18, 4)  # the second output's shape
    assert hwb.load_model(wider, input_shape=[(16,), (4,)]).fingerprint != base


def test_pt2_and_torchscript_files_load_the_same_specs(pt2, module, data, want, tmp_path,
                                                        store_dir):
    import torch

    m = hwb.load_model(pt2)
    assert _specs(m) == SPECS and "fixed_batch" not in m.meta
    _close(m.reference(data), want)
    traced = tmp_path / "two_head.pt"
    torch.jit.trace(module, (torch.zeros(2, 16), torch.zeros(2, 4))).save(str(traced))
    with pytest.raises(hwb.ModelError, match="example_input=.*input_shape=.*--input-shape"):
        hwb.load_model(traced)
    ts = hwb.load_model(traced, input_shape=[(16,), (4,)])
    assert _specs(ts) == SPECS  # TorchScript: names from forward's schema
    _close(ts.reference(data), want)
    # ref stores the TorchScript file and reloads it in its worker with every input's shape
    _close(hwb.compile(ts, "ref", store=store_dir).predict(data), want)
    with pytest.raises(hwb.ModelError, match=r"input_shape=\[\(16,\), \(5,\)\].*takes samples"):
        hwb.load_model(pt2, input_shape=[(16,), (5,)])


@pytest.mark.slow  # ~18 s: a dynamo ONNX export and an isolated compile
def test_a_fixed_batch_program_is_compiled_at_its_batch(module, data, want, tmp_path, store_dir):
    import torch

    path = tmp_path / "static.pt2"
    torch.export.save(torch.export.export(module, (torch.zeros(4, 16), torch.zeros(4, 4))), path)
    m = hwb.load_model(path)
    assert m.meta["fixed_batch"] == 4 and _specs(m) == SPECS
    _close(m.reference(data), want)  # N=10 runs padded, in chunks of 4
    cm = hwb.compile(m, "cpu.onnxruntime", store=store_dir)
    assert cm.batch_size == 4
    _close(cm.predict(data), want)


@pytest.mark.parametrize("kind", ["module", "pt2"])
def test_onnx_export_names_every_tensor(kind, module, pt2, tmp_path):
    from hwb_plugins.converters.to_onnx import torch_to_onnx

    m = hwb.load_model(module, input_shape=[(16,), (4,)]) if kind == "module" else hwb.load_model(pt2)
    g = torch_to_onnx(m, tmp_path).obj.graph
    inits = {i.name for i in g.initializer}
    assert [i.name for i in g.input if i.name not in inits] == ["features", "state"]
    assert [o.name for o in g.output] == ["output_0", "output_1"]
    dim0 = {v.type.tensor_type.shape.dim[0].dim_param for v in [*g.input, *g.output]
            if v.name not in inits}
    assert len(dim0) == 1 and dim0 != {""}, "one symbolic batch dimension for every tensor"


@pytest.mark.parametrize("target", TARGETS)
def test_module_compiles_on_multi_io_targets(target, module, data, want, store_dir):
    kw = {} if target == "ref" else {"batch_size": 4}
    m = hwb.load_model(module, input_shape=[(16,), (4,)])
    cm = hwb.compile(m, target, store=store_dir, **kw)
    assert cm.multi_io and [s.name for s in cm.inputs] == ["features", "state"]
    _close(cm.predict(data), want)
    _close(cm.predict({"state": data[1], "features": data[0]}), want)
    outs = tuple(np.full(s.batched(cm.batch_size), np.nan, np.float32) for s in cm.outputs)
    cm.predict_into(tuple(a[:cm.batch_size] for a in data), outs)
    _close(outs, tuple(w[:cm.batch_size] for w in want))
    f = cm.fidelity
    assert set(f.outputs) == {"output_0", "output_1"} and f.corr > 0.99999
    assert f.outputs["output_1"].kind == "probabilities"


def test_single_io_targets_refuse_torch_multi_io(module, store_dir):
    m = hwb.load_model(module, input_shape=[(16,), (4,)])
    for target in ("fpga.hls4ml", "fpga.da4ml"):
        if target not in hwb.get_registry().targets:
            continue
        with pytest.raises(hwb.UnsupportedError, match=f"{target} takes models with one input.*"
                                                       "features.*state.*cpu.onnxruntime"):
            hwb.compile(m, target, store=store_dir)


@pytest.mark.parametrize("precision, atol", [("fp32", 1e-6), ("fp16", 5e-3)])
def test_gpu_torch_path_takes_several_tensors_on_the_cpu(precision, atol, module, data, want,
                                                          tmp_path):
    """gpu.torch's export → save → move → fixed-buffer executor for two inputs and two
    outputs, run on the CPU without torch.compile or a CUDA graph (the plumbing, not a GPU
    result), and moved whole to "meta" (nothing left on the export device)."""
    import torch

    from hwb_plugins.gpu_torch.target import ARTIFACT, TorchCudaExecutor, program_on, static_program

    m = hwb.load_model(module, input_shape=[(16,), (4,)])
    b = 2
    torch.export.save(static_program(m.obj, [s.batched(b) for s in m.inputs], precision),
                      tmp_path / ARTIFACT)
    meta, dtype = program_on(tmp_path / ARTIFACT, "meta")
    ys = meta(*(torch.zeros(s.batched(b), dtype=dtype, device="meta") for s in m.inputs))
    assert [(y.device.type, tuple(y.shape)) for y in ys] == [("meta", (b, 1)), ("meta", (b, 3))]
    ex = TorchCudaExecutor(tmp_path / ARTIFACT, b, m.inputs, m.outputs, precision,
                                mode="none", cuda_graph=False, device="cpu")
    outs = tuple(np.full(s.batched(b), np.nan, np.float32) for s in m.outputs)
    ex.predict_into(tuple(a[:b] for a in data), outs)
    _close(outs, tuple(w[:b] for w in want), atol=atol)
    ex.predict_into(tuple(a[b:2 * b] for a in data), outs)  # buffers reused: the next rows
    _close(outs, tuple(w[b:2 * b] for w in want), atol=atol)
    with pytest.raises(hwb.InputError, match="input 'state' has shape"):
        ex.predict_into((data[0][:b], data[1][:b, :3]), outs)


@pytest.mark.gpu
@pytest.mark.parametrize("precision, atol", [("fp32", 1e-4), ("fp16", 5e-3)])
def test_gpu_torch_compiles_several_tensors_on_a_gpu(precision, atol, module, data, want,
                                                     store_dir):
    """The real thing: torch.compile + CUDA-graph replay with two inputs and two outputs."""
    avail = hwb.get_registry().target("gpu.torch").probe()
    if not avail.usable:
        pytest.skip(f"gpu.torch unavailable: {avail.reason}")
    m = hwb.load_model(module, input_shape=[(16,), (4,)])
    cm = hwb.compile(m, "gpu.torch", precision, batch_size=4, store=store_dir)
    assert cm.mode.value == "hardware"
    _close(cm.predict(data), want, atol=atol)


def test_outputs_that_are_not_a_flat_tuple_of_tensors_are_refused():
    import torch

    class Dicty(torch.nn.Module):
        def forward(self, x):
            return {"a": x, "b": x * 2}

    with pytest.raises(hwb.ModelError, match="returns dict.*flat tuple of tensors"):
        hwb.load_model(Dicty(), input_shape=(3,))



@pytest.mark.parametrize("target", TARGETS)
def test_pt2_through_hwb_compile_and_predict(target, pt2, data, want, store_dir, tmp_path, hwb_cli):
    batch = [] if target == "ref" else ["--batch-size", "4"]
    rc, out, err = hwb_cli("compile", str(pt2), "-t", target, *batch, "--json",
                        "--cache-dir", str(store_dir))
    assert rc == 0, err
    d = json.loads(out)
    assert d["variant"] == f"{target}:fp32"
    assert [t["name"] for t in d["inputs"]] == ["features", "state"]
    assert set(d["fidelity"]["outputs"]) == {"output_0", "output_1"}
    np.savez(tmp_path / "x.npz", features=data[0], state=data[1])
    rc, _, err = hwb_cli("predict", str(pt2), "-t", target, *batch, "-i",
                      str(tmp_path / "x.npz"), "--output", str(tmp_path / "y.npz"),
                      "--cache-dir", str(store_dir))
    assert rc == 0, err
    y = np.load(tmp_path / "y.npz")
    _close((y["output_0"], y["output_1"]), want)
