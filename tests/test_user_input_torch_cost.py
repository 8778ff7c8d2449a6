"""A torch file's cost is taken from what it declares, and nothing in it runs, before torch
opens it.

The hostile files are written here from a real ``torch.export.save`` archive of a small
model: its weights table made to declare a ``40000 × 40000`` float32 parameter (6.0 GiB; the
default limit is 4 GiB) over an empty weight file, which ``torch.export.load`` would allocate
at its declared size (nothing about the file's size gives it away); the same for a
``torch.save`` zip whose pickle names a storage of that size. ``hwb compile`` must refuse each
in ≤ 3 s under 500 MB of RSS, naming the figure and the limit. An archive with parts
``torch.export.load`` would run (a pickle torch's restricted unpickler refuses — torch then
loads it with the full one —, a pickled payload, an AOTInductor package) is refused unless the
caller trusts the file, and the code never runs. A model path that is a FIFO or a device (any
format) is refused before anything opens it."""
from __future__ import annotations

import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest

from hwbackends import cost, load_model
from hwbackends.errors import ModelError
from hwbackends.models import torch_archive

torch = pytest.importorskip("torch")

from test_user_input_keras_cost import hwb_peak  # noqa: E402

WIDE = 40_000


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.l(x))


@pytest.fixture(scope="module")
def small_pt2(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("pt2") / "small.pt2"
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(Net(), (torch.zeros(2, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(ep, str(p))
    return p


def rewrite(src: Path, dst: Path, edit) -> Path:
    """``src`` with each record passed through ``edit(name, bytes) -> bytes | None`` (None
    drops it); ``edit`` may add records by returning them from ``edit(None, None)``."""
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as out:
        for info in z.infolist():
            data = edit(info.filename, z.read(info))
            if data is not None:
                out.writestr(info, data)
        for name, data in (edit(None, None) or {}).items():
            out.writestr(name, data)
    return dst


def wide_weight(name, data):
    """The weights table declares l.weight as WIDE × WIDE over an empty weight file."""
    if name is None:
        return None
    if name.endswith("_weights_config.json"):
        cfg = json.loads(data)
        meta = cfg["config"]["l.weight"]["tensor_meta"]
        meta["sizes"] = [{"as_int": WIDE}, {"as_int": WIDE}]
        meta["strides"] = [{"as_int": WIDE}, {"as_int": 1}]
        wfile = cfg["config"]["l.weight"]["path_name"]
        wide_weight.empty = wfile
        return json.dumps(cfg).encode()
    if name.endswith("/data/weights/" + getattr(wide_weight, "empty", "weight_0")):
        return b""
    return data


def test_a_declared_6gb_torch_export_parameter_is_refused_fast_and_small(small_pt2, tmp_path):
    f = rewrite(small_pt2, tmp_path / "wide.pt2", wide_weight)
    assert f.stat().st_size < 64 << 10  # nothing about the file's size gives it away
    rc, err, took, peak = hwb_peak("compile", str(f), "-t", "ref")
    assert rc == 1, err
    assert "CostError" in err and "6.0 GiB of weight bytes" in err and "limit of 4.0 GiB" in err, err
    assert "HWB_MAX_WEIGHTS=8G" in err, err  # and the way to raise it
    assert "Traceback" not in err and len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
    assert took <= 3.0, f"refused after {took:.1f} s"
    assert peak < 500, f"peak RSS {peak:.0f} MB"
    with pytest.raises(cost.CostError, match=r"6\.0 GiB of weight bytes.*limit of 4\.0 GiB"):
        load_model(f)


def test_a_declared_6gb_storage_in_a_torch_save_pickle_is_refused_unrun(tmp_path):
    """A whole-module pickle whose storage declares WIDE × WIDE floats over an empty record:
    read for its declarations with stand-ins only, so even a trusted file is refused before
    torch allocates (or runs) anything."""
    marker = tmp_path / "ran"

    class Run:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    class Declares(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", WIDE * WIDE) if obj == "W" else None

    buf = io.BytesIO()
    Declares(buf, protocol=2).dump({"weight": "W", "run": Run()})
    f = tmp_path / "whole.pt"
    with zipfile.ZipFile(f, "w") as z:
        z.writestr("whole/data.pkl", buf.getvalue())
        z.writestr("whole/data/0", b"")
        z.writestr("whole/version", "3\n")
        z.writestr("whole/byteorder", "little")
    for trust in (False, True):
        with pytest.raises(cost.CostError, match=r"6\.0 GiB of weight bytes"):
            load_model(f, trust_pickle=trust, input_shape=(8,))
    assert not marker.exists()
    rc, err, took, peak = hwb_peak("compile", str(f), "-t", "ref", "--trust-pickle",
                                   "--input-shape", "8")
    assert rc == 1 and "CostError" in err and "6.0 GiB" in err and "Traceback" not in err, err
    assert took <= 3.0 and peak < 500, (took, peak)
    assert not marker.exists()


def test_a_real_archive_declares_what_torch_loads(small_pt2, tmp_path):
    with zipfile.ZipFile(small_pt2) as z:
        declared = cost.torch_export_cost(z, small_pt2)
    m = load_model(small_pt2)
    assert declared.params == m.meta["cost"]["params"] == 8 * 4 + 4
    assert declared.weight_bytes == m.meta["cost"]["weight_bytes"] == 4 * 36
    # per sample (a symbolic batch counts one): input 8 + linear 4 + relu 4 floats
    assert declared.activation_bytes == 4 * (8 + 4 + 4)
    assert declared.macs == 8 * 4 + 4  # the linear's, and one per relu output
    torch.save(Net(), tmp_path / "whole.pt")
    with zipfile.ZipFile(tmp_path / "whole.pt") as z:
        assert torch_archive.declared_storages(z, tmp_path / "whole.pt").weight_bytes == 4 * 36


def _pickled(code_marker: Path):
    class Run:
        def __reduce__(self):
            return (os.system, (f"touch {code_marker}",))
    buf = io.BytesIO()
    torch.save((Run(),), buf)
    return buf.getvalue()


@pytest.mark.parametrize("part", ["sample-inputs", "use-pickle", "aotinductor"])
def test_parts_torch_export_load_would_run_are_refused_unless_trusted(part, small_pt2, tmp_path):
    marker = tmp_path / "ran"
    evil = _pickled(marker)

    def edit(name, data):
        if name is None:
            return {"small/data/aotinductor/model/model.so": b"\x7fELF"} if part == "aotinductor" else None
        if part == "sample-inputs" and "/data/sample_inputs/" in name:
            return evil
        if part == "use-pickle" and name.endswith("_weights_config.json"):
            cfg = json.loads(data)
            cfg["config"]["l.bias"]["use_pickle"] = True
            return json.dumps(cfg).encode()
        return data

    f = rewrite(small_pt2, tmp_path / "evil.pt2", edit)
    with pytest.raises(ModelError, match="trust_pickle=True") as e:
        load_model(f)
    assert {"sample-inputs": "restricted unpickler refuses", "use-pickle": "a pickled tensor",
            "aotinductor": "AOTInductor"}[part] in str(e.value)
    rc, err, _, _ = hwb_peak("compile", str(f), "-t", "ref")
    assert rc == 1 and "--trust-pickle" in err and "Traceback" not in err, err
    assert not marker.exists()


def test_a_hostile_archive_json_is_refused_with_what_it_is(small_pt2, tmp_path):
    def deep(name, data):
        if name is not None and name.endswith("/models/model.json"):
            return b"[" * 100_000 + b"]" * 100_000
        return data

    f = rewrite(small_pt2, tmp_path / "deep.pt2", deep)
    with pytest.raises(ModelError, match="nested deeper than a torch.export archive writes"):
        load_model(f)


@pytest.mark.parametrize("suffix", [".pt2", ".pt", ".onnx", ".keras", ".h5", ".json"])
def test_a_model_path_that_is_a_fifo_or_device_is_refused_unread(suffix, tmp_path):
    """A FIFO no one writes would block the framework that opens it forever; a link to a
    device (``/dev/zero``) would be read without end. Both are refused before any open."""
    fifo = tmp_path / f"m{suffix}"
    os.mkfifo(fifo)
    rc, err, took, _ = hwb_peak("compile", str(fifo), "-t", "ref", "--input-shape", "4")
    assert rc == 1 and "is a FIFO (named pipe), not a model file" in err, err
    assert "Traceback" not in err and took < 30, (took, err)
    dev = tmp_path / f"zero{suffix}"
    dev.symlink_to("/dev/zero")
    with pytest.raises(ModelError, match="is a character device, not a model file"):
        load_model(dev, input_shape=(4,))
