"""The results file of ``hwb bench``: versioned JSON that ``hwb report`` and others read."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import strict_json
from ..errors import ResultsError
from ..variant import RecordError, VariantRecord
from .profile import LatencyProfile, table, table_csv

FORMAT = "hwbackends-bench-results"
#: Bumped when the layout changes incompatibly; loading another version is a clear error
#: saying to re-run ``hwb bench``. 2: a variant row's plugin metadata is ``plugin_report``
#: (was ``fpga``), and the rows written before the variant record are no longer read.
VERSION = 2


@dataclass
class BenchResults:
    """Everything one bench run found: what could run and how (availability), each compiled
    variant (fidelity, compile time, artifact size, or the error), the measured profiles, and
    optionally the routing decisions made from them."""

    model: dict[str, Any]
    machine: dict[str, Any]
    availability: list[dict[str, Any]] = field(default_factory=list)
    #: One typed record per variant row (hwbackends/variant.py), as the router judges them.
    variants: list[VariantRecord] = field(default_factory=list)
    profiles: list[LatencyProfile] = field(default_factory=list)
    routing: list[dict[str, Any]] | None = None
    trace: dict[str, Any] | None = None
    interrupted: bool = False
    #: A fleet run (``hwb fleet``): its nodes and each task's cost; rows carry ``machine``.
    fleet: dict[str, Any] | None = None
    command: str = ""
    created: float = field(default_factory=time.time)
    #: Where the calibration and validation inputs came from (hwbackends/samples.py): the
    #: report's fidelity section says it; ``synthetic: true`` when no data was given.
    data: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "created": self.created,
            "command": self.command, "model": self.model, "machine": self.machine,
            "availability": self.availability,
            "variants": [v.to_dict() for v in self.variants],
            "profiles": [p.to_dict() for p in self.profiles], "routing": self.routing,
            "trace": self.trace, "interrupted": self.interrupted, "data": self.data}
        if self.fleet is not None:
            d["fleet"] = self.fleet
        return d

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.tmp")
        # strict JSON: a NaN (a profile with no samples, an undefined correlation) is written
        # as null with its reason (hwbackends/strict_json.py), and read back as NaN
        tmp.write_text(strict_json.dumps(self.to_dict(), indent=1))
        tmp.replace(p)
        return p

    @classmethod
    def load(cls, path: str | Path) -> "BenchResults":
        p = Path(path)
        if not p.exists():
            raise ResultsError(f"results file {p} does not exist; create one with "
                               f"`hwb bench MODEL -o {p.name}`")
        try:
            d = strict_json.restore(json.loads(p.read_text()))
        except (OSError, ValueError) as exc:
            raise ResultsError(f"{p} is not a readable JSON results file: {exc}") from exc
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ResultsError(f"{p} is not an hwbackends bench results file (no "
                               f"\"format\": \"{FORMAT}\"); produce one with `hwb bench`")
        if d.get("version") != VERSION:
            raise ResultsError(f"{p} has results-format version {d.get('version')!r}; this "
                               f"hwbackends reads version {VERSION}. Re-run `hwb bench` with "
                               f"this version to regenerate it.")
        try:
            variants = [VariantRecord.from_dict(v) for v in d["variants"]]
        except RecordError as exc:
            raise ResultsError(f"{p}: {exc}") from exc
        profiles = [LatencyProfile.from_dict(x) for x in d["profiles"]]
        from .load import parse_load  # a sliding row's load sweep, checked field by field
        for j, prof in enumerate(profiles):
            if isinstance(prof.sliding, dict) and prof.sliding.get("load") is not None:
                parse_load(prof.sliding["load"], f"{p}: profile {j} ({prof.variant})")
        return cls(model=d["model"], machine=d["machine"], availability=d["availability"],
                   variants=variants, profiles=profiles,
                   routing=d.get("routing"), trace=d.get("trace"),
                   interrupted=bool(d.get("interrupted")), fleet=d.get("fleet"), command=d.get("command", ""),
                   created=d.get("created", 0.0), data=d.get("data"))

    def table(self) -> str:
        return table(self.profiles)

    def table_csv(self) -> str:
        """:meth:`table` as CSV (``hwb bench --csv``, ``hwb report --csv``)."""
        return table_csv(self.profiles)
