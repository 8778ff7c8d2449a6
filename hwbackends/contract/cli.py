"""The plugin contract's command-line part: what a plugin that adds an ``hwb`` subcommand
(a ``hwb_cli`` hook, e.g. fpga.hls4ml's ``hwb fpga-trace``) uses so its command loads models,
compiles and prints as every other command does."""
from __future__ import annotations

from ..cli import emit
from ..cli.compile import add_model_args, compile_from_args
from ..cli.source import model_from_args

__all__ = ["add_model_args", "compile_from_args", "emit", "model_from_args"]
