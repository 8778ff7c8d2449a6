"""What a model will cost before any work is done on it, and the limits it must stay within.

A model file is data: its shapes and sizes are untrusted. A graph that declares a window of a
million steps, or external weights of 40 GB, must be refused from its declarations, before a
framework reads the weights, before synthetic inputs are drawn for it and before a converter
runs — not by the operating system after minutes and gigabytes. :class:`Cost` is the estimate
(parameters, weight bytes, external-data bytes, multiply-adds and activation bytes per sample)
and :class:`Limits` what is allowed; :meth:`Limits.check` refuses with a :class:`CostError`
that gives the figure, the limit and the option that raises it.

The estimates come from declarations only:

- **ONNX**: the protobuf read with ``load_external_data=False``; external tensors counted from
  their dims (or declared ``length``, whichever is larger) and checked against the real size
  of the file they live in; activations and multiply-adds from ONNX shape inference (a
  symbolic batch counts as one sample).
- **Keras**: first the architecture the file declares (``config.json``, a Keras 2 JSON, an
  HDF5 ``model_config``), read without Keras, each known layer's weights from its config and
  input shape (:func:`keras_config_cost`); then, once built, each layer's output shape and
  weights (the layer graph, no call).
- **torch**: first what the file declares, read without torch: a ``torch.export`` archive's
  weight tables and graph (:func:`torch_export_cost`: tensor shapes, weighted ops), a
  ``torch.save`` zip's storages as its pickle names them (read by
  :mod:`hwbackends.models.torch_archive` without running it); then parameter sizes before any
  call, and the one-sample example call that loading already makes, observed with forward
  hooks.
- **any file**: its size (and a zip's declared entry sizes) bound the weights before the
  framework opens it.

Activation bytes are the sum over every tensor of one sample (inputs included): an upper
bound on what a framework keeps alive, and what the compile multiplies by the validation
samples it runs through the reference (:data:`SAMPLES_PER_PASS`).

The limits are set by environment variables (``HWB_MAX_WEIGHTS``, ``HWB_MAX_ACTIVATIONS``,
``HWB_MAX_MACS``; ``hwb compile --limit NAME=VALUE`` sets them for one command) or passed as
``Limits`` to :func:`hwbackends.load_model` / :func:`hwbackends.compile`. The compile worker's
memory limit (:func:`worker_memory`, ``HWB_WORKER_MEMORY``) is enforced in
:mod:`hwbackends.isolate`.
"""
from __future__ import annotations

import json
import math
import os
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from .errors import ConfigError, ModelError
from .units import fmt_bytes, parse_size

#: The compile runs this many samples through the reference at once (the validation set;
#: hwbackends/samples.py), so per-sample activations are multiplied by it.
SAMPLES_PER_PASS = 512
#: Nothing declared beyond this is believed (an int64 shape product overflows past it).
_HUGE = 1 << 62

#: name → (environment variable, default, what it bounds, unit).
LIMITS: dict[str, tuple[str, float, str, str]] = {
    "weights": ("HWB_MAX_WEIGHTS", 4 << 30, "weight bytes (in the file and its external data)", "bytes"),
    "activations": ("HWB_MAX_ACTIVATIONS", 16 << 20, "activation bytes per sample (every tensor "
                    "of one sample)", "bytes"),
    "macs": ("HWB_MAX_MACS", 1e10, "multiply-adds per sample", "count"),
}
WORKER_MEMORY_ENV = "HWB_WORKER_MEMORY"
_DTYPE_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8,
                14: 8, 15: 16, 16: 2}


class CostError(ModelError):
    """A model whose declared cost exceeds a limit (:class:`Limits`), refused before work."""


@dataclass
class Cost:
    """A model's declared cost. ``None``: not estimated (an op or layer the estimate does not
    know, a shape inference failure); a figure that is known is a lower bound then."""

    params: int | None = None
    weight_bytes: int | None = None
    external_bytes: int = 0
    macs: float | None = None
    activation_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        def b(v: int | None) -> str:
            return "?" if v is None else fmt_bytes(int(v))
        return (f"{self.params if self.params is not None else '?'} parameters, weights "
                f"{b(self.weight_bytes)} (external {b(self.external_bytes)}), "
                f"{'?' if self.macs is None else f'{self.macs:.3g}'} multiply-adds and "
                f"{b(self.activation_bytes)} of activations per sample")


