"""gpu.tensorrt without a GPU: the precision-carrying ONNX graph (prepare_onnx) run in the real
ONNX Runtime on the CPU and gated like the router gates a variant; the TensorRT build plan per
version string; the CUDA-stack version checks; the cuda-python handle extraction."""
from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest

from hwbackends.config import FidelityConfig
from hwbackends.errors import UnavailableError, UnsupportedError
from hwbackends.fidelity import compare

MODELS = ("mlp", "lstm", "signal")
BATCH = 1  # what the router compiles for; the graph's batch is fixed as compile() fixes it


def _needs_tf() -> None:
    from hwb_plugins._util import importable
    if not (importable("tensorflow") and importable("tf2onnx")):
        pytest.skip("tensorflow/tf2onnx not installed: the Keras zoo models cannot become ONNX")


@pytest.fixture(scope="module")
def onnx_zoo(zoo_model):
    """``onnx_zoo(name)`` → (batch-fixed ONNX proto, calibration, validation, reference), the
    graph gpu.tensorrt's compile() starts from (tf2onnx, then fix_batch)."""
    _needs_tf()
    from hwb_plugins._shared.onnx_batch import fix_batch
    from hwb_plugins.converters.to_onnx import keras_to_onnx

    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            m = zoo_model(name)
            proto = fix_batch(keras_to_onnx(m, None).obj, BATCH)
            v = m.validation_data
            if v is not None:  # disjoint halves, as hwbackends.compiler splits them
                half = len(v) // 2
                cal, val = v[:half][:256], v[half:][:512]
            else:
                cal, val = m.representative(256, seed=0), m.representative(512, seed=1)
            cal, val = (np.ascontiguousarray(a, dtype=np.float32) for a in (cal, val))
            cache[name] = (proto, cal, val, m.reference(val))
        return cache[name]
    return get


def _run(proto, x: np.ndarray, *, fused: bool = True) -> np.ndarray:
    """The graph in ONNX Runtime, one batch-1 call per sample. ``fused=False`` turns ORT's graph
    optimizer off, so each QuantizeLinear/DequantizeLinear runs as the ONNX operator defines it
    (round, saturate, rescale) around float MatMuls: the reference meaning of the Q/DQ graph,
    which TensorRT implements with int8 GEMMs accumulating in int32. With the optimizer on,
    ORT fuses the pairs into its own u8s8 CPU kernels, which on AVX2 machines without VNNI
    saturate int16 intermediates (ORT's docs: use reduce_range there) — a property of that
    CPU kernel, not of the graph TensorRT builds."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if not fused:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    return np.concatenate([s.run(None, {name: x[i:i + BATCH]})[0] for i in range(0, len(x), BATCH)])


def _io_types(proto) -> list[int]:
    return [v.type.tensor_type.elem_type for v in (*proto.graph.input, *proto.graph.output)]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_fp16_graph_passes_the_fidelity_gate(onnx_zoo, name):
    import onnx

    from hwb_plugins.gpu_tensorrt.precision import prepare_onnx

    proto, _, val, ref = onnx_zoo(name)
    g = prepare_onnx(proto, "fp16")
    assert _io_types(g) == [onnx.TensorProto.FLOAT] * 2, "fp16 keeps fp32 graph I/O"
    weights = [i for i in g.graph.initializer if i.dims and np.prod(i.dims) > 1]
    assert weights and all(i.data_type == onnx.TensorProto.FLOAT16 for i in weights)
    f = compare(ref, _run(g, val))
    assert FidelityConfig().tolerance().passes(f), f"{name} fp16: {f}"
    assert f.corr > 0.9999 and f.rel_err < 5e-3, f


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_int8_qdq_graph_passes_the_fidelity_gate_with_zero_points_0(onnx_zoo, name):
    import onnx

    from hwb_plugins.gpu_tensorrt.precision import prepare_onnx, qdq_zero_points

    proto, cal, val, ref = onnx_zoo(name)
    g = prepare_onnx(proto, "int8", cal)
    assert _io_types(g) == [onnx.TensorProto.FLOAT] * 2
    zps = qdq_zero_points(g)
    assert len(zps) >= 4, f"expected Q/DQ pairs around the dense layers, got {sorted(zps)}"
    assert all(v == 0 for vals in zps.values() for v in vals), zps
    inits = {i.name: i for i in g.graph.initializer}
    for n in g.graph.node:  # int8, not uint8: TensorRT takes signed symmetric Q/DQ only
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2:
            assert inits[n.input[2]].data_type == onnx.TensorProto.INT8, n.name
    f = compare(ref, _run(g, val, fused=False))
    assert FidelityConfig().tolerance().passes(f), f"{name} int8: {f}"


@pytest.mark.slow
def test_prepare_onnx_fp32_is_an_untouched_copy(onnx_zoo):
    from hwb_plugins.gpu_tensorrt.precision import prepare_onnx

    proto = onnx_zoo("signal")[0]
    g = prepare_onnx(proto, "fp32")
    assert g is not proto and g.SerializeToString() == proto.SerializeToString()


@pytest.mark.slow
def test_prepare_onnx_refuses_bad_input(onnx_zoo):
    from hwb_plugins.gpu_tensorrt.precision import prepare_onnx

    proto = onnx_zoo("signal")[0]
    with pytest.raises(UnsupportedError, match="calibration data"):
        prepare_onnx(proto, "int8", None)
    with pytest.raises(UnsupportedError, match="fp32, fp16, int8"):
        prepare_onnx(proto, "bf16")


# -- the TensorRT build, per version, without importing tensorrt --------------------------------
@pytest.mark.parametrize("version,flags", [("10.16.1.11", ("STRONGLY_TYPED",)),
                                           ("10.8.0.43", ("STRONGLY_TYPED",)),
                                           ("11.4.0.106", ()), ("11.0.0.114", ()), ("12.0.1", ())])
def test_build_plan_is_strongly_typed_and_sets_no_precision_flag(version, flags):
    from hwb_plugins.gpu_tensorrt.target import build_plan

    plan = build_plan(version)
    assert plan.trt_major == int(version.split(".")[0])
    assert plan.network_flags == flags
    assert plan.builder_flags == ()  # fp16/int8 live in the graph on every version


@pytest.mark.parametrize("version", ["8.6.1", "", "garbage"])
def test_build_plan_refuses_tensorrt_before_10(version):
    from hwb_plugins.gpu_tensorrt.target import build_plan

    with pytest.raises(UnavailableError, match="TensorRT 10 or 11"):
        build_plan(version)


def _code_names(module) -> tuple[set[str], set[str]]:
    """Every identifier/attribute and every non-docstring string constant in a module's code
    (comments and docstrings may *say* what was removed; code may not *use* it)."""
    tree = ast.parse(inspect.getsource(module))
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str) and id(n) not in docs}
    return names, strings


def test_no_code_path_touches_weak_typing_or_calibrators():
    """TensorRT 11 removed these: the plugin's code uses none of them, on any version."""
    import hwb_plugins.gpu_tensorrt.precision as precision
    import hwb_plugins.gpu_tensorrt.target as target

    for module in (target, precision):
        names, strings = _code_names(module)
        for gone in ("FP16", "INT8", "BF16", "IInt8EntropyCalibrator2", "IInt8Calibrator",
                     "int8_calibrator", "set_calibration_profile", "EXPLICIT_BATCH",
                     "quantization_flags"):
            assert gone not in names and gone not in strings, (module.__name__, gone)
        assert "BuilderFlag" not in names or module is target
    assert "prepare_onnx" in _code_names(target)[0]
    assert "prepare_onnx(" in inspect.getsource(target.TensorRTTarget.compile)


