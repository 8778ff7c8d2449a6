"""``hwb export``: settings from measurements, the Triton and TF Serving layouts,
their files parsed with the servers' own protos, the SavedModel and the python-backend model
run against the source model, and the errors.

The measurements come from a real (short) ``bench_model`` batch sweep of ``two_head`` (two
inputs, two outputs) on cpu.litert and cpu.onnxruntime. The servers' proto modules are not
dependencies of hwbackends: ``tritonclient`` and ``tensorflow-serving-api`` are installed with
``--no-deps`` into a cached directory (``HWB_EXPORT_PYLIBS``, default
``~/.cache/hwbackends-export/pylibs``); where pip cannot reach them those checks skip with the
reason. TF Serving's API lacks the batching message: ``BatchingParameters`` is rebuilt here
from session_bundle_config.proto's field list and the file parsed against it. The real Triton
server is tests/test_export_triton.py (slow)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hwbackends.context import RunContext
from hwbackends.errors import ConfigError, InputError, UnsupportedError
from hwbackends.export import export
from hwbackends.export.measurements import Measured, SizeCost, plan, read_measurements

PYLIBS_PINS = ("tritonclient==2.51.0", "tensorflow-serving-api==2.21.0")


# -- measurement → settings (pure) ---------------------------------------------------------------
def _measured(rows: list[tuple[int, float, float]], cores: int = 4) -> Measured:
    """Hand-written figures as a test input for the arithmetic (not a measurement claim)."""
    return Measured("cpu.x:fp32", "box", cores, "hardware",
                    tuple(SizeCost(b, p50, p99, 1000, "batch") for b, p50, p99 in rows), "cmd", "r.json")


def test_preferred_sizes_are_where_cost_per_row_drops():
    m = _measured([(1, 10.0, 20.0), (2, 25.0, 40.0), (8, 40.0, 60.0), (32, 200.0, 300.0)])
    s = plan(m)
    # per row: 10, 12.5 (dearer: not preferred), 5, 6.25 (dearer than 8's 5)
    assert s.preferred == (8,)
    assert s.max_batch_size == 32 and s.warmup_sizes == (1, 2, 8, 32)
    assert s.queue_delay_us == 20 and s.timeout_us is None  # no deadline: one batch-1 p99
    assert s.instances == 4 and s.threads == 1


def test_deadline_caps_max_batch_and_sets_delay_and_timeout():
    m = _measured([(1, 10.0, 20.0), (8, 40.0, 60.0), (32, 200.0, 300.0)])
    s = plan(m, deadline_us=100.0)
    assert s.max_batch_size == 8 and s.preferred == (8,)
    assert s.queue_delay_us == 20 and s.timeout_us == 100  # (100 − p99 60 at batch 8) / 2
    assert any("over the deadline" in w for w in s.why)
    with pytest.raises(UnsupportedError, match="already exceeds the strategy's deadline"):
        plan(m, deadline_us=15.0)


def test_preferred_never_above_max_batch_size():
    m = _measured([(1, 10.0, 20.0), (8, 40.0, 60.0), (32, 100.0, 150.0)])
    s = plan(m, max_batch=8)
    assert s.max_batch_size == 8 and max(s.preferred) <= 8


def test_bad_batch_and_thread_requests_are_clear_errors():
    m = _measured([(1, 10.0, 20.0), (8, 40.0, 60.0)], cores=2)
    with pytest.raises(UnsupportedError, match="beyond the engine's optimization profile"):
        plan(m, max_batch=16, engine_max=8)
    with pytest.raises(InputError, match="beyond the largest measured batch size 8"):
        plan(m, max_batch=16)
    with pytest.raises(ConfigError, match="oversubscribed"):
        plan(m, threads=2, instances=2)
    assert plan(m, threads=2).instances == 1


# -- a real measurement --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def measured_file(tmp_path_factory, zoo_model, store_dir) -> Path:
    from hwbackends.bench.harness import bench_model
    from hwbackends.bench.scenarios import Batch

    res = bench_model(zoo_model("two_head"), ["cpu.litert", "cpu.onnxruntime"], ["fp32"],
                      [Batch(sizes=(1, 4, 16), n=200, max_s=0.5, warmup=20)],
                      context=RunContext.at(store_dir), bars=False)
    res.command = "bench_model(two_head, cpu.litert+cpu.onnxruntime, batch 1/4/16) in tests/test_export.py"
    return res.save(tmp_path_factory.mktemp("export-results") / "r.json")


@pytest.fixture(scope="module")
def pylibs(tmp_path_factory) -> Path:
    """tritonclient and tensorflow-serving-api (--no-deps) in a cached directory, or skip."""
    d = Path(os.environ.get("HWB_EXPORT_PYLIBS",
                            Path.home() / ".cache" / "hwbackends-export" / "pylibs"))
    stamp = d / ".installed"
    if not stamp.exists() or stamp.read_text() != " ".join(PYLIBS_PINS):
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--upgrade", "--target", str(d), *PYLIBS_PINS],
                           capture_output=True, text=True, timeout=300)
        if r.returncode:
            pytest.skip(f"cannot install {', '.join(PYLIBS_PINS)} for the proto checks: "
                        f"{r.stderr.strip()[-300:]}")
        stamp.write_text(" ".join(PYLIBS_PINS))
    return d


def _triton_proto(pylibs: Path):
    """Triton's ModelConfig, from tritonclient's generated module (loaded by path: the
    package's own __init__ wants its grpc extra, which is not installed here)."""
    spec = importlib.util.spec_from_file_location(
        "_hwb_triton_model_config_pb2", pylibs / "tritonclient" / "grpc" / "model_config_pb2.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _parse_triton(pylibs: Path, path: Path):
    from google.protobuf import text_format

    mc = _triton_proto(pylibs)
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def _load_runner(version_dir: Path):
    spec = importlib.util.spec_from_file_location("_hwb_exported_model", version_dir / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Runner(version_dir)


def _inputs(model, n: int, seed: int = 3) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s.batched(n)).astype(np.float32) for s in model.inputs)


def test_read_measurements_from_a_bench_file(measured_file, zoo_model):
    got = read_measurements(measured_file, "cpu.litert:fp32", zoo_model("two_head"))
    (m,) = got.values()
    assert [s.batch for s in m.sizes] == [1, 4, 16] and m.cores >= 1
    assert "bench_model(two_head" in m.command
    with pytest.raises(InputError, match="no closed-loop .* of cpu.litert:int8"):
        read_measurements(measured_file, "cpu.litert:int8")
    with pytest.raises(InputError, match="measured model 'two_head'"):
        read_measurements(measured_file, "cpu.litert:fp32", zoo_model("mlp"))


def test_triton_python_backend_two_head(measured_file, zoo_model, store_dir, tmp_path, pylibs):
    m = zoo_model("two_head")
    res = export(m, "cpu.litert", "triton", tmp_path, results=measured_file, store=store_dir)
    root = tmp_path / "two_head"
    cfg = _parse_triton(pylibs, root / "config.pbtxt")
    s = next(iter(res.settings.values()))
    assert cfg.backend == "python" and cfg.max_batch_size == s.max_batch_size == 16
    assert [i.name for i in cfg.input] == ["features", "state"]
    assert [o.name for o in cfg.output] == ["signal", "confidence"]
    assert list(cfg.input[0].dims) == [16] and list(cfg.input[1].dims) == [4]
    assert list(cfg.dynamic_batching.preferred_batch_size) == list(s.preferred)
    assert all(b <= cfg.max_batch_size for b in cfg.dynamic_batching.preferred_batch_size)
    assert [w.batch_size for w in cfg.model_warmup] == [1, 4, 16]
    assert cfg.instance_group[0].count * s.threads <= os.cpu_count()
    text = (root / "config.pbtxt").read_text()
    assert "# measured: cpu.litert:fp32" in text and "p99" in text and m.fingerprint in text
    assert "bench_model" not in text  # the results file's command is not written: no free text
    assert sorted(p.name for p in (root / "1").iterdir()) == ["b1", "b16", "b4", "hwb_model.json",
                                                               "hwb_runtime.py", "model.py"]
    # the runner beside model.py is the target's own (the core's model.py runs no framework)
    from hwbackends.registry import get_registry

    shipped = get_registry().target("cpu.litert").triton().runtime
    assert (root / "1" / "hwb_runtime.py").read_bytes() == shipped.read_bytes()
    # model.py's runner (what the python backend calls) answers as the source model, at a
    # batch no artifact was compiled for (3: padded into the batch-4 artifact)
    runner = _load_runner(root / "1")
    xs = _inputs(m, 3)
    ys = runner.run(list(xs))
    ref = m.reference(xs)
    for y, r in zip(ys, ref, strict=True):
        np.testing.assert_allclose(y, r, atol=1e-5)


def test_triton_onnxruntime_native_two_head(measured_file, zoo_model, store_dir, tmp_path, pylibs):
    import onnxruntime as ort

    m = zoo_model("two_head")
    export(m, "cpu.onnxruntime", "triton", tmp_path, results=measured_file, store=store_dir,
           config=_strategies(tmp_path, 5000), strategy="s")
    root = tmp_path / "two_head"
    cfg = _parse_triton(pylibs, root / "config.pbtxt")
    assert cfg.backend == "onnxruntime"
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params == {"intra_op_thread_count": "1", "inter_op_thread_count": "1"}
    q = cfg.dynamic_batching.default_queue_policy
    reject = _triton_proto(pylibs).ModelQueuePolicy.REJECT
    assert q.default_timeout_microseconds == 5000 and q.timeout_action == reject
    m16 = read_measurements(measured_file, "cpu.onnxruntime:fp32")
    p99 = next(iter(m16.values())).at(cfg.max_batch_size).p99_us
    assert cfg.dynamic_batching.max_queue_delay_microseconds == int((5000 - p99) / 2)
    # model.onnx: the model's tensor names, any batch size
    sess = ort.InferenceSession(str(root / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["features", "state"]
    xs = _inputs(m, 7)
    got = sess.run(["signal", "confidence"], {"features": xs[0], "state": xs[1]})
    for y, r in zip(got, m.reference(xs), strict=True):
        np.testing.assert_allclose(y, r, atol=1e-5)


def test_triton_python_backend_xla(zoo_model, store_dir, tmp_path, pylibs):
    """tpu.xla (here XLA:cpu, emulated) through model.py's jax runner, two inputs and outputs."""
    from hwbackends.bench.harness import bench_model
    from hwbackends.bench.scenarios import Batch

    m = zoo_model("two_head")
    res = bench_model(m, ["tpu.xla"], ["fp32"], [Batch(sizes=(1, 4), n=100, max_s=0.3, warmup=10)],
                      context=RunContext.at(store_dir), bars=False)
    results = res.save(tmp_path / "r.json")
    export(m, "tpu.xla", "triton", tmp_path / "repo", results=results, store=store_dir)
    root = tmp_path / "repo" / "two_head"
    cfg = _parse_triton(pylibs, root / "config.pbtxt")
    assert cfg.backend == "python" and cfg.max_batch_size == 4
    assert "(emulated)" in (root / "config.pbtxt").read_text()
    runner = _load_runner(root / "1")
    xs = _inputs(m, 3)
    for y, r in zip(runner.run(list(xs)), m.reference(xs), strict=True):
        np.testing.assert_allclose(y, r, atol=1e-5)


def _strategies(d: Path, p99_us: float) -> Path:
    p = d / "strategies.toml"
    p.write_text(f'[tiers.t]\np99_us = {p99_us}\n\n[strategies.s]\nmodel = "zoo:two_head"\n'
                 f'tier = "t"\ntargets = ["cpu.*"]\n')
    return p


def test_tensorrt_plan_config_parses(pylibs, zoo_model, tmp_path):
    """gpu.tensorrt cannot build here: its Triton form writes ``model.plan`` from an artifact
    of a static-batch engine (a stand-in file; no engine is run), binds the engine's tensor
    names, and the config the core writes from it parses with Triton's proto."""
    from hwbackends.export.triton import TritonModel, config_text
    from hwbackends.registry import get_registry
    from hwbackends.target import Artifact

    form = get_registry().target("gpu.tensorrt").triton()
    assert form.native_backend and form.one_batch and form.runtime is None
    m = zoo_model("two_head")
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / form.artifact_file).write_bytes(b"engine")
    art = Artifact(tmp_path / "art", "k", "gpu.tensorrt", "fp32", m.fingerprint, 8, m.inputs,
                   m.outputs, meta={"io": {"inputs": ["in_a", "in_b"], "outputs": ["y0", "y1"]},
                                    "bound_to": {"tensorrt": "10.x"}})
    with pytest.raises(UnsupportedError, match="not built with VERSION_COMPATIBLE"):
        form.check(art, True)
    form.check(art, False)

    class Compiled:
        artifact = art
    f = form.native(tmp_path / "1", {8: Compiled()}, m.inputs, m.outputs, 1)
    assert [p.name for p in f.files] == ["model.plan"] and f.files[0].read_bytes() == b"engine"
    assert any("TensorRT 10.x" in n for n in f.notes)
    s = plan(_measured([(1, 10.0, 20.0), (8, 40.0, 60.0)]), max_batch=8, engine_max=8)
    tm = TritonModel.native("th", m.inputs, m.outputs, f, 1)
    p = tmp_path / "config.pbtxt"
    p.write_text(config_text(tm, s, f.notes))
    cfg = _parse_triton(pylibs, p)
    assert cfg.platform == "tensorrt_plan" and cfg.max_batch_size == 0
    assert [i.name for i in cfg.input] == ["in_a", "in_b"]
    assert list(cfg.input[0].dims) == [8, 16] and not cfg.HasField("dynamic_batching")
    assert cfg.instance_group[0].kind == _triton_proto(pylibs).ModelInstanceGroup.KIND_GPU


def test_a_preferred_size_above_max_is_never_written(zoo_model):
    """Triton's core refuses to load such a config: the writer refuses it first."""
    from dataclasses import replace

    from hwbackends.export.triton import TritonModel, config_text

    m = zoo_model("two_head")
    s = replace(plan(_measured([(1, 10.0, 20.0), (8, 40.0, 60.0)])), preferred=(16,))
    tm = TritonModel("th", m.inputs, m.outputs, {"backend": "python"}, 1)
    with pytest.raises(UnsupportedError, match="exceeds max_batch_size 8"):
        config_text(tm, s, [])


def test_fleet_file_gives_one_config_per_machine(measured_file, zoo_model, store_dir, tmp_path, pylibs):
    """A fleet results file: the same profiles tagged with two machines (a copy of the real
    measurement, relabelled, as the fleet runner tags rows), one configs/<machine>.pbtxt each."""
    from hwbackends.bench.results import BenchResults

    res = BenchResults.load(measured_file)
    rows = []
    for label, cores in (("alpha", 2), ("beta", 1)):
        for p in res.profiles:
            d = p.to_dict()
            d["machine"] = dict(d["machine"], label=label, node_id=label, usable_cores=cores)
            rows.append(type(p).from_dict(d))
    res.profiles = rows
    fleet = res.save(tmp_path / "fleet.json")
    out = export(zoo_model("two_head"), "cpu.onnxruntime", "triton", tmp_path / "repo",
                 results=fleet, store=store_dir)
    root = tmp_path / "repo" / "two_head"
    assert sorted(p.name for p in (root / "configs").iterdir()) == ["alpha.pbtxt", "beta.pbtxt"]
    assert _parse_triton(pylibs, root / "configs" / "beta.pbtxt").instance_group[0].count == 1
    assert _parse_triton(pylibs, root / "configs" / "alpha.pbtxt").instance_group[0].count == 2
    assert "on beta, 1 cores" in (root / "configs" / "beta.pbtxt").read_text()
    assert set(out.settings) == {"alpha", "beta"}


# -- TF Serving ------------------------------------------------------------------------------------
def _batching_parameters_class():
    """TF Serving's BatchingParameters (session_bundle_config.proto, package
    tensorflow.serving), rebuilt from its field list: tensorflow-serving-api ships no module
    for it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="hwb_test/session_bundle_config.proto", package="tensorflow.serving",
        syntax="proto3", dependency=["google/protobuf/wrappers.proto"])
    msg = fdp.message_type.add(name="BatchingParameters")
    for name, num, typ in (("max_batch_size", 1, ".google.protobuf.Int64Value"),
                           ("batch_timeout_micros", 2, ".google.protobuf.Int64Value"),
                           ("max_enqueued_batches", 3, ".google.protobuf.Int64Value"),
                           ("num_batch_threads", 4, ".google.protobuf.Int64Value"),
                           ("thread_pool_name", 5, ".google.protobuf.StringValue")):
        msg.field.add(name=name, number=num, type=F.TYPE_MESSAGE, type_name=typ,
                      label=F.LABEL_OPTIONAL)
    msg.field.add(name="allowed_batch_sizes", number=6, type=F.TYPE_INT64, label=F.LABEL_REPEATED)
    msg.field.add(name="pad_variable_length_inputs", number=7, type=F.TYPE_BOOL,
                  label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))


def test_tf_serving_two_head(measured_file, zoo_model, store_dir, tmp_path, pylibs):
    import tensorflow as tf
    from google.protobuf import text_format

    m = zoo_model("two_head")
    res = export(m, "cpu.litert", "tf-serving", tmp_path, results=measured_file, store=store_dir)
    s = next(iter(res.settings.values()))
    bp = text_format.Parse((tmp_path / "batching_parameters.txt").read_text(),
                           _batching_parameters_class()())
    assert bp.max_batch_size.value == s.max_batch_size == 16
    assert bp.batch_timeout_micros.value == s.queue_delay_us
    sizes = list(bp.allowed_batch_sizes)
    assert sizes == sorted(set(sizes)) and sizes[-1] == bp.max_batch_size.value
    assert bp.num_batch_threads.value * s.threads <= os.cpu_count()
    assert "# measured: cpu.litert:fp32" in (tmp_path / "batching_parameters.txt").read_text()
    sys.path.insert(0, str(pylibs))
    try:
        from tensorflow_serving.apis import prediction_log_pb2
        from tensorflow_serving.config import model_server_config_pb2
    finally:
        sys.path.remove(str(pylibs))
    mc = text_format.Parse((tmp_path / "models.config").read_text(),
                           model_server_config_pb2.ModelServerConfig())
    assert mc.model_config_list.config[0].name == "two_head"
    assert Path(mc.model_config_list.config[0].base_path) == (tmp_path / "two_head").resolve()
    vdir = tmp_path / "two_head" / "1"
    logs = [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in
            tf.data.TFRecordDataset(str(vdir / "assets.extra" / "tf_serving_warmup_requests"))]
    assert [tf.make_ndarray(x.predict_log.request.inputs["features"]).shape[0] for x in logs] == [1, 4, 16]
    assert logs[0].predict_log.request.model_spec.signature_name == "serving_default"
    assert "tensorflow_model_server" in (tmp_path / "README.md").read_text()
    # the SavedModel: TF2 loader, keys = the model's tensor names, batch -1, equal to the source
    xs = _inputs(m, 5)
    ref = m.reference(xs)
    sig = tf.saved_model.load(str(vdir)).signatures["serving_default"]
    assert set(sig.structured_input_signature[1]) == {"features", "state"}
    assert sig.structured_input_signature[1]["features"].shape.as_list() == [None, 16]
    got = sig(features=tf.constant(xs[0]), state=tf.constant(xs[1]))
    assert set(got) == {"signal", "confidence"}
    for name, r in zip(("signal", "confidence"), ref, strict=True):
        np.testing.assert_allclose(got[name].numpy(), r, atol=1e-5)
    # ... and the TF1 session loader TF Serving itself uses
    g = tf.Graph()
    with tf.compat.v1.Session(graph=g) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(vdir))
        sd = meta.signature_def["serving_default"]
        feeds = {sd.inputs[k].name: x for k, x in zip(("features", "state"), xs, strict=True)}
        outs = sess.run([sd.outputs["signal"].name, sd.outputs["confidence"].name], feeds)
    for y, r in zip(outs, ref, strict=True):
        np.testing.assert_allclose(y, r, atol=1e-5)


# -- errors ---------------------------------------------------------------------------------------
def test_errors_say_what_to_do(measured_file, zoo_model, store_dir, tmp_path):
    m = zoo_model("two_head")
    with pytest.raises(UnsupportedError, match="no Triton backend and no python-backend flavour"):
        export(m, "fpga.hls4ml", "triton", tmp_path, results=measured_file, store=store_dir)
    with pytest.raises(UnsupportedError, match="no native Triton backend; use --flavour python"):
        export(m, "cpu.litert", "triton", tmp_path, results=measured_file, flavour="native")
    with pytest.raises(InputError, match="beyond the largest measured batch size 16"):
        export(m, "cpu.litert", "triton", tmp_path, results=measured_file, max_batch_size=64)
    with pytest.raises(UnsupportedError, match="exports no format|unknown export format 'c'"):
        export(m, "cpu.litert", "c", tmp_path)
    with pytest.raises(UnsupportedError, match="already exceeds the strategy's deadline"):
        export(m, "cpu.litert", "triton", tmp_path, results=measured_file,
               config=_strategies(tmp_path, 0.5), strategy="s")
    with pytest.raises(ConfigError, match="has no strategy 'nope'"):
        export(m, "cpu.litert", "triton", tmp_path, results=measured_file,
               config=_strategies(tmp_path, 100), strategy="nope")
    with pytest.raises(UnsupportedError, match="TF Serving serves TensorFlow SavedModels"):
        from hwbackends.export.tfserving import saved_model
        torch_m = zoo_model("mlp_torch")
        saved_model(torch_m, tmp_path / "x", torch_m.inputs, torch_m.outputs)


def test_cli_export_json(measured_file, store_dir, tmp_path, hwb_cli):
    rc, out, err = hwb_cli("export", "zoo:two_head", "-t", "cpu.onnxruntime:fp32", "--format",
                           "triton", "-r", str(measured_file), "-o", str(tmp_path),
                           "--cache-dir", str(store_dir), "--json")
    assert rc == 0, err
    d = json.loads(out)
    (s,) = d["settings"].values()
    assert s["max_batch_size"] == 16 and any(f.endswith("model.onnx") for f in d["files"])
    rc, out, err = hwb_cli("export", "zoo:two_head", "-t", "ref", "--format", "triton",
                           "-r", str(measured_file), "-o", str(tmp_path))
    assert rc == 1 and "UnsupportedError" in err and "no python-backend flavour" in err


# -- every CPU variant of the zoo (slow: about 80 compiles) ---------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "lstm", "conv1d", "signal", "mlp_torch", "lstm_torch",
                                  "two_head"])
def test_every_cpu_variant_of_the_zoo_exports(name, zoo_model, store_dir, tmp_path, pylibs):
    """Each CPU variant bench_model can build (batch 1 and 4, measured for real) exports to
    Triton: the config parses with Triton's proto, model.py / model.onnx answer as the compiled
    variant at a batch of 3 (padded / dynamic); keras models' fp32 variants also export to TF
    Serving."""
    from hwbackends import compile as hwb_compile
    from hwbackends.bench.harness import bench_model
    from hwbackends.bench.scenarios import Batch
    from hwbackends.export.names import served

    m = zoo_model(name)
    res = bench_model(m, ["cpu.litert", "cpu.onnxruntime"], None,
                      [Batch(sizes=(1, 4), n=100, max_s=0.3, warmup=10)],
                      context=RunContext.at(store_dir), bars=False)
    results = res.save(tmp_path / "r.json")
    variants = sorted({p.variant for p in res.profiles})
    if m.format == "keras":
        assert len(variants) == 7, variants  # litert ×4, onnxruntime ×3
    else:
        assert {v.split(":")[0] for v in variants} == {"cpu.onnxruntime"}, variants
    for v in variants:
        target, prec = v.split(":")
        out = tmp_path / v.replace(":", "_")
        export(m, target, "triton", out, precision=prec, results=results, store=store_dir)
        cfg = _parse_triton(pylibs, out / m.name / "config.pbtxt")
        names = served(m)  # the model's own names (a single-input Keras model's Input name)
        assert cfg.max_batch_size == 4 and [i.name for i in cfg.input] == [s.name for s in names.inputs]
        cm = hwb_compile(m, target, prec, batch_size=4, store=store_dir, fidelity=False)
        xs = _inputs(m, 4)
        want = cm.predict(xs if m.multi_io else xs[0])
        want = want if isinstance(want, tuple) else (want,)
        # int8-dynamic scales activations per call: a row's answer depends on its batch
        # companions, so those compare on the compiled batch itself
        n = 4 if prec == "int8-dynamic" else 3
        native = (out / m.name / "1" / "model.onnx").exists()
        if target == "cpu.onnxruntime" and not native:
            # the graph's batch is fixed inside (LSTM states): the python backend instead, said
            assert cfg.backend == "python", v
            assert "python backend instead of" in (out / m.name / "config.pbtxt").read_text()
        if not native:
            got = _load_runner(out / m.name / "1").run([x[:n] for x in xs])
        else:
            import onnxruntime as ort
            sess = ort.InferenceSession(str(out / m.name / "1" / "model.onnx"),
                                        providers=["CPUExecutionProvider"])
            got = sess.run([s.name for s in names.outputs],
                           {s.name: x[:n] for s, x in zip(names.inputs, xs, strict=True)})
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w[:n], atol=1e-5, err_msg=v)
        if m.format == "keras" and prec == "fp32":
            export(m, target, "tf-serving", out / "tfs", precision=prec, results=results,
                   store=store_dir)
            assert (out / "tfs" / m.name / "1" / "saved_model.pb").exists()


def test_a_format_the_target_owns_goes_to_target_export(zoo_model, store_dir, tmp_path):
    """``--format c`` is cpu.native's (``Target.exports``): hwb export hands the compiled
    artifact to its ``Target.export`` and returns what that wrote."""
    from hwbackends.registry import get_registry

    if "c" not in getattr(get_registry().targets.get("cpu.native"), "exports", ()):
        pytest.skip("no cpu.native target exporting 'c' registered here")
    res = export(zoo_model("mlp"), "cpu.native", "c", tmp_path, store=store_dir)
    names = sorted(p.name for p in res.files)
    assert any(n.endswith(".h") for n in names) and any(n.endswith(".so") for n in names), names
    assert all(p.parent == tmp_path and p.stat().st_size > 0 for p in res.files)
    with pytest.raises(UnsupportedError, match="no Triton backend and no python-backend flavour"):
        export(zoo_model("mlp"), "cpu.native", "triton", tmp_path, results="unused.json")
