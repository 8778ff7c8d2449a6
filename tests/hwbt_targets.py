"""Targets for the trust and isolation tests. A module of its own (not a test file) because
the compile worker unpickles targets by module name.

- ``fpga.hwbt_so`` builds a shared library with g++ (as ``fpga.hls4ml`` does) whose
  constructor writes ``$HWBT_MARKER``: proof of whether a library was ever ``dlopen``'d.
- ``cpu.hwbt_setsid`` is a "compiler" that starts a helper in a new session (``setsid sleep
  1000``), writes an intermediate file into ``TMPDIR`` (like ``cc*.s``) and never finishes.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

from hwbackends import hookimpl
from hwbackends.specs import Availability
from hwbackends.target import Artifact, CompileOptions, Target

_CONSTRUCTOR = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void hwbt_ran(void) {
    const char *p = getenv("HWBT_MARKER");
    if (p) { FILE *f = fopen(p, "w"); if (f) { fputs("constructor ran\n", f); fclose(f); } }
}
extern "C" int hwbt_answer(void) { return 42; }
"""


class _Zeros:
    """Writes zeros: enough for the store's checks, which compare against stored outputs."""

    def __init__(self, lib: Any, batch: int):
        self.lib, self.batch_size = lib, batch

    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None:
        out[...] = 0.0


class SoTarget(Target):
    name = "fpga.hwbt_so"
    family = "fpga"
    formats = ("keras",)
    static_batch = False
    description = "test target: a g++-built library with a constructor"

    def probe(self) -> Availability:
        return Availability.hardware("CPU (test)")

    def toolchain(self) -> dict[str, str]:
        return {"hwbt": "1"}

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        src = workdir.parent / f"{workdir.name}-lib.cpp"
        src.write_text(_CONSTRUCTOR)
        try:
            subprocess.run(["g++", "-shared", "-fPIC", "-o", str(workdir / "lib.so"), str(src)],
                           check=True, capture_output=True)
        finally:
            src.unlink()
        return {"lib": "lib.so"}

    def load(self, artifact: Artifact, options: CompileOptions) -> Any:
        lib = ctypes.CDLL(str(artifact.file("lib.so")))
        return _Zeros(lib, artifact.batch_size)


class SetsidTarget(Target):
    name = "cpu.hwbt_setsid"
    family = "cpu"
    formats = ("keras",)
    description = "test target: a compiler whose helper escapes the process group"

    def __init__(self, report: str = "") -> None:
        # Where compile() says what it did. Plain data on the target, which is pickled into
        # the compile worker: an environment variable would not reach a worker that was
        # started before the test set it.
        self.report = report

    def probe(self) -> Availability:
        return Availability.hardware("CPU (test)")

    def toolchain(self) -> dict[str, str]:
        return {"hwbt": "1"}

    def compile(self, model: Any, options: CompileOptions, workdir: Path) -> dict[str, Any]:
        report = Path(self.report)
        fd, scratch = tempfile.mkstemp(prefix="cc", suffix=".s")  # as g++ does, under TMPDIR
        os.close(fd)
        helper = subprocess.Popen(["setsid", "sleep", "1000"])
        time.sleep(0.3)  # let setsid exec into sleep
        report.write_text(f"{helper.pid}\n{scratch}\n{tempfile.gettempdir()}\n")
        time.sleep(1000)
        return {}

    def load(self, artifact: Artifact, options: CompileOptions) -> Any:
        raise AssertionError("never built")


def plugin(*targets: Target) -> types.ModuleType:
    mod = types.ModuleType("hwbt_targets_plugin")
    mod.hwb_targets = hookimpl(lambda: list(targets))
    return mod