def test_tensorrt_executor_init_is_small_steps():
    from hwb_plugins.gpu_tensorrt.target import TensorRTExecutor

    lines = inspect.getsource(TensorRTExecutor.__init__).splitlines()
    assert len(lines) <= 25, len(lines)
    assert callable(TensorRTExecutor._run)


# -- the CUDA stack: versions and mismatches ---------------------------------------------------
def _stack(**kw):
    from hwb_plugins._nvidia import CudaStack
    base = dict(tensorrt="11.4.0.106", tensorrt_cuda=12, cuda_python="12.9.10",
                cuda_runtime="12.9.79", driver="570.124.06", driver_cuda="12.8")
    return CudaStack(**{**base, **kw})


def test_consistent_cuda12_stack_is_accepted():
    from hwb_plugins._nvidia import CudaStack, stack_mismatch
    assert stack_mismatch(_stack()) is None
    assert _stack().summary() == ("TensorRT 11.4.0.106 (CUDA 12), cuda-python 12.9.10, "
                                  "CUDA runtime 12.9.79, driver 570.124.06 (CUDA 12.8)")
    assert CudaStack().summary() == ""
    # a newer driver runs older CUDA majors
    assert stack_mismatch(_stack(driver="580.82.07", driver_cuda="13.0")) is None


@pytest.mark.parametrize("kw,why", [
    (dict(tensorrt_cuda=13), "built for CUDA 13 but cuda-python 12.9.10 is for CUDA 12"),
    (dict(cuda_python="13.4.4"), "cuda-python 13.4.4 is for CUDA 13"),
    (dict(tensorrt_cuda=13, cuda_python="13.4.4"), "too old for CUDA 13"),
    (dict(driver="470.82.01", driver_cuda="11.4"), "too old for CUDA 12"),
    (dict(driver="470.82.01", driver_cuda=""), "needs ≥ 525.60.13"),
    (dict(tensorrt="8.6.1", tensorrt_cuda=None), "older than 10"),
])
def test_mismatched_stack_is_refused_with_the_reason(kw, why):
    from hwb_plugins._nvidia import stack_mismatch
    reason = stack_mismatch(_stack(**kw))
    assert reason and why in reason, reason


def test_probe_names_the_stack_and_what_to_install():
    from hwb_plugins._nvidia import no_gpu_reason
    from hwb_plugins.gpu_tensorrt.target import TensorRTTarget

    a = TensorRTTarget().probe()
    if no_gpu_reason() is None:
        pytest.skip("a GPU is present: the unavailable reason is not what this checks")
    assert not a.usable
    assert set(a.details) >= {"tensorrt", "cuda_python", "cuda_runtime", "driver"}
    if not a.details["tensorrt"]:
        assert "pip install 'hwbackends[gpu]'" in a.reason
    if a.details["cuda_python"]:  # what is installed is named
        assert f"cuda-python {a.details['cuda_python']}" in a.reason


def test_handle_extraction_uses_cuda_python_and_falls_back_to_int():
    from hwb_plugins.gpu_tensorrt.target import native_handle

    assert native_handle(12345) == 12345  # device/host pointers are plain ints

    class Legacy:  # a handle type get_cuda_native_handle does not know: int() it
        def __int__(self) -> int:
            return 77
    assert native_handle(Legacy()) == 77
    rt = pytest.importorskip("cuda.bindings.runtime", reason="cuda-python not installed")
    pytest.importorskip("cuda.bindings.utils", reason="cuda-python < 12.9")
    assert native_handle(rt.cudaStream_t(init_value=0xBEEF)) == 0xBEEF
    assert native_handle(rt.cudaGraphExec_t(init_value=4096)) == 4096