@dataclass(frozen=True)
class Limits:
    """What a model may cost (see :data:`LIMITS`): numbers, or text as the environment
    variables take it (``"8G"``, ``"1e11"``); ``0`` turns a limit off."""

    weights: float | str = LIMITS["weights"][1]
    activations: float | str = LIMITS["activations"][1]
    macs: float | str = LIMITS["macs"][1]

    def __post_init__(self) -> None:
        for key, (_, _, _, unit) in LIMITS.items():
            v = getattr(self, key)
            text = v if isinstance(v, str) else repr(v) if isinstance(v, (int, float)) else None
            if text is None or isinstance(v, bool):
                raise ConfigError(f"Limits({key}=…) must be a number or a size such as '8G'; "
                                  f"got {type(v).__name__}")
            object.__setattr__(self, key, parse_limit(text, "count" if not isinstance(v, str)
                                                      else unit, f"Limits({key}=…)"))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Limits:
        """The defaults, each raised or lowered by its environment variable."""
        env = os.environ if env is None else env
        kw = {}
        for name, (var, _, _, unit) in LIMITS.items():
            if env.get(var, "").strip():
                kw[name] = parse_limit(env[var], unit, var)
        return cls(**kw)

    def check(self, cost: Cost, name: str) -> None:
        """Raise :class:`CostError` for the first figure over its limit."""
        figures = {"weights": max(cost.weight_bytes or 0, cost.external_bytes),
                   "activations": cost.activation_bytes, "macs": cost.macs}
        for key, value in figures.items():
            limit = getattr(self, key)
            if value is None or not limit or value <= limit:
                continue
            var, _, what, unit = LIMITS[key]
            shown, cap = (fmt_bytes(int(value)), fmt_bytes(int(limit))) if unit == "bytes" else \
                (f"{value:.3g}", f"{limit:.3g}")
            extra = (f" (× {SAMPLES_PER_PASS} validation samples ≈ "
                     f"{fmt_bytes(int(value) * SAMPLES_PER_PASS)})") if key == "activations" else ""
            want = _suggest(value, unit)
            raise CostError(
                f"model {name!r} declares {shown} of {what}{extra}, over the limit of {cap}; "
                f"refused before any work on it. If the model is meant to be this large, "
                f"raise the limit: {var}={want} in the environment, hwb compile --limit "
                f"{key}={want}, or load_model/compile(..., limits=hwbackends.cost.Limits("
                f"{key}={want!r})); 0 turns it off")


def _suggest(value: float, unit: str) -> str:
    """A limit just above ``value``, as a person writes it: ``128M``, ``64G``, ``1e+11``."""
    if unit != "bytes":
        return f"{10.0 ** math.ceil(math.log10(max(value, 1.0))):.0e}"
    for suffix, size in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        n = math.ceil(value / size)
        if n < 1024 or suffix == "T":
            return f"{1 << max(0, n - 1).bit_length()}{suffix}"
    return str(int(value))


def parse_limit(text: str, unit: str, what: str) -> float:
    """A limit's value: a size (``8G``) for bytes, a number (``1e11``) for counts; ``0``: off."""
    try:
        value = float(parse_size(text)) if unit == "bytes" else float(str(text).strip())
    except (ValueError, OverflowError):
        value = float("nan")
    if not (math.isfinite(value) and 0 <= value <= _HUGE):
        form = "a size such as 8G or 512M" if unit == "bytes" else "a number such as 1e11"
        raise ConfigError(f"{what}={text[:40]!r}: expected {form} (0 turns the limit off), "
                          f"at most {_HUGE:.3g}")
    return value


def limits_from_items(items: Iterable[str], base: Limits | None = None) -> Limits:
    """``["weights=8G", "macs=1e11"]`` (``hwb compile --limit``) applied to ``base``."""
    lim = base or Limits.from_env()
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in LIMITS:
            raise ConfigError(f"--limit {item[:60]!r}: expected NAME=VALUE with NAME one of "
                              f"{', '.join(LIMITS)}")
        lim = replace(lim, **{key: parse_limit(value, LIMITS[key][3], f"--limit {key}")})
    return lim


def export_limits(lim: Limits, env: Any = None) -> None:
    """Set the environment variables to ``lim`` (a command's ``--limit``: every load in this
    process and the compile worker, which inherits the environment, see the same limits)."""
    env = os.environ if env is None else env
    for key, (var, _, _, _) in LIMITS.items():
        env[var] = repr(float(getattr(lim, key))) if LIMITS[key][3] == "count" else str(int(getattr(lim, key)))


def worker_memory() -> int:
    """The compile worker's memory limit in bytes (``HWB_WORKER_MEMORY``; default ¾ of this
    machine's memory, so a runaway compile fails with a message instead of the machine
    swapping or the OOM killer choosing a victim); ``0``: no limit."""
    text = os.environ.get(WORKER_MEMORY_ENV, "").strip()
    if text:
        return int(parse_limit(text, "bytes", WORKER_MEMORY_ENV))
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4)
    except (ValueError, OSError, AttributeError):
        return 0


# -- files, before a framework opens them ------------------------------------------------------
def file_bytes(path: Path) -> int:
    """What a model file may hold once unpacked: its size, or a zip's declared entry sizes
    (``.keras``, ``.pt2``: the central directory, read without inflating anything)."""
    size = path.stat().st_size
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                return max(size, sum(i.file_size for i in z.infolist()))
        except (zipfile.BadZipFile, OSError, ValueError):
            return size
    return size


def check_file(path: Path, name: str, limits: Limits) -> None:
    """Refuse a file whose size alone is over the weight limit, before it is parsed."""
    limits.check(Cost(weight_bytes=file_bytes(path)), name)


