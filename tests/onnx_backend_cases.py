"""ONNX's own backend test data (shipped in the ``onnx`` wheel: ``backend/test/data``'s
``pytorch-converted``, ``pytorch-operator`` and ``simple``; each case a ``model.onnx`` and
``test_data_set_*/input_*.pb`` / ``output_*.pb``) run through ``hwb.load_model`` and
``hwb.compile`` on one target, each case judged against its expected outputs:

* ``right``: every output within ``rtol``/``atol`` of the expected one (ONNX's backend test
  tolerances, rtol 1e-3, atol 1e-5);
* ``refused``: an :class:`~hwbackends.HwbError` (a clear refusal, counted by its class);
* ``wrong``: it compiled and answered, off the expected outputs;
* ``raw``: any other exception (a traceback a user would see).

Used by tests/test_onnx_backend_data.py and scripts/onnx_backend_table.py (docs/targets.md's
table)."""
from __future__ import annotations

import glob
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SUITES = ("pytorch-converted", "pytorch-operator", "simple")
RTOL, ATOL = 1e-3, 1e-5


def data_dir() -> Path:
    import onnx
    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def cases() -> list[Path]:
    """Every case directory of :data:`SUITES`, sorted."""
    base = data_dir()
    return [Path(p).parent for s in SUITES for p in sorted(glob.glob(str(base / s / "*" / "model.onnx")))]


def case_id(case: Path) -> str:
    return f"{case.parent.name}/{case.name}"


def _tensors(d: Path, kind: str) -> list[np.ndarray]:
    import onnx
    from onnx import numpy_helper
    files = sorted(glob.glob(str(d / f"{kind}_*.pb")), key=lambda f: int(Path(f).stem.split("_")[1]))
    return [numpy_helper.to_array(onnx.load_tensor(f)) for f in files]


@dataclass
class Outcome:
    case: str
    verdict: str  # right | refused | wrong | raw
    detail: str = ""
    upgraded: bool = False


@dataclass
class Tally:
    target: str
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> Counter:
        return Counter(o.verdict for o in self.outcomes)


def run_case(case: Path, target: str, store: str | Path) -> Outcome:
    """Load, compile (fidelity=False: judged here against the expected outputs), predict
    every test data set of ``case`` on ``target``."""
    import hwbackends as hwb

    cid = case_id(case)
    try:
        m = hwb.load_model(str(case / "model.onnx"))
        cm = hwb.compile(m, target, "fp32", store=store, isolate_compile=False, fidelity=False)
        for ds in sorted(case.glob("test_data_set_*")):
            ins, want = _tensors(ds, "input"), _tensors(ds, "output")
            got = cm.predict(tuple(ins) if len(ins) > 1 else ins[0])
            got = list(got) if isinstance(got, (tuple, list)) else [got]
            if len(got) != len(want):
                return Outcome(cid, "wrong", f"{len(got)} outputs, expected {len(want)}")
            for g, w in zip(got, want, strict=True):
                g = np.asarray(g).reshape(np.shape(w)) if np.size(g) == np.size(w) else g
                if np.shape(g) != np.shape(w) or not np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True):
                    err = (float(np.max(np.abs(g - w))) if np.shape(g) == np.shape(w)
                           else f"shape {np.shape(g)} vs {np.shape(w)}")
                    return Outcome(cid, "wrong", f"{ds.name}: max error {err}")
        return Outcome(cid, "right", upgraded=bool(m.meta.get("upgraded")))
    except hwb.HwbError as exc:
        return Outcome(cid, "refused", f"{type(exc).__name__}: {str(exc)[:300]}")
    except Exception as exc:  # a traceback a user would see
        return Outcome(cid, "raw", f"{type(exc).__name__}: {str(exc)[:300]}")


def run_target(target: str, only: list[Path] | None = None) -> Tally:
    """Every case on ``target``, in a fresh store."""
    t0, tally = time.monotonic(), Tally(target)
    with tempfile.TemporaryDirectory(prefix="hwb-onnx-backend-") as store:
        os.environ.setdefault("HWB_CACHE_DIR", store)
        for case in only or cases():
            tally.outcomes.append(run_case(case, target, store))
    tally.seconds = time.monotonic() - t0
    return tally


DOC = Path(__file__).resolve().parents[1] / "docs" / "targets.md"
BEGIN = ("<!-- BEGIN GENERATED ONNX BACKEND TABLE: written by `python scripts/onnx_backend_table.py`; "
         "edit that, not this section -->")
END = "<!-- END GENERATED ONNX BACKEND TABLE -->"


def table_row(t: Tally) -> str:
    c = t.counts()
    up = sum(1 for o in t.outcomes if o.verdict == "right" and o.upgraded)
    return f"| {t.target} | {c['right']} ({up} upgraded) | {c['refused']} | {c['wrong']} | {c['raw']} |"


def table(tallies: list[Tally]) -> str:
    import onnx
    n = len(tallies[0].outcomes) if tallies else 0
    return "\n".join([
        f"ONNX's backend test data, {n} cases ({', '.join(SUITES)} from the onnx {onnx.__version__} "
        f"wheel), each judged against its expected outputs (rtol {RTOL}, atol {ATOL}); "
        f"\"upgraded\": right after `onnx.version_converter` took an opset-6 file to opset 17.",
        "",
        "| target | right | refused | wrong | raw |",
        "|---|---|---|---|---|",
        *(table_row(t) for t in tallies)])


def doc_table() -> str:
    """The generated section of docs/targets.md ('' when it has none)."""
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        return ""
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)]


def write_doc(tallies: list[Tally]) -> None:
    text = DOC.read_text()
    body = f"{BEGIN}\n{table(tallies)}\n{END}"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + body + text[text.index(END) + len(END):]
    else:
        raise SystemExit(f"{DOC} has no {BEGIN!r} … {END!r} section to write into")
    DOC.write_text(text)
