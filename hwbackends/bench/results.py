"""The results file of ``hwb bench``: versioned JSON that ``hwb report`` and others read."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, model_validator

from .. import strict_json
from ..errors import HwbError, ResultsError
from ..fidelity import ALL_METRICS
from ..units import MAX_BATCH
from ..user_files import read_json, schema_problem, shown
from ..variant import RecordError, VariantRecord
from .profile import LatencyProfile, table, table_csv

FORMAT = "hwbackends-bench-results"
#: Bumped when the layout changes incompatibly; loading another version is a clear error
#: saying to re-run ``hwb bench``. 2: a variant row's plugin metadata is ``plugin_report``,
#: and every row carries the variant record; files of version 1 are refused.
VERSION = 2


@dataclass
class BenchResults:
    """Everything one bench run found: what could run and how (availability), each compiled
    variant (fidelity, compile time, artifact size, or the error), the measured profiles, and
    optionally the routing decisions made from them."""

    model: dict[str, Any]
    machine: dict[str, Any]
    availability: list[dict[str, Any]] = field(default_factory=list)
    #: One typed record per variant row (hwbackends/variant.py), as the router judges them.
    variants: list[VariantRecord] = field(default_factory=list)
    profiles: list[LatencyProfile] = field(default_factory=list)
    routing: list[dict[str, Any]] | None = None
    trace: dict[str, Any] | None = None
    interrupted: bool = False
    #: A fleet run (``hwb fleet``): its nodes and each task's cost; rows carry ``machine``.
    fleet: dict[str, Any] | None = None
    command: str = ""
    created: float = field(default_factory=time.time)
    #: Where the calibration and validation inputs came from (hwbackends/samples.py): the
    #: report's fidelity section says it; ``synthetic: true`` when no data was given.
    data: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "created": self.created,
            "command": self.command, "model": self.model, "machine": self.machine,
            "availability": self.availability,
            "variants": [v.to_dict() for v in self.variants],
            "profiles": [p.to_dict() for p in self.profiles], "routing": self.routing,
            "trace": self.trace, "interrupted": self.interrupted, "data": self.data}
        if self.fleet is not None:
            d["fleet"] = self.fleet
        return d

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.tmp")
        # strict JSON: a NaN (a profile with no samples, an undefined correlation) is written
        # as null with its reason (hwbackends/strict_json.py), and read back as NaN
        tmp.write_text(strict_json.dumps(self.to_dict(), indent=1))
        tmp.replace(p)
        return p

    @classmethod
    def load(cls, path: str | Path) -> "BenchResults":
        """Read results file ``path``, an untrusted file: the one reader of results files
        (:func:`read_results_json`, then every row checked against its schema, a sliding row's
        load sweep by :func:`hwbackends.bench.load.parse_load`); any problem is a
        :class:`ResultsError` of one line naming the field, the value and what it must be."""
        p = Path(path)
        d = _validated(p)
        profiles = [LatencyProfile.from_dict(x) for x in d["profiles"]]
        from .load import parse_load  # a sliding row's load sweep, checked field by field
        for j, prof in enumerate(profiles):
            if isinstance(prof.sliding, dict) and prof.sliding.get("load") is not None:
                parse_load(prof.sliding["load"], f"{p}: profile {j} ({prof.variant})")
        try:
            variants = [VariantRecord.from_dict(v) for v in d["variants"]]
        except RecordError as exc:  # a row the schema passed but the record refuses
            raise ResultsError(f"{p}: {exc}") from None
        return cls(model=d["model"], machine=d["machine"], availability=d.get("availability", []),
                   variants=variants,
                   profiles=profiles,
                   routing=d.get("routing"), trace=d.get("trace"),
                   interrupted=bool(d.get("interrupted")), fleet=d.get("fleet"),
                   command=d.get("command", ""), created=d.get("created", 0.0), data=d.get("data"))

    def table(self) -> str:
        return table(self.profiles)

    def table_csv(self) -> str:
        """:meth:`table` as CSV (``hwb bench --csv``, ``hwb report --csv``)."""
        return table_csv(self.profiles)


# -- reading: the one reader of results files ---------------------------------------------------
#: The largest results file read (one with the CDFs and timelines of a large sweep is a few
#: MB): this bounds what a hostile one makes the parser hold.
MAX_RESULTS_BYTES = 64 << 20
#: What each field must be, as the error message says it.
EXPECTED = {
    "format": f"\"{FORMAT}\"", "version": f"{VERSION} (this hwbackends' results format)",
    "batch_size": f"an integer 1..{MAX_BATCH}", "n": "an integer ≥ 0 (a sample count)",
    "variant": "a string (TARGET:PRECISION)", "target": "a target name (a string)",
    "precision": "a precision (a string)", "scenario": "a string", "mode": "a string",
    "interrupted": "true or false", "cached": "true or false", "degenerate": "true or false",
    "error": "a string, or null", "gated": "a list of metric names",
    "rate_hz": "a number of Hz (a list of them in a sliding sweep)", "params": "an object", "machine": "an object",
    "fidelity": "an object (the variant's fidelity), or null", "profiles": "a list of objects",
    "variants": "a list of objects", "availability": "a list of objects",
    "routing": "a list of objects, or null", "fleet": "an object, or null",
    "nodes": "a list of objects", "tasks": "a list of objects", "node_id": "a string",
    "cdf": "a list of [quantile, µs] pairs", "model": "an object",
    **{k: "a number (null when undefined)" for k in (
        "p50_us", "p90_us", "p95_us", "p99_us", "p999_us", "max_us", "mean_us", "min_us",
        "throughput", "duration_s", "created", "max_abs", "mae", "rel_err", "corr",
        "sign_agree", "argmax_agree", "compile_seconds", "queue_mean_us")},
}
_HINT = "Give a results file `hwb bench` or `hwb fleet` wrote"


def _number(v: Any) -> float:
    """A figure: a JSON number as a float (NaN for null: undefined); the range is the
    reader's (report, gate) to judge, the type is checked here."""
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError("not a number")
    try:
        return float(v)
    except OverflowError:
        raise ValueError("a number beyond a float's range") from None


