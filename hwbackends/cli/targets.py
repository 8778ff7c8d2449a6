"""``hwb targets``: every registered target, its family, precisions and availability."""
from __future__ import annotations

import argparse

from . import emit


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("targets", help="list targets and whether they can run here")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    # -v/--verbose (hwb's own, given before or after `targets`) adds options and import times
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..registry import get_registry, safe_probe

    reg = get_registry()
    rows = []
    for name in sorted(reg.targets):
        t = reg.targets[name]
        rows.append({"name": name, "family": t.family, "precisions": list(t.precisions),
                     "precision_rule": t.precision_rule, "formats": list(t.formats), "description": t.description,
                     "plugin": reg.target_plugin[name], "options": t.option_docs,
                     "install": t.install or None,
                     "availability": safe_probe(t).to_dict()})
    data = {"targets": rows, "problems": [p.to_dict() for p in reg.problems],
            "plugin_import_seconds": reg.import_seconds,
            "converters": [{"name": c.name, "src": c.src, "dst": c.dst,
                            "unavailable": c.available()} for c in reg.converters]}
    lines = [f"{'TARGET':<18} {'FAMILY':<6} {'MODE':<12} {'PRECISIONS':<32} REASON / DEVICE"]
    for r in rows:
        a = r["availability"]
        lines.append(f"{r['name']:<18} {r['family']:<6} {a['mode']:<12} "
                     f"{','.join(r['precisions']):<32} {a['reason']}"
                     + (f" [{a['device']}]" if a["device"] else ""))
        if a["mode"] == "unavailable" and r["install"] and not extra_installed(r["install"]):
            lines.append(f"{'':<20}packages: pip install '{r['install']}'")
        if args.verbose and r["options"]:
            for k, v in r["options"].items():
                lines.append(f"{'':<20}option {k}: {v}")
        if r["precision_rule"]:  # what -p / precisions = [...] also take beyond the listed ones
            lines.append(f"{'':<20}also precisions: {r['precision_rule']}")
    if data["problems"]:
        lines.append("\nplugins that could not be used:")
        for p in data["problems"]:
            lines.append(f"  {p['plugin']} ({p['stage']}): {p['error']}")
    if args.verbose:
        lines.append("\nplugin import times:")
        for k, v in sorted(reg.import_seconds.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {k:<24} {v * 1000:8.1f} ms")
    emit(args, data, "\n".join(lines))
    return 0


def extra_installed(spec: str, _seen: frozenset[str] = frozenset()) -> bool:
    """Whether every requirement of the pip requirement ``spec`` (``"hwbackends[torch]"``) is
    installed, its extras' own included: then ``pip install`` would change nothing and the
    probe's reason (a CPU-only torch build, no device) is what to act on. False when it
    cannot tell (the distribution or ``packaging`` is not installed)."""
    import re
    from importlib import metadata

    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*", spec)
    if not m or spec in _seen:
        return False
    try:
        from packaging.requirements import Requirement
        reqs = metadata.requires(m.group(1)) or []
    except (ImportError, metadata.PackageNotFoundError):
        return False
    for extra in [e.strip() for e in (m.group(2) or "").split(",") if e.strip()]:
        for text in reqs:
            req = Requirement(text)
            if req.marker is None or not req.marker.evaluate({"extra": extra}):
                continue
            if req.extras:  # hwbackends[cpu] inside hwbackends[torch]
                if not extra_installed(f"{req.name}[{','.join(sorted(req.extras))}]", _seen | {spec}):
                    return False
                continue
            try:
                if not req.specifier.contains(metadata.version(req.name), prereleases=True):
                    return False
            except metadata.PackageNotFoundError:
                return False
    return True
