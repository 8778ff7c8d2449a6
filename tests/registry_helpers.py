"""A registry holding given targets and no installed plugin: what a test of the core with its
own target (a subclass of the sample target) compiles against."""
from __future__ import annotations

import types

from hwbackends.hookspecs import hookimpl
from hwbackends.registry import Registry, build_registry
from hwbackends.target import Target


def registry_with(*targets: Target, name: str = "test_targets") -> Registry:
    """A registry of the built-in converters plus ``targets`` (one plugin module ``name``),
    without entry points; a registration problem fails the test at once."""
    reg = build_registry(entry_points=False)
    plugin = types.ModuleType(name)
    plugin.hwb_targets = hookimpl(lambda: list(targets))
    reg.register(plugin, name)
    assert not reg.problems, reg.problems
    return reg
