"""``hwb export`` against a hostile model, results file and output directory, and
the served tensor names.

Everything goes through ``hwb export`` (``hwbackends.cli.main``) except the Hypothesis test of
names a file name cannot hold (NUL, ``/``), which uses ``load_model(name=...)`` and
:func:`hwbackends.export.export`. The model is a one-layer ONNX Gemm built here (cpu.onnxruntime
compiles it in ~60 ms, so many batch sizes and names stay cheap); the results files are
written here by hand: they are the hostile input under test, and the export only reads their
figures. Each planted path holds a "victim" outside the output directory, checked unchanged.
The Triton configs are parsed with Triton's own proto (tritonclient's model_config_pb2, the
``pylibs`` fixture of tests/test_export.py; skipped where it cannot be installed).
"""
from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import test_export as _export_tests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwbackends.bench.results import FORMAT, VERSION
from hwbackends.errors import HwbError
from hwbackends.identifiers import is_plain
from hwbackends.registry import get_registry

pylibs = _export_tests.pylibs  # the fixture (Triton's and TF Serving's protos), reused
_parse_triton = _export_tests._parse_triton

EXAMPLES = int(os.environ.get("HWB_FUZZ_EXAMPLES", "6"))
VARIANT = "cpu.onnxruntime:fp32"


# -- a model and its results, written here ------------------------------------------------------
def onnx_model(path: Path, xin: str = "x", yout: str = "y", node: str = "fc") -> Path:
    """A 4 → 2 Gemm whose input, output and node names are the caller's."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2) / 8, "w")
    b = numpy_helper.from_array(np.ones(2, np.float32), "b")
    g = helper.make_graph([helper.make_node("Gemm", [xin, "w", "b"], [yout], name=node)], "g",
                          [helper.make_tensor_value_info(xin, TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info(yout, TensorProto.FLOAT, ["N", 2])],
                          [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))
    return path


def results(model, variant: str = VARIANT, sizes=(1, 4), cores: int = 2) -> dict:
    """A results file's content: a batch sweep of ``variant`` (p50 10 µs × batch, p99 twice)."""
    target, prec = variant.split(":")
    rows = [{"variant": variant, "target": target, "precision": prec, "batch_size": b,
             "scenario": "batch", "params": {}, "mode": "hardware", "n": 100,
             "p50_us": 10.0 * b, "p90_us": 15.0 * b, "p99_us": 20.0 * b, "p999_us": 30.0 * b,
             "max_us": 40.0 * b, "mean_us": 11.0 * b, "min_us": 9.0 * b, "throughput": 1e5,
             "duration_s": 0.1, "machine": {"id": "m1", "cores": cores}} for b in sizes]
    return {"format": FORMAT, "version": VERSION, "command": "written by test_export_hostile",
            "model": {"name": model.name, "fingerprint": model.fingerprint},
            "machine": {"id": "m1", "cores": cores}, "availability": [], "variants": [],
            "profiles": rows}


def write_json(path: Path, d: dict) -> Path:
    path.write_text(json.dumps(d, allow_nan=True))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hwbackends import load_model

    d = tmp_path_factory.mktemp("hostile-model")
    p = onnx_model(d / "tiny.onnx", "features", "signal")
    m = load_model(p)
    return p, m, write_json(d / "r.json", results(m))


@pytest.fixture
def cli(hwb_cli, store_dir):
    """``cli(*args)`` → (rc, stdout, stderr) of ``hwb export ARGS --cache-dir STORE``."""
    def run(*args: str):
        return hwb_cli("export", *args, "--cache-dir", str(store_dir))
    return run


def _triton(cli, tiny, out: Path, *extra: str):
    p, _, r = tiny
    return cli(str(p), "-t", VARIANT, "--format", "triton", "-r", str(r), "-o", str(out), *extra)


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.mkdir(exist_ok=True)
    (v / "secret").write_text("precious")
    (v / "secret").chmod(0o600)
    return v


