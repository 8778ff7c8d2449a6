"""Every code block of README.md and docs/*.md, run as written.

* ```python blocks and shell lines run in a scratch directory holding the files the docs name
  (model.keras, x.npy, two_head.pt2, model.json + params.h5, net.pt, examples/,
  strategies.toml), with the session's artifact store.
* ``hwb …`` lines of shell blocks (untagged, bash, sh, console; ``$ `` prompts and ``\\``
  continuations understood) run for real, in document order, one scratch directory per block
  (so ``hwb bench`` then ``hwb report`` of its results works as a reader would run it).
  A line that only computes and prints runs through ``hwbackends.cli.main`` in this process
  (:data:`OWN_PROCESS` lists the commands that do not): its compiles go to the session's warm
  compile worker and store instead of a fresh interpreter, worker and TensorFlow import per
  line. ``hwb serve`` lines run as a process of their own and are stopped with SIGTERM as soon
  as they print their endpoints (they would serve until Ctrl-C).
* ```python blocks run the same way: in this process, as ``__main__``, in their scratch
  directory, stdout captured.

A new doc line runs by default, in the fast part. Lines that compile or measure are in
:data:`SLOW` (``-m slow``); lines that cannot run here as written (another machine, an
install into this environment, vendor tools, multi-minute FPGA builds) are in :data:`SKIP`
with the reason. Every entry of both must still match a doc line.
"""
from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"", "bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Snippet:
    doc: str       # README.md, docs/serving.md, …
    line: int      # first line of the command or block
    kind: str      # "python" | "shell"
    text: str      # the block, or the (joined) command
    block: int     # the line of the block's opening fence

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def extract(path: Path) -> list[Snippet]:
    doc = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    out: list[Snippet] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i + 1
        j = start
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        body = lines[start:j]
        if lang == "python":
            out.append(Snippet(doc, start + 1, "python", "\n".join(body) + "\n", start))
        elif lang in SHELL:
            k = 0
            while k < len(body):
                first = k
                cmd = body[k].strip()
                cmd = cmd[2:] if cmd.startswith("$ ") else cmd
                while cmd.endswith("\\") and k + 1 < len(body):
                    k += 1
                    cmd = cmd[:-1] + " " + body[k].strip()
                if cmd.startswith("hwb "):
                    out.append(Snippet(doc, start + first + 1, "shell", cmd, start))
                k += 1
        i = j + 1
    return out


SNIPPETS = [s for p in DOCS for s in extract(p)]

_FPGA_BUILD = ("a multi-minute RTL build (da4ml + Verilator, ≈ 2–3 min each here, "
               "docs/targets-fpga.md); tests/test_fpga_da4ml.py builds zoo:signal's design "
               "(without yosys) and runs the same synthesis path on a small net")
_PLUGIN = ("needs the scaffolded plugin pip-installed into this environment; "
           "tests/test_scaffold.py pip-installs one into a private --target directory and runs the kit on it")
_CLUSTER = ("runs on the machines of a Ray cluster at 10.0.0.5; tests/test_fleet.py runs "
            "`hwb node --head` and `hwb fleet --fleet ADDRESS` on loopback")

#: (doc, text the snippet contains) → why it is not run here.
SKIP: dict[tuple[str, str], str] = {
    ("docs/fleet.md", "hwb node --head --port 6379 --node-ip-address 10.0.0.5"): _CLUSTER,
    ("docs/fleet.md", "hwb node --address 10.0.0.5:6379 --node-ip-address"): _CLUSTER,
    ("docs/fleet.md", "hwb node --address 10.0.0.5:6379 -t"): _CLUSTER,
    ("docs/fleet.md", "hwb fleet zoo:signal --fleet 10.0.0.5:6379"): _CLUSTER,
    ("docs/fleet.md", "hwb route --fleet-results fleet.json"): (
        "reads fleet.json of the multi-machine run above ([--json] is optional); README's "
        "`hwb route --fleet-results r.json` runs the same on a local fleet run"),
    ("docs/plugins.md", "hwb plugin check cpu.mynpu"): _PLUGIN,
    ("docs/plugins.md", "hwb compile zoo:signal --target cpu.mynpu"): _PLUGIN,
    ("docs/plugins.md", "# hwb_mynpu/__init__.py"): (
        "a file of a plugin package (relative import of .target); tests/test_scaffold.py "
        "builds, installs and runs such a package"),
    ("docs/plugins.md", "ctx = Conformance(\"cpu.mynpu\", tmp_path"): (
        "runs inside a plugin's own tests (pytest's tmp_path, an installed cpu.mynpu); "
        "tests/test_conformance_kit.py runs these checks"),
    ("docs/serving.md", "--tls-cert c.pem"): (
        "needs your TLS certificate, key and token files and fixed ports 50051/9464 (a shared "
        "machine); tests/test_serve_cli.py serves TLS + token gRPC, shm and metrics on free ports"),
    ("docs/serving.md", 'c = ShmClient("hwb-lstm")'): (
        "a client of a running `hwb serve … --sliding --streams` endpoint; "
        "tests/test_serve_sliding_streams.py makes these calls against a real one"),
    ("docs/serving.md", "import numpy as np, tritonclient.grpc"): (
        "Triton's client lives in a venv of its own (it pins protobuf < 7); "
        "tests/test_serve_oip_clients.py makes these calls against hwb serve"),
    ("docs/serving.md", "--http 8000 --grpc-port 8001 --sequences 64 --insecure-loopback"): (
        "fixed ports 8000/8001 (a shared machine); tests/test_serve_oip_clients.py serves "
        "--http, --grpc-port and --sequences on free ports"),
    ("README.md", "hwb compare base.json"): (
        "needs a baseline results file of an earlier run; tests/test_cli_conventions.py "
        "compares real bench runs through hwb compare"),
    ("docs/targets-fpga.md", "-O synth=true"): "C-synthesis needs vitis_hls (not installed here)",
    ("docs/targets-fpga.md", "-t fpga.da4ml"): _FPGA_BUILD,
    ("docs/targets-fpga.md", 'hwb.compile("zoo:signal", "fpga.da4ml")'): _FPGA_BUILD,
}

