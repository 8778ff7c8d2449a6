"""What the artifact store trusts: paths only this user (or a named group) can change, and
records signed with this user's key. Modelled on OpenSSH's ``StrictModes``.

- **Ownership and modes.** A trusted directory or file is owned by this user (or root) and is
  not group- or world-writable; a symlink inside the store is never followed. With a shared
  group (``HWB_STORE_GROUP=NAME``), paths whose group is ``NAME`` may be group-writable and
  owned by any member. The store root's ancestors must not be writable by others unless
  sticky (``/tmp``), else someone could swap the root.
- **The key.** 32 random bytes in ``$HWB_KEY_FILE``, else
  ``$XDG_CONFIG_HOME/hwbackends/store.key`` (``~/.config/hwbackends/store.key``), created
  0600 on first use; a key file others can read or write is refused. Manifests carry
  ``hmac-sha256(key, manifest)``: a manifest edited without the key does not verify.
"""
from __future__ import annotations

import grp
import hashlib
import hmac
import json
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import Any

from .errors import StoreTrustError

KEY_BYTES = 32


def trusted_gid() -> int | None:
    """The group named by ``HWB_STORE_GROUP`` (shared stores), or ``None``."""
    name = os.environ.get("HWB_STORE_GROUP")
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise StoreTrustError(f"HWB_STORE_GROUP={name!r} names no group on this machine; "
                              f"unset it or name an existing group") from None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def check_path(path: Path, what: str, gid: int | None, *, ancestor: bool = False) -> os.stat_result:
    """Refuse ``path`` unless only this user (or ``gid``) can change it. Raises
    :class:`StoreTrustError` naming the path and the fix; returns its ``lstat``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StoreTrustError(f"{what} {path} cannot be inspected ({exc})") from exc
    me = os.getuid()
    shared = gid is not None and st.st_gid == gid
    if stat.S_ISLNK(st.st_mode) and not ancestor:
        raise StoreTrustError(f"{what} {path} is a symlink; the store follows none. Remove it "
                              f"(rm {path}) and let hwbackends rebuild it")
    if st.st_uid not in (me, 0) and not shared:
        raise StoreTrustError(
            f"{what} {path} is owned by {_user(st.st_uid)} (uid {st.st_uid}), not by you "
            f"({_user(me)}); nothing in it is loaded. If it is yours: chown -R {_user(me)} {path}; "
            f"otherwise use a store of your own (HWB_CACHE_DIR), or share one with a group "
            f"(HWB_STORE_GROUP)")
    writable = st.st_mode & (0o002 if shared else 0o022)
    if writable and not (ancestor and st.st_mode & stat.S_ISVTX):
        mode = "700" if stat.S_ISDIR(st.st_mode) else "600"
        raise StoreTrustError(
            f"{what} {path} is writable by {'others' if st.st_mode & 0o002 else 'its group'} "
            f"(mode {stat.filemode(st.st_mode)}); nothing in it is loaded. Fix: chmod "
            f"{'-R go-w' if ancestor else mode} {path}"
            + ("" if shared or ancestor else " (or share the store with HWB_STORE_GROUP=GROUP)"))
    return st


def check_root(root: Path, gid: int | None) -> None:
    """The store root and every directory above it (``check_path`` rules; ancestors may be
    sticky and world-writable, like ``/tmp``)."""
    real = Path(os.path.realpath(root))
    check_path(real, "store directory", gid)
    for parent in real.parents:
        check_path(parent, "directory above the store", gid, ancestor=True)


def check_tree(d: Path, gid: int | None) -> None:
    """``d`` and everything under it: no symlinks, nothing others can change."""
    check_path(d, "store entry", gid)
    for dirpath, dirnames, filenames in os.walk(d):
        for name in dirnames + filenames:
            check_path(Path(dirpath) / name, "store file", gid)


def key_path() -> Path:
    env = os.environ.get("HWB_KEY_FILE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "hwbackends" / "store.key"


def load_key() -> bytes:
    """This user's store key, created 0600 on first use; refused if others could read it."""
    p = key_path()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        try:
            p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:  # another process created it first
            return load_key()
        except OSError as exc:
            raise StoreTrustError(f"cannot create the store key {p} ({exc}); set HWB_KEY_FILE "
                                  f"to a path only you can write") from exc
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
        return load_key()
    except OSError as exc:
        raise StoreTrustError(f"store key {p} cannot be opened ({exc}); it must be a regular "
                              f"file (not a symlink) readable by you") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        gid = trusted_gid()
        others = 0o007 if gid is not None and st.st_gid == gid else 0o077
        if st.st_uid != os.getuid() or st.st_mode & others:
            raise StoreTrustError(
                f"store key {p} must be yours and private (owner {_user(st.st_uid)}, mode "
                f"{stat.filemode(st.st_mode)}); fix: chown {_user(os.getuid())} {p}; chmod 600 {p}")
        key = f.read()
    if len(key) < 16:
        raise StoreTrustError(f"store key {p} is {len(key)} bytes (≥ 16 expected); remove it "
                              f"(every artifact is then rebuilt once)")
    return key


def sign(key: bytes, record: dict[str, Any]) -> str:
    """``hmac-sha256`` of the record's canonical JSON (without its ``hmac`` field)."""
    body = {k: v for k, v in record.items() if k != "hmac"}
    blob = json.dumps(body, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hmac.new(key, blob, hashlib.sha256).hexdigest()


def verify(key: bytes, record: dict[str, Any]) -> bool:
    got = record.get("hmac")
    return isinstance(got, str) and hmac.compare_digest(got, sign(key, record))


def sign_bytes(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()
