"""Results files another party wrote, handed to every command that reads one: ``hwb compare``,
``hwb report`` (HTML and ``--csv``), ``hwb route --fleet-results`` and ``hwb export -r`` (the last in the HTML test, fewer examples:
it writes a repository).

One real ``hwb bench`` file (cpu.onnxruntime fp32, single-stream and server) is
measured once; Hypothesis then breaks it at a random place (a value replaced by another type,
a huge, negative or non-finite number, a 400-digit integer, nesting past any sane depth, a key
removed) and every command must answer with exit 1 and one line on stderr, or read the file
(exit 0, or 1 with its one line for ``route`` when no variant serves), never a traceback. The
fixed cases are the files that are not files: a FIFO (must not block), a link to /dev/zero, a
directory, a file over the size cap, nesting 100,000 deep."""
from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwbackends.cli import main

EXAMPLES = int(os.environ.get("HWB_FUZZ_EXAMPLES", "40"))
ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ROOT / "examples" / "strategies.toml"


def run(*argv: str) -> tuple[int, str, str]:
    """``hwb ARGV`` in this process: (exit code, stdout, stderr). An exception other than
    SystemExit escaping ``main`` is what a user would see as a traceback: it fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse's usage errors
            rc = int(exc.code or 0)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def measured(tmp_path_factory, store_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("bench") / "base.json"
    rc, _, err = run("bench", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "200",
                     "-s", "single-stream", "-s", "server:rate=2000,n=200", "-q",
                     "-o", str(out), "--cache-dir", str(store_dir))
    assert rc == 0, err
    return out


def commands(path: Path, base: Path, tmp: Path, html: bool = True,
             export: bool = False) -> list[tuple[str, ...]]:
    return [("compare", str(base), str(path), "--max-p99", "10", "--max-corr-drop", "0.01"),
            ("compare", str(path), str(base), "--max-p50", "10"),
            ("report", str(path), "--csv"),
            *([("report", str(path), "-o", str(tmp / "r.html"))] if html else []),
            ("route", "--fleet-results", str(path), str(STRATEGIES)),
            *([("export", "zoo:mlp", "-t", "cpu.onnxruntime:fp32", "--format", "triton", "-r",
                str(path), "-o", str(tmp / "repo"))] if export else [])]


def one_line_error(rc: int, err: str, argv: tuple[str, ...]) -> None:
    assert rc == 1, (argv, rc, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, (argv, err)


def read_or_refused(argv: tuple[str, ...], rc: int, err: str, why: str) -> None:
    """What a command may answer a broken file with: it read the file (exit 0; ``compare``'s
    gate: 4 a move, 5 a broken figure; ``route``: 1 with the routing table, a strategy with no
    variant) or refused it (exit 1, one line)."""
    assert "Traceback" not in err, (why, argv, err)
    if rc == 0 or (argv[0] == "compare" and rc in (4, 5)):
        return
    if argv[0] == "route" and rc == 1 and not err.strip():
        return
    one_line_error(rc, err, argv + (why,))


def paths(d: Any, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    """Every place in ``d`` down to depth 4 (dict keys, the first two list items)."""
    out = []
    if depth > 4:
        return out
    items = (d.items() if isinstance(d, dict) else
             enumerate(d[:2]) if isinstance(d, list) else ())
    for k, v in items:
        out.append(prefix + (k,))
        out += paths(v, prefix + (k,), depth + 1)
    return out


DROP = object()
HOSTILE = st.sampled_from([
    DROP, None, True, 0, -1, -1e300, 1e308, float("nan"), float("inf"), float("-inf"),
    10 ** 400, -(10 ** 400), "text", "", [], {}, [[[[[[1]]]]]], {"a": {"b": {"c": 1}}},
    [1, "x", None], {"nodes": "x"}, {"nodes": [1]}, 3.5,
])


def mutate(d: Any, where: tuple, value: Any) -> Any:
    cur = d
    for k in where[:-1]:
        cur = cur[k]
    if value is DROP:
        if isinstance(cur, dict):
            del cur[where[-1]]
        else:
            cur.pop(where[-1])
    else:
        cur[where[-1]] = value
    return d


@pytest.fixture(scope="module")
def base_doc(measured: Path) -> dict:
    return json.loads(measured.read_text())


def test_the_measured_file_reads_everywhere(measured: Path, tmp_path: Path):
    for argv in commands(measured, measured, tmp_path):
        rc, _, err = run(*argv)
        assert rc in (0, 1) and "Traceback" not in err, (argv, err)
        if argv[0] != "route":
            assert rc == 0, (argv, err)


def _break(base_doc: dict, data: Any, value: Any, tmp_path: Path) -> tuple[Path, str]:
    import copy

    where = data.draw(st.sampled_from(paths(base_doc)))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutate(copy.deepcopy(base_doc), where, value), allow_nan=True))
    return bad, f"at {where!r} = {value!r:.40}"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), value=HOSTILE)
def test_a_broken_results_file_is_one_line_never_a_traceback(data, value, base_doc, measured: Path,
                                                           tmp_path: Path):
    bad, why = _break(base_doc, data, value, tmp_path)
    for argv in commands(bad, measured, tmp_path, html=False):
        read_or_refused(argv, *run(*argv)[::2], why)


@settings(max_examples=max(4, EXAMPLES // 5), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), value=HOSTILE)
def test_a_broken_results_file_reports_as_html_exports_or_is_refused(data, value, base_doc,
                                                                    tmp_path: Path):
    import uuid

    bad, why = _break(base_doc, data, value, tmp_path)
    for argv in [("report", str(bad), "-o", str(tmp_path / "r.html")),
                 ("export", "zoo:mlp", "-t", "cpu.onnxruntime:fp32", "--format", "triton", "-r",
                  str(bad), "-o", str(tmp_path / uuid.uuid4().hex))]:
        read_or_refused(argv, *run(*argv)[::2], why)


def _deep(n: int) -> str:
    return '{"format": "hwbackends-bench-results", "version": 2, "x": ' + "[" * n + "]" * n + "}"


@pytest.mark.parametrize("kind", ["deep", "fifo", "dev-zero-link", "directory", "huge",
                                  "not-json", "bare-list", "no-variants", "routing-object"])
def test_files_that_are_not_results_files(kind: str, measured: Path, base_doc: dict, tmp_path: Path):
    p = tmp_path / f"{kind}.json"
    if kind == "deep":
        p.write_text(_deep(100_000))
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "dev-zero-link":
        p.symlink_to("/dev/zero")
    elif kind == "directory":
        p.mkdir()
    elif kind == "huge":
        with open(p, "wb") as f:  # sparse: past the cap without writing it
            f.truncate(65 << 20)
    elif kind == "not-json":
        p.write_text("{not json")
    elif kind == "bare-list":
        p.write_text("[1, 2]")
    elif kind == "no-variants":
        d = dict(base_doc)
        del d["variants"]
        p.write_text(json.dumps(d))
    elif kind == "routing-object":
        p.write_text(json.dumps(dict(base_doc, routing={"a": 1})))
    for argv in commands(p, measured, tmp_path, export=True):
        box: dict[str, Any] = {}

        def go(argv=argv, box=box):
            box["r"] = run(*argv)
        t = threading.Thread(target=go, daemon=True)
        t0 = time.monotonic()
        t.start()
        t.join(10)
        assert not t.is_alive(), f"{argv} still running after 10 s on a {kind}"
        rc, _, err = box["r"]
        one_line_error(rc, err, argv)
        assert time.monotonic() - t0 < 10


def test_export_reads_results_through_the_same_reader(measured: Path, tmp_path: Path):
    """``hwb export -r`` refuses what the others refuse, with the same reader's message."""
    p = tmp_path / "deep.json"
    p.write_text(_deep(100_000))
    rc, _, err = run("export", "zoo:mlp", "-t", "cpu.onnxruntime", "--format", "triton",
                     "-r", str(p), "-o", str(tmp_path / "repo"))
    one_line_error(rc, err, ("export",))
    assert "nested" in err
    rc2, _, err2 = run("report", str(p), "--csv")
    assert rc2 == 1 and err.split(": ", 2)[-1] == err2.split(": ", 2)[-1]


