"""A model file is data, never code: hostile layer, node, tensor and model names
go through every generator, and nothing of them runs.

Each name carries a payload that, if it became code, would run ``touch <MARK>`` as the user
who compiles: a ``/* */`` comment closer followed by a ``__attribute__((constructor))``, a line
break out of a ``//`` comment or a ``typedef`` line into a guarded static initializer (what
hls4ml's writer made of a Keras layer name), a closing quote for string literals, Python
triple quotes, ``??/`` trigraphs, a trailing backslash, NUL, non-ASCII and 10 kB of text. The
models are compiled through the public API (and ``hwb compile``) on cpu.native (fp32, int8,
fixed), fpga.hls4ml and fpga.da4ml, loaded again from the store and run; each build succeeds
or refuses with an :class:`HwbError`, the answers match the reference, the marker never
appears, and no generated source holds the name's text (:func:`assert_no_model_text`).

Budget: a few examples per target by default (each is a fresh C, C++ or Verilator build);
``HWB_HOSTILE_EXAMPLES=N`` runs N per target.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import hwbackends as hwb
from hwbackends.errors import HwbError
from hwbackends.identifiers import c_string, is_plain, safe_ident, unique_idents

#: Where a payload that ran would leave its mark (outside the store and the build dirs; a
#: short path, so that a payload fits a file name's 255 bytes).
MARK = Path("/tmp") / f"hwbm-{os.getpid()}"
N = int(os.environ.get("HWB_HOSTILE_EXAMPLES", "0"))
#: Files of an artifact that are data written by json/numpy/the frameworks, not generated
#: source: the user's names appear in them as JSON-escaped strings, by design (reports).
DATA_SUFFIXES = (".json", ".npy", ".keras", ".onnx", ".pt2", ".so", ".o", ".a", ".gch", ".hmac",
                 ".txt", ".mem")


def _oct(text: str) -> str:
    """``text`` as the inside of a C (and Python) string literal, every byte an octal escape:
    a payload spelled without ``/`` (Keras forbids it in names) that still names an absolute
    path."""
    return "".join(f"\\{b:03o}" for b in text.encode())


CMD = _oct(f"touch {MARK}")
GUARD = "#ifndef HWB_PWN\n#define HWB_PWN\n{body}\n#endif\n"
PAYLOADS = {
    # closes a /* */ comment (cpu.native's per-layer comment)
    "comment": f'*/ __attribute__((constructor)) static void hwb_pwn(void) {{ system("{CMD}"); }} /*',
    # ends a // comment or a typedef line (hls4ml's writer), once however often it is pasted
    "line": "x;\n" + GUARD.format(body=f'static int hwb_pwn = system("{CMD}");') + "int y",
    # closes a string literal (the header's HWB_MODEL_NAME)
    "quote": '";\n' + GUARD.format(body=f'__attribute__((constructor)) static void hwb_pwn(void) '
                                        f'{{ system("{CMD}"); }}') + 'static const char *hwb_q = "',
    # a Python literal or docstring
    "python": f"'''\"\"\"\nimport os; os.system(\"{CMD}\")\n#",
    # trigraphs (??/ is a backslash where trigraphs are on), a trailing backslash, NUL, RTL mark
    "trigraph": "a??/\nb??=c??'d\\\n\x00e\u202ef é 中",
    "long": "L" * 10_000 + "\nint hwb_pwn;",
}
#: Keras forbids only "/" in a name.
KERAS_PAYLOADS = {k: v for k, v in PAYLOADS.items() if "/" not in v}
# A file stem cannot hold "/" or NUL and is at most 255 bytes.
STEM_PAYLOADS = {k: v for k, v in PAYLOADS.items() if "/" not in v and "\x00" not in v and len(v.encode()) < 230}


def hostile(payloads: dict[str, str]) -> st.SearchStrategy[str]:
    """A payload, maybe wrapped in random text (printable, control and non-ASCII characters)."""
    noise = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/"), max_size=6)
    return st.builds(lambda a, p, b: a + p + b, noise, st.sampled_from(sorted(payloads.values())), noise)


def names(payloads: dict[str, str], n: int) -> st.SearchStrategy[list[str]]:
    """``n`` distinct hostile names (Keras and ONNX want unique layer names)."""
    return st.lists(hostile(payloads), min_size=n, max_size=n, unique=True)


@pytest.fixture(autouse=True)
def _no_mark():
    MARK.unlink(missing_ok=True)
    yield
    ran = MARK.exists()
    MARK.unlink(missing_ok=True)
    assert not ran, "a model name ran as code: the marker file was written"


# -- checks on what a build wrote -----------------------------------------------------------------
def generated_texts(root: Path) -> dict[Path, str]:
    """Every generated text file under ``root`` (sources, headers, scripts, configs)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.is_symlink() or p.suffix in DATA_SUFFIXES:
            continue
        if "ap_types" in p.parts or "nnet_utils" in p.parts:  # hls4ml's library, copied
            continue
        data = p.read_bytes()
        if b"\x00" in data:
            continue  # a binary
        out[p] = data.decode("utf-8", "replace")
    return out