def _untouched(v: Path) -> None:
    assert sorted(p.name for p in v.iterdir()) == ["secret"]
    assert (v / "secret").read_text() == "precious"


# -- links and other versions in the output directory --------------------------------------------
@pytest.mark.parametrize("planted", ["config.pbtxt", "1", "tiny", "1/model.onnx"])
def test_triton_refuses_a_link_where_it_writes(planted, cli, tiny, tmp_path):
    """A link in place of the config, the version directory, the model directory or a file in
    the version: refused, nothing written, the link and its target untouched."""
    v = _victim(tmp_path)
    out = tmp_path / "repo"
    link = out / "tiny" / planted if planted != "tiny" else out / "tiny"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(v / "secret" if planted.endswith(("pbtxt", "onnx")) else v)
    rc, _, err = _triton(cli, tiny, out)
    assert rc == 1 and "ExportPathError" in err and "symbolic link" in err, err
    assert link.is_symlink()
    _untouched(v)


def test_a_link_as_the_output_directory_is_refused(cli, tiny, tmp_path):
    v = _victim(tmp_path)
    (tmp_path / "repo").symlink_to(v)
    rc, _, err = _triton(cli, tiny, tmp_path / "repo")
    assert rc == 1 and "symbolic link" in err, err
    _untouched(v)


def test_another_version_is_refused_unless_replace(cli, tiny, tmp_path, pylibs):
    """A stranger's ``2/`` (Triton serves the newest version): refused, named, left in place;
    with ``--replace`` the model directory is replaced whole and ``2/`` is gone."""
    out = tmp_path / "repo"
    (out / "tiny" / "2").mkdir(parents=True)
    (out / "tiny" / "2" / "model.onnx").write_bytes(b"stranger")
    rc, _, err = _triton(cli, tiny, out)
    assert rc == 1 and "model version(s) 2/" in err and "--replace" in err, err
    assert (out / "tiny" / "2" / "model.onnx").read_bytes() == b"stranger"
    assert not (out / "tiny" / "config.pbtxt").exists()
    rc, _, err = _triton(cli, tiny, out, "--replace")
    assert rc == 0, err
    assert sorted(p.name for p in (out / "tiny").iterdir()) == ["1", "config.pbtxt"]
    cfg = _parse_triton(pylibs, out / "tiny" / "config.pbtxt")
    assert cfg.name == "tiny" and cfg.backend == "onnxruntime"


