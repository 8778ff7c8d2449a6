"""``hwb ARGS`` through the command's entry point (``hwbackends.cli.main``) in this process.

What it prints and returns is what ``hwb`` would print and exit with; its compiles run in the
session's warm compile worker and store instead of a fresh interpreter, worker and TensorFlow
import per call (≈ 6 s each on 2 cores). An exception escaping the command is raised here,
so it fails the test that ran it. Tests of what only a process shows (a signal, the exit status
the OS sees, a crash) start ``hwb`` as a process instead.
"""
from __future__ import annotations

import contextlib
import io
import sys
from typing import NamedTuple


class Run(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def hwb(*args: str) -> Run:
    """Run ``hwb ARGS``; stdout and stderr captured (sys-level, as pytest's capsys)."""
    from hwbackends.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(args))
    except BaseException:  # argparse's SystemExit(2), an escaped exception: what it printed
        sys.stdout.write(out.getvalue())  # goes on to the caller's streams (capsys, the report)
        sys.stderr.write(err.getvalue())
        raise
    return Run(rc, out.getvalue(), err.getvalue())
