"""Plugins add their own ``hwb`` commands (hook ``hwb_cli_commands``); the core's
command line names none. ``hwb fpga-trace`` is the fpga.hls4ml plugin's. A plugin whose hook
raises, or that takes a name already used, is reported and skipped: ``hwb`` keeps working."""
from __future__ import annotations

import json
from typing import Any

import pytest

import hwbackends as hwb
from hwbackends.cli import build_parser, main
from hwbackends.errors import UnsupportedError
from hwbackends.registry import get_registry


class _Good:
    @hwb.hookimpl
    def hwb_cli_commands(self, subparsers: Any) -> None:
        p = subparsers.add_parser("hello-plugin", help="a plugin's own command")
        p.add_argument("--who", default="world")
        p.set_defaults(func=lambda args: print(f"hello {args.who}") or 0)


class _Raises:
    @hwb.hookimpl
    def hwb_cli_commands(self, subparsers: Any) -> None:
        raise RuntimeError("boom in the plugin's command table")


class _Collides:
    @hwb.hookimpl
    def hwb_cli_commands(self, subparsers: Any) -> None:
        subparsers.add_parser("compile", help="a plugin trying to take over a core command")


class _Refuses:
    @hwb.hookimpl
    def hwb_cli_commands(self, subparsers: Any) -> None:
        p = subparsers.add_parser("refuse-plugin")
        p.set_defaults(func=self.run)

    def run(self, args: Any) -> int:
        raise UnsupportedError("this plugin's command refuses: expected X, pass --x")


@pytest.fixture
def plugins():
    """A fresh process-wide registry with the test plugins; rebuilt without them afterwards."""
    get_registry(refresh=True)
    for plugin, name in ((_Good(), "good-cli"), (_Raises(), "broken-cli"),
                         (_Collides(), "colliding-cli"), (_Refuses(), "refusing-cli")):
        hwb.register_plugin(plugin, name)
    yield
    get_registry(refresh=True)


def test_fpga_trace_is_added_by_the_hls4ml_plugin() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert "fpga-trace" in sub.choices
    func = sub.choices["fpga-trace"].get_default("func")
    assert func.__module__ == "hwb_plugins.fpga_hls4ml.cli"
    assert sub.choices["fpga-trace"].get_default("target") == "fpga.hls4ml"


def test_fpga_trace_refuses_another_target(capsys) -> None:
    assert main(["fpga-trace", "zoo:mlp", "-t", "cpu.litert"]) == 1
    err = capsys.readouterr().err
    assert "UnsupportedError" in err and "traces fpga.hls4ml designs" in err


def test_a_raising_plugin_is_reported_and_hwb_still_works(plugins, capsys) -> None:
    assert main(["hello-plugin", "--who", "desk"]) == 0
    cap = capsys.readouterr()
    assert "hello desk" in cap.out
    assert "plugin 'broken-cli' could not add its commands (RuntimeError: boom" in cap.err
    assert "plugin 'colliding-cli' could not add its commands" in cap.err  # argparse refused it
    assert main(["targets", "--json"]) == 0
    probs = json.loads(capsys.readouterr().out)["problems"]
    stages = {(p["plugin"], p["stage"]) for p in probs}
    assert {("broken-cli", "hwb_cli_commands"), ("colliding-cli", "hwb_cli_commands")} <= stages
    # reported once however often hwb builds its parser
    assert sum(p["plugin"] == "broken-cli" for p in probs) == 1
    # the core's compile is still the core's
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sub.choices["compile"].get_default("func").__module__ == "hwbackends.cli.compile"


def test_a_plugin_commands_error_is_printed_like_a_core_one(plugins, capsys) -> None:
    assert main(["refuse-plugin"]) == 1
    err = capsys.readouterr().err
    assert "hwb refuse-plugin: UnsupportedError: this plugin's command refuses" in err
