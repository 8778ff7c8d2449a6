"""Stand-ins for what this machine lacks: the market (tick-arrival traces).

Installed as package ``hwb_sim`` (pyproject maps ``hwb_sim`` → ``sim/``).
"""
from .ticks import Segment, TickTrace, generate, load

__all__ = ["Segment", "TickTrace", "generate", "load"]
