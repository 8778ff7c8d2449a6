"""Run by the light-probe check (:mod:`hwbackends.testing.light`) as a script in a fresh
``python -X importtime`` interpreter: load one plugin through its entry point, call
``hwb_targets()`` and one target's ``probe()``, and mark each phase on stderr so the import
log can be split by phase. Prints one JSON line on stdout.

    python -X importtime probe_child.py GROUP ENTRY_POINT TARGET
"""
from __future__ import annotations

import importlib.metadata
import json
import sys

# The core (and so the package root) is imported by every plugin: not the plugin's cost.
import hwbackends.target  # noqa: F401

PHASE = "hwb-phase:"


def mark(phase: str) -> None:
    print(f"{PHASE} {phase}", file=sys.stderr, flush=True)


def main(group: str, ep_name: str, target: str) -> None:
    ep = next(e for e in importlib.metadata.entry_points(group=group) if e.name == ep_name)
    mark("import")
    plugin = ep.load()
    targets = list(plugin.hwb_targets()) if hasattr(plugin, "hwb_targets") else []
    mark("probe")
    av = next(t for t in targets if t.name == target).probe()
    mark("end")
    # The top-level packages really loaded: find_spec("a.b") tries to import "a" to search it,
    # which -X importtime logs even when "a" is absent, or a code-less namespace package.
    loaded = sorted(n for n, m in sys.modules.items() if "." not in n
                    and not (hasattr(m, "__path__") and getattr(m, "__file__", None) is None))
    print(json.dumps({"mode": av.mode.value, "package": ep.value.split(":")[0].split(".")[0],
                      "loaded": loaded}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