# -- ONNX ---------------------------------------------------------------------------------------
def onnx_external_bytes(proto: Any, base: Path | None, name: str) -> int:
    """Bytes of the external-data tensors ``proto`` declares (read without their data), each
    checked against the file it lives in: a location outside the model's directory, or a
    file shorter than the tensor, is refused here, not by a read that fails at an outside
    memory cap."""
    total = 0
    for t in _onnx_initializers(proto):
        if t.data_location != 1:  # TensorProto.EXTERNAL
            continue
        info = {kv.key: kv.value for kv in t.external_data}
        want = max(_int(info.get("length")), _numel(t.dims) * _DTYPE_BYTES.get(t.data_type, 8))
        total += want
        if base is None:
            continue
        loc = info.get("location", "")
        p = (base / loc).resolve()
        if not loc or Path(loc).is_absolute() or not p.is_relative_to(base.resolve()):
            raise ModelError(f"ONNX model {name!r}: tensor {t.name[:80]!r} keeps its data at "
                             f"{loc[:200]!r}, outside the model's directory; external data must "
                             f"sit beside the .onnx file (re-save with onnx.save(..., "
                             f"save_as_external_data=True))")
        try:
            have = p.stat().st_size
        except OSError:
            have = -1
        end = _int(info.get("offset")) + want
        if have < end:
            raise ModelError(f"ONNX model {name!r}: tensor {t.name[:80]!r} declares {fmt_bytes(want)} "
                             f"at offset {_int(info.get('offset'))} of {loc[:200]!r}, which holds "
                             f"{'nothing' if have < 0 else fmt_bytes(have)}: the external data is "
                             f"missing or incomplete; copy it beside the .onnx file or re-export")
    return min(total, _HUGE)


def onnx_cost(proto: Any, name: str, base: Path | None = None) -> Cost:
    """The cost of an ONNX graph from its declarations (``proto`` may lack its external data)."""
    import onnx

    external = onnx_external_bytes(proto, base, name)
    params = sum(_numel(t.dims) for t in _onnx_initializers(proto))
    weight = sum(_numel(t.dims) * _DTYPE_BYTES.get(t.data_type, 8) for t in _onnx_initializers(proto))
    cost = Cost(params=min(params, _HUGE), weight_bytes=min(max(weight, external), _HUGE),
                external_bytes=external)
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_weights(proto))
    except Exception as exc:  # noqa: BLE001 - an estimate is not a verdict
        cost.notes.append(f"shape inference failed ({type(exc).__name__}); activations not estimated")
        return cost
    g = inferred.graph
    shapes = {v.name: _vi_shape(v) for v in (*g.input, *g.value_info, *g.output)}
    batch = _onnx_batch(g, {t.name for t in g.initializer})
    act, macs, unknown = 0, 0.0, set()
    init_names = {t.name for t in g.initializer}
    for v in (*g.input, *g.value_info, *g.output):
        s = shapes.get(v.name)
        if s is not None and v.name not in init_names:
            act += _numel(s) * _DTYPE_BYTES.get(v.type.tensor_type.elem_type, 4)
    inits = {t.name: tuple(t.dims) for t in g.initializer}
    for node in g.node:
        m = _onnx_node_macs(node, shapes, inits)
        if m is None:
            unknown.add(node.op_type)
        else:
            macs += m
    if unknown:
        cost.notes.append(f"multiply-adds of {', '.join(sorted(unknown))} not counted")
    cost.activation_bytes = min(act // batch, _HUGE)
    cost.macs = macs / batch
    return cost


def _without_weights(proto: Any) -> Any:
    """``proto`` with each initializer reduced to its name, type and dims: what shape
    inference needs, without copying (and serializing) the weights."""
    import onnx

    light = onnx.ModelProto(ir_version=proto.ir_version)
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    g, src = light.graph, proto.graph
    g.name = src.name
    for part in ("node", "input", "output", "value_info"):
        getattr(g, part).extend(getattr(src, part))
    g.initializer.extend(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)
                         for t in src.initializer)
    return light


def _onnx_initializers(proto: Any) -> list[Any]:
    return list(proto.graph.initializer)


def _onnx_batch(g: Any, inits: set[str]) -> int:
    """The graph's fixed batch (its first real input's first dimension), 1 when symbolic."""
    for i in g.input:
        if i.name in inits:
            continue
        dims = i.type.tensor_type.shape.dim
        if len(dims) and dims[0].HasField("dim_value") and dims[0].dim_value > 1:
            return int(dims[0].dim_value)
        return 1
    return 1


def _vi_shape(v: Any) -> tuple[int, ...] | None:
    """A value's shape with symbolic dimensions as 1 (the batch), ``None`` when unknown."""
    tt = v.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(max(1, d.dim_value) if d.HasField("dim_value") else 1 for d in tt.shape.dim)


def _onnx_node_macs(node: Any, shapes: dict[str, Any], inits: dict[str, tuple[int, ...]]) -> float | None:
    """Multiply-adds of one node: the weighted ops exactly, element-wise ops as one per output."""
    def shape(i: int, outs: bool = False) -> tuple[int, ...] | None:
        names = node.output if outs else node.input
        if i >= len(names):
            return None
        return shapes.get(names[i]) or inits.get(names[i])

    out = shape(0, True)
    op = node.op_type
    if op in ("Conv", "ConvInteger", "QLinearConv"):
        w = shape(3 if op == "QLinearConv" else 1)
        return None if out is None or w is None else _numel(out) * _numel(w[1:])
    if op == "ConvTranspose":
        x, w = shape(0), shape(1)
        return None if x is None or w is None else _numel(x) * _numel(w[1:])
    if op in ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "FusedMatMul"):
        a = shape(0)
        if out is None or a is None or not a:
            return None
        k = a[0] if op == "Gemm" and any(x.name == "transA" and x.i for x in node.attribute) else a[-1]
        return _numel(out) * k
    if op in ("LSTM", "GRU", "RNN"):
        x, w, r = shape(0), shape(1), shape(2)
        if x is None or w is None or r is None:
            return None
        return x[0] * (_numel(w) + _numel(r))  # steps × (input + recurrent weights)
    return None if out is None else float(_numel(out))


