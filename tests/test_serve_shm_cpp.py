"""The C/C++ side of the shared-memory endpoint: examples/shm_strategy.cpp, compiled with g++
against `hwb serve --print-include`, runs against a live `hwb serve --shm` and gets exactly the
Python client's answers; protocol mismatches are a clear refusal."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hwbackends.serve.shm import ShmClient, endpoint_dir

sys.path.insert(0, str(Path(__file__).parent))
from shm_raw import VERSION, FakeServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the C++ example")


@pytest.fixture(scope="module")
def strategy_bin(tmp_path_factory) -> Path:
    inc = subprocess.run([sys.executable, "-m", "hwbackends", "serve", "--print-include"],
                         capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert (Path(inc) / "hwb_shm.h").is_file()
    out = tmp_path_factory.mktemp("cpp") / "shm_strategy"
    subprocess.run(["g++", "-O2", "-std=c++17", "-Wall", "-Werror", f"-I{inc}",
                    str(ROOT / "examples" / "shm_strategy.cpp"), "-o", str(out)],
                   check=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def hwb_serve(compiled):
    compiled("signal", "cpu.litert")  # in the session's store: the server below loads it
    name = f"hwb-cpp-{secrets.token_hex(3)}"
    p = subprocess.Popen([sys.executable, "-m", "hwbackends", "serve", "zoo:signal", "--target",
                          "cpu.litert", "--shm", name, "--preset", "single", "--duration", "300"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()  # the server prints its JSON info line once serving
        assert line, p.stderr.read()[-2000:]
        info = json.loads(line)
        assert info["shm"] == name and info["shm_mode"] == "direct"
        yield name
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
    assert not endpoint_dir(name).exists()  # the server removed its files on SIGTERM


def test_cpp_strategy_gets_the_python_clients_answers(strategy_bin, hwb_serve, zoo_model, litert_ref,
                                                      tmp_path):
    xs = np.ascontiguousarray(zoo_model("signal").validation_data[:200], dtype=np.float32)
    xs.tofile(tmp_path / "in.f32")
    r = subprocess.run([str(strategy_bin), hwb_serve, "predict", str(tmp_path / "in.f32"),
                        str(tmp_path / "out.f32")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    cpp = np.fromfile(tmp_path / "out.f32", np.float32).reshape(len(xs), 1)
    with ShmClient(hwb_serve) as c:
        py = np.stack([c.predict(x) for x in xs])
    np.testing.assert_array_equal(cpp, py)
    np.testing.assert_array_equal(cpp, litert_ref.predict(xs))
    r = subprocess.run([str(strategy_bin), hwb_serve, "bench", "2000"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["errors"] == 0 and stats["n"] == 1900


@pytest.fixture(scope="module")
def litert_ref(compiled):
    return compiled("signal", "cpu.litert")


def test_cpp_attach_refuses_mismatches_clearly(strategy_bin, hwb_serve, tmp_path):
    r = subprocess.run([str(strategy_bin), "hwb-no-such-endpoint", "bench", "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 3 and "no such endpoint" in r.stderr
    # an endpoint speaking another protocol version (a planted one, as the server's header is
    # sealed read-only): refused at attach with the reason
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    fake = FakeServer(root / "ep", hello_version=VERSION + 1)  # a newer server
    try:
        r = subprocess.run([str(strategy_bin), "ep", "bench", "1"], capture_output=True,
                           text=True, timeout=30, env=dict(os.environ, HWB_SHM_DIR=str(root)))
        assert r.returncode == 3 and "protocol version mismatch" in r.stderr
    finally:
        fake.close()
    # a wrong-size buffer is refused by the client before anything is sent
    src = tmp_path / "wrong.cpp"
    src.write_text(f"""#include <hwb_shm.h>
#include <cstdio>
int main() {{
    hwb_shm_client c;
    if (hwb_shm_attach(&c, "{hwb_serve}", 31, 1) != HWB_SHM_E_SHAPE) return 1;  // at attach
    if (hwb_shm_attach(&c, "{hwb_serve}", 0, 0)) return 2;
    float x[31] = {{0}}, y[1];
    int rc = hwb_shm_predict(&c, x, 31, y, 1, 0);                          // at call
    hwb_shm_detach(&c);
    std::printf("%s\\n", hwb_shm_strerror(rc));
    return rc == HWB_SHM_E_SHAPE ? 0 : 3;
}}
""")
    inc = ROOT / "hwbackends" / "serve" / "include"
    subprocess.run(["g++", "-std=c++17", f"-I{inc}", str(src), "-o", str(tmp_path / "wrong")],
                   check=True, timeout=120)
    r = subprocess.run([str(tmp_path / "wrong")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "shape mismatch" in r.stdout, (r.returncode, r.stdout)
    time.sleep(0)  # nothing left running


def test_header_compiles_as_c(tmp_path):
    """The header is C too (gnu11), with -Wall -Werror."""
    src = tmp_path / "c.c"
    src.write_text('#include <hwb_shm.h>\nint main(void) { hwb_shm_client c; '
                   'return hwb_shm_attach(&c, "x", 0, 0) == HWB_SHM_E_NOENT ? 0 : 1; }\n')
    inc = ROOT / "hwbackends" / "serve" / "include"
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    subprocess.run([cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", f"-I{inc}", str(src), "-o",
                    str(tmp_path / "c")], check=True, timeout=120)
    env = dict(os.environ, HWB_SHM_DIR=str(tmp_path / "none"))
    assert subprocess.run([str(tmp_path / "c")], env=env, timeout=30).returncode == 0