_COMPILES = "compiles (and measures) through the real toolchains"
#: (doc, text the snippet contains) → why it runs only with ``-m slow``.
SLOW: dict[tuple[str, str], str] = {
    ("README.md", "hwb compile "): _COMPILES,
    ("README.md", "hwb predict "): _COMPILES,
    ("README.md", "hwb bench "): "measures every CPU variant in three scenarios",
    ("README.md", "hwb report hwb-results.json"): "reads what the bench line above wrote",
    ("README.md", "hwb route examples/strategies.toml"): "plans every example strategy (FPGA builds included)",
    ("README.md", "hwb serve "): _COMPILES,
    ("README.md", "hwb fleet "): "an embedded Ray evaluating every CPU variant",
    ("README.md", "hwb route --fleet-results r.json"): "reads what the fleet line above wrote",
    ("README.md", "hwb export "): "reads what the bench line above wrote",
    ("docs/export.md", "hwb "): "measures two_head, then exports from that measurement",
    ("README.md", "hwb.load_model(\"model.keras\")"): _COMPILES,
    ("docs/fleet.md", "--fleet local -o r.json"): "an embedded Ray evaluating every CPU variant",
    ("docs/routing.md", "hwb bench zoo:signal -t 'cpu.*' -p fp32,int8"): "measures every CPU variant",
    ("docs/routing.md", "hwb.Router.from_config"): "plans every example strategy (FPGA builds included)",
    ("docs/serving.md", "compile_batch_variants(\"zoo:signal\""): _COMPILES,
    ("docs/serving.md", "hwb.compile(\"zoo:two_head\""): _COMPILES,
    ("docs/serving.md", "hwb serve --config strategies.toml"): "plans the momentum strategy",
    ("docs/serving.md", "hwb serve zoo:signal -t cpu.litert --shm"): _COMPILES,
    ("docs/serving.md", "hwb serve zoo:lstm -t cpu.native --shm hwb-lstm --sliding"): _COMPILES,
    ("docs/targets-accelerators.md", "hwb compile "): _COMPILES,
    ("docs/targets-fpga.md", "hwb compile zoo:mlp -t fpga.hls4ml"): "hls4ml C-simulation builds",
    ("docs/targets-fpga.md", "hwb fpga-trace"): "hls4ml C-simulation builds",
    ("docs/targets-fpga.md", 'hwb.compile("zoo:mlp", "fpga.hls4ml")'): "hls4ml C-simulation builds",
}


def _match(table: dict[tuple[str, str], str], s: Snippet) -> str | None:
    return next((why for (doc, needle), why in table.items()
                 if doc == s.doc and needle in s.text), None)


def _same_as_earlier(s: Snippet) -> Snippet | None:
    """An earlier snippet, run here, whose command is exactly ``s``'s (comments aside): every
    scratch directory holds the same files, so running it again tests nothing new (README's
    `hwb fleet … --fleet local` is docs/fleet.md's, ~14 s)."""
    text = s.text.split("#")[0].strip()
    return next((e for e in SNIPPETS[:SNIPPETS.index(s)] if e.kind == s.kind
                 and e.text.split("#")[0].strip() == text and _match(SKIP, e) is None), None)