# -- Keras and torch ---------------------------------------------------------------------------
def keras_cost(km: Any) -> Cost:
    """The cost of a built Keras model from its layers' shapes and weights (nothing runs)."""
    params = sum(_numel(w.shape) for w in km.weights)
    wbytes = sum(_numel(w.shape) * _itemsize(w) for w in km.weights)
    act = sum(_numel(_batchless(t.shape)) * 4 for t in km.inputs)
    macs, notes = 0.0, []
    for layer in _keras_layers(km):
        try:
            outs = layer.output if isinstance(layer.output, (list, tuple)) else [layer.output]
            ins = layer.input if isinstance(layer.input, (list, tuple)) else [layer.input]
        except (AttributeError, ValueError, RuntimeError):
            notes.append(f"layer {type(layer).__name__} has no single output shape")
            continue
        act += sum(_numel(_batchless(o.shape)) * 4 for o in outs)
        positions = _numel(_batchless(ins[0].shape)[:-1]) if ins and len(ins[0].shape) > 2 else 1
        macs += positions * sum(_numel(w.shape) for w in layer.weights if len(w.shape) >= 2)
        macs += sum(_numel(_batchless(o.shape)) for o in outs)
    return Cost(params=params, weight_bytes=wbytes, macs=macs, activation_bytes=min(act, _HUGE),
                notes=notes)


# -- Keras declarations: config.json, a Keras 2 JSON, an HDF5 model_config ---------------------
#: The largest architecture read from a Keras file (a config is a few hundred KB at most).
MAX_KERAS_CONFIG_BYTES = 16 << 20
_SAME_SHAPE = {"Dropout", "Activation", "ReLU", "LeakyReLU", "ELU", "Softmax", "PReLU",
               "BatchNormalization", "LayerNormalization", "GaussianNoise", "GaussianDropout",
               "SpatialDropout1D", "SpatialDropout2D", "ActivityRegularization", "Masking",
               "UnitNormalization", "Rescaling", "Identity"}
_RNN_GATES = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1}


def keras_declared_config(path: Path) -> dict[str, Any] | None:
    """The architecture a ``.keras`` (``config.json`` in the zip), Keras 2 ``.json`` or
    ``.h5`` (``model_config``) file declares, read without Keras: at most
    :data:`MAX_KERAS_CONFIG_BYTES`, nesting bounded; ``None`` when the file holds none (the
    loader then says what is wrong)."""
    from .user_files import MAX_JSON_DEPTH, json_depth

    def parse(raw: bytes | str) -> dict[str, Any] | None:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if json_depth(text) > MAX_JSON_DEPTH:
            raise ModelError(f"{path}: the model's architecture is nested more than "
                             f"{MAX_JSON_DEPTH} deep; refused before Keras builds it")
        try:
            cfg = json.loads(text)
        except (ValueError, RecursionError):
            return None
        return cfg if isinstance(cfg, dict) else None

    def too_big(n: int) -> ModelError:
        return ModelError(f"{path}: its architecture is {fmt_bytes(n)}; a Keras config is at "
                          f"most {fmt_bytes(MAX_KERAS_CONFIG_BYTES)}. Refused before Keras reads it")

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                try:
                    info = z.getinfo("config.json")
                except KeyError:
                    return None
                if info.file_size > MAX_KERAS_CONFIG_BYTES:
                    raise too_big(info.file_size)
                return parse(z.read(info))
        if path.suffix.lower() == ".json":
            from .user_files import read_small_file

            try:
                return parse(read_small_file(path, "Keras JSON model", MAX_KERAS_CONFIG_BYTES))
            except ConfigError as exc:
                raise ModelError(str(exc)) from None
        if path.suffix.lower() in (".h5", ".hdf5"):
            import h5py

            with h5py.File(path, "r") as f:
                raw = f.attrs.get("model_config")
            if raw is None:
                return None
            if len(raw) > MAX_KERAS_CONFIG_BYTES:
                raise too_big(len(raw))
            return parse(raw)
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    return None


