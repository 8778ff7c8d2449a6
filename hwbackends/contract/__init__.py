"""The plugin contract: everything a target plugin takes from hwbackends, in one place.

A plugin (the built-in ones in hwb_plugins/ and a third party's alike) imports this package
and nothing else of the core; tests/test_layering.py holds every built-in plugin to it. What
it holds, by concern:

* the hooks: :data:`hookimpl` (and the specs, :mod:`hwbackends.hookspecs`);
* what a target is and returns: :class:`Target`, :class:`Executor` (:class:`BufferedExecutor`),
  :class:`Artifact`, :class:`CompileOptions`, :class:`Converter`, and how it is exported
  (:class:`TritonForm`, :class:`TritonFile`);
* the data it describes: :class:`TensorSpec`, :class:`Availability`, the modes;
* the errors it raises (messages that say what was expected and what to do);
* the fidelity policy it gates with (:class:`Tolerance`, :func:`compare`, …);
* the sliding window's calls (:class:`Steps`, :class:`StreamSteps` and their checks);
* the model it compiles (:class:`Model`, :func:`load_model`, …);
* the store's trust rules for a plugin's own files (:func:`check_path`,
  :func:`check_trusted_dir`, :func:`private_dir`: owned by this user or root, not writable by
  others, no links followed) and its signatures (:func:`seal`, :func:`sealed`: this user's
  HMAC over a record), the FPGA bitstream store's;
* shared services: the per-compile build cache (:mod:`build_cache`), file digests,
  identifier derivation for generated code (:func:`ident`, :func:`c_string`: model text never
  becomes code), the machine's CPU (:mod:`machine`), generated-docs splicing;
* the native entry's C header directory (:data:`NATIVE_INCLUDE`: ``hwb_native.h``, the ABI a
  target's executor hands the shm server).

:mod:`hwbackends.contract.cli` has the helpers for a plugin that adds a subcommand.
"""
from __future__ import annotations

from pathlib import Path

from .. import machine
from ..docgen import splice
from ..errors import (
    CacheError,
    CompileError,
    ConfigError,
    ExecutionError,
    HwbError,
    InputError,
    ModelError,
    StoreTrustError,
    UnavailableError,
    UnknownTargetError,
    UnsupportedError,
)
from ..fidelity import AUTO_SEARCH, TOLERANCES, Fidelity, Tolerance, compare, gate_violations
from ..hookspecs import hookimpl
from ..identifiers import c_string, ident
from ..models import Model, keras_call_input, load_model, load_saved
from ..sliding import Steps, StreamSteps, check_id, check_many, check_step
from ..specs import MODELLED, Availability, Mode, TensorSpec, several
from ..store import build_cache
from ..store.artifacts import file_sha256
from ..store.trust import check_path, check_trusted_dir, private_dir, seal, sealed
from ..target import (
    Artifact,
    BufferedExecutor,
    CompileOptions,
    Converter,
    Executor,
    Target,
    TritonFile,
    TritonForm,
)

#: The directory of ``hwb_native.h`` (the native entry's one definition): add it with ``-I``
#: to build an executor's entry; ``hwb serve --print-include`` prints the same directory.
NATIVE_INCLUDE = Path(__file__).resolve().parents[1] / "serve" / "include"

__all__ = [
    "AUTO_SEARCH", "MODELLED", "NATIVE_INCLUDE", "TOLERANCES", "Artifact", "Availability",
    "BufferedExecutor", "CacheError", "CompileError", "CompileOptions", "ConfigError", "Converter",
    "ExecutionError", "Executor", "Fidelity", "HwbError", "InputError", "Mode", "Model", "ModelError", "Steps",
    "StoreTrustError", "StreamSteps", "Target", "TensorSpec", "Tolerance", "TritonFile",
    "TritonForm", "UnavailableError", "UnknownTargetError", "UnsupportedError", "build_cache",
    "c_string", "check_id", "check_many", "check_path", "check_step", "check_trusted_dir",
    "compare", "file_sha256", "gate_violations", "hookimpl", "ident", "keras_call_input",
    "load_model", "load_saved", "machine", "private_dir", "seal", "sealed", "several", "splice",
]
