"""A differential fuzz of cpu.native on models with several inputs and outputs: random Keras
functional models, torch modules (``forward(a, b, …)`` returning a tuple) and those modules as
``torch.onnx`` writes them (ONNX) of the shape desks
write — each input through its own chain of Dense layers (possibly none), over flat features or
a (time, channels) window, one ``Concatenate``/``cat`` of the last axis or an ``Add``, a shared
trunk, then one head per output, some taken from inside the trunk — each compared with its own
framework:

* the IR reader (``layer_ir.multi.extract_multi`` then ``forward_multi``, float64): max error
  ≤ 1e-5 of each output's scale, no C compiler;
* the generated C through ``hwbackends.compile(...).predict`` with a tuple and with a dict by
  name, and ``predict_into`` with one buffer per tensor: the same bound.

Also ``hwb compile`` on a saved multi-IO ``.keras`` and ``.onnx`` file, the C ABI from C
(``hwb_model_predict_multi`` and the packed record of ``hwb_model_predict``), and the
refusals (int8, ``fixed``, two merges, an output reading an input past the merge).

The default run is a small fixed budget (derandomized: the same models every run);
``HWB_FUZZ_EXAMPLES=N`` draws N models per IR test and N/4 per C test, fresh each run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hwbackends as hwb
from hwbackends.errors import UnsupportedError
from hwbackends.layer_ir.multi import extract_multi, forward_multi

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

EXAMPLES = int(os.environ.get("HWB_FUZZ_EXAMPLES", "0") or 0)
LONG = EXAMPLES > 0
BOUND = 1e-5
ACTS = ("linear", "relu", "tanh", "sigmoid")


def _settings(n_default: int, share: int) -> settings:
    return settings(max_examples=max(EXAMPLES // share, 1) if LONG else n_default, deadline=None,
                    derandomize=not LONG, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass(frozen=True)
class MSpec:
    """``window`` 0: flat inputs, else (window, width) ones (the trunk's first Dense per step,
    then a flatten); each input ``(width, chain)``; a chain is ``((units, act), …)``; heads
    ``(at, chain)``: from trunk point ``at`` (0: the merge's result; with a window, points
    after the flatten only)."""

    seed: int
    window: int
    inputs: tuple[tuple[int, tuple[tuple[int, str], ...]], ...]
    merge: str
    trunk: tuple[tuple[int, str], ...]
    heads: tuple[tuple[int, tuple[tuple[int, str], ...]], ...]

    def describe(self) -> str:
        return (f"window={self.window} inputs={self.inputs} merge={self.merge} trunk={self.trunk} "
                f"heads={self.heads} seed={self.seed}")

    def in_shapes(self) -> list[tuple[int, ...]]:
        return [(self.window, w) if self.window else (w,) for w, _ in self.inputs]


def _chain(draw, lo: int, hi: int, last: int | None = None, out_act: bool = False):
    n = draw(st.integers(lo, hi))
    acts = ACTS + (("softmax",) if out_act else ())
    units = [draw(st.integers(1, 9)) for _ in range(n)]
    if last is not None and n:
        units[-1] = last
    return tuple((u, draw(st.sampled_from(acts))) for u in units)


@st.composite
def mspecs(draw) -> MSpec:
    n_in = draw(st.integers(1, 3))
    window = draw(st.sampled_from((0, 0, 3)))
    merge = "none" if n_in == 1 else draw(st.sampled_from(("concat", "concat", "add")))
    same = draw(st.integers(2, 8))  # an add's operand width
    inputs = tuple((draw(st.integers(1, 10)), _chain(draw, 1 if merge == "add" else 0, 2,
                                                     same if merge == "add" else None))
                   for _ in range(n_in))
    trunk = _chain(draw, 1 if window else 0, 3)
    points = len(trunk) + 1  # trunk points 0..len(trunk)
    first = 2 if window else 0  # with a window: after the per-step Dense and the flatten
    n_heads = draw(st.integers(2 if n_in == 1 else 1, 3))
    heads = []
    for _ in range(n_heads):
        at = draw(st.integers(min(first, points), points - 1 + (1 if window else 0)))
        heads.append((at, _chain(draw, 0, 2, out_act=True)))
    # two outputs of one tensor are one output: give a repeated one a layer of its own
    seen: set = set()
    for i, (at, ch) in enumerate(heads):
        if (at, ch) in seen or (not ch and at == 0 and n_in == 1):
            heads[i] = (at, ((draw(st.integers(1, 6)), "tanh"), *ch))
        seen.add(heads[i])
    return MSpec(draw(st.integers(0, 2**16)), window, inputs, merge, trunk, tuple(heads))


# -- the two frameworks ------------------------------------------------------------------------
def _weights(rng, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    return (rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_out)).astype(np.float32),
            rng.normal(0, 0.3, n_out).astype(np.float32))


def build_keras(s: MSpec):
    import keras

    rng = np.random.default_rng(s.seed)

    def dense(x, units: int, act: str):
        layer = keras.layers.Dense(units, activation=act)
        y = layer(x)
        layer.set_weights(list(_weights(rng, int(x.shape[-1]), units)))
        return y

    ins = [keras.Input(shape, name=f"in{i}") for i, shape in enumerate(s.in_shapes())]
    xs = []
    for x, (_, chain) in zip(ins, s.inputs, strict=True):
        for u, a in chain:
            x = dense(x, u, a)
        xs.append(x)
    merged = (keras.layers.Concatenate(axis=-1)(xs) if s.merge == "concat" else
              keras.layers.Add()(xs) if s.merge == "add" else xs[0])
    points = [merged]
    for i, (u, a) in enumerate(s.trunk):
        points.append(dense(points[-1], u, a))
        if s.window and i == 0:
            points.append(keras.layers.Flatten()(points[-1]))
    outs = []
    for at, chain in s.heads:
        y = points[at]
        for u, a in chain:
            y = dense(y, u, a)
        outs.append(y)
    return keras.Model(ins, outs)


def build_torch(s: MSpec):
    import torch

    rng = np.random.default_rng(s.seed)
    acts = {"linear": torch.nn.Identity, "relu": torch.nn.ReLU, "tanh": torch.nn.Tanh,
            "sigmoid": torch.nn.Sigmoid, "softmax": lambda: torch.nn.Softmax(-1)}

    def seq(width: int, chain) -> tuple[torch.nn.Sequential, int]:
        mods = []
        for u, a in chain:
            lin = torch.nn.Linear(width, u)
            w, b = _weights(rng, width, u)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w.T.copy()))
                lin.bias.copy_(torch.from_numpy(b))
            mods += [lin, acts[a]()]
            width = u
        return torch.nn.Sequential(*mods), width

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            branches, widths = [], []
            for w, chain in s.inputs:
                m, out = seq(w, chain)
                branches.append(m)
                widths.append(out)
            self.branches = torch.nn.ModuleList(branches)
            width = sum(widths) if s.merge == "concat" else widths[0]
            steps, self.tap = [], {0: 0}
            for i, (u, a) in enumerate(s.trunk):
                m, width = seq(width, ((u, a),))
                steps.append(m)
                if s.window and i == 0:
                    width *= s.window
                    steps.append(torch.nn.Flatten(1))
            self.trunk = torch.nn.ModuleList(steps)
            heads = []
            for at, chain in s.heads:
                w_at = self._width_at(at, sum(widths) if s.merge == "concat" else widths[0])
                heads.append(seq(w_at, chain)[0])
            self.heads = torch.nn.ModuleList(heads)

        def _width_at(self, at: int, width: int) -> int:
            for m in list(self.trunk)[:at]:
                if isinstance(m, torch.nn.Flatten):
                    width *= s.window
                else:
                    width = m[0].out_features
            return width

        def forward(self, *xs):
            points = [_torch_merge(s.merge, [b(x) for b, x in zip(self.branches, xs, strict=True)])]
            for m in self.trunk:
                points.append(m(points[-1]))
            return tuple(hd(points[at]) for hd, (at, _) in zip(self.heads, s.heads, strict=True))

    return Net().eval()


def _torch_merge(kind: str, parts: list):
    import torch

    if kind == "concat":
        return torch.cat(parts, -1)
    h = parts[0]
    for p in parts[1:]:  # add: a + b + c, as a module's forward writes it
        h = h + p
    return h


def _model(s: MSpec, frontend: str):
    """(the framework's model, the hwbackends Model); ``onnx``: the torch module as
    torch.onnx writes it (dynamic batch), its reference the module."""
    if frontend == "keras":
        km = build_keras(s)
        return km, hwb.load_model(km, name="fuzz_multi")
    import torch

    mod = build_torch(s)
    ex = tuple(torch.zeros((1, *shape)) for shape in s.in_shapes())
    if frontend == "onnx":
        import io

        buf = io.BytesIO()
        ins = [f"in{i}" for i in range(len(ex))]
        outs = [f"out{k}" for k in range(len(s.heads))]
        torch.onnx.export(mod, ex, buf, dynamo=False, opset_version=17, input_names=ins,
                          output_names=outs, dynamic_axes={n: {0: "batch"} for n in (*ins, *outs)})
        import onnx

        return mod, hwb.load_model(onnx.load_from_string(buf.getvalue()), name="fuzz_multi")
    return mod, hwb.load_model(mod, name="fuzz_multi", example_input=ex)


def _reference(obj, frontend: str, xs: list[np.ndarray]) -> list[np.ndarray]:
    if frontend == "keras":  # torch and onnx: the module
        ys = obj(xs) if len(obj.outputs) > 1 else [obj(xs)]
        return [np.asarray(y, np.float64) for y in ys]
    import torch

    with torch.no_grad():
        ys = obj(*(torch.from_numpy(x) for x in xs))
    return [y.numpy().astype(np.float64) for y in ys]


def _inputs(s: MSpec, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1, (n, *shape)).astype(np.float32) for shape in s.in_shapes()]


def _err(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max()) / max(float(np.abs(want).max()), 1e-3)


def _check_ir(s: MSpec, frontend: str) -> None:
    obj, m = _model(s, frontend)
    net = extract_multi(m, "cpu.native")
    assert len(net.heads) == len(s.heads) and len(net.branches) == len(s.inputs)
    xs = _inputs(s, 16, s.seed + 1)
    for k, (g, w) in enumerate(zip(forward_multi(net, xs), _reference(obj, frontend, xs), strict=True)):
        assert g.shape == w.shape, (k, g.shape, w.shape)
        assert _err(g, w) <= BOUND, f"{s.describe()}: output {k} off by {_err(g, w):.3g}"


def _check_c(s: MSpec, frontend: str) -> None:
    obj, m = _model(s, frontend)
    with tempfile.TemporaryDirectory(prefix="hwb-fuzz-multi-") as store:
        cm = hwb.compile(m, "cpu.native", "fp32", store=store, isolate_compile=False, fidelity=False)
        assert cm.multi_io
        xs = _inputs(s, 9, s.seed + 2)  # 9: the batch of 1 runs 9 times
        want = _reference(obj, frontend, xs)
        by_name = {spec.name: x for spec, x in zip(cm.inputs, xs, strict=True)}
        for got in (cm.predict(tuple(xs)), cm.predict(by_name)):
            if len(want) == 1:  # one output: predict gives the array itself
                assert isinstance(got, np.ndarray)
                got = (got,)
            assert isinstance(got, tuple) and len(got) == len(want)
            for k, (g, w) in enumerate(zip(got, want, strict=True)):
                assert g.shape == w.shape and _err(g, w) <= BOUND, \
                    f"{s.describe()}: C output {k} off by {_err(g, w):.3g}"
        outs = tuple(np.full(spec.batched(1), np.nan, np.float32) for spec in cm.outputs)
        cm.predict_into(tuple(x[:1] for x in xs), outs)
        for k, (o, w) in enumerate(zip(outs, want, strict=True)):
            assert _err(o, w[:1]) <= BOUND, f"{s.describe()}: predict_into output {k}"


@pytest.mark.parametrize("frontend", ["keras", "torch", "onnx"])
def test_ir_reader_matches_the_framework(frontend: str) -> None:
    @_settings(6, 1)
    @given(mspecs())
    def check(s: MSpec) -> None:
        _check_ir(s, frontend)

    check()


@pytest.mark.parametrize("frontend", ["keras", "torch", "onnx"])
def test_generated_c_matches_the_framework(frontend: str) -> None:
    @_settings(3, 4)
    @given(mspecs())
    def check(s: MSpec) -> None:
        _check_c(s, frontend)

    check()


# -- the files, the C ABI, the refusals --------------------------------------------------------
DESK = MSpec(5, 0, ((6, ((8, "relu"),)), (3, ())), "concat", ((7, "relu"),),
             ((1, ((1, "tanh"),)), (1, ((3, "softmax"),)), (0, ((2, "sigmoid"),))))


def test_hwb_compile_takes_saved_multi_io_keras_and_onnx_files(tmp_path: Path, hwb_cli) -> None:
    from hwbackends import zoo

    km = build_keras(DESK)
    keras_file = tmp_path / "desk.keras"
    km.save(keras_file)
    onnx_file = tmp_path / "two_head.onnx"
    onnx_file.write_bytes(zoo.onnx_two_head().SerializeToString())
    for f in (keras_file, onnx_file):
        rc, out, err = hwb_cli("compile", str(f), "-t", "cpu.native", "-p", "fp32", "--json",
                               "--cache-dir", str(tmp_path / "store"))
        assert rc == 0, err
        d = json.loads(out)
        row = d[0] if isinstance(d, list) else d
        assert "cpu.native" in json.dumps(row)
    cm = hwb.compile(hwb.load_model(keras_file), "cpu.native", store=tmp_path / "store")
    xs = _inputs(DESK, 5, 1)
    for g, w in zip(cm.predict(tuple(xs)), _reference(km, "keras", xs), strict=True):
        assert _err(g, w) <= BOUND


_CLIENT = r"""
#include <math.h>
#include <stdio.h>
#include "hwb_model.h"
int main(void) {
    float a[HWB_MODEL_INPUT_0_SIZE], b[HWB_MODEL_INPUT_1_SIZE], rec[HWB_MODEL_INPUT_SIZE];
    float y0[HWB_MODEL_OUTPUT_0_SIZE], y1[HWB_MODEL_OUTPUT_1_SIZE], y2[HWB_MODEL_OUTPUT_2_SIZE];
    float out[HWB_MODEL_OUTPUT_SIZE];
    for (int i = 0; i < HWB_MODEL_INPUT_0_SIZE; i++) a[i] = rec[HWB_MODEL_INPUT_0_OFFSET + i] = 0.25f * i - 0.5f;
    for (int i = 0; i < HWB_MODEL_INPUT_1_SIZE; i++) b[i] = rec[HWB_MODEL_INPUT_1_OFFSET + i] = 0.5f - 0.3f * i;
    const float *xs[] = {a, b};
    float *ys[] = {y0, y1, y2};
    if (hwb_model_predict_multi(xs, ys) || hwb_model_predict(rec, out)) return 1;
    for (int k = 0; k < HWB_MODEL_OUTPUTS; k++) {
        const int n[] = {HWB_MODEL_OUTPUT_0_SIZE, HWB_MODEL_OUTPUT_1_SIZE, HWB_MODEL_OUTPUT_2_SIZE};
        const int at[] = {HWB_MODEL_OUTPUT_0_OFFSET, HWB_MODEL_OUTPUT_1_OFFSET, HWB_MODEL_OUTPUT_2_OFFSET};
        for (int i = 0; i < n[k]; i++) {
            if (ys[k][i] != out[at[k] + i]) return 2;
            printf("%.9g\n", ys[k][i]);
        }
    }
    printf("%s %s %d\n", HWB_MODEL_INPUT_0_NAME, HWB_MODEL_OUTPUT_2_NAME, HWB_MODEL_INPUTS);
    return 0;
}
"""


def test_the_exported_c_library_takes_buffers_and_packed_records(tmp_path: Path) -> None:
    km = build_keras(DESK)
    m = hwb.load_model(km, name="desk")
    from hwbackends.export import export

    cm = hwb.compile(m, "cpu.native", store=tmp_path / "store")
    res = export(m, "cpu.native", "c", tmp_path / "lib", store=tmp_path / "store")
    assert {p.name for p in res.files} == {"libhwb_model.so", "hwb_model.h"}
    (tmp_path / "lib" / "client.c").write_text(_CLIENT)
    subprocess.run(["cc", "-O1", "client.c", "-I.", "-L.", "-lhwb_model", "-Wl,-rpath,$ORIGIN", "-o",
                    "client"], cwd=tmp_path / "lib", check=True, capture_output=True)
    r = subprocess.run([str(tmp_path / "lib" / "client")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    a = (0.25 * np.arange(6) - 0.5).astype(np.float32)
    b = (0.5 - 0.3 * np.arange(3)).astype(np.float32)
    want = np.concatenate([np.ravel(y) for y in cm.predict((a, b))])
    np.testing.assert_array_equal(np.array(lines[:-3], np.float32), want.astype(np.float32))
    assert lines[-3:] == [cm.inputs[0].name, cm.outputs[2].name, "2"]


def test_refusals_name_what(tmp_path: Path) -> None:
    import keras

    km = build_keras(DESK)
    m = hwb.load_model(km, name="desk")
    for precision, words in (("int8", "calibrates on one input"), ("fixed", "'fp32'")):
        with pytest.raises(UnsupportedError, match=words):
            hwb.compile(m, "cpu.native", precision, store=tmp_path / "s", isolate_compile=False)
    # an output reading an input past the merge
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Dense(5)(keras.layers.Concatenate()([a, b]))
    skip = keras.Model([a, b], [keras.layers.Dense(1)(h), keras.layers.Dense(1)(a)])
    with pytest.raises(UnsupportedError, match="output"):
        extract_multi(hwb.load_model(skip, name="skip"), "cpu.native")
    # two merges: a concatenation of two inputs, added to the third
    c = keras.Input((2,), name="c")
    two = keras.Model([a, b, c], [keras.layers.Add()([keras.layers.Dense(2)(keras.layers.Concatenate()(
        [a, b])), c])])
    with pytest.raises(UnsupportedError, match="do not meet in one Concatenate"):
        extract_multi(hwb.load_model(two, name="two"), "cpu.native")
    cm = hwb.compile(m, "cpu.native", store=tmp_path / "s")
    with pytest.raises(UnsupportedError, match="one input and one output"):
        cm.sliding()


def test_a_window_branch_of_desk_layers_beside_a_state_vector(tmp_path: Path) -> None:
    """A (time, channels) window through Conv1D and LSTM (Keras) or a channels-first Conv1d
    and a mean over time (torch), beside a state vector, concatenated: the branches' layers
    are the single-chain readers' own. An input read by two branches is refused naming it."""
    import keras
    import torch

    rng = np.random.default_rng(3)
    xs = [rng.normal(size=(5, 10, 3)).astype(np.float32), rng.normal(size=(5, 4)).astype(np.float32)]
    a, b = keras.Input((10, 3), name="book"), keras.Input((4,), name="state")
    x = keras.layers.LSTM(6)(keras.layers.Conv1D(5, 3, activation="relu")(a))
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()(
        [x, keras.layers.Dense(4, activation="relu")(b)]))
    km = keras.Model([a, b], [keras.layers.Dense(1, activation="tanh")(h),
                              keras.layers.Dense(3, activation="softmax")(h)])
    cm = hwb.compile(km, "cpu.native", store=tmp_path / "s")
    for g, w in zip(cm.predict(tuple(xs)), km(xs), strict=True):
        assert _err(g, np.asarray(w, np.float64)) <= BOUND

    class Desk(torch.nn.Module):
        def __init__(self, fork: bool) -> None:
            super().__init__()
            self.fork = fork
            self.conv, self.lstm = torch.nn.Conv1d(3, 5, 3), torch.nn.LSTM(3, 6, batch_first=True)
            self.d, self.t = torch.nn.Linear(4, 4), torch.nn.Linear(15 if fork else 9, 8)
            self.h1, self.h2 = torch.nn.Linear(8, 1), torch.nn.Linear(8, 2)

        def forward(self, w, st):
            parts = [torch.relu(self.conv(w.transpose(1, 2))).mean(-1)]
            if self.fork:
                parts.append(self.lstm(w)[0][:, -1])
            h = torch.relu(self.t(torch.cat([*parts, torch.relu(self.d(st))], -1)))
            return torch.tanh(self.h1(h)), torch.sigmoid(self.h2(h))

    ex = (torch.zeros(1, 10, 3), torch.zeros(1, 4))
    mod = Desk(False).eval()
    cm = hwb.compile(hwb.load_model(mod, example_input=ex), "cpu.native", store=tmp_path / "s")
    for g, w in zip(cm.predict(tuple(xs)), _reference(mod, "torch", xs), strict=True):
        assert _err(g, w) <= BOUND
    with pytest.raises(UnsupportedError, match=r"operands reading inputs \[\[0\], \[0\], \[1\]\]"):
        extract_multi(hwb.load_model(Desk(True).eval(), example_input=ex), "cpu.native")