def _dim(v: Any) -> int | None:
    """A declared dimension: a non-negative int (capped at the believable), else unknown."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        return None
    return min(v, _HUGE)


def _shape(v: Any) -> list[int | None] | None:
    """A declared shape with its batch: ``[null, 40000]`` → ``[None, 40000]``."""
    if not isinstance(v, list) or not v or len(v) > 16:
        return None
    return [None if d is None else _dim(d) if _dim(d) is not None else -1 for d in v]  # type: ignore[misc]


def _known(shape: list[Any] | None) -> bool:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape[1:])


def _prod(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n = min(n * d, _HUGE)
    return n


def _entry_input(layer: dict[str, Any], cfg: dict[str, Any], outputs: dict[str, Any],
                 previous: list[Any] | None) -> list[Any] | None:
    """The input shape Keras builds ``layer`` with: its ``build_config``, the shape of the
    tensor its inbound node names (Keras 3), the output of the layer named there (Keras 2),
    or the previous layer's output (a Sequential)."""
    build = layer.get("build_config")
    if isinstance(build, dict) and _shape(build.get("input_shape")) is not None:
        return _shape(build["input_shape"])
    for key in ("batch_shape", "batch_input_shape"):
        if _shape(cfg.get(key)) is not None:
            return _shape(cfg[key])
    nodes = layer.get("inbound_nodes")
    if isinstance(nodes, list) and nodes:
        node = nodes[0]
        args = node.get("args") if isinstance(node, dict) else None
        if isinstance(args, list) and args:
            t = args[0]
            t = t[0] if isinstance(t, list) and t else t
            if isinstance(t, dict) and isinstance(t.get("config"), dict):
                return _shape(t["config"].get("shape"))
        if isinstance(node, list) and node and isinstance(node[0], list) and node[0]:
            return outputs.get(str(node[0][0]))
        return None
    return previous


def _entry_cost(kind: str, cfg: dict[str, Any], shape: list[Any]) -> tuple[int, int, list[Any] | None] | None:
    """(parameters, multiply-adds, output shape) of one declared layer over input ``shape``
    (with its batch), or None for a layer the estimate does not know."""
    last = shape[-1] if len(shape) > 1 else None
    positions = _prod(shape[1:-1]) if len(shape) > 2 else 1
    if kind in _SAME_SHAPE or kind == "InputLayer":
        params = 4 * last if kind == "BatchNormalization" and last else (
            2 * last if kind == "LayerNormalization" and last else 0)
        return params, 0, shape
    if kind == "Dense":
        units = _dim(cfg.get("units"))
        if units is None or last is None:
            return None
        w = last * units
        return min(w + units, _HUGE), min(positions * w, _HUGE), [*shape[:-1], units]
    if kind == "Embedding":
        n, d = _dim(cfg.get("input_dim")), _dim(cfg.get("output_dim"))
        if n is None or d is None:
            return None
        return min(n * d, _HUGE), 0, [*shape, d]
    if kind in _RNN_GATES:
        units = _dim(cfg.get("units"))
        if units is None or last is None or len(shape) < 3:
            return None
        g = _RNN_GATES[kind]
        params = g * (last * units + units * units + units * (2 if kind == "GRU" else 1))
        out = [shape[0], shape[1], units] if cfg.get("return_sequences") else [shape[0], units]
        return min(params, _HUGE), min(positions * params, _HUGE), out
    if kind in ("Conv1D", "Conv2D"):
        filters = _dim(cfg.get("filters"))
        k = cfg.get("kernel_size")
        ks = [_dim(x) for x in (k if isinstance(k, list) else [k])]
        if filters is None or last is None or any(x is None for x in ks):
            return None
        w = _prod(ks) * last * filters  # type: ignore[arg-type]
        return min(w + filters, _HUGE), min(positions * w, _HUGE), [*shape[:-1], filters]
    if kind == "Flatten":
        return 0, 0, [shape[0], _prod(shape[1:])]
    return None


def keras_config_cost(cfg: dict[str, Any]) -> Cost:
    """The cost a Keras architecture *declares* (``config.json`` of a ``.keras``, a Keras 2
    JSON, an HDF5 ``model_config``), before Keras builds a layer: parameters of the layers
    whose weights follow from their config and input shape (Dense, Conv1D/2D, LSTM, GRU,
    SimpleRNN, Embedding, normalizations), multiply-adds, activations per sample. Other layers
    are noted and not counted, so the figures are lower bounds: enough to refuse a file that
    declares gigabytes, before a framework allocates them."""
    params, macs, act, notes = 0, 0, 0, []
    outputs: dict[str, Any] = {}

    def walk(model_cfg: Any, previous: list[Any] | None) -> list[Any] | None:
        nonlocal params, macs, act
        inner = model_cfg.get("config") if isinstance(model_cfg, dict) else None
        layers = inner if isinstance(inner, list) else (
            inner.get("layers") if isinstance(inner, dict) else None)
        if not isinstance(layers, list):
            return previous
        for layer in layers[:100_000]:
            if not isinstance(layer, dict):
                continue
            kind = str(layer.get("class_name", ""))
            cfg = layer.get("config") if isinstance(layer.get("config"), dict) else {}
            name = str(cfg.get("name", layer.get("name", "")))
            shape = _entry_input(layer, cfg, outputs, previous)
            if kind in ("Sequential", "Functional", "Model"):
                out = walk(layer, shape)
            elif not _known(shape):
                notes.append(f"layer {kind} {name!r:.40}: input shape not declared")
                out = None
            else:
                got = _entry_cost(kind, cfg, shape)  # type: ignore[arg-type]
                if got is None:
                    notes.append(f"layer {kind} {name!r:.40} not counted")
                    out = None
                else:
                    p, m, out = got
                    params, macs = min(params + p, _HUGE), min(macs + m, _HUGE)
                    act = min(act + 4 * _prod(out[1:]) if _known(out) else act, _HUGE)
            if name:
                outputs[name] = out
            previous = out
        return previous

    walk(cfg, None)
    return Cost(params=params, weight_bytes=min(4 * params, _HUGE), macs=float(macs),
                activation_bytes=act, notes=notes[:20])