def _params(kind: str) -> list:
    out = []
    for s in SNIPPETS:
        if s.kind != kind:
            continue
        marks = []
        if (why := _match(SKIP, s)) is not None:
            marks.append(pytest.mark.skip(reason=why))
        elif (first := _same_as_earlier(s)) is not None:
            marks.append(pytest.mark.skip(reason=f"the same command as {first.id}, which runs"))
        elif _match(SLOW, s) is not None:
            marks.append(pytest.mark.slow)
        marks.append(pytest.mark.timeout(_timeout(s)))  # in this process: no subprocess timeout
        out.append(pytest.param(s, id=s.id, marks=marks))
    return out


# -- the files the docs name --------------------------------------------------------------------
def _two_head_pt2(path: Path) -> None:
    import torch

    class TwoHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f, self.s = torch.nn.Linear(16, 12), torch.nn.Linear(4, 6)
            self.signal, self.conf = torch.nn.Linear(18, 1), torch.nn.Linear(18, 3)

        def forward(self, features, state):
            z = torch.cat([torch.relu(self.f(features)), torch.tanh(self.s(state))], dim=1)
            return torch.tanh(self.signal(z)), torch.softmax(self.conf(z), dim=1)

    torch.manual_seed(3)
    batch = torch.export.Dim("batch", min=1, max=4096)
    ep = torch.export.export(TwoHead().eval(), (torch.zeros(3, 16), torch.zeros(3, 4)),
                             dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(ep, path)


def _net_pt(path: Path) -> None:
    import torch

    torch.manual_seed(4)
    torch.save(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(),
                                   torch.nn.Linear(8, 1)).eval(), path)


@pytest.fixture(scope="session")
def doc_files(tmp_path_factory, zoo_model) -> Path:
    """The files the docs' commands and blocks name, made once."""
    from legacy_models import write_keras2_pair

    d = tmp_path_factory.mktemp("doc-files")
    signal = zoo_model("signal")
    signal.obj.save(d / "model.keras")
    np.save(d / "x.npy", signal.representative(4))
    _two_head_pt2(d / "two_head.pt2")
    write_keras2_pair(d, stem="model", weights_name="params.h5")
    _net_pt(d / "net.pt")
    shutil.copytree(ROOT / "examples", d / "examples")
    shutil.copy(ROOT / "examples" / "strategies.toml", d / "strategies.toml")
    return d


_SCRATCH: dict[tuple[str, int], Path] = {}
_STOCKED: set[Path] = set()


def _scratch(s: Snippet, tmp_path_factory, request) -> Path:
    """One scratch directory per doc block (its lines share it, in document order); the doc
    files are put there for a slow snippet (making them trains and saves a model)."""
    key = (s.doc, s.block)
    if key not in _SCRATCH:
        d = tmp_path_factory.mktemp(re.sub(r"\W", "-", f"{s.doc}-{s.block}"))
        (d / "shm").mkdir(mode=0o700)  # the block's own shm endpoints (HWB_SHM_DIR)
        _SCRATCH[key] = d
    d = _SCRATCH[key]
    if d not in _STOCKED and _match(SLOW, s) is not None:
        for f in request.getfixturevalue("doc_files").iterdir():
            (shutil.copytree if f.is_dir() else shutil.copy)(f, d / f.name)
        _STOCKED.add(d)
    return d


def _env(d: Path) -> dict[str, str]:
    return dict(os.environ, HWB_SHM_DIR=str(d / "shm"), PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))


def _timeout(s: Snippet) -> float:
    return 1800.0 if _match(SLOW, s) else 120.0


#: Commands that run as a process of their own: a server (serves until a signal), a fleet run
#: (enters a network namespace, re-executing itself), a Ray node (starts daemons).
OWN_PROCESS = ("serve", "fleet", "node")


def _own_process(argv: list[str]) -> bool:
    return argv[1] in OWN_PROCESS and "--print-include" not in argv and "--dry-run" not in argv


@pytest.fixture
def in_scratch(monkeypatch: pytest.MonkeyPatch):
    """``in_scratch(d)``: this test runs in ``d`` with its own shm directory, as the snippet's
    subprocess would (cwd, HWB_SHM_DIR, the script's directory first on sys.path)."""
    def enter(d: Path) -> None:
        monkeypatch.chdir(d)
        monkeypatch.setenv("HWB_SHM_DIR", str(d / "shm"))
        monkeypatch.syspath_prepend(str(d))
    return enter


