"""Keep Ray on loopback. Ray binds the host's external interface even when asked for
127.0.0.1 (measured: its GCS, raylet and workers listen on ``*`` and the external address), so
the embedded local Ray runs inside a fresh network namespace that holds only ``lo``: there is
no other interface to bind or to send to."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

#: Set in the re-executed process, so it does not try to enter another namespace.
ENV_FLAG = "HWB_FLEET_NETNS"


def loopback_only() -> bool:
    """True when this process's network namespace has no interface but ``lo``."""
    # /proc/self/net follows the process's namespace (/sys/class/net follows the sysfs mount,
    # which still shows the host's interfaces inside `unshare -n`).
    try:
        lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    except OSError:
        return False
    return [ln.split(":", 1)[0].strip() for ln in lines] == ["lo"]


def unshare_prefix() -> list[str] | None:
    """The ``unshare`` command that gives a loopback-only namespace here, or ``None`` when
    namespaces are refused: plain ``unshare -n`` as root, a user namespace (``-r``) otherwise."""
    exe = shutil.which("unshare")
    if not exe:
        return None
    tries = [[exe, "-n"]] if os.geteuid() == 0 else []
    tries.append([exe, "-r", "-n"])
    for pre in tries:
        try:
            r = subprocess.run(pre + ["sh", "-c", "ip link set lo up"], capture_output=True,
                               timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return pre
    return None


def wrap_pid(argv: Sequence[str]) -> list[str] | None:
    """Like :func:`wrap`, in a fresh PID namespace too: every process started inside (a
    daemonized ``ray start`` included) is killed when ``argv`` exits."""
    pre = unshare_prefix()
    if pre is None:
        return None
    return pre + ["-p", "-f", "--mount-proc", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
                  *argv]


def wrap(argv: Sequence[str]) -> list[str] | None:
    """``argv`` run inside a fresh loopback-only namespace (``lo`` brought up first), or
    ``None`` where namespaces are refused."""
    pre = unshare_prefix()
    if pre is None:
        return None
    return pre + ["sh", "-c", 'ip link set lo up && exec "$0" "$@"', *argv]


def reexec_hwb(args: Sequence[str]) -> None:
    """Replace this process by ``hwb ARGS`` inside a loopback-only namespace (returns only
    when that is refused). Exec, not a child: Ctrl-C reaches the run directly."""
    argv = wrap([sys.executable, "-c", "import sys; from hwbackends.cli import main; "
                                       "sys.exit(main(sys.argv[1:]))", *args])
    if argv is None:
        return
    os.environ[ENV_FLAG] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)
