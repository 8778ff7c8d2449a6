"""What the tests that run Triton's own tools share: ``perf_analyzer`` (tritonclient 2.51's
wheel) needs Debian's ``libb64-0d``, fetched with ``apt-get download`` into a cache directory
when the system does not have it."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def libb64(env_dir: Path) -> Path | None:
    """A directory holding libb64.so.0d: None for the system's, else Debian's package unpacked
    under ``env_dir`` (or skip, with the reason, when it cannot be had)."""
    if "libb64.so.0d" in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout:
        return None
    lib = env_dir / "libb64" / "usr" / "lib" / "x86_64-linux-gnu"
    if (lib / "libb64.so.0d").exists():
        return lib
    dl = env_dir / "libb64-deb"
    dl.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["apt-get", "download", "libb64-0d"], cwd=dl, capture_output=True, text=True)
    if r.returncode and os.geteuid() == 0:  # a fresh machine has no package lists yet
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=300)
        r = subprocess.run(["apt-get", "download", "libb64-0d"], cwd=dl, capture_output=True,
                           text=True)
    debs = sorted(dl.glob("libb64-0d_*.deb"))
    if r.returncode or not debs:
        pytest.skip(f"perf_analyzer needs libb64-0d (not installed; apt-get download failed: "
                    f"{r.stderr.strip()[-200:]})")
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(env_dir / "libb64")], check=True)
    return lib
