"""The exception hierarchy. Every message says what was expected and what to do next.

Catch :class:`HwbError` to handle anything this package raises on purpose; the subclasses
tell the caller *which* part failed (input, model, target, compile, cache, plugin, config).
"""
from __future__ import annotations

from typing import Any


class HwbError(Exception):
    """Base class of every error hwbackends raises on purpose."""


class InputError(HwbError, ValueError):
    """The array passed to ``predict``/``predict_into`` has the wrong shape, dtype or values."""


class ExecutionError(HwbError, RuntimeError):
    """A compiled variant's runtime raised on arrays that pass the input guard (right shape
    and dtype): a value outside what the model takes (an index past an embedding table), or
    the runtime or device itself failed. The runtime's exception is ``__cause__``; the
    variant stays loaded and serves the next call."""


class ModelError(HwbError):
    """A model could not be loaded, is corrupt, or has a form hwbackends does not support."""


class UnknownTargetError(HwbError, KeyError):
    """No registered target has this name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnsupportedError(HwbError):
    """The target cannot take this model, layer, precision or option (the message names which)."""


class UnavailableError(HwbError):
    """The target exists but cannot run on this machine (the message gives the reason)."""


class CompileError(HwbError):
    """Compilation or conversion failed, crashed or timed out. The caller's process is intact."""

    def __init__(self, message: str, *, target: str = "", precision: str = "", log: str = ""):
        super().__init__(message)
        self.target = target
        self.precision = precision
        self.log = log


class FidelityGateError(HwbError):
    """A variant was built but fails its precision's fidelity gate, so ``compile()`` does not
    hand it out. ``.variant`` is the loaded :class:`~hwbackends.CompiledModel` (for
    inspection: ``.variant.fidelity``), ``.fidelity`` its figures, ``.violations`` what it
    missed, ``.family`` the precision family whose gate it missed."""

    def __init__(self, message: str, *, variant: Any, violations: list[str], family: str):
        super().__init__(message)
        self.variant = variant
        self.fidelity = getattr(variant, "fidelity", None)
        self.violations = list(violations)
        self.family = family


class CacheError(HwbError):
    """An artifact store entry is unusable (it is removed and rebuilt where possible)."""


class StoreTrustError(CacheError):
    """A store directory, entry or key file could be changed by someone else (another owner,
    group/world-writable, a symlink): nothing in it is loaded. The message names the path and
    the fix."""


class PluginError(HwbError):
    """A plugin failed to import, raised in a hook, or broke the contract."""


class ResultsError(HwbError):
    """A results file is missing, unreadable, or from another results-format version."""


class ConfigError(HwbError, ValueError):
    """A configuration file or value is invalid (the message points at the entry)."""