def test_reexport_replaces_its_own_version(cli, tiny, tmp_path):
    """What an export wrote is replaced by the next one without --replace (no stale files:
    the python flavour's b1/ b4/ go when the native flavour follows)."""
    out = tmp_path / "repo"
    assert _triton(cli, tiny, out, "--flavour", "python")[0] == 0
    assert (out / "tiny" / "1" / "b4").is_dir()
    rc, _, err = _triton(cli, tiny, out)
    assert rc == 0, err
    assert sorted(p.name for p in (out / "tiny" / "1").iterdir()) == ["model.onnx"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging left behind


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_an_output_directory_others_can_write_is_refused(mode, cli, tiny, tmp_path):
    out = tmp_path / "repo"
    out.mkdir()
    out.chmod(mode)
    rc, _, err = _triton(cli, tiny, out)
    assert rc == 1 and "writable by" in err and "chmod go-w" in err, err
    assert list(out.iterdir()) == []


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another uid needs root")
def test_an_output_directory_of_another_user_is_refused(cli, tiny, tmp_path):
    """A directory another uid owns (a stranger's /tmp/repo), even one mode 0755 that root
    could write: refused, nothing written."""
    out = tmp_path / "repo"
    out.mkdir()
    os.chown(out, 12345, 12345)
    rc, _, err = _triton(cli, tiny, out)
    assert rc == 1 and "is owned by" in err and "uid 12345" in err, err
    assert list(out.iterdir()) == []


def test_a_created_output_directory_is_private_to_write(cli, tiny, tmp_path):
    out = tmp_path / "new" / "repo"
    rc, _, err = _triton(cli, tiny, out)
    assert rc == 0, err
    for d in (out, out / "tiny", out / "tiny" / "1"):
        assert not d.stat().st_mode & 0o022, oct(d.stat().st_mode)


def test_tf_serving_refuses_a_link_in_place_of_models_config(hwb_cli, store_dir, zoo_model, tmp_path):
    """TF Serving's top-level files: a link planted as ``models.config`` is refused."""
    m = zoo_model("mlp")
    r = write_json(tmp_path / "r.json", results(m, "cpu.litert:fp32"))
    v = _victim(tmp_path)
    out = tmp_path / "tfs"
    out.mkdir()
    (out / "models.config").symlink_to(v / "secret")
    rc, _, err = hwb_cli("export", "zoo:mlp", "-t", "cpu.litert:fp32", "--format", "tf-serving",
                         "-r", str(r), "-o", str(out), "--cache-dir", str(store_dir))
    assert rc == 1 and "symbolic link" in err, err
    _untouched(v)
    assert (out / "models.config").is_symlink() and not (out / "mlp").exists()


# -- the results file is hostile ---------------------------------------------------------------------
def _set(path: list, value):
    def edit(d: dict) -> dict:
        d = copy.deepcopy(d)
        cur = d
        for k in path[:-1]:
            cur = cur[k]
        if value is _DELETE:
            del cur[path[-1]]
        else:
            cur[path[-1]] = value
        return d
    return edit


_DELETE = object()
BAD_RESULTS = {
    "nan p99": (_set(["profiles", 1, "p99_us"], float("nan")), "profiles[1].p99_us"),
    "inf p99": (_set(["profiles", 0, "p99_us"], float("inf")), "finite"),
    "negative p99": (_set(["profiles", 0, "p99_us"], -5.0), "greater than 0"),
    "p99 below p50": (_set(["profiles", 0, "p99_us"], 1.0), "below p50_us"),
    "batch 0": (_set(["profiles", 0, "batch_size"], 0), "profiles[0].batch_size"),
    "batch 2.5": (_set(["profiles", 0, "batch_size"], 2.5), "an integer 1..65536"),
    "batch 1e30": (_set(["profiles", 1, "batch_size"], 1e30), "batch_size"),
    "batch 2e9": (_set(["profiles", 1, "batch_size"], 2_000_000_000), "less than or equal"),
    "batch as text": (_set(["profiles", 0, "batch_size"], "8"), "batch_size"),
    "batch true": (_set(["profiles", 0, "batch_size"], True), "batch_size"),
    "p99 as text": (_set(["profiles", 0, "p99_us"], "fast"), "p99_us"),
    "no p99 key": (_set(["profiles", 0, "p99_us"], _DELETE), "required key missing"),
    "no profiles": (_set(["profiles"], _DELETE), "profiles"),
    "profiles not a list": (_set(["profiles"], {"a": 1}), "profiles"),
    "no model": (_set(["model"], _DELETE), "model"),
    "no fingerprint": (_set(["model", "fingerprint"], _DELETE), "fingerprint"),
    "another model's fingerprint": (_set(["model", "fingerprint"], "ab" * 16), "measured model"),
    "cores 0": (_set(["profiles", 0, "machine", "cores"], 0), "cores"),
    "wrong version": (_set(["version"], 99), "version"),
    "not an object": (lambda d: [d], "(top level)"),
}


@pytest.mark.parametrize("case", sorted(BAD_RESULTS))
def test_a_bad_results_file_is_refused_naming_the_field(case, cli, tiny, tmp_path):
    p, m, _ = tiny
    edit, expect = BAD_RESULTS[case]
    r = write_json(tmp_path / "r.json", edit(results(m)))
    rc, _, err = cli(str(p), "-t", VARIANT, "--format", "triton", "-r", str(r),
                     "-o", str(tmp_path / "repo"))
    assert rc == 1 and "InputError" in err and expect in err, err
    assert not (tmp_path / "repo" / "tiny").exists()


@pytest.mark.parametrize("text", ["{", "[" * 100_000, '{"format": ' + "1" * 5000 + "}", ""])
def test_a_results_file_that_is_no_json_is_refused(text, cli, tiny, tmp_path):
    p, _, _ = tiny
    (tmp_path / "r.json").write_text(text)
    rc, _, err = cli(str(p), "-t", VARIANT, "--format", "triton", "-r", str(tmp_path / "r.json"),
                     "-o", str(tmp_path / "repo"))
    assert rc == 1 and "Error" in err and "Traceback" not in err, err


def test_a_null_figure_is_an_absent_one(cli, tiny, tmp_path, pylibs):
    """Strict JSON writes an absent figure as null: that size is not measured, the rest is."""
    p, m, _ = tiny
    d = results(m, sizes=(1, 4, 8))
    d["profiles"][2]["p99_us"] = None
    r = write_json(tmp_path / "r.json", d)
    rc, _, err = cli(str(p), "-t", VARIANT, "--format", "triton", "-r", str(r),
                     "-o", str(tmp_path / "repo"))
    assert rc == 0, err
    cfg = _parse_triton(pylibs, tmp_path / "repo" / "tiny" / "config.pbtxt")
    assert cfg.max_batch_size == 4 and [w.batch_size for w in cfg.model_warmup] == [1, 4]


def test_batch_sizes_are_capped_by_memory():
    """A measured size whose rows would not fit in the limit is left out, said why."""
    from hwbackends.export.measurements import Measured, SizeCost, plan

    m = Measured(VARIANT, "m1", 2, "hardware", tuple(SizeCost(b, 10.0 * b, 20.0 * b, 100, "batch")
                                                       for b in (1, 64, 4096)), "", "r.json")
    s = plan(m, memory=(1 << 20, 100 << 20))  # 1 MiB a row, 100 MiB allowed
    assert s.max_batch_size == 64 and s.warmup_sizes == (1, 64)
    assert any("above 100 left out" in w and "4.0 GiB" in w for w in s.why), s.why


# -- the store's cap prunes what the export compiled -------------------------------------------------
def test_export_beside_the_store_cap_never_loses_a_size(hwb_cli, tiny, tmp_path, monkeypatch, pylibs):
    """HWB_CACHE_MAX_SIZE below two artifacts and no grace: each compile of the sweep prunes the
    ones before it. The export still ships every size (each pinned or copied on compile)."""
    import hwbackends.store.prune as prune

    p, m, _ = tiny
    sizes = tuple(range(1, 9))
    r = write_json(tmp_path / "r.json", results(m, sizes=sizes))
    monkeypatch.setattr(prune, "GRACE_S", 0.0)
    monkeypatch.setenv("HWB_CACHE_MAX_SIZE", "12k")
    out = tmp_path / "repo"
    rc, _, err = hwb_cli("export", str(p), "-t", VARIANT, "--format", "triton", "--flavour",
                         "python", "-r", str(r), "-o", str(out), "--cache-dir",
                         str(tmp_path / "store"))
    assert rc == 0, err
    assert sorted(int(d.name[1:]) for d in (out / "tiny" / "1").glob("b*")) == list(sizes)
    assert _parse_triton(pylibs, out / "tiny" / "config.pbtxt").max_batch_size == 8


# -- tensors served under the model's own names ------------------------------------------------------
def test_single_tensor_keras_model_keeps_its_names(hwb_cli, store_dir, zoo_model, tmp_path, pylibs):
    """zoo:mlp is ``keras.Input(name="features")`` → layer ``probs``: those are the served
    names, not the readers' ``input``/``output``."""
    m = zoo_model("mlp")
    r = write_json(tmp_path / "r.json", results(m, "cpu.onnxruntime:fp32"))
    rc, out, err = hwb_cli("export", "zoo:mlp", "-t", VARIANT, "--format", "triton",
                           "-r", str(r), "-o", str(tmp_path / "repo"), "--cache-dir",
                           str(store_dir), "--json")
    assert rc == 0, err
    cfg = _parse_triton(pylibs, tmp_path / "repo" / "mlp" / "config.pbtxt")
    assert [i.name for i in cfg.input] == ["features"] and [o.name for o in cfg.output] == ["probs"]
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "repo" / "mlp" / "1" / "model.onnx"),
                                providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["features"]
    assert [o.name for o in sess.get_outputs()] == ["probs"]


