"""A model with several inputs and outputs (``zoo:two_head``: features (16,) + state (4,) →
signal (1,) + confidence (1,)) through the serving engine (packed, hwbackends.packing), the
shared-memory endpoint and gRPC, the router (tuples on the hot path, failover, deadline
workers) and the benchmark harness. Every answer is checked against the model's own
reference for *its* input."""
from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import pytest

from hwbackends.errors import InputError, UnsupportedError
from hwbackends.packing import Layout, Packed
from hwbackends.specs import TensorSpec


@pytest.fixture(scope="module")
def two_head(zoo_model):
    return zoo_model("two_head")


@pytest.fixture(scope="module")
def cm(compiled):
    return compiled("two_head", "cpu.onnxruntime", "fp32", batch_size=4)


@pytest.fixture(scope="module")
def data(two_head):
    return two_head.representative(24, seed=11)


def _close(got, want, atol=1e-5):
    assert isinstance(got, tuple) and len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, atol=atol)


def test_layout_packs_and_splits_in_model_order():
    lay = Layout.of([TensorSpec("a", (2, 3)), TensorSpec("b", (4,))])
    assert lay.size == 10 and [f.offset for f in lay.fields] == [0, 6]
    a = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    b = -np.arange(8, dtype=np.float32).reshape(2, 4)
    rec = lay.pack({"b": b, "a": a})
    assert rec.shape == (2, 10) and rec.flags.c_contiguous
    np.testing.assert_array_equal(rec[1], np.r_[a[1].ravel(), b[1]])
    _close(lay.split(rec), (a, b), atol=0)
    one = lay.split(rec[0])  # one record → one sample per tensor, no batch axis
    assert [o.shape for o in one] == [(2, 3), (4,)]
    with pytest.raises(InputError, match="input 'b' has shape"):
        lay.pack((a, b[:, :3]))
    with pytest.raises(UnsupportedError, match="float32 tensors only.*ids \\(int32\\)"):
        Layout.of([TensorSpec("ids", (3,), "int32")])


def test_packed_backend_runs_the_model_with_strided_views(cm, data):
    p = Packed(cm)
    assert p.input.shape == (20,) and p.output.shape == (2,) and not p.multi_io
    rec = p.inputs_layout.pack(tuple(d[:4] for d in data))
    out = np.full((4, 2), np.nan, np.float32)
    p.predict_into(rec, out)
    _close(p.outputs_layout.split(out), cm.predict(tuple(d[:4] for d in data)))


def test_engine_serves_tuples_dicts_and_records(cm, data):
    from hwbackends.serve import Engine, EngineConfig

    want = cm.predict(data)
    with Engine(cm, EngineConfig.preset("single")) as eng:
        ins, outs = eng.layout
        assert eng.input_shape == (20,) and eng.output_shape == (2,)
        assert [f.name for f in ins.fields] == ["features", "state"]
        for i in range(6):
            _close(eng.predict((data[0][i], data[1][i])), tuple(w[i] for w in want))
        got = eng.predict({"state": data[1][7], "features": data[0][7]})
        _close(got, tuple(w[7] for w in want))
        y = eng.predict(ins.pack((data[0][8], data[1][8]))[0])  # the packed record itself
        _close(y, tuple(w[8] for w in want))
        bufs = tuple(np.zeros(s.shape, np.float32) for s in cm.outputs)
        assert eng.try_predict_into((data[0][9], data[1][9]), bufs)
        _close(bufs, tuple(w[9] for w in want))
        with pytest.raises(InputError, match="input 'state' has shape"):
            eng.predict((data[0][0], data[1][0][:3]))
        with pytest.raises(InputError, match="unknown \\['extra'\\]"):
            eng.predict({"features": data[0][0], "state": data[1][0], "extra": data[1][0]})
        bad = data[1][0].copy()
        bad[2] = np.nan
        with pytest.raises(InputError, match="input 'state' contains 1 NaN/Inf"):
            eng.predict((data[0][0], bad))
        with pytest.raises(InputError, match="one sample per call"):
            eng.predict((data[0][:2], data[1][:2]))
        with pytest.raises(InputError, match="output buffers"):
            eng.try_predict_into((data[0][0], data[1][0]), (bufs[0],))


def test_engine_micro_batches_concurrent_multi_io_requests(cm, data):
    from hwbackends.serve import Engine, EngineConfig

    want = cm.predict(data)
    with Engine(cm, EngineConfig.preset("latency")) as eng, cf.ThreadPoolExecutor(6) as ex:
        got = list(ex.map(lambda i: (i, eng.predict((data[0][i], data[1][i]))),
                          list(range(24)) * 3))
        for i, y in got:  # each caller got the answer to its own input
            _close(y, tuple(w[i] for w in want))
        assert eng.stats()["requests_ok"] == 72


