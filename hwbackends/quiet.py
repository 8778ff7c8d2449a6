"""Keep the toolchains' start-up noise off the terminal (``hwb`` without ``-v``).

TensorFlow 2.21 prints ``WARNING: All log messages before absl::InitializeLog() is called are
written to STDERR`` and oneDNN/CPU-feature ``I0000 …`` lines from C++ while it is imported,
before any environment variable or Python logger can stop them (``TF_CPP_MIN_LOG_LEVEL``
hides only the later ones). So the first ``import tensorflow`` of the process runs with file
descriptor 2 pointed at ``/dev/null`` (:class:`QuietImport`), whoever imports it (Keras, a
plugin, the LiteRT converter); Python exceptions from the import still propagate and are
reported as usual. The compile worker needs none of this: its output goes to a log file that
errors quote.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
from typing import Any, Iterator, Sequence

#: Top-level packages whose import prints C++ log lines.
NOISY = ("tensorflow",)
#: Python loggers that repeat framework chatter at WARNING.
LOGGERS = ("tensorflow", "absl", "h5py", "jax._src.xla_bridge")


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to ``/dev/null`` for the duration (C/C++ writes included)."""
    try:
        sys.stderr.flush()
    except (AttributeError, ValueError, OSError):
        pass
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class QuietImport(importlib.abc.MetaPathFinder):
    """A meta-path finder that finds nothing itself: for the packages in ``names`` it asks the
    other finders and wraps the loader so the module body runs under :func:`stderr_silenced`."""

    def __init__(self, names: Sequence[str] = NOISY):
        self.names = set(names)
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.names or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.on = False
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                with stderr_silenced():
                    run(module)
            finally:
                self.names.discard(fullname)  # once per process
                with contextlib.suppress(AttributeError):
                    del loader.exec_module

        loader.exec_module = exec_module
        return spec


def install(names: Sequence[str] = NOISY) -> None:
    """Quiet the framework imports and chatter of this process (idempotent)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if any(isinstance(f, QuietImport) for f in sys.meta_path):
        return
    todo = [n for n in names if n not in sys.modules]
    if todo:
        sys.meta_path.insert(0, QuietImport(todo))