def test_without_results_the_export_measures_the_sweep(cli, tiny, tmp_path, pylibs):
    """No --results is no refusal: the sweep is measured first, with progress, and
    the settings come from those figures (max_batch_size = the largest size measured)."""
    p, _, _ = tiny
    rc, out, err = cli(str(p), "-t", VARIANT, "--format", "triton", "-o", str(tmp_path / "repo"),
                       "--max-batch-size", "4")
    assert rc == 0, err
    assert "no --results: measuring cpu.onnxruntime:fp32 at batch sizes 1/4" in err
    assert "measured here (no --results)" in out
    cfg = _parse_triton(pylibs, tmp_path / "repo" / "tiny" / "config.pbtxt")
    assert cfg.max_batch_size == 4 and [w.batch_size for w in cfg.model_warmup] == [1, 4]
    assert "# per batch size: b1 p50" in (tmp_path / "repo" / "tiny" / "config.pbtxt").read_text()


# -- Hypothesis: hostile names and planted paths through every format ------------------------------
PAYLOADS = [
    '*/ __attribute__((constructor)) static void p(void) { system("touch {M}"); } /*',
    '"\n}\nbackend: "python"\nparameters { key: "EXECUTION_ENV_PATH" value { string_value: "{M}" } }\n#',
    "\"\"\"\nimport os; os.system('touch {M}')\n\"\"\"", "a'b\\c\\\\\"d", "x\x00y", "névé ☃ 名前",
    "# comment\nname: \"evil\"", "\r\n\u2028\x85", "A" * 10_000, "../../etc/passwd", "`touch {M}`",
    "$(touch {M})", "*/\n#define HWB_MODEL_NAME 1\n/*", "\\u0022\\n",
]
NAMES = st.one_of(st.sampled_from(PAYLOADS),
                  st.text(st.sampled_from(list("ab_1 */#\"'\\\n\x00é☃{}:;$`")), min_size=1,
                          max_size=40))
