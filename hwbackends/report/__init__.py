"""The hardware-evaluation report (``hwb report RESULTS.json -o report.html``)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..bench.results import BenchResults

if TYPE_CHECKING:  # pragma: no cover
    from ..registry import Registry


def write_report(results: BenchResults | str | Path, out: str | Path, *,
                 registry: "Registry") -> Path:
    """Render ``results`` (or a results JSON path) to one self-contained HTML file, with the
    sections of the run's ``registry``'s plugins."""
    from .html import render

    res = results if isinstance(results, BenchResults) else BenchResults.load(results)
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render(res, registry), encoding="utf-8")
    return p.resolve()


__all__ = ["write_report"]
