"""Text in the report: escaped and never cut (shared by the report's sections)."""
from __future__ import annotations

import html
from typing import Any


def long_text(text: Any, n: int = 200) -> str:
    """``text`` escaped, never cut: past ``n`` characters the first ``n`` (and an ellipsis)
    open a fold that holds all of it (an error with its traceback, every routing reason)."""
    t = str(text)
    if len(t) <= n:
        return html.escape(t)
    return (f'<details class="long"><summary>{html.escape(t[:n].rstrip())}…</summary>'
            f'<pre class="full">{html.escape(t)}</pre></details>')
