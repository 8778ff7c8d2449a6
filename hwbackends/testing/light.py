"""Target-level check: loading a plugin and probing its target stay light.

``hwb targets`` imports every installed plugin and probes every target, so each costs every
user something on every command. Measured, not guessed from a list of known heavy names: in a
fresh interpreter (:mod:`.import_child`: it times imports), while the plugin is imported and registers its
targets, and while ``probe()`` runs, every import is timed in CPU time of that process, and

* no module may take more than :data:`IMPORT_BUDGET_MS` to import (cumulative: a module
  counts with everything it pulls in), and
* no top-level package may be loaded beyond the standard library, the core's own
  dependencies, the plugin's own package and :data:`LIGHT_PACKAGES`.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..registry import ENTRY_POINT_GROUP
from .context import Conformance, ConformanceError, NotApplicable

#: The most one module may take to import (CPU ms, cumulative) while the plugin loads or
#: probes: the built-in plugins take 5–60 ms; a vendor SDK such as OpenVINO ~300 ms.
IMPORT_BUDGET_MS = 150.0
#: Non-standard-library top-level packages a plugin may import at load or probe time: the
#: core and its light dependencies. Everything else (frameworks, vendor SDKs) belongs in
#: ``compile()``/``load()``/``toolchain()``.
LIGHT_PACKAGES = frozenset({
    "hwbackends", "hwb_plugins", "numpy", "pluggy", "pydantic", "pydantic_core",
    "typing_extensions", "annotated_types", "typing_inspection", "importlib_metadata",
})
CHILD = Path(__file__).with_name("import_child.py")


@dataclass(frozen=True)
class Imported:
    """A module first imported during ``phase``, with its import cost in CPU ms."""

    module: str
    cumulative_ms: float
    phase: str

    @property
    def package(self) -> str:
        return self.module.split(".")[0]


def parse_records(records: list[list[Any]]) -> list[Imported]:
    """The child's ``imports`` records as :class:`Imported`."""
    return [Imported(name, float(ms), phase) for name, ms, phase in records]


def violations(imports: list[Imported], own_package: str,
               budget_ms: float = IMPORT_BUDGET_MS) -> list[str]:
    """What the plugin import (phase ``import``) and ``probe()`` (phase ``probe``) did wrong."""
    allowed = set(sys.stdlib_module_names) | LIGHT_PACKAGES | {own_package}
    bad = []
    for phase, what in (("import", "importing the plugin / hwb_targets()"), ("probe", "probe()")):
        mine = [i for i in imports if i.phase == phase]
        slow = sorted((i for i in mine if i.cumulative_ms > budget_ms),
                      key=lambda i: -i.cumulative_ms)
        if slow:
            bad.append(f"{what} imports {', '.join(f'{i.module} ({i.cumulative_ms:.0f} ms)' for i in slow[:3])}"
                       f": over the {budget_ms:.0f} ms budget per module")
        new = {}
        for i in mine:
            if i.package not in allowed:
                new[i.package] = max(new.get(i.package, 0.0), i.cumulative_ms)
        if new:
            bad.append(f"{what} imports {', '.join(f'{p} ({ms:.0f} ms)' for p, ms in sorted(new.items()))}"
                       f": not a light package ({', '.join(sorted(LIGHT_PACKAGES))} or the "
                       f"standard library)")
    return bad


def check_probe_is_light(ctx: Conformance) -> str:
    """In a fresh interpreter, importing the plugin, ``hwb_targets()`` and ``probe()`` import
    no module costing over :data:`IMPORT_BUDGET_MS` of CPU time and no package beyond
    :data:`LIGHT_PACKAGES`, the standard library and the plugin's own."""
    name = ctx.target_name
    ep = ctx.reg.target_plugin.get(name)
    if not ep or not [e for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if e.name == ep]:
        raise NotApplicable(f"{name} is not installed through the {ENTRY_POINT_GROUP!r} entry-point "
                            f"group (registered at run time), so a fresh process cannot load it")
    r = subprocess.run([sys.executable, str(CHILD), ENTRY_POINT_GROUP, ep, name],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    if r.returncode != 0:
        raise ConformanceError(f"loading plugin {ep!r} and probing {name} in a fresh process "
                               f"failed:\n{r.stderr[-2000:]}")
    child = json.loads(r.stdout.strip().splitlines()[-1])
    imports = parse_records(child["imports"])
    bad = violations(imports, child["package"])
    if bad:
        raise ConformanceError(f"{name}: " + "; ".join(bad) + ". Move heavy imports into "
                               "compile()/load()/toolchain(); probe with importlib.util.find_spec "
                               "or shutil.which")
    worst = max((i for i in imports if i.phase in ("import", "probe")),
                key=lambda i: i.cumulative_ms, default=None)
    return (f"plugin {ep!r}: {sum(i.phase in ('import', 'probe') for i in imports)} modules imported, "
            f"slowest {worst.module if worst else '-'} "
            f"({worst.cumulative_ms if worst else 0:.1f} ms CPU; budget {IMPORT_BUDGET_MS:.0f} ms)")
