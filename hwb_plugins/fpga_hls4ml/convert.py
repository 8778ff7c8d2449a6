"""Model → hls4ml ``ModelGraph`` through hls4ml's own converters (Keras 3, PyTorch).

Options come from the target's ``option_docs``; the per-layer precision dict is produced by
hls4ml's ``config_from_*_model(granularity='name')`` and then edited by the precision code.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hwbackends.contract import UnsupportedError
from hwbackends.layer_ir import batchnorm

from .._shared.hls4ml_names import Renamed, generated, rename_keras
from .._shared.torch_export import as_sequential

BACKENDS = ("Vitis", "Vivado", "Quartus", "oneAPI", "Catapult")
#: Backends whose generated C++ our g++ build (ap_types + nnet_utils layout) compiles.
CSIM_BACKENDS = ("Vitis", "Vivado")
PROJECT = "myproject"

#: Keras layers that carry no computation (skipped by hls4ml's parsers as well).
_KERAS_SKIP = {"InputLayer", "Dropout", "SpatialDropout1D", "GaussianNoise", "ActivityRegularization"}


@dataclass(frozen=True)
class HlsOptions:
    """Target options (``CompileOptions.extra``), validated, with hls4ml's defaults."""

    backend: str = "Vitis"
    io_type: str = "io_parallel"
    strategy: str = "Latency"
    reuse_factor: int = 1
    clock_period: float = 5.0
    part: str | None = None
    fidelity: dict[str, float] | None = None
    synth: bool = False

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> "HlsOptions":
        o = cls(**{k: v for k, v in extra.items() if k in cls.__dataclass_fields__})
        if o.backend not in BACKENDS:
            raise UnsupportedError(f"fpga.hls4ml option backend must be one of {', '.join(BACKENDS)}; "
                                   f"got {o.backend!r}")
        if o.backend not in CSIM_BACKENDS:
            raise UnsupportedError(f"fpga.hls4ml builds the C-simulation for the Vitis and Vivado "
                                   f"backends; {o.backend} generates another project layout "
                                   f"(use hls4ml directly for it, or backend='Vitis')")
        if o.io_type not in ("io_parallel", "io_stream"):
            raise UnsupportedError(f"option io_type must be 'io_parallel' or 'io_stream', got {o.io_type!r}")
        if o.strategy not in ("Latency", "Resource"):
            raise UnsupportedError(f"option strategy must be 'Latency' or 'Resource', got {o.strategy!r}")
        if not isinstance(o.reuse_factor, int) or o.reuse_factor < 1:
            raise UnsupportedError(f"option reuse_factor must be an integer ≥ 1, got {o.reuse_factor!r}")
        if not isinstance(o.clock_period, (int, float)) or o.clock_period <= 0:
            raise UnsupportedError(f"option clock_period (ns) must be > 0, got {o.clock_period!r}")
        return o

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def supported_layers(fmt: str) -> list[str]:
    """hls4ml's own list of the layers its converter for the installed framework takes: for
    Keras 3 its ``keras_v3`` registry only (its Keras 2 handlers are reached only as a
    fallback that fails on this hls4ml; ``BatchNormalization`` is folded into a neighbouring
    Dense/Conv1D before it, see :func:`for_hls4ml`)."""
    if fmt == "keras":
        import keras
        if int(keras.__version__.split(".")[0]) >= 3:
            from hls4ml.converters.keras_v3._base import registry
            names = {k.rsplit(".", 1)[-1] for k in registry}
        else:
            from hls4ml.converters.keras_v2_to_hls import get_supported_keras_layers
            names = set(get_supported_keras_layers())
        return sorted(names)
    from hls4ml.converters.pytorch_to_hls import get_supported_pytorch_layers
    return sorted(get_supported_pytorch_layers())


def _unsupported(layer: str, cls: str, fmt: str, why: str = "") -> UnsupportedError:
    return UnsupportedError(
        f"hls4ml {_hls_version()} cannot convert layer {layer!r} ({cls}){': ' + why.rstrip('.') if why else ''}. "
        f"hls4ml's supported {fmt} layers: {', '.join(supported_layers(fmt))}. Replace the layer, "
        f"or pick another target")