def check_keras_declaration(path: Path, name: str, limits: Limits) -> None:
    """Refuse a Keras file whose declared architecture is over a limit
    (:func:`keras_config_cost`), before Keras reads it: a config that declares a
    ``Dense(40000)`` over a 40000-wide input is 6 GB of weights Keras would allocate."""
    cfg = keras_declared_config(path)
    if cfg is not None:
        limits.check(keras_config_cost(cfg), name)


def _keras_layers(km: Any) -> list[Any]:
    out = []
    for layer in getattr(km, "layers", []):
        if type(layer).__name__ == "InputLayer":
            continue
        inner = getattr(layer, "layers", None)
        out.extend(_keras_layers(layer) if inner else [layer])
    return out


def _itemsize(w: Any) -> int:
    import numpy as np

    try:
        return np.dtype(str(getattr(w, "dtype", "float32"))).itemsize
    except TypeError:
        return 4


# -- torch declarations: a torch.export archive's JSON, a torch.save zip's storages -----------
#: The largest JSON record read from a ``.pt2`` archive (a graph of 100k nodes is tens of MB).
MAX_PT2_JSON_BYTES = 64 << 20
#: Bytes per element of torch.export's ScalarType codes (torch/_export/serde/schema.py).
_PT2_DTYPE_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 2, 7: 4, 8: 8, 9: 4, 10: 8, 11: 16, 12: 1,
                    13: 2, 28: 2, 29: 1, 30: 1, 31: 1, 32: 1, 33: 1, 34: 4, 35: 8}
#: Multiply-adds of the weighted aten ops: the contraction length is the last dimension of
#: this argument (linear/mm/addmm/matmul/bmm), or the weight's elements per output channel
#: (convolutions).
_PT2_CONTRACTIONS = {"linear": 0, "mm": 0, "matmul": 0, "bmm": 0, "addmm": 1, "baddbmm": 1}
_PT2_CONVS = ("convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d")


def pt2_root(names: Iterable[str]) -> str | None:
    """The directory a ``torch.export.save`` archive keeps everything under (``"model/"``):
    where its ``archive_format`` record is; ``None`` for a zip that is not one."""
    for n in names:
        if n == "archive_format" or n.endswith("/archive_format") and n.count("/") == 1:
            return n[: -len("archive_format")]
    return None


def read_archive_json(z: zipfile.ZipFile, entry: str, path: Path) -> Any:
    """One JSON record of a model archive: at most :data:`MAX_PT2_JSON_BYTES` (its declared
    size, checked before it is inflated), nested at most ``MAX_JSON_DEPTH``; else
    :class:`ModelError`."""
    from .user_files import MAX_JSON_DEPTH, json_depth

    info = z.getinfo(entry)
    if info.file_size > MAX_PT2_JSON_BYTES:
        raise ModelError(f"{path}: its record {entry[:120]!r} is {fmt_bytes(info.file_size)}; a "
                         f"torch.export graph or weights table is at most "
                         f"{fmt_bytes(MAX_PT2_JSON_BYTES)}. Refused before torch reads it")
    with z.open(info) as f:
        raw = f.read(MAX_PT2_JSON_BYTES + 1)
    text = raw.decode("utf-8", "replace")
    if len(raw) > MAX_PT2_JSON_BYTES or json_depth(text) > MAX_JSON_DEPTH:
        raise ModelError(f"{path}: its record {entry[:120]!r} is larger or nested deeper than a "
                         f"torch.export archive writes; refused before torch reads it. "
                         f"Re-export the model with torch.export.save")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ModelError(f"{path}: its record {entry[:120]!r} is not JSON; the archive is "
                         f"damaged or not written by torch.export.save. Re-export it") from None


def _pt2_meta_numel(meta: Any) -> tuple[int, int] | None:
    """(elements, bytes) of a torch.export TensorMeta: symbolic dimensions count 1 (the
    batch); ``None`` for a value that is not one."""
    if not isinstance(meta, dict) or not isinstance(meta.get("sizes"), list):
        return None
    dims = []
    for d in meta["sizes"][:64]:
        v = d.get("as_int") if isinstance(d, dict) else None
        dims.append(v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 1)
    dtype = meta.get("dtype")
    n = _prod(dims)
    return n, min(n * _PT2_DTYPE_BYTES.get(dtype if isinstance(dtype, int) else 0, 8), _HUGE)


def _pt2_payload_bytes(z: zipfile.ZipFile, cfg: Any, directory: str) -> tuple[int, int]:
    """(elements, bytes) of a weights or constants table: per file, the larger of what its
    views declare (torch allocates a file that is absent or empty at its declared size) and
    the file's own size."""
    entries = cfg.get("config") if isinstance(cfg, dict) else None
    per_file: dict[str, tuple[int, int]] = {}
    for meta in (entries.values() if isinstance(entries, dict) else []):
        if not isinstance(meta, dict):
            continue
        file = str(meta.get("path_name", ""))[:200]
        got = _pt2_meta_numel(meta.get("tensor_meta")) or (0, 0)
        try:
            have = z.getinfo(directory + file).file_size
        except KeyError:
            have = 0
        n, b = per_file.get(file, (0, have))
        per_file[file] = (max(n, got[0]), max(b, got[1]))
    return (min(sum(n for n, _ in per_file.values()), _HUGE),
            min(sum(b for _, b in per_file.values()), _HUGE))