def test_export_refuses_a_results_file_without_variants(base_doc: dict, tmp_path: Path):
    d = dict(base_doc)
    del d["variants"]
    p = tmp_path / "no-variants.json"
    p.write_text(json.dumps(d))
    rc, _, err = run("export", "zoo:mlp", "-t", "cpu.onnxruntime", "--format", "triton",
                     "-r", str(p), "-o", str(tmp_path / "repo"))
    one_line_error(rc, err, ("export",))
    assert "variants: required key missing" in err and not (tmp_path / "repo").exists()


# -- hwb compare's gate on broken figures -------------------------------------------------------
BROKEN = {
    "NaN p99": (("profiles", 0, "p99_us"), float("nan"), "NEW p99 is nan"),
    "inf p99": (("profiles", 0, "p99_us"), float("inf"), "NEW p99 is inf"),
    "null p99": (("profiles", 0, "p99_us"), None, "NEW p99 is nan"),
    "p50 -1e300": (("profiles", 0, "p50_us"), -1e300, "NEW p50 -1e+300 µs is out of range"),
    "p50 0": (("profiles", 0, "p50_us"), 0, "NEW p50 0 µs is out of range"),
    "NaN corr": (("variants", 0, "fidelity", "corr"), float("nan"), "NEW corr is nan"),
    "corr 5": (("variants", 0, "fidelity", "corr"), 5.0, "NEW corr 5 is out of range"),
    "no fidelity": (("variants", 0, "fidelity"), None, "NEW corr is missing"),
}
GATE = ("--max-p99", "10", "--max-p50", "10", "--max-corr-drop", "0.01")


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_compare_fails_the_gate_on_a_broken_figure_in_either_file(case, measured: Path,
                                                                 base_doc: dict, tmp_path: Path):
    import copy

    where, value, said = BROKEN[case]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutate(copy.deepcopy(base_doc), where, value), allow_nan=True))
    rc, out, err = run("compare", str(measured), str(bad), *GATE)
    assert rc == 5, (out, err)
    assert said in out and "broken" in out and "within the thresholds" not in out, out
    rc, out, _ = run("compare", str(bad), str(measured), *GATE, "--json")  # broken in BASE
    d = json.loads(out)
    assert rc == 5 and d["broken"] >= 1, out
    assert said.replace("NEW", "BASE") in " ".join(w for r in d["rows"] for w in r["why"])


def test_compare_of_sound_files_passes_and_a_figure_no_threshold_checks_is_not_judged(
        measured: Path, base_doc: dict, tmp_path: Path):
    import copy

    rc, out, _ = run("compare", str(measured), str(measured), *GATE)
    assert rc == 0 and "within the thresholds" in out, out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutate(copy.deepcopy(base_doc), ("profiles", 0, "p99_us"),
                                     float("nan")), allow_nan=True))
    rc, out, _ = run("compare", str(measured), str(bad), "--max-p50", "10")
    assert rc == 0, out  # only p50 is gated here
