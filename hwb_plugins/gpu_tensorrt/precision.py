"""Precision lives in the ONNX graph: what TensorRT (strongly typed, the only mode in 11.x) builds.

TensorRT 11 removed the builder's precision flags and the INT8 calibrators: an fp32 graph
builds an fp32 engine, an fp16 engine needs fp16 tensors in the graph, and int8 comes only
from QuantizeLinear/DequantizeLinear pairs (symmetric, zero-point 0). :func:`prepare_onnx`
makes that graph with no GPU and no TensorRT, so its numerics are tested on the CPU with
ONNX Runtime, and the same graph is what every TensorRT version builds.

Choices (docs/targets-accelerators.md):

* fp16: ``onnxconverter_common.float16.convert_float_to_float16(keep_io_types=True)`` — a
  pure-Python graph rewrite (weights and activations to fp16, Cast nodes at the fp32 inputs
  and outputs). NVIDIA ModelOpt's AutoCast does the same job with a per-node accuracy search,
  but ``nvidia-modelopt[onnx]`` pins its own onnx and ``onnxruntime-gpu`` (it would replace
  the onnx/onnxruntime this project pins) and pulls cupy-cuda12x: it cannot be installed on
  the CPU machines where this has to be tested.
* int8: ``onnxruntime.quantization.quantize_static`` in QDQ format, int8 activations and
  weights, ``ActivationSymmetric``/``WeightSymmetric`` (zero-point 0, what TensorRT accepts),
  per-channel weight scales (one per output column of a MatMul/Gemm: the dense layers of
  these models have very different column norms), biases left in float (TensorRT fuses the
  float bias; it has no int32 DequantizeLinear), MinMax calibration on ``calibration_data``.
  Ops ONNX Runtime's QDQ quantizer does not cover (LSTM) stay float; TensorRT runs them in
  the precision the graph gives them.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from hwbackends.contract import UnsupportedError

PRECISIONS = ("fp32", "fp16", "int8")
#: Ops given Q/DQ on their inputs; the rest of the graph stays float.
INT8_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Add", "Mul", "Relu", "Sigmoid", "Tanh",
            "MaxPool", "AveragePool", "GlobalAveragePool", "Concat", "Transpose", "Reshape")
#: Enough samples for MinMax ranges; more only costs build time.
MAX_CALIBRATION = 512


def _copy(model: Any) -> Any:
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def input_names(model: Any) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _static_batch(model: Any) -> int | None:
    """The graph inputs' batch dimension when it is fixed (TensorRT graphs are), else None."""
    inits = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name not in inits and len(dims) and dims[0].HasField("dim_value"):
            return int(dims[0].dim_value)
    return None


def to_fp16(model: Any) -> Any:
    """fp16 weights and activations, fp32 graph inputs and outputs (Cast nodes at the ends;
    every input and output of a multi-IO graph keeps fp32)."""
    from onnxconverter_common import float16

    return float16.convert_float_to_float16(_copy(model), keep_io_types=True,
                                            disable_shape_infer=False)


#: What ``calibration_data`` may be: one array (a one-input graph), a tuple/list with one array
#: per graph input in graph order, or a dict keyed by graph input name.
Calibration = np.ndarray | tuple[np.ndarray, ...] | list[np.ndarray] | dict[str, np.ndarray]


def calibration_by_name(names: list[str], data: Any) -> dict[str, np.ndarray]:
    """``calibration_data`` as float32 arrays keyed by graph input name, every input present
    with the same number of samples; refuses anything else saying what was expected."""
    want = f"one array per graph input ({', '.join(names)}): a tuple in that order or a dict by name"
    if isinstance(data, dict):
        missing, extra = [n for n in names if n not in data], sorted(set(data) - set(names))
        if missing or extra:
            raise UnsupportedError(f"gpu.tensorrt:int8 calibration_data is keyed {sorted(data)}; "
                                   f"expected {want}")
        arrays = [data[n] for n in names]
    elif isinstance(data, (tuple, list)):
        arrays = list(data)
    else:
        arrays = [data]
    if len(arrays) != len(names):
        raise UnsupportedError(f"gpu.tensorrt:int8 got calibration data for {len(arrays)} "
                               f"input(s); expected {want}")
    out = {n: np.asarray(a, dtype=np.float32)[:MAX_CALIBRATION] for n, a in zip(names, arrays, strict=True)}
    counts = {n: len(a) for n, a in out.items()}
    if len(set(counts.values())) != 1:
        raise UnsupportedError(f"gpu.tensorrt:int8 calibration arrays hold different numbers of "
                               f"samples ({counts}); give every input the same samples")
    return out