def torch_export_cost(z: zipfile.ZipFile, path: Path) -> Cost:
    """The cost a ``torch.export.save`` archive *declares*, read from its JSON without torch
    (no weight is read, nothing unpickled): weights and constants from their tables
    (``data/weights/*_weights_config.json``), activations per sample from the graph's tensor
    values (``models/*.json``: every tensor that is not a weight, a symbolic batch counted as
    one sample, a fixed batch divided out), multiply-adds of the weighted aten ops (linear,
    matmul, convolutions; the others one per output element)."""
    root = pt2_root(z.namelist())
    if root is None:
        return Cost(notes=["not a torch.export archive: nothing declared"])
    models = [n[len(root) + 7:-5] for n in z.namelist()
              if n.startswith(root + "models/") and n.endswith(".json") and n.count("/") == root.count("/") + 1]
    params = wbytes = act = 0
    macs, notes = 0.0, []
    for model in models[:16]:
        for table, directory in (("data/weights/{}_weights_config.json", "data/weights/"),
                                 ("data/constants/{}_constants_config.json", "data/constants/")):
            entry = root + table.format(model)
            if entry in z.NameToInfo:
                n, b = _pt2_payload_bytes(z, read_archive_json(z, entry, path), root + directory)
                params, wbytes = min(params + n, _HUGE), min(wbytes + b, _HUGE)
        doc = read_archive_json(z, f"{root}models/{model}.json", path)
        a, m, unknown = _pt2_graph_cost(doc)
        act, macs = min(act + a, _HUGE), macs + m
        if unknown:
            notes.append(f"multiply-adds of {', '.join(sorted(unknown)[:8])} not counted")
    return Cost(params=params, weight_bytes=wbytes, macs=macs, activation_bytes=act, notes=notes)


def _pt2_graph_cost(doc: Any) -> tuple[int, float, set[str]]:
    """(activation bytes per sample, multiply-adds per sample, ops not counted) of one
    serialized torch.export program."""
    gm = doc.get("graph_module") if isinstance(doc, dict) else None
    graph = gm.get("graph") if isinstance(gm, dict) else None
    sig = gm.get("signature") if isinstance(gm, dict) else None
    if not isinstance(graph, dict):
        return 0, 0.0, set()
    values = graph.get("tensor_values") if isinstance(graph.get("tensor_values"), dict) else {}
    weights, batch = set(), 1
    for spec in (sig.get("input_specs") if isinstance(sig, dict) else None) or []:
        if not isinstance(spec, dict) or not spec:
            continue
        kind, body = next(iter(spec.items()))
        arg = body.get("arg") if isinstance(body, dict) else None
        arg = arg.get("as_tensor", arg) if isinstance(arg, dict) else None
        name = arg.get("name") if isinstance(arg, dict) else None
        if kind == "user_input":
            if batch == 1 and name in values:
                first = (values[name].get("sizes") or [{}])[0] if isinstance(values[name], dict) else {}
                v = first.get("as_int") if isinstance(first, dict) else None
                batch = v if isinstance(v, int) and v > 1 else batch
        elif name is not None:
            weights.add(name)
    shapes, act = {}, 0
    for name, meta in list(values.items())[:1_000_000]:
        got = _pt2_meta_numel(meta)
        if got is None:
            continue
        shapes[name] = [d.get("as_int") if isinstance(d, dict) and isinstance(d.get("as_int"), int)
                        else 1 for d in meta["sizes"][:64]]
        if name not in weights:
            act = min(act + got[1], _HUGE)
    macs, unknown = 0.0, set()
    for node in (graph.get("nodes") if isinstance(graph.get("nodes"), list) else [])[:1_000_000]:
        m = _pt2_node_macs(node, shapes) if isinstance(node, dict) else None
        if m is None:
            unknown.add(str(node.get("target", "?") if isinstance(node, dict) else "?")[:60])
        else:
            macs += m
    return act // max(1, batch), macs / max(1, batch), unknown


def _pt2_node_macs(node: dict[str, Any], shapes: dict[str, list[int]]) -> float | None:
    """Multiply-adds of one serialized aten call (the weighted ops exactly, any other one per
    output element); ``None`` when its shapes are not declared."""
    def tensor(arg: Any) -> list[int] | None:
        t = arg.get("arg", {}).get("as_tensor") if isinstance(arg, dict) and isinstance(arg.get("arg"), dict) else None
        return shapes.get(t.get("name")) if isinstance(t, dict) else None

    ins = node.get("inputs") if isinstance(node.get("inputs"), list) else []
    outs = node.get("outputs") if isinstance(node.get("outputs"), list) else []
    first = outs[0].get("as_tensor") if outs and isinstance(outs[0], dict) else None
    out = shapes.get(first.get("name")) if isinstance(first, dict) else None
    op = str(node.get("target", "")).split(".")
    op_name = op[-2] if len(op) >= 2 else ""
    if out is None:
        return 0.0 if not outs or first is None else None  # no tensor out (a getitem of a tuple)
    if op_name in _PT2_CONTRACTIONS:
        a = tensor(ins[_PT2_CONTRACTIONS[op_name]]) if len(ins) > _PT2_CONTRACTIONS[op_name] else None
        return None if not a else float(_numel(out) * a[-1])
    if op_name in _PT2_CONVS:
        w = tensor(ins[1]) if len(ins) > 1 else None
        return None if not w else float(_numel(out) * _numel(w[1:]))
    if op_name in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
        return None
    return float(_numel(out))


