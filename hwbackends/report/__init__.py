"""The hardware-evaluation report (``hwb report RESULTS.json -o report.html``)."""
from __future__ import annotations

from pathlib import Path

from ..bench.results import BenchResults


def write_report(results: BenchResults | str | Path, out: str | Path) -> Path:
    """Render ``results`` (or a results JSON path) to one self-contained HTML file."""
    from .html import render

    res = results if isinstance(results, BenchResults) else BenchResults.load(results)
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render(res), encoding="utf-8")
    return p.resolve()


__all__ = ["write_report"]
