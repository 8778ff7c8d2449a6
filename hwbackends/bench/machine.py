"""Moved to :mod:`hwbackends.machine` (a core module: plugins use it at probe time, and the
bench package is heavy). Kept so existing imports keep working."""
from __future__ import annotations

from ..machine import LIBRARIES, cpu_model, describe, fingerprint

__all__ = ["LIBRARIES", "cpu_model", "describe", "fingerprint"]
