"""The conformance checks: the whole target contract, run against the real toolchain.

Each ``check_*`` function takes a :class:`Conformance` (one target, one artifact store) and,
for per-variant checks, a :class:`Variant` (zoo model × precision). A check returns a short
summary on success, raises :class:`ConformanceError` (an ``AssertionError``) naming the rule
that was broken and how to fix it, or :class:`NotApplicable` with the reason it cannot run
here (target unavailable, model not supported by the target).

The checks are plain functions so they run anywhere: under the pytest plugin
(``pytest --hwb-target NAME``), from ``hwb plugin check NAME``, or from a plugin's own tests.
"""
from __future__ import annotations

import gc
import json
import os
import pickle
import re
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..compiled import CompiledModel
from ..compiler import compile as hwb_compile
from ..compiler import conversion_path
from ..errors import HwbError, InputError, UnsupportedError
from ..fidelity import Tolerance, compare
from ..models import FORMATS, Model
from ..registry import ENTRY_POINT_GROUP, Registry, get_registry
from ..specs import Availability, Mode
from ..target import CONTRACT_VERSION, Target

#: Modules that must not be imported by a plugin's import, ``hwb_targets`` or ``probe()``.
HEAVY_MODULES = ("tensorflow", "torch", "jax", "jaxlib", "keras", "hls4ml", "tensorrt")
#: Seconds ``probe()`` may take (it runs on every ``hwb targets`` and every compile).
PROBE_BUDGET_S = 1.0
#: ``predict_into`` calls measured by the allocation check, and the net bytes allowed over
#: all of them (a leak of one small object per call is ≥ 28 bytes × calls).
ALLOC_CALLS = 1000
ALLOC_BOUND_BYTES = 2048
FAMILIES = ("cpu", "gpu", "tpu", "fpga", "ref")

#: Fidelity each precision family must meet against the fp32 reference. ``rel_err`` is the
#: max abs error over the reference's output range. fp32 differs only by summation order;
#: half precision by ~3 decimal digits; int8 and fixed point by a quantisation step per layer
#: (DOMAIN: correlation ≥ 0.98 is the practitioners' floor for a compressed signal).
TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(corr_min=0.99999, rel_err=1e-4),
    "half": Tolerance(corr_min=0.999, rel_err=3e-2),
    "quantized": Tolerance(corr_min=0.98, rel_err=0.2),
}


def precision_family(precision: str) -> str:
    """``fp32`` | ``half`` (fp16, bf16, tf32, mixed) | ``quantized`` (int8*, uint8, int4,
    fixed-point). Unknown names count as ``quantized``, the loosest family."""
    p = precision.lower()
    if p in ("fp32", "float32", "f32"):
        return "fp32"
    if any(k in p for k in ("fp16", "bf16", "float16", "half", "tf32", "mixed")):
        return "half"
    return "quantized"


class ConformanceError(AssertionError):
    """The target broke a rule of the contract (the message names the rule and the fix)."""