PLANTS = ["none", "link config", "link version dir", "version 2", "others can write"]
FORMATS = ["triton", "triton-python", "c"]


def _plant(out: Path, name: str, plant: str, victim: Path) -> None:
    mdir = out / name
    if plant == "link config":
        mdir.mkdir(parents=True, exist_ok=True)
        (mdir / "config.pbtxt").symlink_to(victim / "secret")
        (out / "hwb_model.h").symlink_to(victim / "secret")
    elif plant == "link version dir":
        mdir.mkdir(parents=True, exist_ok=True)
        (mdir / "1").symlink_to(victim)
        (out / "libhwb_model.so").symlink_to(victim)
    elif plant == "version 2":
        (mdir / "2").mkdir(parents=True, exist_ok=True)
    elif plant == "others can write":
        out.mkdir(exist_ok=True)
        out.chmod(0o777)


def _generated_text(out: Path) -> list[tuple[Path, bytes]]:
    texts = []
    for dirpath, _, filenames in os.walk(out):  # os.walk follows no link to a directory
        for f in filenames:
            q = Path(dirpath) / f
            if not q.is_symlink() and q.suffix in (".pbtxt", ".json", ".py", ".h", ".txt",
                                                   ".config", ".md"):
                texts.append((q, q.read_bytes()))
    return texts


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payload=NAMES, where=st.sampled_from(["model", "input", "output"]),
       fmt=st.sampled_from(FORMATS), plant=st.sampled_from(PLANTS))
