"""The bitstream store: per board and model fingerprint, a ``.bit`` + ``.hwh`` + manifest.

Layout (root: ``HWB_BITSTREAMS``, default the repository's ``bitstreams/``)::

    bitstreams/<board>/<fingerprint>/design.bit
    bitstreams/<board>/<fingerprint>/design.hwh
    bitstreams/<board>/<fingerprint>/manifest.json

Loading a bitstream reconfigures hardware, so an entry is held to the artifact store's trust
rules (``hwbackends.contract``: ``check_path``, ``seal``) before a byte of it is read:

- the root and every directory above it, the board and entry directories and every file in
  the entry must be owned by this user (or root) and not writable by others, and no symlink is
  followed (the root is resolved once and used by its real path);
- the manifest must carry this user's signature (an HMAC under the store key): entries
  :meth:`BitstreamStore.add` writes are signed as it writes them; an entry from elsewhere (a
  checked-in or copied bitstream) is refused until the user adopts it, after checking where it
  came from, with ``hwb fpga-adopt BOARD FINGERPRINT`` (:meth:`BitstreamStore.adopt`), which
  verifies it as a load does and signs it;
- the manifest is complete, names the board and fingerprint asked for, and the sha256 of each
  file matches it.

Anything else is refused with the reason and the fix.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import shlex
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from hwbackends.contract import (
    CacheError,
    StoreTrustError,
    check_path,
    check_trusted_dir,
    file_sha256,
    private_dir,
    seal,
    sealed,
)

MANIFEST_FORMAT = 1
REQUIRED = ("format", "board", "part", "fingerprint", "hls4ml_config", "files", "build_date", "io")
FILES = ("design.bit", "design.hwh")
#: The largest manifest read (an hls4ml configuration is kilobytes).
MAX_MANIFEST_BYTES = 4 << 20
_SAFE = re.compile(r"^[A-Za-z0-9._-]+$")


class BitstreamRefused(CacheError):
    """A bitstream entry is incomplete, tampered with, unsigned, not trusted where it lies,
    or for another board or model."""


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


#: The store shipped with the code (the repository's ``bitstreams/``).
SHIPPED = Path(__file__).resolve().parents[2] / "bitstreams"


def default_root() -> Path:
    env = os.environ.get("HWB_BITSTREAMS")
    return Path(env) if env else SHIPPED


def detect_board() -> str | None:
    """The PYNQ board this process runs on (PYNQ images export ``BOARD``), else None."""
    board = os.environ.get("BOARD") or os.environ.get("PYNQ_BOARD")
    return board if board and _SAFE.match(board) else None


def adopt_command(board: str, fingerprint: str, root: Path) -> str:
    """The command that adopts an entry (:meth:`BitstreamStore.adopt`), naming its store
    unless it is the shipped one."""
    env = "" if Path(root).resolve() == SHIPPED else f"HWB_BITSTREAMS={shlex.quote(str(root))} "
    return f"{env}hwb fpga-adopt {board} {fingerprint}"


class BitstreamStore:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root else default_root()

    def _dir(self, board: str, fingerprint: str) -> Path:
        for label, v in (("board", board), ("fingerprint", fingerprint)):
            if not _SAFE.match(v) or v in (".", ".."):
                raise BitstreamRefused(f"{label} {v!r} has characters a store path cannot hold")
        return self.root / board / fingerprint

    def add(self, board: str, fingerprint: str, bit: Path, hwh: Path, *, part: str,
            hls4ml_config: dict[str, Any], io: dict[str, Any]) -> BitstreamEntry:
        """Copy a built design in and write its signed manifest (sha256 of each file)."""
        self._dir(board, fingerprint)
        with _refusals():
            root = private_dir(self.root, "bitstream store", elsewhere="HWB_BITSTREAMS")
            d = private_dir(private_dir(root / board, "bitstream store directory",
                                        elsewhere="HWB_BITSTREAMS") / fingerprint,
                            "bitstream entry", elsewhere="HWB_BITSTREAMS")
        for src, name in ((bit, "design.bit"), (hwh, "design.hwh")):
            tmp = d / f".{name}.tmp"
            shutil.copyfile(src, tmp)  # the entry is ours and private: nothing planted in it
            os.chmod(tmp, 0o644)
            os.replace(tmp, d / name)
        manifest = {
            "format": MANIFEST_FORMAT, "board": board, "part": part, "fingerprint": fingerprint,
            "hls4ml_config": hls4ml_config, "io": io,
            "files": {n: file_sha256(d / n) for n in FILES},
            "build_date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        with _refusals():
            manifest = seal(manifest)
        _write_manifest(d, manifest)
        return BitstreamEntry(d, manifest)

    def find(self, board: str, fingerprint: str) -> BitstreamEntry | None:
        """The validated entry for (board, fingerprint); None when there is none.
        Raises :class:`BitstreamRefused` when one exists but must not be loaded."""
        d = self._trusted_entry(board, fingerprint)
        if d is None:
            return None
        return validate(d, board=board, fingerprint=fingerprint, root=self.root)

    def adopt(self, board: str, fingerprint: str) -> BitstreamEntry:
        """Sign an entry this user did not write (a checked-in or copied bitstream) once it
        passes every check a load makes but the signature: the user's decision that it may
        program this machine's board."""
        d = self._trusted_entry(board, fingerprint)
        if d is None:
            raise BitstreamRefused(f"no bitstream entry {self._dir(board, fingerprint)} (with a "
                                   f"manifest.json) to adopt")
        entry = validate(d, board=board, fingerprint=fingerprint, root=self.root, signed=False)
        with _refusals():
            manifest = seal(entry.manifest)
        _write_manifest(d, manifest)
        return BitstreamEntry(d, manifest)

    def _trusted_entry(self, board: str, fingerprint: str) -> Path | None:
        """The entry directory by its real path once the root, the directories on the way and
        everything in the entry pass the store's trust rules; None when there is no entry."""
        self._dir(board, fingerprint)
        with _refusals():
            try:
                root = check_trusted_dir(self.root, "bitstream store")
                d = root
                for part, what in ((board, "bitstream store directory"),
                                   (fingerprint, "bitstream entry")):
                    d = d / part
                    if not stat.S_ISDIR(check_path(d, what, None).st_mode):
                        raise BitstreamRefused(f"{what} {d} is not a directory")
                names = os.listdir(d)
            except FileNotFoundError:
                return None
            if "manifest.json" not in names:
                return None
            for name in names:
                check_path(d / name, "bitstream file", None)
        return d


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """The trust rules' refusals as :class:`BitstreamRefused` (one error class for callers)."""
    try:
        yield
    except StoreTrustError as exc:
        raise BitstreamRefused(f"bitstream store: {exc}") from None