def _deep_onnx(depth: int):
    """Inputs a (4,) and b (3,): a through ``depth`` Relu nodes, concatenated with b, two
    Gemm heads."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, v = [], "a"
    for i in range(depth):
        nodes.append(helper.make_node("Relu", [v], [f"r{i}"]))
        v = f"r{i}"
    nodes.append(helper.make_node("Concat", [v, "b"], ["m"], axis=-1))
    inits = []
    for k, n in enumerate((1, 2)):
        inits += [numpy_helper.from_array(rng.normal(size=(7, n)).astype(np.float32), f"w{k}"),
                  numpy_helper.from_array(rng.normal(size=n).astype(np.float32), f"c{k}")]
        nodes.append(helper.make_node("Gemm", ["m", f"w{k}", f"c{k}"], [f"y{k}"]))
    g = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
                                          helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, ["N", n])
                           for k, n in enumerate((1, 2))], initializer=inits)
    return onnx.helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_deep_graph_is_read_without_recursion() -> None:
    """A hostile file's depth is no stack overflow: the merge is found by an iterative walk."""
    net = extract_multi(hwb.load_model(_deep_onnx(5000), name="deep"), "cpu.native")
    assert net.merge == "concat" and len(net.branches[0].layers) == 5000
    assert [len(h.layers) for h in net.heads] == [1, 1] and not net.trunk