def test_shm_and_grpc_carry_the_packed_record(cm, data):
    from hwbackends.serve import Engine, EngineConfig
    from hwbackends.serve.grpc_server import GrpcClient, GrpcServer
    from hwbackends.serve.shm import ShmClient, ShmServer

    want = cm.predict(data)
    with Engine(cm, EngineConfig.preset("single")) as eng:
        ins, outs = eng.layout
        name = f"mio{np.random.default_rng().integers(1 << 30)}"
        with ShmServer(eng, name, slots=2), ShmClient(name) as c:
            for i in range(5):
                rec = c.predict(ins.pack((data[0][i], data[1][i]))[0])
                _close(outs.split(rec), tuple(w[i] for w in want))
        with GrpcServer(eng, insecure_loopback=True) as srv, GrpcClient(srv.address, insecure=True) as g:
            info = g.info(eng.strategy)  # what a client in another language reads the layout from
            assert [(f.name, list(f.shape), f.offset, f.size) for f in info.inputs] == \
                [("features", [16], 0, 16), ("state", [4], 16, 4)]
            assert [(f.name, f.offset) for f in info.outputs] == [("signal", 0), ("confidence", 1)]
            recs = g.predict(eng.strategy, ins.pack((data[0][:5], data[1][:5])), batch=True)
            _close(outs.split(recs), tuple(w[:5] for w in want))


def _config(tmp_path, extra=""):
    p = tmp_path / "strategies.toml"
    p.write_text('[tiers.t]\np99_us = 50000\n\n[router]\nisolate_compile = false\n'
                 '[router.bench]\nn = 200\nwarmup = 20\n\n'
                 '[strategies.s]\nmodel = "zoo:two_head"\ntier = "t"\nbatch_size = 4\n'
                 f'targets = ["cpu.onnxruntime", "cpu.litert"]\nprecisions = ["fp32"]\n{extra}')
    return p


@pytest.mark.parametrize("extra", ["", "timeout_us = 2000000"], ids=["direct", "deadline-worker"])
def test_router_plans_and_routes_tuples(tmp_path, store_dir, two_head, data, extra):
    from hwbackends.router import Router

    r = Router.from_config(_config(tmp_path, extra), store=store_dir)
    try:
        d = r.decisions["s"]
        assert {c.status for c in d.candidates} <= {"chosen", "candidate", "fallback"}, r.explain()
        assert all(c.profile is not None and c.profile.p50_us > 0 for c in d.order)
        want = two_head.reference(data)
        _close(r.predict("s", data), want)  # 24 samples through batch-4 lanes
        _close(r.predict("s", (data[0][2], data[1][2])), tuple(w[2] for w in want))
        xs = tuple(np.ascontiguousarray(x[:4]) for x in data)
        outs = tuple(np.zeros((4, 1), np.float32) for _ in range(2))
        r.route_into("s", xs, outs)
        _close(outs, tuple(w[:4] for w in want))
        f = r.handle("s")
        f(tuple(np.ascontiguousarray(x[4:8]) for x in data), outs)
        _close(outs, tuple(w[4:8] for w in want))
    finally:
        r.close()


def test_router_strategy_is_served_by_the_engine_packed(tmp_path, store_dir, two_head, data):
    from hwbackends.router import Router
    from hwbackends.serve import Engine, EngineConfig, RouterStrategy

    r = Router.from_config(_config(tmp_path), store=store_dir)
    try:
        rs = RouterStrategy(r, "s")
        assert rs.multi_io
        want = two_head.reference(data)
        with Engine(rs, EngineConfig.preset("latency"), strategy="s") as eng:
            assert eng.layout is not None
            for i in range(5):
                _close(eng.predict((data[0][i], data[1][i])), tuple(w[i] for w in want))
    finally:
        r.close()


def test_bench_measures_multi_io_variants(cm, two_head, store_dir):
    from hwbackends.bench import SingleStream
    from hwbackends.bench.harness import bench_model, measure

    prof = measure(cm, SingleStream(n=200, warmup=10))
    assert prof.n == 200 and 0 < prof.p50_us <= prof.p99_us
    res = bench_model(two_head, ["cpu.onnxruntime"], ["fp32"], [SingleStream(n=100, warmup=10)],
                      store=store_dir, progress=False)
    assert [p.variant for p in res.profiles] == ["cpu.onnxruntime:fp32"]
    assert res.profiles[0].fidelity and res.profiles[0].fidelity.get("outputs")


class _Renamed:
    """Same record sizes as two_head, other tensor names: a swap must not mix them up."""

    def __init__(self, cm):
        self.cm, self.batch_size, self.multi_io = cm, cm.batch_size, True
        self.inputs = [TensorSpec("x", (16,)), TensorSpec("y", (4,))]
        self.outputs = [TensorSpec("a", (1,)), TensorSpec("b", (1,))]
        self.input, self.output = self.inputs[0], self.outputs[0]

    def predict_into(self, xs, outs):
        self.cm.predict_into(xs, outs)


def test_swap_keeps_serving_the_same_tensors(cm, compiled, data):
    import threading

    from hwbackends.serve import Engine, EngineConfig

    litert = compiled("two_head", "cpu.litert", "fp32", batch_size=4)
    want = cm.predict(data)
    stop, errors = threading.Event(), []

    def traffic(eng):
        i = 0
        while not stop.is_set():
            y = eng.predict((data[0][i % 24], data[1][i % 24]))
            if not all(np.allclose(g, w[i % 24], atol=1e-5) for g, w in zip(y, want, strict=True)):
                errors.append(i)
            i += 1

    with Engine(cm, EngineConfig.preset("latency", shadow_samples=16)) as eng:
        t = threading.Thread(target=traffic, args=(eng,))
        t.start()
        try:
            res = eng.swap(_Renamed(litert))
            assert not res.accepted and "tensors" in res.reason
            res = eng.swap(litert)
            assert res.accepted, res.reason
            assert eng.variant == "cpu.litert:fp32" and eng.layout is not None
        finally:
            stop.set()
            t.join(30)
    assert errors == []
