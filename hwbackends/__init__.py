"""hwbackends: one trained signal model in, compiled for every reachable hardware target,
served behind one predict interface.

    import hwbackends as hwb
    model = hwb.load_model("model.keras")
    cm = hwb.compile(model, target="cpu.litert", precision="fp32")
    y = cm.predict(x)
    cm.predict_into(x, out)      # the hot path

Importing this package imports no ML framework; each target imports its own when used.
"""
from __future__ import annotations

from . import zoo  # noqa: F401  (registers the "zoo:NAME" model source; light)
from .compiled import CompiledModel
from .compiler import compile
from .context import RunContext
from .errors import (
    CacheError,
    CompileError,
    ConfigError,
    ExecutionError,
    FidelityGateError,
    HwbError,
    InputError,
    ModelError,
    PluginError,
    UnavailableError,
    UnknownTargetError,
    UnsupportedError,
)
from .fidelity import Fidelity, Tolerance
from .hookspecs import hookimpl
from .models import Model, load_model
from .registry import get_registry, register_plugin
from .specs import Availability, Mode, TensorSpec
from .store.artifacts import ArtifactStore
from .target import CONTRACT_VERSION, Artifact, CompileOptions, Converter, Executor, Target
from .version import __version__  # noqa: F401  (hwbackends.__version__)


def targets() -> dict[str, Target]:
    """Every registered target by name."""
    return dict(get_registry().targets)


__all__ = [
    "Artifact", "ArtifactStore", "Availability", "CONTRACT_VERSION", "CacheError", "CompileError",
    "CompileOptions", "CompiledModel", "ConfigError", "Converter", "ExecutionError", "Executor", "Fidelity",
    "FidelityGateError", "HwbError", "InputError", "Mode", "Model", "ModelError", "PluginError", "RunContext", "Target",
    "TensorSpec", "Tolerance", "UnavailableError", "UnknownTargetError", "UnsupportedError",
    "compile", "get_registry", "hookimpl", "load_model", "register_plugin", "targets",
]


def __getattr__(name: str):  # lazy: the router pulls in pydantic, `import hwbackends` stays light
    if name == "Router":
        from .router import Router
        return Router
    raise AttributeError(f"module 'hwbackends' has no attribute {name!r}")
