"""Load the Edge TPU delegate in a child process before trusting it.

A ``libedgetpu.so.1`` built against another TensorFlow Lite ABI than the installed
``ai-edge-litert`` does not fail politely: it segfaults the process that loads it
(google-coral/edgetpu#812). The target would take the caller (a trading process) down with
it, so the delegate is first loaded and run once — ``load_delegate`` + an interpreter with the
delegate + one ``invoke`` on a tiny bundled int8 model — in a fresh interpreter; only a clean
exit lets ``tpu.edgetpu`` report hardware. The answer is cached per delegate file (path, size,
mtime).
"""
from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

#: A one-layer full-int8 TFLite model (4 → 2 FULLY_CONNECTED), made with the TFLite converter.
PROBE_MODEL = Path(__file__).with_name("probe.tflite")

_CHILD = r"""
import os, sys
try:
    from ai_edge_litert.interpreter import Interpreter, load_delegate
    delegate = load_delegate(sys.argv[1])
    it = Interpreter(model_path=sys.argv[2], experimental_delegates=[delegate])
    it.allocate_tensors()
    it.invoke()
except Exception as exc:  # os._exit: no finalizer noise after the real error
    print("EDGETPU-DELEGATE-ERROR", f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    os._exit(3)
print("EDGETPU-DELEGATE-OK", flush=True)
"""


def probe_delegate(path: str, timeout: float = 60.0) -> str | None:
    """None when the delegate at ``path`` loads and runs one invoke in a child process, else
    why not (what happened, and what to do)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"Edge TPU delegate {path} cannot be read: {exc.strerror}"
    return _probe(os.path.realpath(path), st.st_size, st.st_mtime_ns, timeout)


@functools.lru_cache(maxsize=8)
def _probe(path: str, size: int, mtime_ns: int, timeout: float) -> str | None:
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, path, str(PROBE_MODEL)],
                           capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    except subprocess.TimeoutExpired:
        return (f"Edge TPU delegate {path} hung for {timeout:.0f} s on load + one invoke in a "
                f"probe process (device busy or wedged?)")
    if r.returncode == 0 and "EDGETPU-DELEGATE-OK" in r.stdout:
        return None
    from .._util import version

    runtime = f"ai-edge-litert {version('ai-edge-litert') or '?'}"
    if r.returncode < 0:
        try:
            sig = signal.Signals(-r.returncode).name
        except ValueError:
            sig = f"signal {-r.returncode}"
        return (f"Edge TPU delegate {path} crashed the probe process ({sig}) on load + one "
                f"invoke: it was built for another TensorFlow Lite ABI than {runtime} "
                f"(google-coral/edgetpu#812); install the libedgetpu build made for this "
                f"runtime, or pin the runtime it was built for")
    lines = [ln for ln in (r.stderr or "").splitlines() if ln.strip()]
    last = next((ln.split(" ", 1)[1] for ln in lines if ln.startswith("EDGETPU-DELEGATE-ERROR ")),
                lines[-1] if lines else f"exit code {r.returncode}")
    return (f"Edge TPU delegate {path} failed to load + invoke in a probe process under "
            f"{runtime}: {last[:300]}")