def _hls_version() -> str:
    import hls4ml
    return hls4ml.__version__


def accepted_keras_layers() -> list[str]:
    """The Keras layer classes fpga.hls4ml passes to hls4ml: hls4ml's own list, with
    BatchNormalization folded first (:func:`for_hls4ml`) and the no-op layers skipped."""
    return sorted((set(supported_layers("keras")) | _KERAS_SKIP) - {"BatchNormalization"})


#: Settings of accepted layers that are refused, and why (the docs' table lists them).
REFUSED_SETTINGS = {"Conv1D/Conv2D/…Conv dilation_rate ≠ 1":
                    "hls4ml's Keras 3 handler drops it (the design would be undilated)",
                    "BatchNormalization that folds into neither neighbour":
                    "hls4ml's Keras 3 converter has no handler for it, so " + batchnorm.FOLDS}


def check_keras_layers(km: Any) -> None:
    ok = set(accepted_keras_layers())
    for layer in km.layers:
        cls = type(layer).__name__
        if cls == "BatchNormalization":
            raise _unsupported(layer.name, cls, "keras", "fpga.hls4ml builds no separate "
                               "layer for it: " + batchnorm.FOLDS + " (for_hls4ml)")
        if cls not in ok:
            raise _unsupported(layer.name, cls, "keras")
        why = _unsupported_setting(layer)
        if why:
            raise UnsupportedError(f"hls4ml {_hls_version()} cannot convert layer {layer.name!r} "
                                   f"({cls}): {why}. This is hls4ml's limit; build the model "
                                   f"without it, or pick another target (hwb targets "
                                   f"lists those that take Keras models)")


def _unsupported_setting(layer: Any) -> str:
    """Why hls4ml's Keras 3 converter would build a layer it takes by class but not as
    configured (its handler ignores the setting: the design would compute another function
    and fidelity would be the only thing to notice); "" when nothing is wrong."""
    dilation = getattr(layer, "dilation_rate", None)
    if dilation is not None and any(int(d) != 1 for d in tuple(dilation)):
        return (f"dilation_rate={tuple(int(d) for d in dilation)}: hls4ml's Keras 3 "
                f"convolution handler (converters/keras_v3/conv.py) passes no dilation, so the "
                f"design would compute an undilated convolution (only dilation_rate=1 is built)")
    return ""


#: ``Model.meta`` key of the generated → user's layer names of a model :func:`for_hls4ml` made.
NAMES = "hls4ml_names"


def for_hls4ml(model: Any) -> Any:
    """``model`` as hls4ml's converters take it: a Keras model with every BatchNormalization
    folded into a neighbouring Dense/Conv1D (:func:`batchnorm.fold_keras`; its layers checked), then rebuilt with generated
    names (:mod:`.._shared.hls4ml_names`: no text of the file reaches hls4ml's C++); a
    ``torch.export`` program rebuilt as its ``nn.Sequential``. The reference stays the source
    model's. Idempotent."""
    import dataclasses

    if model.format == "keras":
        if generated(model.obj) and NAMES in model.meta:
            return model
        obj = batchnorm.fold_keras(model.obj, "fpga.hls4ml")
        check_keras_layers(obj)  # refusals name the user's layers
        ren = rename_keras(obj, "fpga.hls4ml")
        return dataclasses.replace(model, obj=ren.obj, meta={**model.meta, NAMES: ren.names})
    obj = _torch_module(model.obj)
    return model if obj is model.obj else dataclasses.replace(model, obj=obj)


def renaming(model: Any) -> Renamed:
    """The generated → user's names of a model :func:`for_hls4ml` made (none for torch)."""
    return Renamed(model.obj, dict(model.meta.get(NAMES, {})))


#: What to do with a PyTorch model whose layers fpga.hls4ml does not rebuild.
TORCH_ADVICE = ("What to do: pass the Keras twin of the model (fpga.hls4ml builds the Keras layers "
                "docs/targets-fpga.md lists, GRU, LSTM and Conv1D among them), or compile it for "
                "cpu.onnxruntime or tpu.xla (what torch.onnx exports) or cpu.native (Linear, "
                "Conv1d, LSTM and GRU chains)")


