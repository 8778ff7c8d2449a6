"""Tiers and strategies from one TOML file, validated with errors that point at the line.

    [tiers.fast]
    p99_us = 100

    [strategies.momentum]
    model = "zoo:signal"                       # a model file (relative to this file) or zoo:NAME
    tier = "fast"
    targets = ["cpu.*", "fpga.hls4ml"]         # allowed targets, globs
    fidelity = { corr_min = 0.999, max_abs = 1e-3 }
    output_kind = "signed"                     # signed, regression, probabilities, logits
    # pin = "cpu.litert:int8"                  # optional explicit choice
    # sliding = { streams = 500, tick_rate_hz = 200, cores = 2 }   # a windowed model's load

Parsing is ``tomllib``; the schema is pydantic v2 (``extra="forbid"``, so a misspelt key is
an error that lists the allowed keys). :func:`load_config` also checks what the schema cannot:
tiers that exist, target globs that match a registered target, precisions some allowed target
offers, a pin inside the allowed targets, a model file that exists. All problems are reported
at once, each as ``FILE:LINE: where: what is wrong; what is allowed``.
"""
from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from . import units, user_files
from .errors import ConfigError, UnsupportedError
from .fidelity import Tolerance
from .labels import parse_label
from .registry import unaccepted_precisions
from .user_files import decode_utf8, read_small_file  # noqa: F401 - re-exported for serve's token and TLS files

if TYPE_CHECKING:  # pragma: no cover
    from .registry import Registry


class _Strict(BaseModel):
    # Every number is finite: ``timeout_us = inf`` is refused here, not by every later call.
    # Strict types: TOML's own types map one to one, so ``batch_size = true`` (a bool is not
    # an int), ``n = 2.0`` or ``trust_pickle = 1`` are mistakes, not values to coerce.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


#: Bounds of every count and time in a strategies file: TOML integers are unbounded in
#: ``tomllib`` (``batch_size = 2**70`` parses), so each field says how large it may be
#: (the batch size's bound is the command line's too: :data:`hwbackends.units.MAX_BATCH`).
MAX_BATCH = units.MAX_BATCH
MAX_COUNT = 10_000_000
MAX_US = 3600e6      # an hour, as the serving engine's deadlines
MAX_S = 86400.0      # a day
_Dim = Annotated[int, Field(ge=1, le=1 << 24)]


class TierConfig(_Strict):
    """A latency tier: the p99 budget of one call, in microseconds."""

    p99_us: float = Field(gt=0, le=MAX_US, description="p99 latency budget per call (µs)")
    description: str = ""


class _FidelityFields(_Strict):
    """What :class:`FidelityConfig` does besides its fields (which come from
    :class:`~hwbackends.fidelity.Tolerance`)."""

    def tolerance(self, kind: str | None = None) -> Tolerance:
        """The gate, for outputs of ``kind`` (the strategy's ``output_kind``; ``None``: as
        each fidelity measured it)."""
        return Tolerance(**self.model_dump(), kind=kind, strict=True)

    def describe(self) -> str:
        """The gate in words, each value marked as set in the file or the default, and the
        keys not checked (``hwb route --explain``)."""
        vals = self.model_dump()
        shown = [f"{k} {v:g} ({'set' if k in self.model_fields_set else 'default'})"
                 for k, v in vals.items() if v is not None]
        unset = [k for k, v in vals.items() if v is None]
        return (", ".join(shown) or "nothing checked") + (f"; not checked: {', '.join(unset)}"
                                                          if unset else "")


FidelityConfig = create_model(
    "FidelityConfig", __base__=_FidelityFields, __module__=__name__,
    **{f.name: (float | None, Field(f.default, ge=f.metadata["bounds"][0],
                                    le=f.metadata["bounds"][1]))
       for f in Tolerance.gate_fields()})
FidelityConfig.__doc__ = ("What a variant must meet against the fp32 reference "
                          "(``hwbackends.fidelity.Tolerance``, whose gate fields, defaults and "
                          "ranges these are); keys left out are not checked.")


