"""The ``cpu.native`` target: compile (emit C, build two shared objects), load (ISA check
before dlopen, then the extension), the executor (the C entry *is* ``predict_into``) and the
``c`` export."""
from __future__ import annotations

import importlib.util
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from hwbackends.contract import (
    Artifact,
    Availability,
    CompileError,
    CompileOptions,
    Executor,
    InputError,
    Target,
    UnavailableError,
    UnsupportedError,
    machine,
)

from .._util import cpu_name, version
from . import build, push_weights
from .fixed import PRECISION_RULE, hls_precision

#: The ``conv_algorithm`` option's values: Winograd where it is eligible and pays, the direct
#: sum everywhere, or Winograd on every eligible conv (hwb_plugins/cpu_native/winograd.py).
CONV_ALGORITHMS = ("auto", "direct", "winograd")
#: Files ``export(artifact, "c", outdir)`` writes: the C ABI and its header.
EXPORTED = ("libhwb_model.so", "hwb_model.h")


class NativeExecutor(Executor):
    """The loaded extension: its ``predict_into`` builtin, bound to this executor, replaces
    the inherited method on the instance, so ``CompiledModel.predict_into`` is one C call.
    The C code checks type, shape, dtype ('f'), C-contiguity and writeability itself and calls
    back into :meth:`_fail` (the core's ``check_io``) only when one of them fails."""

    contiguous = True

    def __init__(self, module: Any, artifact: Artifact):
        self.module = module
        self._artifact = artifact
        if artifact.multi_io:  # one array per tensor, tuples each way (emit_multi.py)
            self._init_io(artifact.inputs, artifact.outputs, artifact.batch_size)
            self.predict_into = module.bind_multi(self._fail, np.ndarray, InputError)  # type: ignore[method-assign]
            return
        self._init_io(artifact.inputs[0], artifact.outputs[0], artifact.batch_size)
        self.predict_into = module.bind(self._fail, np.ndarray, InputError)  # type: ignore[method-assign]

    def _fail(self, *args: Any) -> None:
        """The C entry's error path: raise the core's InputError for a wrong ``(x, out)``
        (tuples ``(xs, outs)`` for a model with several inputs or outputs)."""
        if len(args) != 2:
            raise TypeError(f"predict_into takes 2 arguments (x, out); got {len(args)}")
        if self.single:
            self._check((args[0],), (args[1],))
        else:
            self._check(args[0], args[1])

    def _run(self, xs: tuple[np.ndarray, ...], outs: tuple[np.ndarray, ...]) -> None:
        if self.single:
            self.predict_into(xs[0], outs[0])
        else:
            self.predict_into(tuple(xs), tuple(outs))

    def incremental(self, *, stateful: bool = False, auto_prepare: bool = True) -> Any:
        """The library's sliding window or stream (hwb_plugins/cpu_native/sliding.py), reset."""
        from . import sliding

        art = self._artifact
        return sliding.steps(self.module, art.meta, tuple(art.inputs[0].shape),
                             tuple(art.outputs[0].shape), stateful=stateful, auto_prepare=auto_prepare)

    def incremental_streams(self, streams: int, *, stateful: bool = False, auto_prepare: bool = True) -> Any:
        """``streams`` windows or streams as the library's handles (hwb_window.h), each empty."""
        from . import sliding

        art = self._artifact
        return sliding.streams_steps(self.module, art.meta, tuple(art.inputs[0].shape),
                                     tuple(art.outputs[0].shape), streams, stateful=stateful,
                                     auto_prepare=auto_prepare)

    def native_entry(self) -> Any:
        """The generated model function as the contract's native entry (the extension's
        ``entry`` capsule, ABI 1); None for an artifact built before the extension had one,
        and for a model with several inputs or outputs (the contract's entry is for one of
        each; its library's hwb_model_predict takes packed records, emit_multi.py)."""
        if not self.single:
            return None
        return getattr(self.module, "entry", None)