def _serve_until_ready(s: Snippet, argv: list[str], d: Path) -> None:
    """``hwb serve``: started, and stopped with SIGTERM as soon as it printed its endpoints
    (the line it prints once it serves): an event, not a fixed --duration, so a loaded machine
    only waits longer and a quiet one does not wait at all."""
    log = d / f"serve-{s.line}.err"  # a file: a pipe nobody reads until ready could fill up
    with open(log, "w") as errf:
        p = subprocess.Popen([sys.executable, "-m", "hwbackends", *argv[1:]], cwd=d, env=_env(d),
                             stdout=subprocess.PIPE, stderr=errf, text=True)
    try:  # a server that never gets ready is stopped by the test's timeout mark
        ready = ""
        for line in p.stdout:  # the endpoints (a JSON line), once it serves; EOF if it exited
            if line.startswith("{"):
                ready = line
                p.send_signal(signal.SIGTERM)
                break
        out, _ = p.communicate(timeout=_timeout(s))
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    err = log.read_text()
    assert ready.startswith("{") and p.returncode == 0, (
        f"{s.id}: `{s.text}` exited {p.returncode}\n{ready}{out[-2000:]}\n{err[-3000:]}")
    info = json.loads(ready)
    assert info.get("shm") or info.get("grpc"), info  # it was serving on something


def _run_own_process(s: Snippet, argv: list[str], d: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "hwbackends", *argv[1:]], cwd=d, env=_env(d),
                       capture_output=True, text=True, timeout=_timeout(s))
    assert r.returncode == 0, (f"{s.id}: `{s.text}` exited {r.returncode}\n"
                               f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}")


@pytest.mark.parametrize("s", _params("shell"))
def test_doc_shell_line(s: Snippet, store_dir, tmp_path_factory, request, in_scratch,
                        hwb_cli) -> None:
    d = _scratch(s, tmp_path_factory, request)
    argv = shlex.split(s.text, comments=True)
    if argv[1] == "serve" and _own_process(argv) and "--duration" not in argv:
        return _serve_until_ready(s, argv, d)
    if _own_process(argv):
        return _run_own_process(s, argv, d)
    in_scratch(d)
    try:
        rc, out, err = hwb_cli(*argv[1:])
    except SystemExit as exc:  # argparse refusing the line as written
        rc, out, err = exc.code, "", f"SystemExit({exc.code})"
    # A line whose comment says "exits N" documents that exit code (hwb --help, exit codes).
    want = int(m.group(1)) if (m := re.search(r"#.*\bexits (\d+)\b", s.text)) else 0
    assert rc == want, f"{s.id}: `{s.text}` exited {rc}, not {want}\n{out[-2000:]}\n{err[-3000:]}"


@pytest.mark.parametrize("s", _params("python"))
def test_doc_python_block(s: Snippet, store_dir, tmp_path_factory, request, in_scratch,
                          capsys) -> None:
    d = _scratch(s, tmp_path_factory, request)
    script = d / f"block_{s.line}.py"
    script.write_text(s.text)
    in_scratch(d)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # a block ending in sys.exit(0) ran as written
        if exc.code not in (0, None):
            out = capsys.readouterr()
            raise AssertionError(f"{s.id} exited {exc.code}:\n{s.text}\n{out.out[-2000:]}\n"
                                 f"{out.err[-3000:]}") from exc
    except Exception as exc:
        out = capsys.readouterr()
        raise AssertionError(f"{s.id} failed:\n{s.text}\n{out.out[-2000:]}\n"
                             f"{out.err[-3000:]}") from exc


# -- what the table and the extraction themselves promise ---------------------------------------
def test_every_skip_and_slow_entry_matches_a_doc_line() -> None:
    stale = [key for table in (SKIP, SLOW) for key in table
             if not any(s.doc == key[0] and key[1] in s.text for s in SNIPPETS)]
    assert not stale, f"entries that match no doc line any more (remove them): {stale}"


def test_the_docs_have_blocks_to_run() -> None:
    kinds = {(s.doc, s.kind) for s in SNIPPETS}
    assert ("README.md", "python") in kinds and ("README.md", "shell") in kinds
    assert sum(s.doc == "README.md" and s.kind == "shell" for s in SNIPPETS) >= 15
    assert ("docs/serving.md", "python") in kinds


def test_readme_conformance_kit_line_names_the_scaffolded_target_after_installing_it() -> None:
    """`pytest --hwb-target NAME` is not an hwb line: checked here against the scaffold."""
    text = (ROOT / "README.md").read_text()
    new = re.search(r"^hwb plugin new (\S+) --family (\S+)", text, re.M)
    inst = re.search(r"^pip install -e \./hwb-(\S+)", text, re.M)
    kit = re.search(r"^pytest --hwb-target (\S+)", text, re.M)
    assert new and inst and kit, "README: plugin new, pip install and the kit line"
    name, family = new.groups()
    assert inst.group(1) == name and new.start() < inst.start() < kit.start()
    assert kit.group(1) == f"{family}.{name}"  # the scaffold registers FAMILY.NAME
