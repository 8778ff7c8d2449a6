"""What one compile asks for: the caller's request as given (:class:`CompileRequest`), and
resolved (:class:`Request`: model, target, options, the store key and what it hashes), plus
the fidelity of a variant against its model's reference."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any

import numpy as np

from .. import cost
from ..batchdim import resolve_batch
from ..compiled import CompiledModel
from ..errors import UnavailableError, UnsupportedError
from ..fidelity import Fidelity, compare
from ..labels import label
from ..models import Model, load_model
from ..registry import Registry
from ..specs import Availability
from ..store.artifacts import cache_key
from ..target import CompileOptions, Converter, Target
from .converters import conversion_path
from .data import select_data

#: Bumped when the core changes how models travel to the worker or how artifacts are laid out.
CORE_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class CompileRequest:
    """What a caller asks :func:`compile` (or a fleet node's import) for, as given: the model
    (anything :func:`load_model` takes), the target's name and the options, unresolved."""

    model: Any
    target: str
    precision: str | None = None
    batch_size: int | None = None
    threads: int | None = None
    options: dict[str, Any] | None = None
    calibration_data: Any = None
    validation_data: Any = None
    #: What a model loaded here may cost (:mod:`hwbackends.cost`); ``None``: the environment's.
    limits: cost.Limits | None = None


@dataclasses.dataclass
class Request:
    """What one compile asks for, resolved: the model, the target, the options and the store
    key computed from them (``parts``: what the key hashes, signed into the manifest)."""

    m: Model
    tgt: Target
    avail: Availability
    chain: list[Converter]
    opts: CompileOptions
    key: str
    parts: dict[str, Any]
    val: Any
    #: Where the calibration and validation inputs came from (hwbackends/samples.py).
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    limits: cost.Limits | None = None

    @property
    def what(self) -> str:
        """The build in words, for progress and error messages."""
        return f"compiling {self.m.name!r} for {label(self.tgt.name, self.opts.precision)}"


def resolve(ask: CompileRequest, reg: Registry) -> Request:
    """Load the model, resolve the target in the run's registry ``reg``, check the request,
    and compute its key. The caller's :class:`Model` is never changed: the compile works on
    its own copy (fields and ``meta``; the framework object is shared, and the targets receive
    it read-only)."""
    m = _own_copy(load_model(ask.model, limits=ask.limits))
    tgt = reg.target(ask.target)
    prec, batch_size = _check_request(m, tgt, ask.precision, ask.batch_size, ask.options)
    if m.multi_io:
        _check_multi_io(m, tgt, prec, reg)
    avail = tgt.probe()
    if not avail.usable:
        raise UnavailableError(f"target {tgt.name} is unavailable here: {avail.reason}")
    chain = conversion_path(reg, m.format, tgt.formats, tgt.name)
    # The caller's data is checked here and used for this compile only (the model is not
    # changed); ``data`` says where calibration and validation inputs came from.
    calib, val, data = select_data(m, ask.calibration_data, ask.validation_data,
                             prec in tgt.calibrated)
    opts, key, parts = _plan(m, tgt, prec, chain, calib,
                             CompileOptions(prec, batch_size, ask.threads, dict(ask.options or {}),
                                            None))
    return Request(m, tgt, avail, chain, opts, key, parts, val, data, ask.limits)


def _own_copy(m: Model) -> Model:
    """A copy of ``m`` whose fields and ``meta`` the compile may set (an in-process target,
    a converter, the reference cache) without reaching the caller's object."""
    own = copy.copy(m)  # a deferred model stays deferred: a cached artifact needs no framework
    own.meta, own.inputs, own.outputs = copy.deepcopy(m.meta), list(m.inputs), list(m.outputs)
    return own


def _check_request(m: Model, tgt: Target, precision: str | None, batch_size: int | None,
                   options: dict[str, Any] | None) -> tuple[str, int]:
    """The precision and batch size to build; refuses precisions, batch sizes and options the
    target lacks."""
    prec = precision or tgt.precisions[0]
    tgt.check_precision(prec)
    # None: the model's fixed batch if it has one (predict() pads/chunks), else 1.
    batch_size = resolve_batch(m.meta, m.format, m.name, batch_size, tgt.static_batch)
    unknown = sorted(set(options or {}) - set(tgt.option_docs))
    if unknown:
        docs = "; ".join(f"{k}: {v}" for k, v in tgt.option_docs.items()) or "none"
        raise UnsupportedError(f"target {tgt.name} has no option(s) {', '.join(unknown)}; "
                               f"its options: {docs}")
    return prec, batch_size


def _check_multi_io(m: Model, tgt: Target, prec: str, reg: Registry) -> None:
    """Refuse a model with several inputs/outputs, before any worker starts, on a target that
    does not take them (and its calibrated precisions unless it declares
    ``multi_io_calibrated``: they would be fed one calibration tensor)."""
    ins = ", ".join(str(s) for s in m.inputs)
    outs = ", ".join(str(s) for s in m.outputs)
    if not tgt.multi_io:
        able = sorted(n for n, t in reg.targets.items() if t.multi_io)
        raise UnsupportedError(f"target {tgt.name} takes models with one input and one output; "
                               f"{m.name!r} has {len(m.inputs)} input(s) ({ins}) and "
                               f"{len(m.outputs)} output(s) ({outs}). Targets that take several: "
                               f"{', '.join(able) or 'none installed'}")
    if prec in tgt.calibrated and not tgt.multi_io_calibrated:
        able = sorted(f"{n}:{'/'.join(t.calibrated)}" for n, t in reg.targets.items()
                      if t.multi_io_calibrated and t.multi_io)
        raise UnsupportedError(f"{label(tgt.name, prec)} calibrates on one input tensor; {m.name!r} has "
                               f"several inputs/outputs. Use an uncalibrated precision of "
                               f"{tgt.name} ({', '.join(p for p in tgt.precisions if p not in tgt.calibrated)})"
                               f", or a target whose calibrated precisions take several inputs: "
                               f"{', '.join(able) or 'none installed'}")


def as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _digest_inputs(x: Any) -> str:
    h = hashlib.sha256()
    for a in as_tuple(x):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _plan(m: Model, tgt: Target, prec: str, chain: list[Converter], calib: Any,
          opts: CompileOptions) -> tuple[CompileOptions, str, dict[str, Any]]:
    """The compile options (with calibration data where the precision uses it), the cache
    key and what it hashes. A multi-input model's calibration data is a tuple, one array per
    input (checked and ordered by :func:`select_data`)."""
    uses_calib = prec in tgt.calibrated
    opts = dataclasses.replace(opts, calibration=calib if uses_calib else None)
    parts = {
        "core": CORE_FORMAT, "fingerprint": m.fingerprint, "target": tgt.name,
        "target_version": tgt.version, "options": _key_options(tgt, opts),
        "calibration": _digest_inputs(calib) if uses_calib else None,
        "toolchain": tgt.toolchain(), "chain": [c.name for c in chain],
    }
    parts = json.loads(json.dumps(parts, sort_keys=True, default=str))  # as the manifest holds it
    return opts, cache_key(parts), parts


def _key_options(tgt: Target, opts: CompileOptions) -> dict[str, Any]:
    """The options the store key hashes: without the batch size on a target whose artifact
    does not depend on it (``Target.batch_independent``: one build serves every size)."""
    d = opts.key_dict()
    if tgt.batch_independent:
        d.pop("batch_size", None)
    return d


def differences(got: dict[str, Any], want: dict[str, Any]) -> str:
    """The key parts that differ, each with both values (shortened), for an error message."""
    def short(v: Any) -> str:
        return json.dumps(v, sort_keys=True, default=str)[:60]
    names = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    return "; ".join(f"{k}: {short(got.get(k))} there, {short(want.get(k))} here" for k in names)


def fidelity_of(m: Model, cm: CompiledModel, val: Any, kind: str | dict[str, str] | None = None) -> Fidelity:
    """``cm`` against ``m``'s own fp32 reference on the validation data ``val`` (per output,
    named, for a multi-IO model), judged as output ``kind`` (inferred when ``None``)."""
    xs = as_tuple(val)
    return compare(m.reference(xs), as_tuple(cm.predict(xs)), kind=kind,
                   names=[s.name for s in m.outputs] if m.multi_io else None)
