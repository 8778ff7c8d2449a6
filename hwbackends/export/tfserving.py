"""``hwb export --format tf-serving``: a TF Serving model directory from a measured variant.

Layout (``DIR/``): ``NAME/1/`` a SavedModel whose ``serving_default`` signature takes and
returns the model's tensors by name (batch dimension -1), with
``assets.extra/tf_serving_warmup_requests`` (one PredictRequest per measured batch size);
``batching_parameters.txt``, ``models.config`` and ``README.md`` with the launch line.

TF Serving runs TensorFlow, so the SavedModel is the model itself in fp32 (a Keras model;
torch and ONNX sources have no TensorFlow form here). The batching parameters come from the
measured variant's figures, and the file's comment names that variant: measure the fp32
LiteRT or reference variant for figures closest to what TF Serving will run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UnsupportedError
from .measurements import Measured, Settings
from .textproto import comment, dumps

SIGNATURE = "serving_default"


def saved_model(model: Any, version_dir: Path, inputs: list[Any], outputs: list[Any]) -> Path:
    """Write ``model`` (a Keras model) as a SavedModel with a ``serving_default`` signature
    keyed by the served input and output names (``inputs``/``outputs``: the model's specs
    under those names, :mod:`.names`)."""
    check_servable(model)
    import keras
    import tensorflow as tf

    km = model.obj
    specs = [tf.TensorSpec([None, *s.shape], tf.float32, name=s.name) for s in inputs]
    out_names = [s.name for s in outputs]
    multi_in = len(specs) > 1

    def serve(*xs: Any) -> dict[str, Any]:
        ys = km(list(xs) if multi_in else xs[0], training=False)
        if isinstance(ys, dict):  # keyed by the model's own output names (its specs')
            ys = [ys[s.name] for s in model.outputs]
        ys = ys if isinstance(ys, (list, tuple)) else [ys]
        return {n: tf.identity(y, name=n) for n, y in zip(out_names, ys, strict=True)}

    # Keras's ExportArchive, not tf.saved_model.save of a tf.Module holding the model: with the
    # latter the TF1 session loader (TF Serving's) finds no Keras 3 variables to restore.
    archive = keras.export.ExportArchive()
    archive.track(km)
    archive.add_endpoint(SIGNATURE, serve, input_signature=specs)
    archive.write_out(str(version_dir), verbose=False)
    return version_dir


def check_servable(model: Any) -> None:
    """Refuse a model TF Serving cannot run (no TensorFlow form: torch, ONNX)."""
    if model.format != "keras":
        raise UnsupportedError(
            f"TF Serving serves TensorFlow SavedModels; {model.name!r:.80} is a {model.format} "
            f"model and hwbackends has no {model.format}→TensorFlow conversion. Export it with "
            f"--format triton (ONNX Runtime or the python backend runs it)")


def batching_text(s: Settings, m: Measured, command: str) -> str:
    """``batching_parameters.txt``: allowed sizes = every measured size up to the max (TF
    Serving pads a batch up to the next allowed size, so each batch it runs is a measured one,
    and one lone request is not padded to a larger size)."""
    allowed = sorted({*s.warmup_sizes, s.max_batch_size})
    cfg = {"max_batch_size": {"value": s.max_batch_size},
           "batch_timeout_micros": {"value": s.queue_delay_us},
           # a batch waiting in the queue holds requests past their deadline: keep the queue
           # at what the batch threads can clear in one deadline
           "max_enqueued_batches": {"value": max(1, s.instances)},
           "num_batch_threads": {"value": s.instances},
           "allowed_batch_sizes": allowed}
    return comment([f"written by: {command}"] + m.provenance() + [""] + s.why
                   + [f"num_batch_threads {s.instances} (× {s.threads} intra-op threads ≤ "
                      f"{m.cores} cores)"]) + dumps(cfg)


def models_config(name: str, base: bytes) -> str:
    """``models.config`` (ModelServerConfig) naming the one model; ``base``: its directory's
    path as the file system has it (written byte for byte, escaped)."""
    return dumps({"model_config_list": {"config": [
        {"name": name, "base_path": base, "model_platform": "tensorflow"}]}})


# -- warm-up requests: PredictionLog records, TF Serving's own format ---------------------------
def _field(num: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2)."""
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def predict_log(name: str, inputs: dict[str, np.ndarray]) -> bytes:
    """A serialized ``tensorflow.serving.PredictionLog`` holding one PredictRequest:
    PredictionLog.predict_log (6) → PredictLog.request (1) → PredictRequest {model_spec (1):
    ModelSpec {name (1), signature_name (3)}, inputs (2): map<string, TensorProto>}. The
    TensorProtos come from TensorFlow itself; the tests parse the record with TF Serving's
    own ``prediction_log_pb2``."""
    import tensorflow as tf

    spec = _field(1, name.encode()) + _field(3, SIGNATURE.encode())
    req = _field(1, spec)
    for k, x in inputs.items():
        tp = tf.make_tensor_proto(x).SerializeToString()
        req += _field(2, _field(1, k.encode()) + _field(2, tp))
    return _field(6, _field(1, req))


def warmup_file(path: Path, name: str, inputs: list[Any], sizes: tuple[int, ...]) -> Path:
    """``assets.extra/tf_serving_warmup_requests``: one request per batch size, a TFRecord."""
    import tensorflow as tf

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(path)) as w:
        for b in sizes:
            w.write(predict_log(name, {s.name: rng.standard_normal(s.batched(b)).astype(np.float32)
                                       for s in inputs}))
    return path


def readme(name: str, variant: str) -> str:
    return (f"# {name} for TensorFlow Serving\n\n"
            f"Written by `hwb export` from the measurements of {variant} (see the comment in "
            f"batching_parameters.txt). The SavedModel in `{name}/1/` is the model in fp32; its "
            f"`{SIGNATURE}` signature takes and returns the model's tensors by name.\n\n"
            "Launch (from this directory):\n\n"
            "```\n"
            f"tensorflow_model_server --port=8500 --rest_api_port=8501 "
            f"--model_config_file=$PWD/models.config --enable_batching "
            f"--batching_parameters_file=$PWD/batching_parameters.txt\n"
            "```\n\n"
            "The warm-up requests in `assets.extra/` run once per measured batch size at load. "
            "`models.config` names this directory by its absolute path: edit `base_path` "
            "when you move it (in a container, `/models/NAME`).\n")