def check_isa(meta: dict[str, Any], cpuinfo: str | None = None) -> None:
    """Refuse, before anything is dlopen'ed, an artifact this CPU cannot run (another
    architecture, a CPU feature it lacks, another Python ABI): UnavailableError saying what is
    missing and what to do, instead of SIGILL on the first call."""
    where = f"this CPU ({cpu_name()})"
    if meta.get("arch") != build.arch():
        raise UnavailableError(f"cpu.native artifact was built for {meta.get('arch')}; {where} is "
                               f"{build.arch()}. Recompile it on this machine")
    have = build.host_flags(cpuinfo)
    missing = [f for f in meta.get("requires", []) if f not in have]
    if missing:
        raise UnavailableError(
            f"cpu.native artifact was built with -march={meta.get('march')} (isa="
            f"{meta.get('isa')!r}) and needs CPU features {', '.join(missing)}, which {where} "
            f"lacks; running it would die with SIGILL. Recompile for this CPU: options="
            f"{{'isa': 'native'}} (or an ISA level it has)")
    if meta.get("python_abi") != build.python_abi():
        raise UnavailableError(f"cpu.native artifact's extension was built for Python ABI "
                               f"{meta.get('python_abi')!r}; this interpreter is "
                               f"{build.python_abi()!r}. Recompile it with this Python")


