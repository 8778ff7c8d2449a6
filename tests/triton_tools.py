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


def tritonserver_env(venv: Path) -> dict:
    """Paths of the ``nvidia-pytriton`` venv's server: ``tritonserver`` (its directory), the
    python-backend ``stub`` for this Python, ``site`` and ``libpython``; raises LookupError
    naming what is missing."""
    import sys
    import sysconfig

    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / f"python{py}" / "site-packages"
    ts = site / "pytriton" / "tritonserver"
    stub = ts / "python_backend_stubs" / py / "triton_python_backend_stub"
    if not (ts / "bin" / "tritonserver").exists() or not stub.exists():
        raise LookupError(f"nvidia-pytriton in {venv} has no tritonserver or no python-backend "
                          f"stub for Python {py}")
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "")
    if not (libdir / f"libpython{py}.so.1.0").exists() and not (libdir / f"libpython{py}.so").exists():
        raise LookupError(f"the python-backend stub needs libpython{py}.so, not found in {libdir}")
    return {"venv": venv, "site": site, "tritonserver": ts, "stub": stub, "libpython": libdir}


def start_tritonserver(env: dict, repo: Path, workdir: Path, http: int, grpc: int,
                       models: tuple[str, ...], timeout_s: float = 120.0) -> "subprocess.Popen":
    """Start the venv's ``tritonserver`` on 127.0.0.1 over ``repo`` (python backend copied
    into ``workdir`` with the stub) and wait until every model in ``models`` is ready; the
    caller stops it (``os.killpg(p.pid, SIGTERM)``). Raises RuntimeError with the log's tail
    when it exits or is not ready in time."""
    import shutil
    import time
    import urllib.error
    import urllib.request

    be = workdir / "backends"
    shutil.copytree(env["tritonserver"] / "backends" / "python", be / "python", dirs_exist_ok=True)
    shutil.copy(env["stub"], be / "python")
    venv, site = env["venv"], env["site"]
    penv = dict(os.environ,
                LD_LIBRARY_PATH=os.pathsep.join([str(env["libpython"]), str(site / "nvidia_pytriton.libs")]),
                # the stub embeds this Python: the Triton venv's packages (numpy < 2, LiteRT)
                PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                PYTHONPATH=str(site), VIRTUAL_ENV=str(venv))
    log_path = workdir / "tritonserver.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [str(env["tritonserver"] / "bin" / "tritonserver"), f"--model-repository={repo}",
         f"--backend-directory={be}", "--http-address=127.0.0.1", f"--http-port={http}",
         "--grpc-address=127.0.0.1", f"--grpc-port={grpc}", "--allow-metrics=false",
         "--exit-timeout-secs=5"], stdout=log, stderr=subprocess.STDOUT, env=penv,
        start_new_session=True)
    log.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if all(urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{n}/ready",
                                          timeout=2).status == 200 for n in models):
                return proc
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.5)
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        proc.wait(15)
    raise RuntimeError(f"tritonserver not ready (exit {proc.returncode}): "
                       f"{log_path.read_text()[-3000:]}")