class _Reader:
    """ONNX Runtime's CalibrationDataReader protocol over arrays keyed by input name, one dict
    per batch in the graph's batch size (a static batch takes whole chunks only; a dynamic one
    takes chunks of 32)."""

    def __init__(self, data: dict[str, np.ndarray], batch: int | None):
        step = batch or 32
        n = (len(next(iter(data.values()))) // step) * step
        self._it: Iterator[dict[str, np.ndarray]] = (
            {name: np.ascontiguousarray(a[i:i + step]) for name, a in data.items()}
            for i in range(0, n, step))

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:  # the MinMax calibrator reads once
        pass


def to_int8(model: Any, calibration_data: Any, per_channel: bool = True) -> Any:
    """The symmetric int8 Q/DQ graph, calibrated on ``calibration_data`` (see
    :data:`Calibration`; every input of a multi-input graph is calibrated)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    names = input_names(model)
    batch = _static_batch(model)
    need = batch or 1
    if calibration_data is None:
        raise UnsupportedError(f"gpu.tensorrt:int8 needs calibration data: at least {need} "
                               f"sample(s) of each model input (calibration_data=…)")
    data = calibration_by_name(names, calibration_data)
    if len(data[names[0]]) < need:
        raise UnsupportedError(f"gpu.tensorrt:int8 needs calibration data: at least {need} "
                               f"sample(s) of each model input (calibration_data=…)")
    with tempfile.TemporaryDirectory(prefix="hwb-trt-int8-") as tmp:
        src, pre, dst = (Path(tmp) / f for f in ("in.onnx", "pre.onnx", "int8.onnx"))
        onnx.save(model, str(src))
        # Shape inference + constant folding first (what ONNX Runtime recommends before
        # quantize_static); the graph optimizer is off so the graph keeps standard ops only.
        try:
            quant_pre_process(str(src), str(pre), skip_optimization=True, skip_onnx_shape=False,
                              skip_symbolic_shape=False)
        except Exception:  # symbolic shape inference can fail on exotic graphs: optional
            pre = src
        quantize_static(
            str(pre), str(dst), _Reader(data, batch),
            quant_format=QuantFormat.QDQ, op_types_to_quantize=list(INT8_OPS),
            per_channel=per_channel, reduce_range=False,
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                           "QuantizeBias": False,
                           # TensorRT's per-channel weight scales run along the output axis.
                           "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1}})
        return onnx.load(str(dst))


def prepare_onnx(model: Any, precision: str, calibration_data: Any = None) -> Any:
    """The ONNX graph TensorRT builds for ``precision`` (a new ``onnx.ModelProto``; ``model``
    is not modified): fp32 as is, fp16 converted with fp32 I/O, int8 as a symmetric Q/DQ graph
    calibrated on ``calibration_data`` (one array, or for a graph with several inputs a tuple
    in graph input order or a dict keyed by input name). Needs neither a GPU nor TensorRT."""
    if precision == "fp32":
        return _copy(model)
    if precision == "fp16":
        return to_fp16(model)
    if precision == "int8":
        return to_int8(model, calibration_data)
    raise UnsupportedError(f"gpu.tensorrt precision must be one of {', '.join(PRECISIONS)}; "
                           f"got {precision!r}")


def qdq_zero_points(model: Any) -> dict[str, list[int]]:
    """Every Q/DQ node's zero-point values, by node name (an absent zero-point is 0)."""
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    consts = {o: numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
              for o in n.output}
    out: dict[str, list[int]] = {}
    for n in model.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        if len(n.input) < 3 or not n.input[2]:
            out[n.name] = [0]
            continue
        zp = inits.get(n.input[2], consts.get(n.input[2]))
        if zp is None:
            raise ValueError(f"zero-point {n.input[2]!r} of {n.name} is not a constant")
        out[n.name] = [int(v) for v in np.asarray(zp).ravel()]
    return out
