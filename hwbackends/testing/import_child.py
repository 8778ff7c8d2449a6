"""Run by the ``probe_is_light`` check (:mod:`hwbackends.testing.light`) as a script in a fresh
interpreter: load one plugin through its entry point, call ``hwb_targets()`` and one target's
``probe()``, and time every module imported meanwhile. Prints one JSON line on stdout.

    python import_child.py GROUP ENTRY_POINT TARGET

Each import is timed in *CPU* seconds of this process (``time.process_time``), not wall
time: executing a module's code and loading its shared libraries is what an import costs,
and on a busy machine wall time would charge a light module for other processes' work.
"""
from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from importlib.abc import MetaPathFinder
from typing import Any

# The core (and so the package root) is imported by every plugin: not the plugin's cost.
import hwbackends.target  # noqa: F401

#: (module, cumulative CPU ms including what it imports, phase)
RECORDS: list[tuple[str, float, str]] = []
PHASE = ["before"]


class TimedLoader:
    """Delegates to the real loader, timing module creation and execution."""

    def __init__(self, loader: Any, name: str):
        self._loader, self._name = loader, name

    def create_module(self, spec: Any) -> Any:
        t0 = time.process_time()
        try:
            return self._loader.create_module(spec)
        finally:
            self._created = time.process_time() - t0

    def exec_module(self, module: Any) -> None:
        t0 = time.process_time()
        self._loader.exec_module(module)
        spent = time.process_time() - t0 + getattr(self, "_created", 0.0)
        RECORDS.append((self._name, spent * 1000.0, PHASE[0]))

    def __getattr__(self, attr: str) -> Any:  # get_data, is_package, resource readers, …
        return getattr(self._loader, attr)


class TimingFinder(MetaPathFinder):
    """Finds specs with the other finders and wraps their loaders in :class:`TimedLoader`
    (namespace packages hold no code and are not wrapped)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and spec.origin not in (None, "namespace"):
                    spec.loader = TimedLoader(spec.loader, name)
                return spec
        return None


def main(group: str, ep_name: str, target: str) -> None:
    ep = next(e for e in importlib.metadata.entry_points(group=group) if e.name == ep_name)
    sys.meta_path.insert(0, TimingFinder())
    PHASE[0] = "import"
    plugin = ep.load()
    targets = list(plugin.hwb_targets()) if hasattr(plugin, "hwb_targets") else []
    PHASE[0] = "probe"
    av = next(t for t in targets if t.name == target).probe()
    PHASE[0] = "end"
    print(json.dumps({"mode": av.mode.value, "package": ep.value.split(":")[0].split(".")[0],
                      "imports": RECORDS}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