class NotApplicable(Exception):
    """The check cannot run here; ``reason`` says why (shown as the skip reason)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def zoo_format(name: str) -> str:
    """Source format of a zoo model, known without building it (builds import frameworks)."""
    return "torch" if name.endswith("_torch") else "keras"


@dataclass(frozen=True)
class Variant:
    model: str
    precision: str

    @property
    def id(self) -> str:
        return f"{self.model}-{self.precision}"


@dataclass
class Conformance:
    """One target under test: its registry, an artifact store of its own and the variants
    (zoo model × precision) to check. ``models=None`` means every zoo model the target claims
    (its ``formats`` plus the installed converters); ``precisions=None`` means all of them."""

    target_name: str
    store: Path
    models: Sequence[str] | None = None
    precisions: Sequence[str] | None = None
    registry: Registry | None = None
    _compiled: dict[Variant, CompiledModel | BaseException] = field(default_factory=dict, repr=False)
    _models: dict[str, Model] = field(default_factory=dict, repr=False)
    _availability: Availability | None = field(default=None, repr=False)
    #: Fresh builds made through the kit, and ``Target.compile`` calls seen in *this* process
    #: (there must be none: compiles belong in the worker). See :meth:`_compile`.
    _fresh_builds: list[str] = field(default_factory=list, repr=False)
    _inprocess_compiles: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.store = Path(self.store)

    # -- what is under test -----------------------------------------------------------------
    @property
    def reg(self) -> Registry:
        return self.registry or get_registry()

    @property
    def target(self) -> Target:
        return self.reg.target(self.target_name)

    def availability(self) -> Availability:
        if self._availability is None:
            try:
                av = self.target.probe()
            except Exception as exc:
                raise ConformanceError(f"{self.target_name}.probe() raised {type(exc).__name__}: "
                                       f"{exc}. probe() must never raise: return "
                                       f"Availability.unavailable(reason) instead") from exc
            self._availability = av
        return self._availability

    def require_usable(self) -> Availability:
        av = self.availability()
        if isinstance(av, Availability) and not av.usable:
            raise NotApplicable(f"{self.target_name} is unavailable here: {av.reason}")
        return av

    def claimed_models(self) -> list[str]:
        """Zoo models whose format the target takes, directly or through converters."""
        from .. import zoo

        names = list(self.models) if self.models is not None else list(zoo.NAMES)
        out = []
        for n in names:
            if n not in zoo.NAMES:
                raise ConformanceError(f"no zoo model {n!r}; the zoo has {', '.join(zoo.NAMES)}")
            try:
                conversion_path(self.reg, zoo_format(n), self.target.formats, self.target_name)
            except UnsupportedError:
                continue
            out.append(n)
        return out

    def variants(self) -> list[Variant]:
        t = self.target
        precs = list(t.precisions) if self.precisions is None else [
            t.precisions[0] if p == "default" else p for p in self.precisions]
        return [Variant(m, p) for m in self.claimed_models() for p in dict.fromkeys(precs)]

    def model(self, name: str) -> Model:
        if name not in self._models:
            from .. import zoo
            self._models[name] = zoo.get(name)
        return self._models[name]

    def compiled(self, v: Variant) -> CompiledModel:
        """The variant compiled through ``hwb.compile`` into this context's store (memoised).
        An ``UnsupportedError`` that names the layer/op is accepted (→ NotApplicable)."""
        self.require_usable()
        if v not in self._compiled:
            try:
                self._compiled[v] = self._compile(v, self.store)
            except BaseException as exc:
                self._compiled[v] = exc
        got = self._compiled[v]
        if isinstance(got, BaseException):
            raise got
        return got

    def _compile(self, v: Variant, store: Path, **kw: Any) -> CompiledModel:
        if v.precision not in self.target.precisions:
            raise ConformanceError(f"{self.target_name} has no precision {v.precision!r} "
                                   f"(it offers {', '.join(self.target.precisions)})")
        m = self.model(v.model)
        # Spy on the target class in this process only: the worker imports the class afresh,
        # so a call recorded here means compile() ran in the caller's process.
        cls = type(self.target)
        real = cls.__dict__.get("compile")  # None when inherited: then delete the spy after
        orig = cls.compile
        seen = self._inprocess_compiles

        def spy(target: Target, *a: Any, **k: Any) -> Any:
            seen.append(os.getpid())
            return orig(target, *a, **k)

        cls.compile = spy  # type: ignore[method-assign]
        try:
            cm = hwb_compile(m, self.target_name, v.precision, store=store,
                             registry=self.registry, **kw)
            if not cm.artifact.cached:
                self._fresh_builds.append(f"{v.id} ({cm.artifact.compile_seconds:.1f} s)")
            return cm
        except UnsupportedError as exc:
            named = names_layer(m, str(exc))
            if not named:
                raise ConformanceError(
                    f"{self.target_name} raised UnsupportedError for zoo model {v.model!r} "
                    f"({v.precision}) without naming the layer or op it cannot compile: "
                    f"{exc!s:.400}. Say which layer/op (e.g. \"layer 'lstm' (LSTM) is not "
                    f"supported\") so users know what to change") from exc
            raise NotApplicable(f"{v.model} is not supported by {self.target_name}: {exc!s:.300}") from exc
        except HwbError as exc:
            raise ConformanceError(f"compiling zoo model {v.model!r} for {self.target_name}:"
                                   f"{v.precision} failed: {type(exc).__name__}: {exc!s:.1500}") from exc
        finally:
            if real is None:
                del cls.compile
            else:
                cls.compile = real  # type: ignore[method-assign]

    def first_compilable(self) -> Variant:
        """The first claimed model at the default precision that compiles."""
        reasons = []
        for m in self.claimed_models():
            v = Variant(m, self.target.precisions[0])
            try:
                self.compiled(v)
                return v
            except NotApplicable as exc:
                reasons.append(exc.reason)
        raise NotApplicable(f"{self.target_name} compiles none of the selected zoo models"
                            + (f" ({'; '.join(reasons)})" if reasons else ""))


# -- helpers ------------------------------------------------------------------------------------
_NAMED = re.compile(r"\b(layer|op|ops|operator|node|module)\b\W{0,3}[\w./:-]+", re.I)


def layer_names(model: Model) -> set[str]:
    """Names and class names of the layers/ops of a source model (for UnsupportedError)."""
    names: set[str] = set()
    obj = model.obj
    if model.format == "keras":
        for layer in getattr(obj, "layers", []):
            names |= {layer.name, type(layer).__name__}
    elif model.format == "torch":
        mods = obj.module() if hasattr(obj, "module") and not hasattr(obj, "named_modules") else obj
        for n, mod in getattr(mods, "named_modules", lambda: [])():
            names |= {n, type(mod).__name__} - {""}
    elif model.format == "onnx":
        for node in obj.graph.node:
            names |= {node.op_type, node.name} - {""}
    return {n for n in names if len(n) > 1}


def names_layer(model: Model, message: str) -> bool:
    """Whether an error message names a layer or op of ``model`` (or says 'layer X'/'op X')."""
    low = message.lower()
    if any(n.lower() in low for n in layer_names(model)):
        return True
    return bool(_NAMED.search(message))


def _io(cm: CompiledModel, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(cm.input.batched(cm.batch_size)).astype(np.float32)
    return x, np.full(cm.output.batched(cm.batch_size), np.nan, np.float32)


# -- target-level checks ------------------------------------------------------------------------
def check_metadata(ctx: Conformance) -> str:
    """Class attributes a target must set, and the methods it must implement."""
    t = ctx.target
    bad = []
    if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_-]+)*", t.name or ""):
        bad.append(f"name {t.name!r} must be lowercase dotted 'family.runtime' (e.g. cpu.litert)")
    elif "." in t.name and t.name.split(".")[0] != t.family:
        bad.append(f"name {t.name!r} must start with its family {t.family!r}")
    if t.family not in FAMILIES:
        bad.append(f"family {t.family!r} must be one of {', '.join(FAMILIES)}")
    if not t.precisions or not all(isinstance(p, str) and p for p in t.precisions):
        bad.append(f"precisions {t.precisions!r} must be a non-empty tuple of names (first = default)")
    if not t.formats or set(t.formats) - set(FORMATS):
        bad.append(f"formats {t.formats!r} must be a non-empty subset of {FORMATS}")
    if not (t.description or "").strip():
        bad.append("description must be one line for `hwb targets`")
    if not isinstance(t.option_docs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in t.option_docs.items()):
        bad.append("option_docs must map each option name to a one-line documentation string")
    calibrated = getattr(t, "calibrated", ())
    if set(calibrated) - set(t.precisions):
        bad.append(f"calibrated {calibrated!r} lists precisions the target does not offer")
    if t.contract_version != CONTRACT_VERSION:
        bad.append(f"contract_version {t.contract_version} != {CONTRACT_VERSION}")
    if not t.compile_timeout or t.compile_timeout <= 0:
        bad.append("compile_timeout must be a positive number of seconds")
    for meth in ("probe", "compile", "load"):
        if getattr(type(t), meth) is getattr(Target, meth):
            bad.append(f"{meth}() is not implemented")
    if bad:
        raise ConformanceError(f"{t.name}: " + "; ".join(bad))
    return f"{t.name} ({t.family}): precisions {', '.join(t.precisions)}; formats {', '.join(t.formats)}"


def check_probe(ctx: Conformance) -> str:
    """``probe()`` is fast, never raises, returns an ``Availability`` with an actionable reason
    when unavailable, a device when usable and says what stands in when emulated."""
    t = ctx.target
    t0 = time.perf_counter()
    ctx._availability = None
    av = ctx.availability()
    dt = time.perf_counter() - t0
    if not isinstance(av, Availability):
        raise ConformanceError(f"{t.name}.probe() returned {av!r}; return an Availability "
                               f"(Availability.hardware/emulated/unavailable)")
    if dt > PROBE_BUDGET_S:
        raise ConformanceError(f"{t.name}.probe() took {dt:.2f} s (budget {PROBE_BUDGET_S} s): it "
                               f"runs on every `hwb targets` and compile. Use find_spec/which, "
                               f"not imports or subprocesses")
    if not isinstance(av.mode, Mode):
        raise ConformanceError(f"Availability.mode is {av.mode!r}, not a hwbackends.Mode")
    if av.mode is Mode.UNAVAILABLE and not av.reason.strip():
        raise ConformanceError(f"{t.name} is unavailable without a reason; say what a person can "
                               f"do (e.g. 'tensorrt not importable (pip install tensorrt)')")
    if av.mode is Mode.EMULATED and not av.reason.strip():
        raise ConformanceError(f"{t.name} is emulated without saying what stands in for the hardware")
    if av.usable and not av.device.strip():
        raise ConformanceError(f"{t.name} is {av.mode.value} but names no device")
    again = t.probe()
    if again.mode is not av.mode:
        raise ConformanceError(f"{t.name}.probe() changed its answer between two calls "
                               f"({av.mode.value} → {again.mode.value})")
    return f"{av.mode.value} in {dt * 1000:.1f} ms: {av.reason or av.device}"


_LIGHT_PROBE = r"""
import importlib.metadata, json, sys, time
heavy = set(sys.argv[3].split(","))
def loaded():
    return sorted({m.split(".")[0] for m in sys.modules} & heavy)