def _opt_number(v: Any) -> float | None:
    return None if v is None else _number(v)


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 53:
        raise ValueError("not an integer 0..2^53")
    return v


_Fig = Annotated[float, PlainValidator(_number)]
_OptFig = Annotated[Optional[float], PlainValidator(_opt_number)]
_Count = Annotated[int, PlainValidator(_count)]
_Batch = Annotated[int, Field(ge=1, le=MAX_BATCH)]


class _Obj(BaseModel):
    """An object of a results file: its known keys typed, others kept as they are."""
    model_config = ConfigDict(strict=True, extra="allow")


class _Stats(_Obj):  # a noise floor, a sliding row's prepare / full figures
    p50_us: _OptFig = None
    p99_us: _OptFig = None


class _Sliding(_Obj):
    form: Optional[str] = None
    window: Any = None
    prepare: Optional[_Stats] = None
    full: Optional[_Stats] = None


class _Trace(_Obj):  # a burst scenario's tick trace, as the report states it
    duration_s: _Fig = 0.0
    mean_rate_hz: _Fig = 0.0
    peak_rate_hz_10ms: _Fig = 0.0


def _rates(v: Any) -> Any:
    """``rate_hz``: one rate (server), or a sliding load sweep's list of rates."""
    return [_number(x) for x in v] if isinstance(v, list) else _opt_number(v)


class _Params(_Obj):
    rate_hz: Annotated[Any, PlainValidator(_rates)] = None
    loadavg_1m: _OptFig = None
    trace: Optional[_Trace] = None


class _Fidelity(_Obj):
    n: _Count
    max_abs: _Fig
    mae: _Fig
    rel_err: _Fig
    corr: _Fig
    sign_agree: _Fig
    argmax_agree: _OptFig  # null: not a classification output
    kind: str = "signed"
    gated: list[str] = list(ALL_METRICS)
    degenerate: bool = False
    warning: str = ""
    output: str = ""
    outputs: Optional[dict[str, "_Fidelity"]] = None
    kind_source: str = "inferred"


