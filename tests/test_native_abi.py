"""The native entry's C ABI (hwbackends/serve/include/hwb_native.h): one
header, valid C and C++ on its own, the only definition of the struct in the source tree;
every cpu.native build (the incremental and the recompute sliding forms) offers an ABI 3
entry whose window the shm loop can serve; the extension's fixed C (hwb_plugins/cpu_native/
hwb_ext.h) compiles warning-free; `hwb serve --print-include` names the header's directory."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import native_entries
import numpy as np
import pytest

from hwb_plugins.cpu_native import build
from hwbackends.serve import Engine, EngineConfig, _shmloop
from hwbackends.serve.shm import INCLUDE_DIR, ShmClient, ShmServer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

_PROGRAM = r"""
#include <stdio.h>
#include "hwb_native.h"
int main(void) {
    printf("%u %u %zu %zu %zu\n", (unsigned)HWB_NATIVE_ENTRY_ABI, (unsigned)HWB_NATIVE_ENTRY_V1_BYTES,
           sizeof(hwb_native_entry), offsetof(hwb_native_entry, push), offsetof(hwb_native_entry, window));
    return 0;
}
"""


@pytest.mark.parametrize("compiler, std, suffix", [("cc", "-std=c11", "c"), ("g++", "-std=c++17", "cpp")])
def test_the_header_is_c_and_cpp_on_its_own(tmp_path, compiler, std, suffix):
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    src = tmp_path / f"layout.{suffix}"
    src.write_text(_PROGRAM)
    exe = tmp_path / "layout"
    subprocess.run([compiler, std, "-pedantic", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE_DIR}",
                    str(src), "-o", str(exe)], check=True, timeout=120)
    abi, v1, size, push, window = map(int, subprocess.run([str(exe)], capture_output=True, text=True,
                                                          check=True).stdout.split())
    # the server was compiled from the same header: its constants are the same numbers
    assert (abi, v1, size) == (_shmloop.NATIVE_ENTRY_ABI, _shmloop.NATIVE_ENTRY_V1_BYTES,
                               _shmloop.NATIVE_ENTRY_BYTES)
    assert push == v1  # ABI 2 only appends, and so does ABI 3
    if sysconfig.get_config_var("SIZEOF_VOID_P") == 8:
        assert (abi, v1, size, window) == (3, 32, 128, 60)


def test_the_struct_is_defined_in_the_header_only():
    # the end of a typedef of the struct (brace, name, semicolon) anywhere but hwb_native.h is
    # a copy of it
    definition = re.compile("}" + r"\s*hwb_native_entry\s*;")
    found = []
    for top in ("hwbackends", "hwb_plugins", "tests", "examples", "bench", "scripts", "hwb_sim"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in {".c", ".h", ".cpp", ".hpp", ".py"} and path.is_file():
                if definition.search(path.read_text(errors="replace")):
                    found.append(path.relative_to(ROOT).as_posix())
    assert found == ["hwbackends/serve/include/hwb_native.h"]


def test_hwb_serve_print_include_names_the_headers_directory():
    r = subprocess.run([sys.executable, "-m", "hwbackends", "serve", "--print-include"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    d = Path(r.stdout.strip())
    assert (d / "hwb_native.h").is_file() and (d / "hwb_shm.h").is_file()
    assert d == INCLUDE_DIR == build.NATIVE_INCLUDE  # what cpu.native builds against


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    return native_entries.build(tmp_path_factory.mktemp("entries"))


@pytest.mark.parametrize("name, precision, form", [
    ("lstm", "fp32", "incremental"), ("lstm", "int8", "recompute"), ("signal", "fp32", "recompute")])
def test_every_cpu_native_build_offers_its_window_in_the_entry(compiled, entries, name, precision, form):
    cm = compiled(name, "cpu.native", precision)
    assert cm.artifact.meta["sliding"]["form"] == form
    cap = cm.executor.native_entry()
    f = entries.fields(cap)
    window, step = int(cm.input.shape[0]), int(np.prod(cm.input.shape[1:]))
    assert f == {"abi": 3, "struct_bytes": _shmloop.NATIVE_ENTRY_BYTES, "predict": True,
                 "in_count": window * step, "out_count": int(np.prod(cm.output.shape)), "batch": 1,
                 "push": True, "prepare": True, "reset": True, "step_count": step, "window": window}
    assert _shmloop.native_windows(cap) == (window, step, f["out_count"])
    assert cm.executor.module.info()["native_entry_abi"] == 3


def test_the_recompute_forms_window_is_served_from_the_entry(compiled):
    # the fallback form (int8 here) through the C loop: the entry's push equals cm.sliding()
    cm = compiled("lstm", "cpu.native", "int8")
    xs = np.random.default_rng(21).normal(0, 1, (60, *cm.input.shape[1:])).astype(np.float32)
    eng = Engine(cm, EngineConfig.preset("single", warmup=1)).start()
    try:
        with ShmServer(eng, slots=1, sliding=True) as srv, ShmClient(srv.name) as c:
            assert srv.native, srv.native_reason
            got = np.stack([c.predict(x) for x in xs])
    finally:
        eng.stop()
    w = cm.sliding()
    want = np.empty((len(xs), *cm.output.shape), np.float32)
    for i, x in enumerate(xs):
        w.push_into(x, want[i])
    np.testing.assert_array_equal(got, want)


def test_the_extensions_c_compiles_warning_free(compiled):
    # the artifact's generated ext.c: shapes, method table and PyInit around hwb_ext.h; the
    # sliding window's entries (sliding.py) leave their unused METH_NOARGS parameters
    art = Path(compiled("lstm", "cpu.native").artifact.path)
    ext = (art / "ext.c").read_text()
    assert '#include "hwb_ext.h"' in ext and "hwb_native_entry" not in ext
    subprocess.run([build.compiler(), "-fsyntax-only", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                    "-Wno-unused-parameter", f"-I{art}", f"-I{build.RUNTIME_DIR}",
                    f"-I{build.NATIVE_INCLUDE}", f"-I{sysconfig.get_paths()['include']}", "ext.c"],
                   cwd=art, check=True, timeout=120)