class SlidingLoadConfig(_Strict):
    """A sliding strategy's load: ``streams`` symbols (one window each) ticking at
    ``tick_rate_hz`` each, on at most ``cores`` cores (instances of a target). The router
    ranks variants by their sliding load profile at ``streams × tick_rate_hz`` ticks/s
    (hwbackends/bench/load.py), says how many cores each needs, and refuses one whose knee on
    the cores allowed is below the load."""

    streams: int = Field(ge=1, le=MAX_COUNT, description="symbols, one window each")
    tick_rate_hz: float = Field(gt=0, le=1e9, description="ticks per second per symbol")
    cores: int = Field(1, ge=1, le=4096, description="cores (target instances) allowed")


class StrategyConfig(_Strict):
    """One trading strategy: which model, which tier, which targets it may use."""

    model: str = Field(min_length=1)
    tier: str
    targets: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    precisions: list[str] | None = None
    fidelity: FidelityConfig = Field(default_factory=FidelityConfig)
    pin: str | None = None
    #: What the model's output is: it decides which fidelity metrics gate (sign for a signed
    #: output, the decision for probabilities, errors only for a regression). Unset, it is
    #: inferred from the reference outputs, and ``hwb route --explain`` says so.
    output_kind: Literal["signed", "regression", "probabilities", "logits"] | None = None
    batch_size: int = Field(1, ge=1, le=MAX_BATCH)
    #: The scenario whose p99 ranks the variants: ``single-stream`` (a whole input per call,
    #: the default) or ``sliding`` (a windowed model fed one tick at a time: ``push_into``'s
    #: p99, the prepare apart; a variant with no sliding measurement is not eligible).
    scenario: Literal["single-stream", "sliding"] = "single-stream"
    #: A sliding strategy's load (``sliding = {streams = 500, tick_rate_hz = 200}``): it
    #: makes the scenario ``sliding`` and ranks by the p99 at that load (SlidingLoadConfig).
    sliding: SlidingLoadConfig | None = None
    #: Hard per-call deadline: calls go through a watchdog thread and a call that misses it is
    #: served by the next candidate. Costs a thread hand-off per call (see docs/routing.md).
    timeout_us: float | None = Field(None, gt=0, le=MAX_US)
    allow_emulated: bool | None = None
    #: Rank variants with a *modelled* hardware latency (fpga.da4ml's end-to-end estimate)
    #: beside measured ones, labelled "modelled" (hwbackends/router/modelled.py).
    allow_modelled: bool = False
    #: How to load a model file that needs more than its path (as ``hwb compile``'s
    #: ``--weights``, ``--input-shape``, ``--trust-pickle``): Keras 2 JSON weights (relative to
    #: this file), per-sample input shape(s), and whether a whole-module torch pickle may be
    #: unpickled (that runs code from the file: only for files you trust).
    weights: str | None = None
    input_shape: list[_Dim] | list[list[_Dim]] | None = None
    trust_pickle: bool = False
    #: Samples of the model's real inputs (``.npy``, or ``.npz`` by input name; relative to
    #: this file): calibration of quantized/fixed-point variants and the fidelity check, as
    #: ``--calibration-data`` / ``--validation-data`` (hwbackends/samples.py). Without them
    #: both use the model's own data, else synthetic N(0,1), and the results say so.
    calibration_data: str | None = None
    validation_data: str | None = None

    def data_paths(self, config_path: Path) -> dict[str, Path]:
        """``{"calibration": path, "validation": path}`` for the data files this strategy names."""
        return {k: resolve_model(v, config_path) for k, v in
                (("calibration", self.calibration_data), ("validation", self.validation_data)) if v}

    def load_kwargs(self, config_path: Path) -> dict[str, Any]:
        """Keyword arguments for :func:`hwbackends.models.load_model` (empty by default)."""
        kw: dict[str, Any] = {}
        if self.weights:
            kw["weights"] = resolve_model(self.weights, config_path)
        if self.input_shape is not None:
            shapes = self.input_shape
            kw["input_shape"] = (tuple(shapes) if shapes and isinstance(shapes[0], int)
                                 else [tuple(x) for x in shapes])  # type: ignore[union-attr]
        if self.trust_pickle:
            kw["trust_pickle"] = True
        return kw

    @model_validator(mode="after")
    def _load_is_sliding(self) -> "StrategyConfig":
        if self.sliding is not None:
            if "scenario" in self.model_fields_set and self.scenario != "sliding":
                raise ValueError(f"sliding = {{streams, tick_rate_hz}} declares a sliding load, "
                                 f"but scenario = {self.scenario!r}; drop the scenario key (a "
                                 f"load makes it 'sliding') or the sliding table")
            self.scenario = "sliding"
        return self

    @field_validator("pin")
    @classmethod
    def _pin_form(cls, v: str | None) -> str | None:
        # The precision may be any the target accepts (``ap_fixed<16,6>``): checked later
        # by Target.check_precision, not by a character class here.
        if v is not None and not re.fullmatch(r"[\w.\-]+:\S+", v):
            raise ValueError(f"pin must be 'target:precision' (e.g. 'cpu.litert:int8'), got {v!r}")
        return v


