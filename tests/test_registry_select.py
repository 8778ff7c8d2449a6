"""The one target selector and the one safe probe (registry.py), used by `hwb targets`,
`hwb bench` and the router's planning."""
from __future__ import annotations

import pytest

import hwbackends as hwb
from hwbackends.errors import UnknownTargetError
from hwbackends.registry import safe_probe, select_targets
from hwbackends.specs import Availability, Mode
from hwbackends.target import Target


class _Raises(Target):
    name = "test.raises"
    family = "cpu"
    precisions = ("fp32",)
    formats = ("keras",)

    def probe(self) -> Availability:
        raise RuntimeError("driver exploded")


class _NotAnAvailability(_Raises):
    name = "test.wrongtype"

    def probe(self):  # type: ignore[override]
        return "yes"


def test_safe_probe_turns_a_plugin_bug_into_a_reason() -> None:
    av = safe_probe(_Raises())
    assert av.mode is Mode.UNAVAILABLE and av.reason == "probe raised RuntimeError: driver exploded"
    av = safe_probe(_NotAnAvailability())
    assert av.mode is Mode.UNAVAILABLE and "not an Availability" in av.reason
    assert safe_probe(hwb.get_registry().target("cpu.litert")).usable


def test_select_targets_same_rule_everywhere() -> None:
    reg = hwb.get_registry()
    assert select_targets(reg, ["cpu.litert"]) == ["cpu.litert"]
    assert select_targets(reg, ["cpu.onnx*", "cpu.*"])[0] == "cpu.onnxruntime"  # pattern order
    assert len(set(select_targets(reg, ["cpu.*", "cpu.*"]))) == len(select_targets(reg, ["cpu.*"]))
    # a glob may match nothing on this installation when another pattern matches
    assert select_targets(reg, ["nothing.*", "cpu.litert"]) == ["cpu.litert"]
    with pytest.raises(UnknownTargetError, match=r"unknown target 'cpu.litrt'; registered: .*cpu.litert"):
        select_targets(reg, ["cpu.litrt"])
    with pytest.raises(UnknownTargetError, match=r"matches no registered target; registered: .*cpu.litert"):
        select_targets(reg, ["gpu.nothing*"])
