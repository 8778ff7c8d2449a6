"""Keras 3 → TFLite flatbuffer, shared by ``cpu.litert`` and ``tpu.edgetpu``.

Findings on TF 2.21 + Keras 3.15 (see docs/targets.md):
- no combination of converter entry point and flags yields the fused
  ``UNIDIRECTIONAL_SEQUENCE_LSTM`` op for a Keras 3 LSTM: Keras 3 no longer marks its
  recurrent kernels with the ``tf._implements`` attribute the fusion pass looks for;
- a dynamic batch dimension fails (``TensorListReserve`` needs a static element shape);
  a static batch gives a ``WHILE`` loop (27 µs for the zoo LSTM) whose full-int8 conversion
  segfaults the converter;
- unrolling the recurrence over the (static) window gives plain FULLY_CONNECTED/LOGISTIC/TANH
  ops: 2.1× faster (12.7 µs) and full-int8 converts. So ``recurrent="unroll"`` is the default.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import numpy as np

from hwbackends.contract import UnsupportedError, keras_call_input, several

RECURRENT = ("LSTM", "GRU", "SimpleRNN")


def static_clone(km: Any, batch: int, unroll: bool = False, names: list[str] | None = None) -> Any:
    """The Keras model with a static batch on every input (named ``names`` when given) and,
    if asked, unrolled recurrent layers; its inputs have ``km.input``'s structure."""
    import keras

    def clone_layer(layer: Any) -> Any:
        cfg = layer.get_config()
        if unroll and type(layer).__name__ in RECURRENT:
            cfg["unroll"] = True
        return type(layer).from_config(cfg)

    names = names or [None] * len(km.inputs)
    flat = [keras.Input(tuple(t.shape[1:]), batch_size=batch, name=n)
            for t, n in zip(km.inputs, names, strict=True)]
    clone = keras.models.clone_model(km, input_tensors=keras_call_input(km, flat),
                                     clone_function=clone_layer)
    clone.set_weights(km.get_weights())
    return clone


def has_recurrent(km: Any) -> bool:
    return any(type(l).__name__ in RECURRENT for l in getattr(km, "_flatten_layers", lambda: km.layers)())


def to_tflite(km: Any, precision: str, batch: int, inputs: Sequence[Any], outputs: Sequence[Any],
              calibration: tuple[np.ndarray, ...] | np.ndarray | None = None,
              recurrent: str = "unroll", target: str = "cpu.litert", int8_io: bool = False) -> bytes:
    """The Keras model ``km`` (inputs/outputs described by the specs ``inputs``/``outputs``)
    as a TFLite flatbuffer with a static batch: fp32, fp16, int8-dynamic, or full int8
    calibrated on ``calibration`` (one array per input, in ``inputs`` order; a bare array for
    a single input). ``recurrent="unroll"`` unrolls LSTM/GRU/SimpleRNN over the window (see
    the module's doc). Variables are frozen (no trackable object), which leaves the flatbuffer
    without a SignatureDef: its input tensors carry the specs' names and its outputs are named
    ``Identity``, ``Identity_1``, … in the model's output order; :func:`io_tensors` maps them
    by those names, never by the flatbuffer's tensor order."""
    import keras
    import tensorflow as tf

    if precision not in ("fp32", "fp16", "int8-dynamic", "int8"):
        raise UnsupportedError(f"{target} has no precision {precision!r}; use fp32, fp16, "
                               f"int8-dynamic or int8")
    if len(km.inputs) != len(inputs):
        raise UnsupportedError(f"{target}: the Keras model has {len(km.inputs)} input(s), its "
                               f"specs declare {len(inputs)}")
    model = static_clone(km, batch, unroll=(recurrent == "unroll"), names=[s.name for s in inputs])
    sig = [tf.TensorSpec([batch, *s.shape], tf.float32, name=s.name) for s in inputs]
    names = [s.name for s in outputs]

    @tf.function(input_signature=sig)
    def serve(*xs: Any) -> Any:
        ys = keras.tree.flatten(model(keras_call_input(model, list(xs)), training=False))
        if len(ys) != len(names):
            raise UnsupportedError(f"{target}: the model returns {len(ys)} tensors, its specs "
                                   f"declare {len(names)} ({', '.join(names)})")
        return list(ys)

    concrete = serve.get_concrete_function()
    # No trackable object: the variables are frozen into constants (no VAR_HANDLE ops); with
    # one, the converter keeps them as resource variables and the interpreter returned NaN.
    conv = _converter(tf, concrete, precision)
    if precision == "int8":
        data = _calibration(calibration, inputs, batch, target)
        # one input: nothing to order (and no float conversion to read the order from)
        order = [0] if len(inputs) == 1 else _converter_input_order(
            tf, concrete, [s.name for s in inputs], target)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = _representative(data, order, batch)
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if int8_io:
            conv.inference_input_type = tf.int8
            conv.inference_output_type = tf.int8
    try:
        return conv.convert()
    except Exception as exc:
        raise UnsupportedError(_explain(exc, km, concrete, target, precision)) from exc


def _layers_with_ops(km: Any, concrete: Any, ops: set[str]) -> list[str]:
    """Keras layers whose TF graph contains one of ``ops`` (node names carry layer scopes)."""
    gd = concrete.graph.as_graph_def()
    nodes = list(gd.node) + [n for f in gd.library.function for n in f.node_def]
    hits = [n.name for n in nodes if n.op in ops]
    names = {l.name for l in km.layers}
    found = []
    for h in hits:
        for part in re.split(r"[/_]\d*/|/", h):
            base = re.sub(r"_\d+$", "", part)
            if base in names and base not in found:
                found.append(base)
    return found