def check_torch_export(z: zipfile.ZipFile, path: Path, name: str, limits: Limits) -> Cost:
    """Refuse a ``torch.export`` archive whose declared cost (:func:`torch_export_cost`) is
    over a limit, before torch reads a weight: a table that declares a 6.4 GB parameter over
    an empty file is 6.4 GB torch would allocate."""
    c = torch_export_cost(z, path)
    limits.check(c, name)
    return c


def torch_storage_cost(storages: dict[str, int], records: dict[str, int]) -> Cost:
    """The weights a ``torch.save`` zip declares: each storage the pickle names (key → the
    bytes its element count and type declare), at least the size of its record."""
    total = sum(max(b, records.get(k, 0)) for k, b in storages.items())
    return Cost(weight_bytes=min(total, _HUGE))


def torch_param_cost(state: dict[str, Any]) -> Cost:
    """Parameters and weight bytes of a torch state dict (before any call)."""
    params = sum(int(v.numel()) for v in state.values() if hasattr(v, "numel"))
    wbytes = sum(int(v.numel()) * int(v.element_size()) for v in state.values() if hasattr(v, "numel"))
    return Cost(params=params, weight_bytes=wbytes)


def torch_input_cost(base: Cost, examples: Iterable[Any]) -> Cost:
    """``base`` with the example inputs' bytes per sample as its activations (a floor)."""
    ex = list(examples)
    b = max(1, int(ex[0].shape[0])) if ex and ex[0].dim() else 1
    return replace(base, activation_bytes=sum(int(e.numel()) * int(e.element_size()) for e in ex) // b)


class TorchProbe:
    """Forward hooks on a module's leaves for one call: activation bytes and multiply-adds
    of the one-sample example call that loading makes anyway (``with TorchProbe(m) as p``)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.act = 0
        self.macs = 0.0
        self._hooks: list[Any] = []
        self.blind = False

    def __enter__(self) -> TorchProbe:
        import torch

        self._torch = torch
        self.blind = isinstance(self.module, torch.jit.ScriptModule)  # takes no hooks
        if self.blind:
            return self
        leaves = [m for m in getattr(self.module, "modules", lambda: [])()
                  if not list(m.children())]
        try:
            for m in leaves:
                self._hooks.append(m.register_forward_hook(self._hook))
        except RuntimeError:  # a module type that refuses hooks: inputs counted only
            self.__exit__()
            self.blind = True
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._hooks:
            h.remove()

    def _hook(self, mod: Any, inputs: Any, output: Any) -> None:
        torch = self._torch
        outs = [o for o in (output if isinstance(output, (tuple, list)) else [output])
                if isinstance(o, torch.Tensor)]
        self.act += sum(int(o.numel()) * int(o.element_size()) for o in outs)
        weights = [p for p in mod.parameters(recurse=False) if p.dim() >= 2]
        x = next((i for i in inputs if isinstance(i, torch.Tensor)), None)
        if not weights or x is None or not outs:
            self.macs += sum(int(o.numel()) for o in outs)
            return
        if isinstance(mod, torch.nn.RNNBase):
            positions = int(x.numel()) // max(1, int(mod.input_size))
        elif isinstance(mod, torch.nn.modules.conv._ConvNd):
            positions = int(outs[0].numel()) // max(1, int(weights[0].shape[0]))
        else:
            positions = int(x.numel()) // max(1, int(weights[0].shape[-1]))
        self.macs += positions * sum(int(w.numel()) for w in weights)

    def cost(self, base: Cost, examples: Iterable[Any], batch: int) -> Cost:
        """``base`` (parameters) with this call's figures per sample (``batch`` rows ran)."""
        act = self.act + sum(int(e.numel()) * int(e.element_size()) for e in examples)
        b = max(1, batch)
        if self.blind:
            return replace(base, activation_bytes=act // b,
                           notes=[*base.notes, "a TorchScript module: its inputs counted only"])
        return replace(base, macs=self.macs / b, activation_bytes=act // b)


def _batchless(shape: Any) -> tuple[int, ...]:
    dims = tuple(shape)[1:]
    return tuple(int(d) if isinstance(d, int) and d > 0 else 1 for d in dims)


def _numel(dims: Iterable[Any]) -> int:
    n = 1
    for d in dims:
        n *= max(0, int(d))
        if n > _HUGE:
            return _HUGE
    return n


def _int(text: Any) -> int:
    try:
        v = int(str(text))
    except (TypeError, ValueError):
        return 0
    return v if 0 <= v <= _HUGE else _HUGE
