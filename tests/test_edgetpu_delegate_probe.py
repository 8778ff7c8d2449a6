"""tpu.edgetpu's delegate probe: the delegate is loaded and invoked once in a child process, so
a libedgetpu built for another TFLite ABI (it segfaults its loader, google-coral/edgetpu#812)
costs a probe process, not the caller. Real shared libraries, real child processes, the real
LiteRT ``load_delegate``."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("ai_edge_litert", reason="ai-edge-litert not installed")

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler to build the test delegates")

CRASHING = r"""
#include <signal.h>
/* What an ABI-mismatched delegate does to its loader, at the earliest moment: dlopen. */
__attribute__((constructor)) static void crash_on_load(void) { raise(SIGSEGV); }
void* tflite_plugin_create_delegate(void) { return 0; }
"""

# A delegate that claims no node: TFLite's external-delegate plugin ABI with the
# TfLiteDelegate layout of tensorflow/lite/core/c/common.h.
WORKING = r"""
#include <stdint.h>
#include <stdlib.h>
typedef struct TfLiteDelegate {
  void* data_;
  int (*Prepare)(void* context, struct TfLiteDelegate* delegate);
  void* CopyFromBufferHandle;
  void* CopyToBufferHandle;
  void* FreeBufferHandle;
  int64_t flags;
  void* opaque_delegate_builder;
} TfLiteDelegate;
static int prepare(void* context, TfLiteDelegate* d) { (void)context; (void)d; return 0; }
TfLiteDelegate* tflite_plugin_create_delegate(char** k, char** v, size_t n, void (*err)(const char*)) {
  (void)k; (void)v; (void)n; (void)err;
  TfLiteDelegate* d = calloc(1, sizeof(TfLiteDelegate));
  d->Prepare = prepare;
  return d;
}
void tflite_plugin_destroy_delegate(TfLiteDelegate* d) { free(d); }
"""


def _build(tmp_path: Path, name: str, source: str) -> str:
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    lib = tmp_path / f"{name}.so"
    subprocess.run([CC, "-shared", "-fPIC", "-O0", "-o", str(lib), str(src)], check=True,
                   capture_output=True, timeout=60)
    return str(lib)


@needs_cc
def test_delegate_that_crashes_its_loader_is_unavailable_with_the_abi_reason(tmp_path):
    from hwb_plugins.tpu_edgetpu.delegate_probe import probe_delegate

    reason = probe_delegate(_build(tmp_path, "libedgetpu_crash", CRASHING))
    assert reason is not None
    assert "crashed the probe process (SIGSEGV)" in reason
    assert "another TensorFlow Lite ABI" in reason and "ai-edge-litert" in reason


def test_file_that_is_not_a_library_is_unavailable(tmp_path):
    from hwb_plugins.tpu_edgetpu.delegate_probe import probe_delegate

    fake = tmp_path / "libedgetpu.so.1"
    fake.write_text("not an ELF file\n")
    reason = probe_delegate(str(fake))
    assert reason is not None and "failed to load + invoke" in reason, reason
    assert "OSError" in reason and ("file too short" in reason or "ELF" in reason), reason
    assert probe_delegate(str(tmp_path / "absent.so")).endswith("No such file or directory")


@needs_cc
def test_delegate_that_loads_and_invokes_passes(tmp_path):
    from hwb_plugins.tpu_edgetpu.delegate_probe import PROBE_MODEL, probe_delegate

    assert PROBE_MODEL.stat().st_size > 0
    assert probe_delegate(_build(tmp_path, "libedgetpu_ok", WORKING)) is None