class BenchConfig(_Strict):
    """How the router measures candidates (cached per artifact, machine and these values)."""

    n: int = Field(2000, ge=50, le=MAX_COUNT)
    warmup: int = Field(200, ge=0, le=MAX_COUNT)
    max_s: float = Field(5.0, gt=0, le=MAX_S)
    #: Candidates are measured interleaved in this many rounds (n/rounds calls each per round).
    rounds: int = Field(5, ge=1, le=10_000)


class RouterConfig(_Strict):
    """Routing policy and run-time protection."""

    allow_emulated: bool = False
    #: Timed calls per live latency window (the rolling p99 is computed per window).
    window: int = Field(200, ge=10, le=MAX_COUNT)
    #: Time one call in this many (a uniform sample; the clock reads dominate the lane's cost).
    sample_every: int = Field(4, ge=1, le=MAX_COUNT)
    #: Consecutive windows over budget before switching to the next candidate.
    switch_after: int = Field(3, ge=1, le=MAX_COUNT)
    #: Hysteresis: re-route only to a candidate measured this much better (0.2: 20% lower p99).
    switch_margin: float = Field(0.2, ge=0, lt=1)
    #: Seconds a switched-away or broken variant rests before it serves a retry window.
    retry_after_s: float = Field(2.0, ge=0, le=MAX_S)
    #: Consecutive failures (exceptions, missed deadlines) that open the circuit breaker.
    breaker_failures: int = Field(3, ge=1, le=MAX_COUNT)
    isolate_compile: bool = True
    bench: BenchConfig = Field(default_factory=BenchConfig)


class StrategiesFile(_Strict):
    tiers: dict[str, TierConfig] = Field(min_length=1)
    strategies: dict[str, StrategyConfig] = Field(min_length=1)
    router: RouterConfig = Field(default_factory=RouterConfig)


# -- line numbers -----------------------------------------------------------------------------
#: Deepest nesting of arrays/inline tables accepted (a strategies file needs 2).
MAX_DEPTH = 16
_KEY = re.compile(r"[A-Za-z0-9_\-\"'. ]+")
_IDENT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _split_key(k: str) -> list[str]:
    return [p.strip().strip("\"'") for p in k.split(".")]


def scan_lines(text: str, source: str = "<config>") -> list[tuple[int, str, bool]]:
    """One linear pass over ``text``: for each line its number, its code without the comment,
    and whether it starts outside any string and bracket (only such a line can hold a key or
    a table header). Nesting deeper than :data:`MAX_DEPTH` is a :class:`ConfigError` with the
    line (``tomllib`` would recurse until ``RecursionError``)."""
    out: list[tuple[int, str, bool]] = []
    state = ""  # "", '"', "'", '"""' or "'''"
    depth = 0
    for no, line in enumerate(text.splitlines(), 1):
        clean = not state and depth == 0
        if state in ('"', "'"):
            state = ""  # a one-line string ends with its line (else tomllib reports it)
        cut, i, n = len(line), 0, len(line)
        while i < n:
            c = line[i]
            if not state:
                if c == "#":
                    cut = i
                    break
                if c in "\"'":
                    state = c * 3 if line.startswith(c * 3, i) else c
                    i += len(state)
                    continue
                if c in "[{":
                    depth += 1
                    if depth > MAX_DEPTH:
                        raise ConfigError(f"{source}:{no}: arrays/tables nested deeper than "
                                          f"{MAX_DEPTH} levels; a strategies file needs 2")
                elif c in "]}":
                    depth = max(0, depth - 1)
            elif c == "\\" and state[0] == '"':
                i += 2  # an escape: the next character never ends the string
                continue
            elif c == state[0] and line.startswith(state, i):
                i += len(state)
                while len(state) == 3 and i < n and line[i] == c:  # up to 2 quotes before """
                    i += 1
                state = ""
                continue
            i += 1
        out.append((no, line[:cut], clean))
    return out