def assert_no_model_text(root: Path, user_names: list[str], model_name: str | None = None) -> None:
    """No generated file under ``root`` holds any of ``user_names`` (or a payload's marker
    identifier), except the header's ``HWB_MODEL_NAME``, which must be ``c_string`` of it."""
    texts = generated_texts(root)
    assert texts, f"nothing generated under {root}"
    for path, text in texts.items():
        if path.name == "hwb_model.h":
            line = next(ln for ln in text.splitlines() if ln.startswith("#define HWB_MODEL_NAME "))
            assert line == f"#define HWB_MODEL_NAME {c_string(model_name)}", line[:200]
            text = text.replace(line, "")
        for name in user_names:
            assert name not in text, f"{path.relative_to(root)} holds model text {name[:60]!r}"
        for token in ("hwb_pwn", "HWB_PWN", CMD, str(MARK)):  # any line of any payload
            assert token not in text, f"{path.relative_to(root)} holds payload text {token[:60]!r}"


def assert_header_literal(header: Path, model_name: str, tmp: Path) -> None:
    """A C program that includes the exported header sees the model's name as text."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return
    prog = tmp / "show_name.c"
    prog.write_text(f'#include <stdio.h>\n#include "{header}"\n'
                    'int main(void) { fputs(HWB_MODEL_NAME, stdout); return 0; }\n')
    exe = tmp / "show_name"
    subprocess.run([cc, str(prog), "-o", str(exe)], check=True, capture_output=True, timeout=60)
    out = subprocess.run([str(exe)], check=True, capture_output=True, timeout=10).stdout
    want = model_name[:256].encode("utf-8", "backslashreplace").split(b"\x00")[0]
    assert out == want


def check_answers(cm, m, x: np.ndarray, tol: float) -> None:
    y, ref = cm.predict(x), m.reference(x)
    scale = max(float(np.ptp(ref)), 1e-3)
    err = float(np.abs(np.asarray(y, np.float64) - ref).max())
    assert err <= tol * scale, (cm.variant, err, scale)


def compile_or_refuse(model, target: str, precision: str, store: Path):
    """The compiled model, or None when it was refused with an HwbError (never another
    exception: pytest reports that as the failure)."""
    try:
        return hwb.compile(model, target, precision, store=store)
    except HwbError as exc:
        assert "Traceback" not in str(exc)
        return None


def reload_and_check(model, target: str, precision: str, store: Path, cm, x: np.ndarray) -> None:
    """The same compile again is a load from the store: the same answers, nothing ran."""
    again = hwb.compile(model, target, precision, store=store)
    assert again.artifact.cached, "the second compile should load the stored artifact"
    np.testing.assert_array_equal(again.predict(x), cm.predict(x))


# -- models with hostile names ---------------------------------------------------------------------
def keras_model(ns: list[str], model_name: str):
    """Input → Dense(8, relu) → Dense(1): its input, layers and the model named ``ns``."""
    import keras

    rng = np.random.default_rng(len("".join(ns)))
    inp = keras.Input((6,), name=ns[0])
    h = keras.layers.Dense(8, activation="relu", name=ns[1])(inp)
    out = keras.layers.Dense(1, name=ns[2])(h)
    km = keras.Model(inp, out, name=model_name)
    km.set_weights([rng.normal(0, 0.5, w.shape).astype(np.float32) for w in km.get_weights()])
    return km


def tensor_names(ns: list[str]) -> list[str]:
    """The ten tensor names of :func:`onnx_model` (distinct from its node names)."""
    return [f"{ns[i % len(ns)]}#{i}" for i in range(10)]


def onnx_model(ns: list[str]):
    """X → MatMul → Add → Relu → MatMul → Add → Y, every node, tensor and initializer named
    from ``ns``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(len("".join(ns)))
    t = tensor_names(ns)
    w1, b1 = rng.normal(0, 0.5, (6, 8)), rng.normal(0, 0.1, 8)
    w2, b2 = rng.normal(0, 0.5, (8, 1)), rng.normal(0, 0.1, 1)
    inits = [numpy_helper.from_array(a.astype(np.float32), name) for a, name in
             zip((w1, b1, w2, b2), t[1:5], strict=True)]
    nodes = [helper.make_node("MatMul", [t[0], t[1]], [t[5]], name=ns[0]),
             helper.make_node("Add", [t[5], t[2]], [t[6]], name=ns[1]),
             helper.make_node("Relu", [t[6]], [t[7]], name=ns[2]),
             helper.make_node("MatMul", [t[7], t[3]], [t[8]], name=ns[3]),
             helper.make_node("Add", [t[8], t[4]], [t[9]], name=ns[4])]
    graph = helper.make_graph(nodes, ns[5], [helper.make_tensor_value_info(t[0], TensorProto.FLOAT, [None, 6])],
                              [helper.make_tensor_value_info(t[9], TensorProto.FLOAT, [None, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def samples(n: int = 64) -> np.ndarray:
    return np.random.default_rng(3).normal(0, 1, (n, 6)).astype(np.float32)


def _settings(default: int):
    """Each example is a build: no shrinking (a failing example is reported as found)."""
    return settings(max_examples=N or default, deadline=None, derandomize=not N,
                    phases=(Phase.explicit, Phase.reuse, Phase.generate),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# -- the identifier functions themselves (cheap: many examples) ---------------------------------
@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=80), max_size=20))
def test_identifiers_are_plain_and_unique(texts):
    ids = unique_idents(texts)
    assert len(set(ids)) == len(ids)
    for k, (text, i) in enumerate(zip(texts, ids, strict=True)):
        assert i.isascii() and i.replace("_", "").isalnum() and i[0].isalpha(), i
        if is_plain(text) and text not in texts[:k]:
            assert i == text  # a plain name is kept (readable configs)
        else:
            assert i.startswith(safe_ident(text)) and i != text  # derived, or made unique


def test_c_string_holds_any_text_exactly(tmp_path):
    """Many hostile strings as C literals in one program: it compiles (no literal ended
    early, no comment closed) and prints each text back byte for byte."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    texts = [*PAYLOADS.values(), "", "??=??/??'", "\\", '"', "\n", "\r\n\t\v\f\a\b", "é中\u202e🙂"]
    rng = np.random.default_rng(0)
    texts += ["".join(chr(int(c)) for c in rng.integers(1, 0x3000, 30) if not 0xD800 <= c < 0xE000)
              for _ in range(40)]
    src = ["#include <stdio.h>", "static const char *T[] = {"]
    src += [f"    {c_string(t, max_chars=20_000)}," for t in texts]
    src += ["};", "int main(void) { for (unsigned i = 0; i < sizeof T / sizeof *T; i++) "
                  "{ fputs(T[i], stdout); fputc(0, stdout); } return 0; }"]
    (tmp_path / "t.c").write_text("\n".join(src), encoding="utf-8")
    r = subprocess.run([cc, "-trigraphs", "-Werror=trigraphs", str(tmp_path / "t.c"), "-o",
                        str(tmp_path / "t")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, timeout=10).stdout.split(b"\x00")[:-1]
    assert out == [t.encode().split(b"\x00")[0] for t in texts]


# -- cpu.native -------------------------------------------------------------------------------------
@_settings(2)
@given(ns=names(KERAS_PAYLOADS, 4))
def test_keras_names_on_cpu_native_fp32(ns, tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    km = keras_model(ns[:3], "hwbm")  # Keras' own model name is checked like a layer's
    m = hwb.load_model(km, name=ns[3])  # the model's name: the header's HWB_MODEL_NAME
    x = samples()
    cm = compile_or_refuse(m, "cpu.native", "fp32", store)
    assert cm is not None, "a Keras Dense chain with odd names compiles on cpu.native"
    check_answers(cm, m, x, 1e-5)
    assert_no_model_text(cm.artifact.path, ns, ns[3])
    assert_header_literal(cm.artifact.path / "hwb_model.h", ns[3], tmp_path_factory.mktemp("c"))
    reload_and_check(m, "cpu.native", "fp32", store, cm, x)


@_settings(2)
@given(ns=names(PAYLOADS, 6), stem=hostile(STEM_PAYLOADS))
def test_onnx_names_and_file_stem_on_cpu_native_fp32_and_int8(ns, stem, tmp_path_factory):
    import onnx

    store, d = tmp_path_factory.mktemp("store"), tmp_path_factory.mktemp("m")
    stem = stem.replace("\x00", "").encode()[:240].decode("utf-8", "ignore") or "x"
    path = d / f"{stem}.onnx"
    onnx.save(onnx_model(ns), str(path))
    m = hwb.load_model(str(path))
    assert m.name == stem
    x = samples()
    for precision, tol in (("fp32", 1e-5), ("int8", 0.05)):
        cm = compile_or_refuse(m, "cpu.native", precision, store)
        assert cm is not None, f"the ONNX MLP compiles on cpu.native:{precision}"
        check_answers(cm, m, x, tol)
        assert_no_model_text(cm.artifact.path, [*ns, *tensor_names(ns)], stem)
        reload_and_check(m, "cpu.native", precision, store, cm, x)


def test_the_cli_compiles_a_hostile_file_stem(tmp_path, capsys):
    """``hwb compile`` of a file whose stem closes a comment and a string: rc 0, nothing runs."""
    from hwbackends.cli import main

    stem = PAYLOADS["quote"].replace("/", "|")[:120]
    path = tmp_path / f"{stem}.onnx"
    import onnx
    onnx.save(onnx_model([f"n{i}{PAYLOADS['comment']}" for i in range(6)]), str(path))
    rc = main(["compile", str(path), "--target", "cpu.native", "--cache-dir", str(tmp_path / "s")])
    assert rc == 0, capsys.readouterr()


@_settings(2)
@given(ns=names(KERAS_PAYLOADS, 4))
def test_keras_names_on_cpu_native_fixed(ns, tmp_path_factory):
    """``fixed`` reads its types from hls4ml's graph of the model: hls4ml gets generated names."""
    pytest.importorskip("hls4ml")
    store = tmp_path_factory.mktemp("store")
    m = hwb.load_model(keras_model(ns[:3], "hwbm"), name=ns[3])
    x = samples()
    cm = compile_or_refuse(m, "cpu.native", "ap_fixed<18,8>", store)
    assert cm is not None, "the Dense chain compiles at ap_fixed<18,8>"
    check_answers(cm, m, x, 0.02)
    assert_no_model_text(cm.artifact.path, ns, ns[3])
    assert set(cm.artifact.meta["types"]) <= {*ns, *(f"{n}_relu" for n in ns), *(f"{n}_linear" for n in ns)}
    reload_and_check(m, "cpu.native", "ap_fixed<18,8>", store, cm, x)


# -- FPGA targets ---------------------------------------------------------------------------------
def _available(target: str) -> None:
    from hwbackends.registry import get_registry, safe_probe

    avail = safe_probe(get_registry().target(target))
    if not avail.usable:
        pytest.skip(f"{target} unavailable here: {avail.reason}")


@_settings(2)
@given(ns=names(KERAS_PAYLOADS, 4))
def test_keras_names_on_fpga_hls4ml(ns, tmp_path_factory):
    """hls4ml's writer pastes layer names into its C++, scripts and YAML; the target hands it a
    rebuild with generated names, and reports keep the user's."""
    _available("fpga.hls4ml")
    store = tmp_path_factory.mktemp("store")
    m = hwb.load_model(keras_model(ns[:3], "hwbm"), name=ns[3])
    x = samples()
    cm = compile_or_refuse(m, "fpga.hls4ml", "ap_fixed<18,8>", store)
    assert cm is not None, "the Dense chain compiles on fpga.hls4ml"
    check_answers(cm, m, x, 0.02)
    assert_no_model_text(cm.artifact.path, ns, ns[3])
    meta = cm.artifact.meta
    assert set(meta["layer_names"].values()) == set(ns[:3])  # generated → the user's names
    assert ns[1] in meta["types"] and ns[2] in meta["types"]  # the report shows the user's names
    reload_and_check(m, "fpga.hls4ml", "ap_fixed<18,8>", store, cm, x)


@_settings(1)
@given(ns=names(KERAS_PAYLOADS, 4))
def test_keras_names_on_fpga_da4ml(ns, tmp_path_factory):
    """da4ml builds from the weight matrices alone: its Verilog, testbench and scripts are
    named by the target (``hwb``), whatever the model's names."""
    _available("fpga.da4ml")
    store = tmp_path_factory.mktemp("store")
    m = hwb.load_model(keras_model(ns[:3], "hwbm"), name=ns[3])
    x = samples()
    cm = compile_or_refuse(m, "fpga.da4ml", "fixed<16,6>", store)
    assert cm is not None, "the Dense chain compiles on fpga.da4ml"
    check_answers(cm, m, x, 0.02)
    assert_no_model_text(cm.artifact.path, ns, ns[3])
    reload_and_check(m, "fpga.da4ml", "fixed<16,6>", store, cm, x)


def test_hls4ml_renaming_keeps_the_graph_and_maps_back():
    """The rebuild hls4ml sees: same outputs, names ``hwb0``…, Bidirectional's inner layers
    renamed too, and ``user()`` maps hls4ml's derived names back."""
    pytest.importorskip("keras")
    import keras

    from hwb_plugins._shared.hls4ml_names import rename_keras

    evil = PAYLOADS["line"]
    inp = keras.Input((5, 3), name=evil + "i")
    h = keras.layers.Bidirectional(keras.layers.LSTM(4, name=evil + "l"), name=evil + "b")(inp)
    out = keras.layers.Dense(2, activation="relu", name=evil + "d")(h)
    km = keras.Model(inp, out, name=evil)
    r = rename_keras(km, "fpga.hls4ml")
    x = np.random.default_rng(1).normal(size=(4, 5, 3)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(km(x)), np.asarray(r.obj(x)))
    assert [layer.name for layer in r.obj.layers] == ["hwb0", "hwb1", "hwb2"] and r.obj.name == "hwbmodel"
    assert "hwb_pwn" not in str(r.obj.get_config())
    assert r.user("hwb2_relu") == evil + "d_relu" and r.user("layer7_out") == "layer7_out"
