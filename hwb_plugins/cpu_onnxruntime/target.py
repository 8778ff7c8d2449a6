from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hwbackends.contract import (
    Artifact,
    Availability,
    BufferedExecutor,
    CompileOptions,
    Executor,
    HwbError,
    Target,
    TensorSpec,
    TritonForm,
    UnsupportedError,
)

from .._shared.onnx_batch import batch_meta, fix_batch
from .._shared.onnx_io import graph_inputs, spec_order
from .._util import cpu_name, importable, version
from .quantiser import quantiser_error, with_default_domain


def _session(path: Path, threads: int) -> Any:
    """One sequential CPU session with every graph optimisation (both executors use it)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class _Calibration:
    """ORT's CalibrationDataReader protocol over representative inputs: one dict per batch,
    keyed by graph input name (``names[i]`` takes ``data[i]``; one array for one input)."""

    def __init__(self, names: list[str], data: np.ndarray | tuple[np.ndarray, ...], batch: int):
        arrays = data if isinstance(data, tuple) else (data,)
        if len(arrays) != len(names):
            raise UnsupportedError(f"cpu.onnxruntime:int8 got calibration data for {len(arrays)} "
                                   f"input(s); the graph takes {len(names)} ({', '.join(names)})")
        n = min(len(a) for a in arrays)
        self._it = iter([{name: a[i:i + batch] for name, a in zip(names, arrays, strict=True)}
                         for i in range(0, n - batch + 1, batch)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


class OnnxRuntimeExecutor(BufferedExecutor):
    """IOBinding onto fixed buffers, one OrtValue per input and output name, run through the
    C++ session directly: no per-call dict, name lookup or output allocation (see
    docs/performance.md for the measured gain)."""

    def __init__(self, path: Path, threads: int, batch: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec]):
        import onnxruntime as ort

        self.session = _session(path, threads)
        self._init_io(inputs, outputs, batch)
        ins = [np.zeros(s.batched(batch), np.float32) for s in self._in_specs]
        outs = [np.zeros(s.batched(batch), np.float32) for s in self._out_specs]
        binding = self.session.io_binding()
        in_names = spec_order([i.name for i in self.session.get_inputs()], self._in_specs)
        out_names = spec_order([o.name for o in self.session.get_outputs()], self._out_specs)
        # OrtValues over our own arrays: ORT reads the inputs and writes the outputs in place;
        # they must live as long as the binding.
        self._values = []
        for name, arr in zip(in_names, ins, strict=True):
            self._values.append(ort.OrtValue.ortvalue_from_numpy(arr))
            binding.bind_ortvalue_input(name, self._values[-1])
        for name, arr in zip(out_names, outs, strict=True):
            self._values.append(ort.OrtValue.ortvalue_from_numpy(arr))
            binding.bind_ortvalue_output(name, self._values[-1])
        self._binding = binding
        self._buffers(ins, outs, functools.partial(self.session._sess.run_with_iobinding,
                                                   binding._iobinding, None))
        self._invoke()


class OnnxRuntimeTarget(Target):
    name = "cpu.onnxruntime"
    family = "cpu"
    precisions = ("fp32", "int8-dynamic", "int8")
    calibrated = ("int8",)
    #: 3: int8 and int8-dynamic quantise weights to 7 bits (reduce_range); older artifacts rebuild.
    version = "3"
    formats = ("onnx",)
    install = "hwbackends[cpu]"
    description = "ONNX Runtime, CPU execution provider"
    multi_io = True
    #: int8 calibrates every input: one dict per batch, keyed by input name.
    multi_io_calibrated = True

    def probe(self) -> Availability:
        if not importable("onnxruntime"):
            return Availability.unavailable("onnxruntime not installed (pip install onnxruntime)")
        return Availability.hardware(f"CPU ({cpu_name()})", "ONNX Runtime CPUExecutionProvider")

    def toolchain(self) -> dict[str, str]:
        return {"onnxruntime": version("onnxruntime"), "onnx": version("onnx"),
                "tf2onnx": version("tf2onnx"), "torch": version("torch")}

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        import onnx
        import onnxruntime as ort

        proto = fix_batch(model.obj, options.batch_size)
        fp32 = workdir / "model.fp32.onnx"
        onnx.save(proto, str(fp32))
        try:  # check it loads before spending time on quantization
            ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise UnsupportedError(f"cpu.onnxruntime cannot load the converted model "
                                   f"{model.name!r}: {str(exc)[:500]}") from exc
        final = workdir / "model.onnx"
        if options.precision == "fp32":
            fp32.rename(final)
        else:
            from onnxruntime.quantization.shape_inference import quant_pre_process

            pre = workdir / "model.pre.onnx"
            try:
                quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
            except Exception:
                pre = fp32  # pre-processing is an optimisation, not a requirement
            onnx.save(with_default_domain(onnx.load(str(pre))), str(pre))
            try:
                self._quantize(model, proto, options, pre, final)
            except HwbError:
                raise
            except Exception as exc:
                raise quantiser_error(model.name, options.precision, proto, exc) from None
            for p in (fp32, workdir / "model.pre.onnx"):
                p.unlink(missing_ok=True)
        ops = sorted({n.op_type for n in onnx.load(str(final)).graph.node})
        return {"file": "model.onnx", "bytes": final.stat().st_size, "ops": ops,
                "converted_from": model.meta.get("converted_from", "onnx"),
                **batch_meta(model, options.batch_size)}

    @staticmethod
    def _quantize(model: Any, proto: Any, options: CompileOptions, pre: Path, final: Path) -> None:
        """ONNX Runtime's dynamic or static int8 quantiser, ``pre`` → ``final``."""
        from onnxruntime.quantization import QuantType, quantize_dynamic, quantize_static

        if options.precision == "int8-dynamic":
            # 7-bit weights: ONNX Runtime's u8s8 kernels on AVX2/AVX-512 CPUs without VNNI
            # saturate their 16-bit intermediate sums with full-range weights (its docs
            # advise reduce_range there); on this project's EPYC machines the zoo MLP fell
            # to corr 0.975 without it (static int8: 0.988 on mlp, 0.985 on lstm). Costs one
            # bit of weight resolution everywhere.
            quantize_dynamic(str(pre), str(final), weight_type=QuantType.QInt8,
                             reduce_range=True)
        else:
            if options.calibration is None:
                raise UnsupportedError("cpu.onnxruntime:int8 needs calibration data")
            reader = _Calibration(spec_order(graph_inputs(proto), model.inputs), options.calibration,
                                  options.batch_size)
            quantize_static(str(pre), str(final), reader, activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8, reduce_range=True)

    def triton(self) -> TritonForm:
        from .export import TRITON

        return TRITON

    def load(self, artifact: Artifact, options: CompileOptions) -> Executor:
        return OnnxRuntimeExecutor(artifact.file("model.onnx"), options.runtime_threads(),
                                   artifact.batch_size, artifact.inputs, artifact.outputs)