def _inline_keys(rest: str) -> list[str]:
    """Bare keys of an inline table (``{ a = 1, b = 2 }`` → a, b), in linear time."""
    keys = []
    for piece in rest.split("=")[:-1]:
        piece = piece.rstrip()
        j = len(piece)
        while j and piece[j - 1] in _IDENT:
            j -= 1
        if j < len(piece):
            keys.append(piece[j:])
    return keys


def line_index(text: str, source: str = "<config>") -> dict[tuple[str, ...], int]:
    """Map each key path (``("strategies", "momentum", "tier")``) to the line it is on."""
    where: dict[tuple[str, ...], int] = {}
    table: list[str] = []
    for no, code, clean in scan_lines(text, source):
        s = code.strip()
        if not clean or not s:
            continue
        if s.startswith("["):
            inner = s[2:] if s.startswith("[[") else s[1:]
            end = inner.find("]")
            if end > 0:
                table = _split_key(inner[:end])
                for i in range(1, len(table) + 1):
                    where.setdefault(tuple(table[:i]), no)
            continue
        k, eq, rest = s.partition("=")
        if not eq or not _KEY.fullmatch(k.strip()):
            continue
        path = tuple(table + _split_key(k.strip()))
        where.setdefault(path, no)
        if "{" in rest:  # inline table: its keys are on this line
            for sub in _inline_keys(rest):
                where.setdefault(path + (sub,), no)
    return where


def _locate(where: dict[tuple[str, ...], int], loc: tuple[Any, ...]) -> int | None:
    parts = tuple(str(p) for p in loc)
    for i in range(len(parts), 0, -1):
        if parts[:i] in where:
            return where[parts[:i]]
    return None


def _allowed(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The keys allowed where ``loc`` points (for 'unknown key' errors)."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(cur, type) and issubclass(cur, BaseModel) and str(part) in cur.model_fields:
            ann = cur.model_fields[str(part)].annotation
            args = getattr(ann, "__args__", ())
            cur = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)),
                       args[-1] if args else ann)
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return ", ".join(cur.model_fields)
    return ""


# -- reading files ----------------------------------------------------------------------------
#: A strategies file is a few KB: anything larger is not one (a log, a device, a mistake).
MAX_CONFIG_BYTES = 1 << 20