def _write_manifest(d: Path, manifest: dict[str, Any]) -> None:
    tmp = d / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.chmod(tmp, 0o644)
    os.replace(tmp, d / "manifest.json")


def _read_manifest(d: Path) -> dict[str, Any]:
    try:
        fd = os.open(d / "manifest.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise BitstreamRefused(f"{d}: manifest.json is not a regular file; rebuild the bitstream")
            raw = f.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise BitstreamRefused(f"{d}: manifest.json is over {MAX_MANIFEST_BYTES >> 20} MiB; "
                                   f"not a manifest hwb writes")
        manifest = json.loads(raw)
    except (OSError, ValueError, RecursionError) as exc:
        raise BitstreamRefused(f"{d}: unreadable manifest ({type(exc).__name__}: "
                               f"{str(exc)[:200]}); rebuild the bitstream") from None
    if not isinstance(manifest, dict):
        raise BitstreamRefused(f"{d}: manifest.json is not an object; rebuild the bitstream")
    return manifest


def validate(d: Path, *, board: str, fingerprint: str, root: Path | None = None,
             signed: bool = True) -> BitstreamEntry:
    """Check a store entry completely before anything programs a device with it (the trust
    of its path is :meth:`BitstreamStore.find`'s). ``signed``: the manifest must carry this
    user's signature (:meth:`BitstreamStore.adopt` checks everything else first)."""
    manifest = _read_manifest(d)
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise BitstreamRefused(f"{d}: manifest lacks {', '.join(missing)}; refusing to load it")
    if signed:
        with _refusals():
            ok = sealed(manifest)
        if not ok:
            how = adopt_command(board, fingerprint, root if root is not None else d.parents[1])
            raise BitstreamRefused(
                f"{d}: manifest is {'not signed by you' if 'hmac' not in manifest else 'edited since it was signed'}"
                f" (loading a bitstream reconfigures the board, so only an entry hwb wrote here "
                f"or one you adopted is loaded). If you know where it came from and trust it: "
                f"{how}; else rebuild it")
    if manifest["format"] != MANIFEST_FORMAT:
        raise BitstreamRefused(f"{d}: manifest format {manifest['format']}, expected {MANIFEST_FORMAT}")
    if manifest["board"] != board:
        raise BitstreamRefused(f"{d}: bitstream built for board {manifest['board']!r}, this is "
                               f"{board!r}; refusing to load it")
    if manifest["fingerprint"] != fingerprint:
        raise BitstreamRefused(f"{d}: bitstream implements model {manifest['fingerprint']}, not "
                               f"{fingerprint}; refusing to load it")
    files = manifest["files"]
    if not isinstance(files, dict):
        raise BitstreamRefused(f"{d}: manifest 'files' is not a table of sha256 digests")
    for name in FILES:
        if name not in files:
            raise BitstreamRefused(f"{d}: manifest has no sha256 for {name}")
        p = d / name
        if not p.exists():
            raise BitstreamRefused(f"{d}: {name} is missing")
        try:
            got = file_sha256(p)
        except (OSError, CacheError) as exc:
            raise BitstreamRefused(f"{d}: {name} cannot be read as a regular file ({exc}); "
                                   f"refusing to load it") from None
        if got != files[name]:
            raise BitstreamRefused(f"{d}: {name} sha256 {got[:16]}… does not match the manifest's "
                                   f"{str(files[name])[:16]}… (tampered or corrupt); refusing to load it")
    return BitstreamEntry(d, manifest)