def test_hostile_names_and_paths_through_every_format(payload, where, fmt, plant, tmp_path_factory,
                                                      store_dir, pylibs):
    """A hostile model name (``load_model(name=)``) or tensor name (the ONNX graph's) and a
    planted output directory, through Triton (native and python flavours) and the C export:
    the export succeeds or refuses with an HwbError; nothing runs (no marker file); no link
    is written through; no generated text file holds the name or a NUL; every Triton config
    parses with Triton's proto under plain names; model.py is the shipped file, unchanged."""
    from hwbackends import load_model
    from hwbackends.export import export

    tmp = tmp_path_factory.mktemp("hostile")
    marker = tmp / "MARKER"
    hostile = "hwbQ" + payload.replace("{M}", str(marker)) + "Qhwb"
    if where == "model":
        m = load_model(onnx_model(tmp / "m.onnx"), name=hostile)
    else:
        try:
            m = load_model(onnx_model(tmp / "m.onnx", **{"xin" if where == "input" else "yout": hostile}))
        except HwbError:
            return  # the reader refused the name: nothing to export
    victim = _victim(tmp)
    out = tmp / "out"
    target, kw = ("cpu.native", {}) if fmt == "c" else ("cpu.onnxruntime", {
        "flavour": "python" if fmt == "triton-python" else None,
        "results": write_json(tmp / "r.json", results(m))})
    from hwbackends.identifiers import safe_ident
    served = safe_ident(m.name, "model")
    _plant(out, served, plant, victim)
    try:
        export(m, target, "c" if fmt == "c" else "triton", out, store=store_dir, **kw)
        ok = True
    except HwbError:
        ok = False
    assert not marker.exists()
    _untouched(victim)
    # the C export writes top-level files only: a model directory's 2/ is not its business
    assert ok == (plant == "none" or (fmt == "c" and plant == "version 2")), (plant, fmt)
    if not ok:
        return
    for q, data in _generated_text(out):
        assert b"\x00" not in data, q
        # the header holds the name as an escaped C literal (c_string): compiled and run below
        if not is_plain(hostile) and q.suffix != ".h":
            assert hostile.encode("utf-8", "surrogatepass") not in data, q
    if fmt == "c":
        _compile_and_run_header(out, tmp, marker)
        return
    cfg = _parse_triton(pylibs, out / served / "config.pbtxt")
    assert cfg.name == served and all(is_plain(t.name) for t in [*cfg.input, *cfg.output])
    if fmt == "triton-python":
        shipped = Path(__import__("hwbackends.export.triton_model", fromlist=["x"]).__file__)
        assert (out / served / "1" / "model.py").read_bytes() == shipped.read_bytes()
        runner = get_registry().target(target).triton().runtime
        assert (out / served / "1" / "hwb_runtime.py").read_bytes() == runner.read_bytes()


def _compile_and_run_header(out: Path, tmp: Path, marker: Path) -> None:
    """A C program that only includes the exported header compiles and runs nothing else."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return
    (tmp / "main.c").write_text('#include "hwb_model.h"\nint main(void) { return 0; }\n')
    r = subprocess.run([cc, "-I", str(out), str(tmp / "main.c"), "-o", str(tmp / "main")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    subprocess.run([str(tmp / "main")], timeout=30, check=True)
    assert not marker.exists()


def test_plants_are_what_the_hypothesis_test_thinks(tmp_path):
    """The planting helper makes what it says (so the property above tests real plants)."""
    v = _victim(tmp_path)
    _plant(tmp_path / "o1", "n", "link config", v)
    assert (tmp_path / "o1" / "n" / "config.pbtxt").is_symlink()
    _plant(tmp_path / "o2", "n", "others can write", v)
    assert stat.S_IMODE((tmp_path / "o2").stat().st_mode) == 0o777
