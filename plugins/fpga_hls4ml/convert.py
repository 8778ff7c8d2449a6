"""Model → hls4ml ``ModelGraph`` through hls4ml's own converters (Keras 3, PyTorch).

Options come from the target's ``option_docs``; the per-layer precision dict is produced by
hls4ml's ``config_from_*_model(granularity='name')`` and then edited by the precision code.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hwbackends.errors import UnsupportedError

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
    """hls4ml's own lists of the layers its converters take."""
    if fmt == "keras":
        from hls4ml.converters.keras_v2_to_hls import get_supported_keras_layers
        from hls4ml.converters.keras_v3._base import registry
        names = {k.rsplit(".", 1)[-1] for k in registry} | set(get_supported_keras_layers())
        return sorted(names)
    from hls4ml.converters.pytorch_to_hls import get_supported_pytorch_layers
    return sorted(get_supported_pytorch_layers())


def _unsupported(layer: str, cls: str, fmt: str, why: str = "") -> UnsupportedError:
    return UnsupportedError(
        f"hls4ml {_hls_version()} cannot convert layer {layer!r} ({cls}){': ' + why if why else ''}. "
        f"hls4ml's supported {fmt} layers: {', '.join(supported_layers(fmt))}. Replace the layer, "
        f"or pick another target")


def _hls_version() -> str:
    import hls4ml
    return hls4ml.__version__


def check_keras_layers(km: Any) -> None:
    ok = set(supported_layers("keras"))
    for layer in km.layers:
        cls = type(layer).__name__
        if cls not in ok and cls not in _KERAS_SKIP:
            raise _unsupported(layer.name, cls, "keras")


def _torch_module(obj: Any) -> Any:
    """An ``nn.Module`` hls4ml's FX-based converter can trace.

    Torch models reach the isolated compile worker as ``torch.export`` programs (the core's
    transport format), whose unlifted module hls4ml cannot read (its parameters are renamed).
    A chain of aten linear/activation ops is rebuilt as the ``nn.Sequential`` it came from,
    with the exported weights; any other op is refused by name."""
    import torch
    if not isinstance(obj, torch.export.ExportedProgram):
        return obj
    from torch import nn

    params = {**obj.graph_signature.inputs_to_parameters, **obj.graph_signature.inputs_to_buffers}
    state = obj.state_dict
    acts = {"aten.relu.default": nn.ReLU, "aten.tanh.default": nn.Tanh,
            "aten.sigmoid.default": nn.Sigmoid}
    layers: list[Any] = []
    prev = None
    for n in obj.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        target = str(n.target)
        args = list(n.args)
        if prev is not None and (not args or args[0] is not prev):
            raise UnsupportedError(f"the exported PyTorch graph branches at op {target} (node "
                                   f"{n.name!r}); the hls4ml target rebuilds only sequential "
                                   f"chains from torch.export programs — pass a Keras model")
        if target == "aten.linear.default":
            w = state[params[args[1].name]]
            lin = nn.Linear(w.shape[1], w.shape[0], bias=len(args) > 2 and args[2] is not None)
            with torch.no_grad():
                lin.weight.copy_(w)
                if lin.bias is not None:
                    lin.bias.copy_(state[params[args[2].name]])
            layers.append(lin)
        elif target in acts:
            layers.append(acts[target]())
        elif target == "aten.softmax.int" and args[1] in (-1, 1):
            layers.append(nn.Softmax(dim=-1))
        else:
            raise UnsupportedError(
                f"hls4ml target: op {target} (node {n.name!r}) of the exported PyTorch model "
                f"cannot be rebuilt for hls4ml's converter (sequential Linear/ReLU/Tanh/Sigmoid/"
                f"Softmax chains only). hls4ml's supported PyTorch layers: "
                f"{', '.join(supported_layers('torch'))}. Pass the Keras twin of the model")
        prev = n
    return nn.Sequential(*layers).eval()


def hls_config(model: Any, opts: HlsOptions, default_precision: str) -> dict[str, Any]:
    """hls4ml's per-layer config for ``model`` (granularity='name')."""
    import hls4ml

    if model.format == "keras":
        check_keras_layers(model.obj)
        cfg = hls4ml.utils.config_from_keras_model(
            model.obj, granularity="name", backend=opts.backend,
            default_precision=default_precision, default_reuse_factor=opts.reuse_factor)
    else:
        try:
            cfg = hls4ml.utils.config_from_pytorch_model(
                _torch_module(model.obj), tuple(model.input.shape), granularity="name",
                backend=opts.backend, default_precision=default_precision,
                default_reuse_factor=opts.reuse_factor)
        except UnsupportedError:
            raise
        except Exception as exc:
            raise _torch_error(exc) from exc
    cfg["Model"]["Strategy"] = opts.strategy
    cfg["Model"]["ReuseFactor"] = opts.reuse_factor
    return cfg


def _torch_error(exc: Exception) -> UnsupportedError:
    msg = str(exc)
    return UnsupportedError(
        f"hls4ml {_hls_version()} cannot convert this PyTorch model ({type(exc).__name__}: "
        f"{msg[:300]}). hls4ml's supported PyTorch layers/ops: "
        f"{', '.join(supported_layers('torch'))}. Export the model to Keras, or pick another target")


def convert(model: Any, cfg: dict[str, Any], opts: HlsOptions, outdir: Path) -> Any:
    """Build the hls4ml ``ModelGraph`` (not yet written or compiled)."""
    import hls4ml

    kw: dict[str, Any] = dict(output_dir=str(outdir), project_name=PROJECT, backend=opts.backend,
                              io_type=opts.io_type, clock_period=opts.clock_period,
                              hls_config=copy.deepcopy(cfg), write_weights_txt=True)
    if opts.part:
        kw["part"] = opts.part
    if model.format == "keras":
        try:
            return hls4ml.converters.convert_from_keras_model(model.obj, allow_da_fallback=False, **kw)
        except Exception as exc:
            layer, cls = _failing_keras_layer(model.obj, exc)
            raise _unsupported(layer, cls, "keras", f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    try:
        return hls4ml.converters.convert_from_pytorch_model(_torch_module(model.obj), **kw)
    except UnsupportedError:
        raise
    except Exception as exc:
        raise _torch_error(exc) from exc


def _failing_keras_layer(km: Any, exc: Exception) -> tuple[str, str]:
    text = str(exc)
    for layer in km.layers:
        cls = type(layer).__name__
        if layer.name in text or cls in text:
            return layer.name, cls
    return "?", type(exc).__name__