def read_text_file(path: str | Path, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """:func:`hwbackends.user_files.read_text_file` at the strategies file's cap."""
    return user_files.read_text_file(path, what, max_bytes)


# -- loading ----------------------------------------------------------------------------------
def parse_config(text: str, source: str = "<config>") -> StrategiesFile:
    """Parse and schema-validate TOML text (no registry or file-system checks)."""
    _, cfg, problems = _validate(text, source)
    if problems or cfg is None:
        raise ConfigError("invalid strategies file:\n  " + "\n  ".join(problems))
    return cfg


def _validate(text: str, source: str) -> tuple[dict[str, Any], StrategiesFile | None, list[str]]:
    """The parsed TOML, the validated file (``None`` when the schema refuses it) and every
    schema problem, each as ``FILE:LINE: dotted.key: message``. TOML syntax errors raise."""
    where = line_index(text, source)  # first: it refuses nesting tomllib would recurse on
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        loc = f"{source}:{m.group(1)}" if m else source
        raise ConfigError(f"{loc}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: values nested too deeply to parse") from None
    problems: list[str] = []
    try:
        cfg = StrategiesFile.model_validate(raw)
        return raw, (None if problems else cfg), problems
    except ValidationError as exc:
        for e in exc.errors():
            loc = tuple(e["loc"])
            line = _locate(where, loc)
            dotted = ".".join(str(p) for p in loc) or "(top level)"
            msg = e["msg"]
            if e["type"] == "extra_forbidden":
                msg = f"unknown key {str(loc[-1])!r}; allowed here: {_allowed(StrategiesFile, loc)}"
            elif e["type"] == "missing":
                msg = f"missing required key {str(loc[-1])!r}"
            elif "input" in e and e["type"] != "value_error":
                msg += f" (got {e['input']!r})"
                if isinstance(e["input"], bool) and e["type"] in ("int_type", "float_type"):
                    msg += "; true/false is not a number: write the number itself"
            problems.append(f"{source}:{line or '?'}: {dotted}: {msg}")
        return raw, None, problems


def load_config(path: str | Path, registry: "Registry | None" = None, *,
                check_targets: bool = True) -> StrategiesFile:
    """Read, parse and fully validate a strategies file (see the module docstring). Every
    problem is reported at once: when the schema refuses some keys, what it accepted is still
    checked against the registry and the file system. ``registry`` is the run's (the
    strategies' targets and precisions are checked against it); only a caller that reads no
    target (``check_targets=False``: the deadlines of ``hwb export``) may omit it."""
    if check_targets and registry is None:
        raise TypeError("load_config checks the strategies' targets against the run's "
                        "registry: pass registry= (RunContext.registry), or "
                        "check_targets=False")
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise ConfigError(f"strategies file {p} does not exist; see examples/strategies.toml")
    text = read_text_file(p, "strategies file")
    raw, cfg, problems = _validate(text, str(p))
    where = line_index(text, str(p))

    def bad(loc: tuple[str, ...], msg: str) -> None:
        problems.append(f"{p}:{_locate(where, loc) or '?'}: {'.'.join(loc)}: {msg}")

    reg = registry if check_targets else None
    if cfg is not None:
        tiers, strategies = list(cfg.tiers), list(cfg.strategies.items())
    else:  # the keys that have the right types, so their problems are found too
        rt, rs = raw.get("tiers"), raw.get("strategies")
        tiers = list(rt) if isinstance(rt, dict) else []
        strategies = [(k, _Lenient(v)) for k, v in rs.items() if isinstance(v, dict)] \
            if isinstance(rs, dict) else []
    for sname, s in strategies:
        _check_strategy(tiers, ("strategies", sname), s, p, reg, bad)
    if problems or cfg is None:
        raise ConfigError("invalid strategies file:\n  " + "\n  ".join(problems))
    return cfg


class _Lenient:
    """A strategy table the schema refused, as the fields :func:`_check_strategy` reads:
    each the table's own value when it has the schema's type, else ``None`` (not checked
    again: the schema already reported it)."""

    def __init__(self, raw: dict[str, Any]):
        def get(key: str, typ: type) -> Any:
            v = raw.get(key)
            return v if isinstance(v, typ) else None

        def strs(key: str) -> list[str] | None:
            v = raw.get(key)
            return v if isinstance(v, list) and all(isinstance(x, str) for x in v) else None

        self.tier, self.model = get("tier", str), get("model", str)
        self.weights = get("weights", str)
        self.calibration_data, self.validation_data = get("calibration_data", str), get("validation_data", str)
        self.targets = strs("targets") if "targets" in raw else ["*"]
        self.precisions = strs("precisions")
        pin = get("pin", str)
        self.pin = pin if pin and re.fullmatch(r"[\w.\-]+:[\w.\-]+", pin) else None


def _check_strategy(tiers: list[str], base: tuple[str, ...], s: Any, p: Path,
                    reg: "Registry | None", bad: Any) -> None:
    """What the schema cannot check for one strategy: its tier, model and data files,
    targets, pin. ``s`` is a :class:`StrategyConfig` or a :class:`_Lenient` (``None``
    fields are skipped)."""
    if s.tier is not None and s.tier not in tiers:
        bad(base + ("tier",), f"unknown tier {s.tier!r}; defined tiers: {', '.join(tiers)}")
    kind, fid = getattr(s, "output_kind", None), getattr(s, "fidelity", None)
    if kind is not None and isinstance(fid, FidelityConfig):
        try:
            fid.tolerance().check_kind(kind)
        except ConfigError as exc:
            bad(base + ("fidelity", fid.tolerance().misapplied(kind)[0]), str(exc))
    _check_files(base, s, p, bad)
    if reg is None or s.targets is None:
        return
    _check_targets(base, s, reg, bad)


def _check_files(base: tuple[str, ...], s: Any, p: Path, bad: Any) -> None:
    if s.model is None:
        pass
    elif s.model.startswith("zoo:"):
        from . import zoo
        if s.model[4:] not in zoo.NAMES + zoo.MULTI_IO_NAMES + zoo.STAC_NAMES + zoo.DEEPLOB_NAMES:
            bad(base + ("model",), f"no zoo model {s.model[4:]!r}; zoo models: "
                                   f"{', '.join('zoo:' + n for n in zoo.NAMES)}")
    elif not resolve_model(s.model, p).exists():
        bad(base + ("model",), f"model file {resolve_model(s.model, p)} does not exist "
                               f"(paths are relative to {p.parent}); give a .keras/.onnx/.pt2 "
                               f"file or zoo:NAME")
    if s.weights and not resolve_model(s.weights, p).exists():
        bad(base + ("weights",), f"weights file {resolve_model(s.weights, p)} does not exist "
                                 f"(paths are relative to {p.parent})")
    for key in ("calibration_data", "validation_data"):
        v = getattr(s, key, None)
        if not v:
            continue
        f = resolve_model(v, p)
        if f.suffix.lower() not in (".npy", ".npz"):
            bad(base + (key,), f"{f.name} is not a .npy/.npz file; give samples of the model's "
                               f"inputs as .npy (n, …) or .npz (one array per input name)")
        elif not f.is_file():
            bad(base + (key,), f"data file {f} does not exist (paths are relative to {p.parent})")


def _check_targets(base: tuple[str, ...], s: Any, reg: "Registry", bad: Any) -> None:
    names = sorted(reg.targets)
    allowed = _allowed_targets(base, s, names, bad)
    # Target.accepts, not the listed precisions: an FPGA target builds any ap_fixed<W,I>
    # named here, as `hwb compile` does.
    why = unaccepted_precisions([reg.targets[n] for n in allowed], s.precisions or [])
    if allowed and why:
        bad(base + ("precisions",), why)
    if s.pin:
        tname, prec, _push = parse_label(s.pin)  # the push form is matched at routing
        if tname not in reg.targets:
            bad(base + ("pin",), f"unknown target {tname!r}; registered: {', '.join(names)}")
        elif tname not in allowed:
            bad(base + ("pin",), f"pinned target {tname!r} is not in this strategy's targets "
                                 f"{s.targets}; add it there or change the pin")
        else:
            try:
                reg.targets[tname].check_precision(prec)
            except UnsupportedError as exc:
                bad(base + ("pin",), str(exc))


def _allowed_targets(base: tuple[str, ...], s: StrategyConfig, names: list[str], bad: Any) -> list[str]:
    allowed: list[str] = []
    for pat in s.targets:
        hit = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        # A glob may match nothing on this installation (``fpga.*`` without the FPGA
        # plugin); an exact name that is not registered is a typo.
        if not hit and not any(c in pat for c in "*?["):
            bad(base + ("targets",), f"unknown target {pat!r}; registered: {', '.join(names)} "
                                     f"(globs such as 'fpga.*' may match nothing)")
        allowed += [n for n in hit if n not in allowed]
    if not allowed and all(any(c in pat for c in "*?[") for pat in s.targets):
        bad(base + ("targets",), f"{s.targets} match no registered target; registered: "
                                 f"{', '.join(names)}")
    return allowed


def resolve_model(model: str, config_path: Path) -> Path:
    m = Path(model).expanduser()
    return m if m.is_absolute() else (config_path.parent / m)