before = loaded()
ep = [e for e in importlib.metadata.entry_points(group=sys.argv[1]) if e.name == sys.argv[2]][0]
t0 = time.perf_counter()
plugin = ep.load()
t1 = time.perf_counter()
targets = list(plugin.hwb_targets()) if hasattr(plugin, "hwb_targets") else []
after_register = loaded()
t = [t for t in targets if t.name == sys.argv[4]][0]
av = t.probe()
print(json.dumps({"before": before, "after_register": after_register, "after_probe": loaded(),
                  "import_s": t1 - t0, "mode": av.mode.value}))
"""


def check_probe_is_light(ctx: Conformance) -> str:
    """In a fresh interpreter: importing the plugin, ``hwb_targets()`` and ``probe()`` import no
    heavy framework (``hwb targets`` must stay fast)."""
    name = ctx.target_name
    ep = ctx.reg.target_plugin.get(name)
    import importlib.metadata
    if not ep or not [e for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if e.name == ep]:
        raise NotApplicable(f"{name} is not installed through the {ENTRY_POINT_GROUP!r} entry-point "
                            f"group (registered at run time), so a fresh process cannot load it")
    r = subprocess.run([sys.executable, "-c", _LIGHT_PROBE, ENTRY_POINT_GROUP, ep,
                        ",".join(HEAVY_MODULES), name],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    if r.returncode != 0:
        raise ConformanceError(f"loading plugin {ep!r} and probing {name} in a fresh process "
                               f"failed:\n{r.stderr[-2000:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    on_import = sorted(set(d["after_register"]) - set(d["before"]))
    on_probe = sorted(set(d["after_probe"]) - set(d["after_register"]))
    if on_import:
        raise ConformanceError(f"importing plugin {ep!r} / hwb_targets() imports {', '.join(on_import)} "
                               f"({d['import_s'] * 1000:.0f} ms): move heavy imports into "
                               f"compile()/load() so `hwb targets` stays fast")
    if on_probe:
        raise ConformanceError(f"{name}.probe() imports {', '.join(on_probe)}: use "
                               f"importlib.util.find_spec / shutil.which instead")
    return f"plugin {ep!r} imports in {d['import_s'] * 1000:.1f} ms; nothing heavy imported"


def check_store_roundtrip(ctx: Conformance) -> str:
    """The artifact holds files; a second compile is a cached load with identical outputs; a
    corrupted artifact file is detected and rebuilt, with identical outputs again. Uses the
    context's own store, so the first build is the one the per-variant checks share."""
    v = ctx.first_compilable()
    first = ctx.compiled(v)
    files = [p for p in first.artifact.path.rglob("*") if p.is_file() and p.name != "manifest.json"]
    if not files:
        raise ConformanceError(f"{ctx.target_name}.compile() wrote no file into workdir: the "
                               f"artifact must hold what load() needs, so it can be cached")
    x, y1 = _io(first)
    first.predict_into(x, y1)
    second = ctx._compile(v, ctx.store, fidelity=False)
    if not second.artifact.cached or second.artifact.key != first.artifact.key:
        raise ConformanceError(f"the second identical compile was not served from the store "
                               f"(cached={second.artifact.cached}): is toolchain() deterministic?")
    y2 = np.full_like(y1, np.nan)
    second.predict_into(x, y2)
    if not np.array_equal(y1, y2):
        raise ConformanceError(f"the cached artifact predicts differently from the first build "
                               f"(max diff {np.nanmax(np.abs(y1 - y2)):.3g})")
    second.close()
    victim = max(files, key=lambda p: p.stat().st_size)
    blob = bytearray(victim.read_bytes())
    if blob:
        blob[len(blob) // 2] ^= 0xFF
    else:
        blob = bytearray(b"corrupt")
    # A new file replaces the old one (never write in place): a loaded executor may have the
    # old file mapped (TFLite mmaps its model, ctypes its .so), and must keep its intact copy.
    tmp = victim.with_name(victim.name + ".hwb-corrupt")
    tmp.write_bytes(bytes(blob))
    os.replace(tmp, victim)
    third = ctx._compile(v, ctx.store, fidelity=False)
    if third.artifact.cached:
        raise ConformanceError(f"a corrupted artifact file ({victim.name}) was loaded as cached")
    y3 = np.full_like(y1, np.nan)
    third.predict_into(x, y3)
    if not np.array_equal(y1, y3):
        raise ConformanceError("the rebuilt artifact predicts differently from the first build")
    third.close()
    return (f"{v.id}: cached load, corrupted {victim.name} detected and rebuilt "
            f"({len(files)} file(s), {first.artifact.size_bytes():,} bytes)")


def check_compile_isolated(ctx: Conformance) -> str:
    """The target pickles (it travels to the worker) and ``compile()`` runs in the worker
    process, never in the caller's (a crashing toolchain cannot take the caller down).
    Every compile made through the kit is watched; if none was a fresh build yet, one is made."""
    from .. import isolate

    t = ctx.target
    try:
        clone = pickle.loads(pickle.dumps(t))
    except Exception as exc:
        raise ConformanceError(f"{t.name} cannot be pickled ({type(exc).__name__}: {exc}); the "
                               f"Target instance travels to the compile worker: keep only plain "
                               f"data on it (no open handles, lambdas or loaded libraries)") from exc
    if getattr(clone, "name", None) != t.name:
        raise ConformanceError(f"{t.name} unpickles as {clone!r}")
    if not ctx._fresh_builds:
        v = ctx.first_compilable()
        if not ctx._fresh_builds:  # everything was cached: force one build
            ctx._compile(v, ctx.store, fidelity=False, rebuild=True).close()
    if ctx._inprocess_compiles:
        raise ConformanceError(f"{t.name}.compile() ran in the caller's process "
                               f"({len(ctx._inprocess_compiles)} time(s)): compiles must run in the "
                               f"isolated worker (hwbackends.isolate)")
    w = isolate.worker()
    pid = w._proc.pid if w._proc is not None else None
    if pid is None or pid == os.getpid() or w._proc.poll() is not None:
        raise ConformanceError("no live compile worker after an isolated compile")
    return (f"{len(ctx._fresh_builds)} build(s) ({', '.join(ctx._fresh_builds)}) ran in worker "
            f"pid {pid}, none in the caller (pid {os.getpid()}); the target pickles")


# -- per-variant checks -------------------------------------------------------------------------
def check_compile(ctx: Conformance, v: Variant) -> str:
    """The zoo model compiles (or is refused with an UnsupportedError naming the layer/op),
    and the result is labelled with the mode the probe reported."""
    cm = ctx.compiled(v)
    av = ctx.availability()
    if cm.mode is not av.mode:
        raise ConformanceError(f"compiled variant says mode {cm.mode.value}, probe says {av.mode.value}")
    if cm.precision != v.precision or cm.target != ctx.target_name:
        raise ConformanceError(f"artifact is labelled {cm.variant}, asked for {ctx.target_name}:{v.precision}")
    d = cm.describe()
    json.dumps(d, default=str)  # metadata must serialise (reports, CLI --json)
    how = "cached" if cm.artifact.cached else f"built in {cm.artifact.compile_seconds:.1f} s"
    return f"{cm.variant} ({cm.mode.value}) {how}, {cm.artifact.size_bytes():,} bytes"


def check_predict(ctx: Conformance, v: Variant) -> str:
    """``predict`` returns float32 of the output shape for one sample and for a batch;
    ``predict_into`` fills ``out`` in place with the same values."""
    cm = ctx.compiled(v)
    m = ctx.model(v.model)
    xs = m.representative(7, seed=3)
    one = cm.predict(xs[0])
    if one.shape != cm.output.shape or one.dtype != np.float32:
        raise ConformanceError(f"predict(one sample) gave {one.dtype}{one.shape}; expected "
                               f"float32{cm.output.shape}")
    many = cm.predict(xs)
    if many.shape != (7, *cm.output.shape) or many.dtype != np.float32:
        raise ConformanceError(f"predict(7 samples) gave {many.dtype}{many.shape}; expected "
                               f"float32{(7, *cm.output.shape)}")
    if not np.isfinite(many).all():
        raise ConformanceError("predict returned NaN/Inf on finite inputs")
    b = cm.batch_size
    x = np.ascontiguousarray(np.resize(xs, cm.input.batched(b)), dtype=np.float32)
    out = np.full(cm.output.batched(b), np.nan, np.float32)
    ret = cm.predict_into(x, out)
    if ret is not None and ret is not out:
        raise ConformanceError("predict_into must write into out (and return None)")
    if not np.isfinite(out).all():
        raise ConformanceError("predict_into did not fill every element of out")
    again = cm.predict(x)
    if not np.allclose(out, again, rtol=1e-6, atol=1e-6):
        raise ConformanceError("predict_into and predict disagree on the same input "
                               f"(max diff {np.max(np.abs(out - again)):.3g})")
    if np.allclose(many[0], many[1:]):
        raise ConformanceError("every sample gives the same output: the input is ignored")
    return f"one {one.dtype}{one.shape}, batch {many.shape}, predict_into batch {b}"


def _net_bytes(fn: Callable[[np.ndarray, np.ndarray], Any], x: np.ndarray, out: np.ndarray,
               n: int) -> int:
    already = tracemalloc.is_tracing()  # e.g. python -X tracemalloc: measure, leave it on
    if not already:
        tracemalloc.start()
    try:
        for _ in range(100):  # one-time costs (first-call caches) happen before the baseline
            fn(x, out)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(n):
            fn(x, out)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        if not already:
            tracemalloc.stop()


def check_no_allocation(ctx: Conformance, v: Variant, calls: int = ALLOC_CALLS,
                        bound: int = ALLOC_BOUND_BYTES) -> str:
    """``predict_into`` keeps nothing per call: net Python/NumPy memory (tracemalloc) after
    ``calls`` calls grows by at most ``bound`` bytes. Best of three rounds, so a one-time
    cache filled during the first round does not count, while a per-call leak fails all."""
    cm = ctx.compiled(v)
    if ctx.target.family == "ref":
        raise NotApplicable("the ref family runs the source framework per call (the golden "
                            "outputs), it is not a serving hot path")
    x, out = _io(cm)
    rounds = []
    for _ in range(3):
        rounds.append(_net_bytes(cm.predict_into, x, out, calls))
        if rounds[-1] <= bound:
            return f"net {rounds[-1]} bytes over {calls} calls (bound {bound})"
    raise ConformanceError(f"predict_into keeps memory: net {', '.join(map(str, rounds))} bytes "
                           f"over {calls} calls in three rounds (bound {bound}). The hot path must "
                           f"write into preallocated buffers and keep nothing per call")


def check_fidelity(ctx: Conformance, v: Variant) -> str:
    """Outputs match the source model's fp32 reference within the precision family's
    tolerance (:data:`TOLERANCES`), on inputs the compile never saw."""
    cm = ctx.compiled(v)
    m = ctx.model(v.model)
    xs = m.representative(256, seed=11)
    fam = precision_family(v.precision)
    f = compare(m.reference(xs), cm.predict(xs))
    bad = TOLERANCES[fam].violations(f)
    if bad:
        raise ConformanceError(f"{cm.variant} on {v.model}: {'; '.join(bad)} (precision family "
                               f"{fam}, tolerance {TOLERANCES[fam]}); measured {f}")
    return f"{fam}: {f}"


def bad_input_cases(cm: CompiledModel, target: Target) -> dict[str, tuple[Any, Any]]:
    """Wrong calls of ``predict_into`` that must raise :class:`InputError`."""
    b = cm.batch_size
    xs, os_ = cm.input.batched(b), cm.output.batched(b)
    f32 = np.float32
    x, out = np.zeros(xs, f32), np.zeros(os_, f32)
    cases: dict[str, tuple[Any, Any]] = {
        "x with one feature too many": (np.zeros((*xs[:-1], xs[-1] + 1), f32), out),
        "x without the batch dimension": (np.zeros(xs[1:], f32), out),
        "x with batch_size+1 rows (out has batch_size)": (np.zeros((b + 1, *xs[1:]), f32), out),
        "x float64": (np.zeros(xs, np.float64), out),
        "x int32": (np.zeros(xs, np.int32), out),
        "x non-contiguous": (np.zeros((*xs[:-1], 2 * xs[-1]), f32)[..., ::2], out),
        "x a list": (x.tolist(), out),
        "out with the wrong shape": (x, np.zeros((*os_[:-1], os_[-1] + 1), f32)),
        "out float64": (x, np.zeros(os_, np.float64)),
        "out non-contiguous": (x, np.zeros((*os_[:-1], 2 * os_[-1]), f32)[..., ::2]),
        "out read-only": (x, np.zeros(os_, f32)),
    }
    cases["out read-only"][1].flags.writeable = False
    if xs[-1] != 1:  # broadcastable into the input buffer: silently wrong if not refused
        cases["x with last dimension 1 (broadcastable)"] = (np.zeros((*xs[:-1], 1), f32), out)
    if target.static_batch:
        cases["x and out with batch_size+1 rows on a static-batch variant"] = (
            np.zeros((b + 1, *xs[1:]), f32), np.zeros((b + 1, *os_[1:]), f32))
    return cases


#: Cases an executor may either refuse with InputError or serve correctly: a buffered
#: executor copies a strided array into its own buffer (or out of it) correctly; one that
#: hands raw pointers to a device must refuse it.
STRIDED = ("x non-contiguous", "out non-contiguous")


def _check_strided(cm: CompiledModel, label: str, x: np.ndarray, ref: np.ndarray) -> str | None:
    bx = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), np.float32)[..., ::2]
    bx[...] = x
    bo = np.zeros((*ref.shape[:-1], 2 * ref.shape[-1]), np.float32)[..., ::2]
    if label == "x non-contiguous":
        bo = np.zeros_like(ref)
    else:
        bx = x
    try:
        cm.predict_into(bx, bo)
    except InputError:
        return None
    except Exception as exc:
        return f"{label}: raised {type(exc).__name__} ({exc!s:.120}), not InputError"
    if not np.array_equal(np.asarray(bo), ref):
        return f"{label}: accepted, but the result differs from the contiguous call"
    return None