def _torch_module(obj: Any) -> Any:
    """An ``nn.Module`` hls4ml's FX-based converter can trace (a ``torch.export`` program
    rebuilt as its ``nn.Sequential``, :func:`as_sequential`)."""
    return as_sequential(obj, "fpga.hls4ml", TORCH_ADVICE, conv=True)


def hls_config(model: Any, opts: HlsOptions, default_precision: str) -> dict[str, Any]:
    """hls4ml's per-layer config for ``model`` (granularity='name')."""
    import hls4ml

    model = for_hls4ml(model)
    if model.format == "keras":
        try:
            cfg = hls4ml.utils.config_from_keras_model(
                model.obj, granularity="name", backend=opts.backend,
                default_precision=default_precision, default_reuse_factor=opts.reuse_factor)
        except UnsupportedError:
            raise
        except Exception as exc:
            raise _keras_error(model, exc) from None
    else:
        try:
            cfg = hls4ml.utils.config_from_pytorch_model(
                _torch_module(model.obj), tuple(model.input.shape), granularity="name",
                backend=opts.backend, default_precision=default_precision,
                default_reuse_factor=opts.reuse_factor)
        except UnsupportedError:
            raise
        except Exception as exc:
            raise _torch_error(exc, model.obj) from exc
    cfg["Model"]["Strategy"] = opts.strategy
    cfg["Model"]["ReuseFactor"] = opts.reuse_factor
    return cfg


def _torch_error(exc: Exception, module: Any = None) -> UnsupportedError:
    """hls4ml's exception on a PyTorch module as a refusal naming the user's layer (its path
    in ``module``) when hls4ml's message names the layer class, and what to do."""
    import re

    msg = str(exc)
    cls = re.search(r"[Uu]nsupported layer:? '?(\w+)", msg)
    paths = [p for p, m in (module.named_modules() if module is not None else ())
             if cls and p and type(m).__name__ == cls.group(1)]
    what = (f"layer {paths[0]!r} ({cls.group(1)})" + (f" and {len(paths) - 1} more" if len(paths) > 1 else "")
            if paths else "this PyTorch model")
    return UnsupportedError(
        f"hls4ml {_hls_version()} cannot convert {what} ({type(exc).__name__}: {msg[:300]}). "
        f"hls4ml's supported PyTorch layers/ops: {', '.join(supported_layers('torch'))}. "
        + TORCH_ADVICE)


def convert(model: Any, cfg: dict[str, Any], opts: HlsOptions, outdir: Path) -> Any:
    """Build the hls4ml ``ModelGraph`` (not yet written or compiled)."""
    import hls4ml

    kw: dict[str, Any] = dict(output_dir=str(outdir), project_name=PROJECT, backend=opts.backend,
                              io_type=opts.io_type, clock_period=opts.clock_period,
                              hls_config=copy.deepcopy(cfg), write_weights_txt=True)
    if opts.part:
        kw["part"] = opts.part
    model = for_hls4ml(model)
    if model.format == "keras":
        try:
            return hls4ml.converters.convert_from_keras_model(model.obj, allow_da_fallback=False, **kw)
        except UnsupportedError:
            raise
        except Exception as exc:
            raise _keras_error(model, exc) from None
    try:
        return hls4ml.converters.convert_from_pytorch_model(_torch_module(model.obj), **kw)
    except UnsupportedError:
        raise
    except Exception as exc:
        raise _torch_error(exc, model.obj) from exc


def _keras_error(model: Any, exc: Exception) -> UnsupportedError:
    """hls4ml's exception on a Keras model (config or conversion) as a refusal naming the
    user's layer it failed on, hls4ml's message (not its traceback) and what to do."""
    layer, cls = _failing_keras_layer(model.obj, exc)
    return _unsupported(renaming(model).user(layer), cls, "keras",
                        f"{type(exc).__name__}: {str(exc)[:300]}")


def _failing_keras_layer(km: Any, exc: Exception) -> tuple[str, str]:
    text = str(exc)
    for layer in km.layers:
        cls = type(layer).__name__
        if layer.name in text or cls in text:
            return layer.name, cls
    return "?", type(exc).__name__
