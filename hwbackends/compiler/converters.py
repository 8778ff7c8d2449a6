"""The converter search: the shortest chain of installed format conversions (``hwb_converters``)
from a model's format to one a target takes."""
from __future__ import annotations

from collections import deque
from typing import Sequence

from ..errors import UnsupportedError
from ..registry import Registry
from ..target import Converter


def conversion_path(reg: Registry, src: str, dst_formats: Sequence[str],
                    target: str = "the target") -> list[Converter]:
    """Shortest chain of available converters from ``src`` to any of ``dst_formats``."""
    if src in dst_formats:
        return []
    usable = [c for c in reg.converters if c.available() is None]
    queue: deque[tuple[str, list[Converter]]] = deque([(src, [])])
    seen = {src}
    while queue:
        fmt, chain = queue.popleft()
        for c in usable:
            if c.src == fmt and c.dst not in seen:
                if c.dst in dst_formats:
                    return chain + [c]
                seen.add(c.dst)
                queue.append((c.dst, chain + [c]))
    offered = ", ".join(f"{c.src}→{c.dst}" + ("" if c.available() is None else f" (unavailable: {c.available()})")
                        for c in reg.converters) or "none"
    raise UnsupportedError(f"{target} takes {', '.join(dst_formats)} models and no installed "
                           f"converter reaches them from {src} (installed: {offered}); pick another "
                           f"target or export the model to {dst_formats[0]}")