def check_bad_inputs(ctx: Conformance, v: Variant) -> str:
    """Every wrong ``x``/``out`` raises :class:`~hwbackends.errors.InputError` with a message
    (a strided array may instead be served correctly, see :data:`STRIDED`), the process
    survives, and the next correct call gives the same result as before."""
    cm = ctx.compiled(v)
    x, ref = _io(cm, seed=5)
    cm.predict_into(x, ref)
    wrong = []
    for label, (bx, bo) in bad_input_cases(cm, ctx.target).items():
        if label in STRIDED:
            err = _check_strided(cm, label, x, ref)
            if err:
                wrong.append(err)
            continue
        try:
            cm.predict_into(bx, bo)
        except InputError as exc:
            if not str(exc).strip():
                wrong.append(f"{label}: InputError without a message")
        except Exception as exc:
            wrong.append(f"{label}: raised {type(exc).__name__} ({exc!s:.120}), not InputError")
        else:
            wrong.append(f"{label}: accepted")
    for label, bad_x in (("predict() with a wrong shape", np.zeros((3, 999), np.float32)),
                         ("predict() with NaN", np.full(cm.input.batched(1), np.nan, np.float32))):
        try:
            cm.predict(bad_x)
            wrong.append(f"{label}: accepted")
        except InputError:
            pass
        except Exception as exc:
            wrong.append(f"{label}: raised {type(exc).__name__}, not InputError")
    out = np.full_like(ref, np.nan)
    cm.predict_into(x, out)
    if not np.array_equal(out, ref):
        wrong.append("after the wrong calls, a correct call gives a different result")
    if wrong:
        raise ConformanceError(
            f"{cm.variant}: predict_into must raise hwbackends.errors.InputError for a wrong "
            f"array (check shape, dtype and C-contiguity of x and out before touching the "
            f"library; call hwbackends.target.check_io in the error path):\n  - " + "\n  - ".join(wrong))
    return f"{len(bad_input_cases(cm, ctx.target)) + 2} wrong calls refused with InputError"