class _Profile(_Obj):
    variant: str
    target: str
    precision: str
    batch_size: _Batch
    scenario: str
    params: _Params
    mode: str
    n: _Count
    p50_us: _Fig
    p90_us: _Fig
    p99_us: _Fig
    p999_us: _Fig
    max_us: _Fig
    mean_us: _Fig
    min_us: _Fig
    throughput: _Fig
    duration_s: _Fig
    machine: dict[str, Any] = {}
    fidelity: Optional[_Fidelity] = None
    artifact_key: str = ""
    interrupted: bool = False
    cdf: list[Annotated[list[_Fig], Field(min_length=2, max_length=2)]] = []
    timeline: Optional[dict[str, list[_Fig]]] = None
    queue_mean_us: _OptFig = None
    created: _Fig = 0.0
    p95_us: _OptFig = None
    sliding: Optional[_Sliding] = None
    noise_floor: Optional[_Stats] = None

    @model_validator(mode="after")
    def _one_rate_unless_a_sweep(self) -> "_Profile":
        if isinstance(self.params.rate_hz, list) and self.scenario != "sliding":
            raise ValueError(f"params.rate_hz is a list in a {self.scenario!r} row; only a "
                             f"sliding row's load sweep has several rates")
        return self


class _Variant(_Obj):
    target: str
    precision: str
    variant: Optional[str] = None
    mode: Optional[str] = None
    error: Optional[str] = None
    fidelity: Optional[_Fidelity] = None
    device: Optional[str] = None
    mode_reason: Optional[str] = None
    compile_seconds: _OptFig = None
    cached: Optional[bool] = None
    artifact_bytes: Optional[_Count] = None
    artifact_key: Optional[str] = None
    batch_size: Optional[_Batch] = None
    toolchain: Optional[dict[str, Any]] = None
    data: Optional[dict[str, Any]] = None
    hardware_estimate: Optional[dict[str, Any]] = None
    plugin_report: Optional[dict[str, Any]] = None
    machine: Optional[dict[str, Any]] = None


class _Availability(_Obj):
    target: str
    mode: str
    family: Optional[str] = None
    reason: str = ""
    precisions: list[str] = []
    machine: Optional[dict[str, Any]] = None


class _Node(_Obj):
    node_id: str
    label: Optional[str] = None


class _Fleet(_Obj):
    nodes: list[_Node] = []
    tasks: list[dict[str, Any]] = []
    placement: Optional[list[dict[str, Any]]] = None


class _ModelInfo(_Obj):
    name: str = ""
    fingerprint: str = ""


class _File(_Obj):
    format: Literal[FORMAT]  # type: ignore[valid-type]
    version: Literal[VERSION]  # type: ignore[valid-type]
    created: _Fig = 0.0
    command: str = ""
    model: _ModelInfo
    machine: dict[str, Any]
    availability: list[_Availability] = []
    variants: list[_Variant]
    profiles: list[_Profile]
    routing: Optional[list[dict[str, Any]]] = None
    trace: Optional[dict[str, Any]] = None
    interrupted: bool = False
    fleet: Optional[_Fleet] = None
    data: Optional[dict[str, Any]] = None


def read_results_json(path: str | Path, error: type[HwbError] = ResultsError) -> Any:
    """The JSON of results file ``path``, not yet checked against a schema: what every reader
    of a results file starts from (:meth:`BenchResults.load`, ``hwb export``'s own row
    checks). Regular files only, at most :data:`MAX_RESULTS_BYTES`, bounded nesting
    (:func:`hwbackends.user_files.read_json`); a problem is an ``error`` of one line."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise error(f"results file {p} does not exist; create one with "
                    f"`hwb bench MODEL -o {p.name}`")
    return read_json(p, "results file", MAX_RESULTS_BYTES, error)


def _validated(p: Path) -> dict[str, Any]:
    """Results file ``p`` checked whole against :class:`_File` (every row typed), as plain
    dicts and lists, NaN where the file held null (strict_json's reasons, or none given)."""
    return validate_results(read_results_json(p), p)


def validate_results(raw: Any, p: str | Path) -> dict[str, Any]:
    """``raw`` (the JSON of results file ``p``) checked whole against the schema: what
    :meth:`BenchResults.load` builds from, and what ``hwb export`` checks beside its own
    stricter rows. A :class:`ResultsError` of one line names the first problem."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ResultsError(f"{p} is not an hwbackends bench results file (no "
                           f"\"format\": \"{FORMAT}\"); produce one with `hwb bench`")
    if raw.get("version") != VERSION:
        raise ResultsError(f"{p} has results-format version {shown(raw.get('version'))}; this "
                           f"hwbackends reads version {VERSION}. Re-run `hwb bench` with "
                           f"this version to regenerate it.")
    raw = strict_json.restore(raw)
    try:
        return _File.model_validate(raw).model_dump(exclude_unset=True)
    except ValidationError as exc:
        raise ResultsError(schema_problem(p, "results file", "", exc, EXPECTED, _HINT)) from None
