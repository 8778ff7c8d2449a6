"""The bitstream store: per board and model fingerprint, a ``.bit`` + ``.hwh`` + manifest.

Layout (root: ``HWB_BITSTREAMS``, default the repository's ``bitstreams/``)::

    bitstreams/<board>/<fingerprint>/design.bit
    bitstreams/<board>/<fingerprint>/design.hwh
    bitstreams/<board>/<fingerprint>/manifest.json

Loading a bitstream reconfigures hardware, so an entry is used only when its manifest is
complete, names the board and fingerprint asked for, and the sha256 of each file matches the
manifest. Anything else is refused with the reason.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwbackends.contract import CacheError, file_sha256

MANIFEST_FORMAT = 1
REQUIRED = ("format", "board", "part", "fingerprint", "hls4ml_config", "files", "build_date", "io")
FILES = ("design.bit", "design.hwh")
_SAFE = re.compile(r"^[A-Za-z0-9._-]+$")


class BitstreamRefused(CacheError):
    """A bitstream entry is incomplete, tampered with, or for another board or model."""


@dataclass(frozen=True)
class BitstreamEntry:
    """A validated store entry."""

    path: Path
    manifest: dict[str, Any]

    @property
    def bit(self) -> Path:
        return self.path / "design.bit"

    @property
    def hwh(self) -> Path:
        return self.path / "design.hwh"

    @property
    def board(self) -> str:
        return self.manifest["board"]


def default_root() -> Path:
    env = os.environ.get("HWB_BITSTREAMS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "bitstreams"


def detect_board() -> str | None:
    """The PYNQ board this process runs on (PYNQ images export ``BOARD``), else None."""
    board = os.environ.get("BOARD") or os.environ.get("PYNQ_BOARD")
    return board if board and _SAFE.match(board) else None


class BitstreamStore:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root else default_root()

    def _dir(self, board: str, fingerprint: str) -> Path:
        for label, v in (("board", board), ("fingerprint", fingerprint)):
            if not _SAFE.match(v):
                raise BitstreamRefused(f"{label} {v!r} has characters a store path cannot hold")
        return self.root / board / fingerprint

    def add(self, board: str, fingerprint: str, bit: Path, hwh: Path, *, part: str,
            hls4ml_config: dict[str, Any], io: dict[str, Any]) -> BitstreamEntry:
        """Copy a built design in and write its manifest (sha256 of each file)."""
        d = self._dir(board, fingerprint)
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy2(bit, d / "design.bit")
        shutil.copy2(hwh, d / "design.hwh")
        manifest = {
            "format": MANIFEST_FORMAT, "board": board, "part": part, "fingerprint": fingerprint,
            "hls4ml_config": hls4ml_config, "io": io,
            "files": {n: file_sha256(d / n) for n in FILES},
            "build_date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        tmp = d / ".manifest.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp, d / "manifest.json")
        return BitstreamEntry(d, manifest)

    def find(self, board: str, fingerprint: str) -> BitstreamEntry | None:
        """The validated entry for (board, fingerprint); None when there is none.
        Raises :class:`BitstreamRefused` when one exists but must not be loaded."""
        d = self._dir(board, fingerprint)
        if not (d / "manifest.json").exists():
            return None
        return validate(d, board=board, fingerprint=fingerprint)


def validate(d: Path, *, board: str, fingerprint: str) -> BitstreamEntry:
    """Check a store entry completely before anything programs a device with it."""
    try:
        manifest = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise BitstreamRefused(f"{d}: unreadable manifest ({exc}); rebuild the bitstream") from exc
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise BitstreamRefused(f"{d}: manifest lacks {', '.join(missing)}; refusing to load it")
    if manifest["format"] != MANIFEST_FORMAT:
        raise BitstreamRefused(f"{d}: manifest format {manifest['format']}, expected {MANIFEST_FORMAT}")
    if manifest["board"] != board:
        raise BitstreamRefused(f"{d}: bitstream built for board {manifest['board']!r}, this is "
                               f"{board!r}; refusing to load it")
    if manifest["fingerprint"] != fingerprint:
        raise BitstreamRefused(f"{d}: bitstream implements model {manifest['fingerprint']}, not "
                               f"{fingerprint}; refusing to load it")
    files = manifest["files"]
    for name in FILES:
        if name not in files:
            raise BitstreamRefused(f"{d}: manifest has no sha256 for {name}")
        p = d / name
        if not p.exists():
            raise BitstreamRefused(f"{d}: {name} is missing")
        got = file_sha256(p)
        if got != files[name]:
            raise BitstreamRefused(f"{d}: {name} sha256 {got[:16]}… does not match the manifest's "
                                   f"{files[name][:16]}… (tampered or corrupt); refusing to load it")
    return BitstreamEntry(d, manifest)