class NativeTarget(Target):
    name = "cpu.native"
    family = "cpu"
    # Listed: what a sweep (and the conformance kit) builds. Accepted besides: "fixed" (hls4ml's
    # default ap_fixed<16,6>) and any ap_fixed<W,I[,Q,O]>, the strings fpga.hls4ml takes
    # (fixed.hls_precision). Not listed, as fpga.hls4ml lists only "auto": an explicit
    # precision reproduces hls4ml bit for bit, including where its default types fail the
    # model (the zoo mlp's softmax at fixed<16,6> indexes its exp table in steps of 128 and
    # outputs 1/3 for every sample, which no fidelity tolerance passes).
    precisions = ("fp32", "int8")
    precision_rule = PRECISION_RULE
    calibrated = ("int8",)
    formats = ("keras", "torch", "onnx")
    version = "19"
    #: several inputs/outputs: fp32, each input's chain, a concatenation or add, a trunk and
    #: one head per output (hwbackends/layer_ir/multi.py, emit_multi.py); int8 calibrates one
    #: input tensor, so multi_io_calibrated stays False
    multi_io = True
    install = "hwbackends[cpu]"
    description = ("generated C, weights as constants, cc -O3 -march=<isa>; one CPython "
                   "FASTCALL call per predict_into; exports a C library + header; precision "
                   "fixed/ap_fixed<W,I>: bit-exact with fpga.hls4ml's C-simulation")
    option_docs = {
        "isa": ("native (default) | x86-64-v2 | x86-64-v3 | x86-64-v4: the -march the model is "
                "built for; load refuses an artifact whose CPU features this CPU lacks"),
        "conv_algorithm": ("auto (default) | direct | winograd: fp32 Conv2D with a (r, 1) kernel "
                           "(r 2..6), stride 1, dilation 1 by Winograd F(9-r, r) along the rows "
                           "(auto: where c_in >= 8 and there are at least 9-r output rows; "
                           "winograd: every such conv) or by the direct sum; meta['winograd'] "
                           "names the convs that took it; int8 is always direct "
                           "(hwb_plugins/cpu_native/winograd.py)"),
        "push_weights": ("fp32 (default) | bf16 | f16 | int8: the weights the sliding window's push "
                         "reads (the input products of the newest step; prepare and predict stay "
                         "fp32) in bf16 (needs avx512_bf16), IEEE half (f16c: AVX2 or AVX-512) or "
                         "int8 (per-tick input scale; avx512_vnni, avx_vnni or AVX2), the form "
                         "picked from the isa's features; the push's answers are gated against the "
                         "fp32 window at the bf16/fp16/int8 tolerance, not bit-equal "
                         "(hwb_plugins/cpu_native/push_weights.py)"),
        "push_gates": ("exact (default in fp32) | fast (default with reduced push_weights): the "
                       "sliding push's LSTM gates as vector code (polynomial exp, reciprocal + "
                       "Newton; AVX-512 or AVX2 + FMA); in fp32 the push is then within 1e-5 of "
                       "the answers' scale of the full window (gated at compile), not bit-equal"),
    }
    exports = ("c",)
    compile_timeout = 300.0

    def accepts(self, precision: str) -> bool:
        return precision in self.precisions or hls_precision(precision) is not None

    def probe(self) -> Availability:
        if build.compiler_path() is None:
            return Availability.unavailable(
                f"C compiler {build.compiler()!r} not found (HWB_CC, default cc): install gcc "
                f"or clang, or set HWB_CC to one")
        if not (build.python_include() / "Python.h").exists():
            return Availability.unavailable("Python.h not found: install the Python development "
                                            "headers (python3-dev) for the extension build")
        return Availability.hardware(f"CPU ({cpu_name()})", "generated C, compiled for this CPU")

    def toolchain(self) -> dict[str, str]:
        return {"cc": build.compiler_version(), "isa": machine.isa(),
                "python_abi": build.python_abi(), "flags": " ".join(build.MODEL_FLAGS),
                "runtime": build.runtime_digest()}

    def check_options(self, options: CompileOptions) -> None:
        isa = options.extra.get("isa", "native")
        if isa not in build.ISAS:
            raise UnsupportedError(f"cpu.native option isa={isa!r}: expected one of "
                                   f"{', '.join(build.ISAS)}")
        if isa != "native" and build.arch() != "x86_64":
            raise UnsupportedError(f"cpu.native option isa={isa!r} is an x86-64 level; this "
                                   f"machine is {build.arch()}: use isa='native'")
        self._check_push_weights(options, isa)
        algo = options.extra.get("conv_algorithm", "auto")
        if algo not in CONV_ALGORITHMS:
            raise UnsupportedError(f"cpu.native option conv_algorithm={algo!r}: expected one of "
                                   f"{', '.join(CONV_ALGORITHMS)}")
        if algo == "winograd" and options.precision != "fp32":
            raise UnsupportedError(f"cpu.native option conv_algorithm='winograd' applies to precision "
                                   f"'fp32'; precision {options.precision!r} computes every conv "
                                   f"directly: drop the option or use 'auto'")

    @staticmethod
    def _check_push_weights(options: CompileOptions, isa: str) -> None:
        """``push_weights``: one of push_weights.CHOICES, at precision fp32 (the only one with
        an incremental push), and its kernel's CPU features both on this CPU and in the
        ``-march`` the artifact is built for."""
        kind, gates = push_weights.choice(options.extra), push_weights.gates_choice(options.extra)
        if kind not in push_weights.CHOICES:
            raise UnsupportedError(f"cpu.native option push_weights={kind!r}: expected one of "
                                   f"{', '.join(push_weights.CHOICES)}")
        if gates not in push_weights.GATES:
            raise UnsupportedError(f"cpu.native option push_gates={gates!r}: expected one of "
                                   f"{', '.join(push_weights.GATES)}")
        if kind == "fp32" and gates == "exact":
            return
        asked = [f"{name}={value!r}" for name, value, plain in
                 (("push_weights", kind, "fp32"), ("push_gates", gates, "exact"))
                 if value != plain and name in options.extra]
        what = " and ".join(asked)
        if options.precision != "fp32":
            raise UnsupportedError(f"cpu.native option {what} applies to precision 'fp32' (its "
                                   f"incremental sliding push); precision {options.precision!r} has "
                                   f"none: drop {' and '.join(a.split('=')[0] for a in asked)}")
        def lacking(have: list[str]) -> tuple[list[str], bool]:
            """The features no form of the kind (or of the fast gates) finds in ``have``, and
            whether the gates lack any."""
            gl = push_weights.missing_features(gates, have)
            return list(dict.fromkeys(push_weights.missing_features(kind, have) + gl)), bool(gl)

        lacks, gates_lack = lacking(build.host_flags())
        if lacks:
            raise UnsupportedError(f"cpu.native option {what} needs CPU feature(s) {', '.join(lacks)}, "
                                   f"which this CPU ({cpu_name()}) lacks: use push_weights='fp32'"
                                   + (", or 'f16' / 'int8' (AVX2 forms)" if kind == "bf16" else "")
                                   + (" and push_gates='exact'" if gates_lack else ""))
        cc = build.compiler_path()
        lacks, _ = lacking(build.required_flags(cc, isa)) if cc else ([], False)
        if lacks:
            raise UnsupportedError(f"cpu.native option {what} needs CPU feature(s) {', '.join(lacks)}, "
                                   f"which -march={build.march(isa)} (isa={isa!r}) does not enable: use "
                                   f"isa='native' on a CPU that has them"
                                   + (", or push_weights='f16' / 'int8' (AVX2 forms)" if kind == "bf16" else ""))

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        from hwbackends import layer_ir

        from . import sliding, sliding_conv
        from .emit import emit, share_constants

        self.check_options(options)
        t0 = time.perf_counter()
        isa = options.extra.get("isa", "native")
        cc = build.compiler_path()
        if cc is None:
            raise CompileError(f"cpu.native: C compiler {build.compiler()!r} not found")
        requires = build.required_flags(cc, isa)
        hls_prec = hls_precision(options.precision)
        fixed_meta: dict[str, Any] = {}
        net = None
        if len(model.inputs) > 1 or len(model.outputs) > 1:
            return self._compile_multi(model, options, workdir, cc, isa, requires, t0)
        if hls_prec is not None:
            src, in_shape, out_shape, layers, fixed_meta = self._fixed(model, hls_prec, cc,
                                                                       requires, workdir)
        else:
            net = layer_ir.extract(model, self.name)
            calib = options.calibration if options.precision == "int8" else None
            src = emit(net, requires, options.precision, calib,
                       options.extra.get("conv_algorithm", "auto"))
            in_shape, out_shape = tuple(net.input_shape), tuple(net.output_shape)
            layers = [f"{layer.name}:{type(layer).__name__}" for layer in net.layers]
        batch = options.batch_size
        kind, gates = push_weights.choice(options.extra), push_weights.gates_choice(options.extra)
        plain = kind == "fp32" and gates == "exact"
        window = ((sliding_conv.emit(net, in_shape, options.precision, requires) if plain else None)
                  or sliding.emit(net, in_shape, options.precision, requires, kind, gates))
        code = share_constants(src.code + "\n" + window.code)
        hdr = build.header(name=model.name, fingerprint=model.fingerprint, isa=isa,
                           requires=requires, precision=options.precision, batch=batch,
                           stack=src.stack_bytes, in_shape=in_shape, out_shape=out_shape,
                           extra=window.header)
        module = build.module_name(code, hdr, cc, isa, build.runtime_digest())
        ext = build.extension_source(module, batch, in_shape, out_shape, sliding.ext_parts(in_shape))
        (workdir / "model.c").write_text(code)
        (workdir / "hwb_model.h").write_text(hdr)
        (workdir / "ext.c").write_text(ext)
        facts = build.build(workdir, cc, isa, module)
        if not plain:
            # the form of each reduced part that this -march builds (push_weights.FORMS)
            window.meta["push_kernels"] = {part: push_weights.kernel(part, requires)
                                           for part in (kind, gates) if part in push_weights.FORMS}
            window.meta["push_gate"] = self._push_gate(workdir, module, kind, in_shape, out_shape, batch)
        return {"module": module, "extension": module + build.python_abi(),
                "library": "libhwb_model.so", "header": "hwb_model.h", "isa": isa,
                "march": build.march(isa), "requires": requires, "arch": build.arch(),
                "python_abi": build.python_abi(), "stack_bytes": src.stack_bytes,
                "vector_matvecs": src.matvecs, "int8_kernel": src.int8_kernel,
                "layers": layers, "winograd": src.winograd, "sliding": window.meta, **fixed_meta,
                "build_seconds": round(time.perf_counter() - t0, 3), **facts}

    def _compile_multi(self, model: Any, options: CompileOptions, workdir: Path, cc: str, isa: str,
                       requires: list[str], t0: float) -> dict[str, Any]:
        """A model with several inputs or outputs (emit_multi.py): fp32, no sliding window."""
        from hwbackends.layer_ir.multi import extract_multi

        from .emit_multi import emit_multi, ext_parts, header_extra

        if options.precision != "fp32":
            raise UnsupportedError(f"cpu.native compiles models with several inputs or outputs at "
                                   f"precision 'fp32' only; {options.precision!r} takes one input "
                                   f"and one output ({model.name!r} has {len(model.inputs)} and "
                                   f"{len(model.outputs)})")
        for opt in ("push_weights", "push_gates"):
            if opt in options.extra:
                raise UnsupportedError(f"cpu.native option {opt} is the sliding window's; a model "
                                       f"with several inputs or outputs has none: drop it")
        net = extract_multi(model, self.name)
        src = emit_multi(net, requires, options.precision, options.extra.get("conv_algorithm", "auto"))
        ins, outs = net.input_shapes, net.output_shapes
        n_in = sum(int(np.prod(s, dtype=np.int64)) for s in ins)
        n_out = sum(int(np.prod(s, dtype=np.int64)) for s in outs)
        batch = options.batch_size
        hdr = build.header(name=model.name, fingerprint=model.fingerprint, isa=isa,
                           requires=requires, precision=options.precision, batch=batch,
                           stack=src.stack_bytes, in_shape=(n_in,), out_shape=(n_out,),
                           extra=header_extra([s.name for s in model.inputs], ins,
                                              [s.name for s in model.outputs], outs))
        module = build.module_name(src.code, hdr, cc, isa)
        ext = build.extension_source(module, batch, (n_in,), (n_out,), ext_parts(batch, ins, outs))
        (workdir / "model.c").write_text(src.code)
        (workdir / "hwb_model.h").write_text(hdr)
        (workdir / "ext.c").write_text(ext)
        facts = build.build(workdir, cc, isa, module)
        layers = [f"{layer.name}:{type(layer).__name__}" for _, chain, _ in net.chains() for layer in chain]
        return {"module": module, "extension": module + build.python_abi(),
                "library": "libhwb_model.so", "header": "hwb_model.h", "isa": isa,
                "march": build.march(isa), "requires": requires, "arch": build.arch(),
                "python_abi": build.python_abi(), "stack_bytes": src.stack_bytes,
                "vector_matvecs": src.matvecs, "int8_kernel": "", "layers": layers,
                "winograd": src.winograd,
                "multi_io": {"merge": net.merge, "branches": [len(b.layers) for b in net.branches],
                             "trunk": len(net.trunk), "heads": [len(h.layers) for h in net.heads],
                             "abi": "hwb_model_predict_multi_n: one buffer per tensor; "
                                    "hwb_model_predict_n: packed records (hwbackends.packing)"},
                "build_seconds": round(time.perf_counter() - t0, 3), **facts}

    @staticmethod
    def _push_gate(workdir: Path, module: str, kind: str, in_shape: tuple[int, ...],
                   out_shape: tuple[int, ...], batch: int) -> dict[str, Any]:
        """push_weights' / push_gates' fidelity gate (push_weights.gate) on the extension just
        built; raises UnsupportedError, and nothing is stored, when the push misses it."""
        spec = importlib.util.spec_from_file_location(module, workdir / (module + build.python_abi()))
        if spec is None or spec.loader is None:
            raise CompileError(f"cpu.native: the extension built in {workdir} does not load")
        ext = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ext)
        result = push_weights.gate(ext, in_shape, out_shape, batch, kind)
        if result["violations"]:
            raise push_weights.refuse(kind, result)
        return result

    @staticmethod
    def _fixed(model: Any, hls_prec: str, cc: str, requires: list[str], workdir: Path
               ) -> tuple[Any, tuple[int, ...], tuple[int, ...], list[str], dict[str, Any]]:
        """precision fixed / ap_fixed<...>: hls4ml's graph of the model (its types), its
        activation tables, and the integer C (fixed.py)."""
        from . import fixed
        from .emit import emit_fixed

        if len(model.inputs) != 1 or len(model.outputs) != 1:
            raise UnsupportedError("cpu.native compiles models with one input and one output")
        scratch = workdir / ".hls4ml"
        try:
            hm, names = fixed.hls_graph(model, hls_prec, scratch)  # hls4ml sees generated names
            net = fixed.describe(hm, hls_prec, model.name, names)
            src = emit_fixed(net, fixed.tables(net, cc, workdir), requires)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        types = {fl.name: {"result": str(fl.result), **({"weight": str(fl.weight_t), "bias": str(fl.bias_t),
                                                         "accum": str(fl.accum)} if fl.kind == "dense" else {}),
                           **({"table": str(fl.table_t), "table_size": fl.table_size} if fl.table_t else {})}
                 for fl in net.layers}
        types = names.user_keys(types)  # the meta shows the user's names
        # hls4ml's version is recorded, not put into toolchain() (the cache key and the fleet's
        # node equality for every precision): types come from hls4ml's conversion.
        meta = {"hls4ml_precision": hls_prec, "hls4ml": version("hls4ml"),
                "input_type": str(net.input_t), "types": types,
                "mode": "bit-exact emulation of hls4ml's ap_fixed arithmetic (fpga.hls4ml C-sim)"}
        return (src, tuple(model.input.shape), tuple(model.output.shape),
                [f"{names.user(fl.name)}:{fl.kind}" for fl in net.layers], meta)

    def summary_lines(self, meta: dict[str, Any]) -> list[str]:
        """The sliding push's options when they change it (push_weights.py): what it reads, its
        gate's figures, and that its answers are not predict_into's bit for bit."""
        sl = meta.get("sliding") if isinstance(meta.get("sliding"), dict) else {}
        gate = sl.get("push_gate") if isinstance(sl.get("push_gate"), dict) else None
        if gate is None:
            return []
        f = gate.get("fidelity") if isinstance(gate.get("fidelity"), dict) else {}
        forms = sl.get("push_kernels") if isinstance(sl.get("push_kernels"), dict) else {}
        forms = f" ({', '.join(f'{k} {v}' for k, v in forms.items())})" if forms else ""
        return [f"  push     {sl.get('push_weights')} input weights, {sl.get('push_gates')} LSTM gates{forms}: within "
                f"the {gate.get('tolerance')} tolerance of the fp32 window (max_abs={f.get('max_abs', 0):.3g}, "
                f"rel={f.get('rel_err', 0):.3g}, corr={f.get('corr', 0):.6f} over {gate.get('ticks')} "
                f"ticks), not bit-equal to predict_into"]

    def load(self, artifact: Artifact, options: CompileOptions) -> Executor:
        meta = artifact.meta
        check_isa(meta)
        path = artifact.file(meta["extension"])
        spec = importlib.util.spec_from_file_location(meta["module"], path)
        if spec is None or spec.loader is None:
            raise UnavailableError(f"cpu.native: {path} is not a loadable extension module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return NativeExecutor(module, artifact)

    def export(self, artifact: Artifact, fmt: str, outdir: Path) -> list[Path]:
        if fmt not in self.exports:
            return super().export(artifact, fmt, outdir)
        outdir = Path(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in EXPORTED:
            dst = outdir / name
            shutil.copyfile(artifact.file(name), dst)
            written.append(dst)
        return written