def _explain(exc: Exception, km: Any, concrete: Any, target: str, precision: str) -> str:
    msg = str(exc)
    ops = sorted(set(re.findall(r"'tf\.(\w+)' op", msg)))
    try:
        layers = _layers_with_ops(km, concrete, set(ops))
    except Exception:  # naming the layer is a courtesy; the op names are the essential part
        layers = []
    parts = [f"{target}:{precision} cannot convert model {km.name!r}"]
    if layers:
        parts.append(f"layer(s) {', '.join(layers)}")
    if ops:
        parts.append(f"TensorFlow op(s) {', '.join(ops)} have no TFLite builtin")
    first = next((ln for ln in msg.splitlines() if "error" in ln.lower()), msg.splitlines()[0] if msg else "")
    parts.append(f"converter said: {first[:400]}")
    return "; ".join(parts) + (". Replace that layer with supported ops, or try another target "
                               "(cpu.onnxruntime, see `hwb targets`)")


def op_names(tflite: bytes) -> list[str]:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=tflite)
    return sorted({d["op_name"] for d in it._get_ops_details()})


def _calibration(calibration: Any, inputs: Sequence[Any], batch: int,
                 target: str) -> tuple[np.ndarray, ...]:
    """The calibration tuple checked against the specs: one array per input, same length."""
    names = [s.name for s in inputs]
    if len(inputs) == 1 and isinstance(calibration, np.ndarray):  # one input: a bare array will do
        calibration = (calibration,)
    if not isinstance(calibration, tuple) or len(calibration) != len(inputs):
        got = (f"{len(calibration)} array(s)" if isinstance(calibration, tuple)
               else type(calibration).__name__)
        raise UnsupportedError(f"{target}:int8 needs representative calibration data with one "
                               f"array per input ({', '.join(names)}); got {got}")
    data = tuple(np.ascontiguousarray(a, dtype=np.float32) for a in calibration)
    if len({len(a) for a in data}) != 1 or len(data[0]) < batch:
        raise UnsupportedError(f"{target}:int8 calibration arrays must all hold the same number "
                               f"(≥ batch_size {batch}) of samples; got "
                               f"{[len(a) for a in data]} for {names}")
    return data


def _converter_input_order(tf: Any, concrete: Any, names: list[str], target: str) -> list[int]:
    """For each of the converter's inputs, in its order, the index of the spec it is.

    The calibrator feeds ``representative_dataset``'s list positionally, in the order of the
    float model's subgraph inputs — which need not be the function's argument order (the
    converter may order them by name). So the order is read from the float flatbuffer of the
    same concrete function, whose input tensors carry the specs' names."""
    from ai_edge_litert.interpreter import Interpreter

    blob = tf.lite.TFLiteConverter.from_concrete_functions([concrete]).convert()
    found = [d["name"] for d in Interpreter(model_content=blob).get_input_details()]
    order = []
    for n in found:
        hits = [i for i, want in enumerate(names) if n == want or n.split(":")[0] == want]
        if len(hits) != 1:
            raise UnsupportedError(f"{target}:int8 cannot match the converter's input {n!r} to "
                                   f"one of the model's inputs {names}; rename the Keras inputs "
                                   f"(keras.Input(name=…)) to distinct plain names")
        order.append(hits[0])
    if sorted(order) != list(range(len(names))):
        raise UnsupportedError(f"{target}:int8: the converter's inputs {found} are not the "
                               f"model's inputs {names}")
    return order


def _representative(data: tuple[np.ndarray, ...], order: list[int],
                    batch: int) -> Callable[[], Any]:
    """Batches of every input, listed in the converter's input order."""
    n = max(1, len(data[0]) // batch)

    def gen() -> Any:
        for i in range(n):
            yield [data[k][i * batch:(i + 1) * batch] for k in order]
    return gen


def io_tensors(input_details: list[dict[str, Any]], output_details: list[dict[str, Any]],
               inputs: Sequence[Any], outputs: Sequence[Any]) -> tuple[list[int], list[int]]:
    """Tensor indices for each input/output spec: the only ones of a flatbuffer with one
    tensor each way, else by name as :func:`to_tflite` writes them (inputs: the spec's name;
    outputs: ``Identity``, ``Identity_1``, … in order)."""
    if not several(inputs, outputs) and len(input_details) == len(output_details) == 1:
        return [input_details[0]["index"]], [output_details[0]["index"]]
    by_name = {d["name"]: d["index"] for d in [*input_details, *output_details]}
    want_in = [s.name for s in inputs]
    want_out = ["Identity" if i == 0 else f"Identity_{i}" for i in range(len(outputs))]
    missing = [n for n in [*want_in, *want_out] if n not in by_name]
    if missing:
        raise UnsupportedError(f"the LiteRT model has no tensor(s) named {missing} (it has "
                               f"{sorted(by_name)}); it was not built by this version of "
                               f"cpu.litert: recompile it (hwb compile --rebuild)")
    return [by_name[n] for n in want_in], [by_name[n] for n in want_out]


def _converter(tf: Any, concrete: Any, precision: str) -> Any:
    """A TFLite converter for ``concrete`` with the weight-only precisions set (fp16,
    int8-dynamic); full int8 needs calibration and is set up by the caller."""
    conv = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    if precision in ("fp16", "int8-dynamic"):
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if precision == "fp16":
        conv.target_spec.supported_types = [tf.float16]
    return conv