#: Checks run once per target / once per (model, precision), in this order.
TARGET_CHECKS: dict[str, Callable[[Conformance], str]] = {
    "metadata": check_metadata, "probe": check_probe, "probe_is_light": check_probe_is_light,
    "store_roundtrip": check_store_roundtrip, "compile_isolated": check_compile_isolated,
}
VARIANT_CHECKS: dict[str, Callable[[Conformance, Variant], str]] = {
    "compile": check_compile, "predict": check_predict, "no_allocation": check_no_allocation,
    "fidelity": check_fidelity, "bad_inputs": check_bad_inputs,
}
#: Target checks that still run (and must pass) when the target is unavailable here.
WHEN_UNAVAILABLE = ("metadata", "probe", "probe_is_light")


def run_target_check(ctx: Conformance, name: str) -> str:
    if name not in WHEN_UNAVAILABLE:
        ctx.require_usable()
    return TARGET_CHECKS[name](ctx)


def run_variant_check(ctx: Conformance, v: Variant, name: str) -> str:
    ctx.require_usable()
    return VARIANT_CHECKS[name](ctx, v)


__all__ = [
    "ALLOC_BOUND_BYTES", "ALLOC_CALLS", "Conformance", "ConformanceError", "HEAVY_MODULES",
    "NotApplicable", "PROBE_BUDGET_S", "TARGET_CHECKS", "TOLERANCES", "VARIANT_CHECKS",
    "Variant", "bad_input_cases", "names_layer", "precision_family", "run_target_check",
    "run_variant_check", "WHEN_UNAVAILABLE",
]
