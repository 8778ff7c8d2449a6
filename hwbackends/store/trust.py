"""What the artifact store trusts: paths only this user (or a named group) can change, and
records signed with this user's key. Modelled on OpenSSH's ``StrictModes``.

- **Ownership and modes.** A trusted directory or file is owned by this user (or root) and is
  not group- or world-writable; a symlink inside the store is never followed. With a shared
  group (``HWB_STORE_GROUP=NAME``), paths whose group is ``NAME`` may be group-writable and
  owned by any member (a file owned by a non-member is refused). The store root's ancestors
  must not be writable by others unless sticky (``/tmp``), else someone could swap the root.
- **The root is pinned.** :func:`resolve_root` follows the root's path component by component
  (a symlink on the way must be yours or root's) and the store keeps the real path it checked:
  later loads never go through a link again.
- **The key.** 32 random bytes in ``$HWB_KEY_FILE``, else
  ``$XDG_CONFIG_HOME/hwbackends/store.key`` (``~/.config/hwbackends/store.key``), created
  0600 on first use; a key file others can read or write, or one that is not a regular file
  (a FIFO, a directory), is refused. Every signed record (:mod:`hwbackends.store.signed_dir`: store
  manifests, build-cache and profile records, the zoo's) carries ``hmac-sha256(key, record)``
  (:func:`sign`, checked with :func:`verify` in constant time): a record edited without the
  key does not verify.
- **Private directories.** :func:`private_dir` creates a directory 0700 (its missing parents
  too) or accepts an existing one only if it passes the rules above, and says how to fix one
  that does not: what the store, the caches, the compile worker's scratch, the shared-memory
  endpoints (opened to a named group on request) and the FPGA bitstream store use.
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

from ..errors import StoreTrustError

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


def _member(uid: int, gid: int) -> bool:
    """Whether user ``uid`` belongs to group ``gid`` (primary or supplementary)."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return False  # no such user: not a member of anything
    if pw.pw_gid == gid:
        return True
    try:
        return pw.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


def _check_owner(path: Path, st: os.stat_result, what: str, gid: int | None,
                 elsewhere: str | None = None) -> bool:
    """Refuse ``path`` unless it is owned by this user, root, or (``gid`` shared) a member of
    ``gid`` with the path's group ``gid``. Returns whether the shared group is what let it in."""
    me = os.getuid()
    shared = gid is not None and st.st_gid == gid
    if st.st_uid in (me, 0):
        return shared
    if not shared:
        instead = (f"set {elsewhere} to a directory of your own" if elsewhere else
                   "use a store of your own (HWB_CACHE_DIR), or share one with a group "
                   "(HWB_STORE_GROUP)")
        raise StoreTrustError(
            f"{what} {path} is owned by {_user(st.st_uid)} (uid {st.st_uid}), not by you "
            f"({_user(me)}); nothing in it is loaded. If it is yours: chown -R {_user(me)} {path}; "
            f"otherwise {instead}")
    assert gid is not None
    if not _member(st.st_uid, gid):
        group = _group(gid)
        raise StoreTrustError(
            f"{what} {path} is owned by {_user(st.st_uid)} (uid {st.st_uid}), who is not a member "
            f"of HWB_STORE_GROUP={group}; nothing in it is loaded. Remove it (rm -r {path}: it "
            f"is rebuilt), or add that user to the group if they are to be trusted")
    return shared


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def others_can_change(st: os.stat_result) -> str | None:
    """Why someone besides this user could change what ``st`` (an ``lstat``/``fstat``)
    describes — a symlink, another owner, group- or world-writable — or ``None``. For paths
    outside the store (``hwb export``'s output directory), whose callers word their errors."""
    me = os.getuid()
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if st.st_uid != me:
        return f"is owned by {_user(st.st_uid)} (uid {st.st_uid}), not by you ({_user(me)})"
    if st.st_mode & 0o022:
        return (f"is writable by {'others' if st.st_mode & 0o002 else 'its group'} (mode "
                f"{stat.filemode(st.st_mode)})")
    return None


def check_path(path: Path, what: str, gid: int | None, *, ancestor: bool = False,
               elsewhere: str | None = None) -> os.stat_result:
    """Refuse ``path`` unless only this user (or members of ``gid``) can change it. Raises
    :class:`StoreTrustError` naming the path and the fix (``elsewhere``: the variable that
    points the caller at another directory, for paths outside the store); returns its
    ``lstat``. A path that does not exist raises :class:`FileNotFoundError` (the caller
    decides what absent means)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StoreTrustError(f"{what} {path} cannot be inspected ({exc})") from exc
    if stat.S_ISLNK(st.st_mode) and not ancestor:
        raise StoreTrustError(f"{what} {path} is a symlink; hwbackends follows none there. "
                              f"Remove it (rm {path}) and let hwbackends rebuild it")
    shared = _check_owner(path, st, what, gid, elsewhere)
    writable = st.st_mode & (0o002 if shared else 0o022)
    if writable and not (ancestor and st.st_mode & stat.S_ISVTX):
        mode = "700" if stat.S_ISDIR(st.st_mode) else "600"
        raise StoreTrustError(
            f"{what} {path} is writable by {'others' if st.st_mode & 0o002 else 'its group'} "
            f"(mode {stat.filemode(st.st_mode)}); nothing in it is loaded. Fix: chmod "
            f"{'-R go-w' if ancestor else mode} {path}"
            + ("" if shared or ancestor else f" (or set {elsewhere} to a directory of your own)"
               if elsewhere else " (or share the store with HWB_STORE_GROUP=GROUP)"))
    return st


def private_dir(path: Path, what: str, gid: int | None = None, *, closed: bool = False,
                mode: int = 0o700, group: int | None = None,
                elsewhere: str | None = None) -> Path:
    """``path`` as a directory only this user (or members of ``gid``) can change: each missing
    component is created 0700 (``Path.mkdir(parents=True)`` would give the parents the
    umask's mode), and the directory itself must pass :func:`check_path`: not a symlink, owned
    by this user (or root), not writable by others. ``closed``: nobody else may even read or
    enter it (mode ``0700``). Anything else is :class:`StoreTrustError` naming ``what``,
    the path and the fix (``elsewhere``: the variable that points the caller at another
    directory, outside the store); nothing is tightened, chmod'ed or removed behind the user's back.

    ``group`` opens the directory to a group that may read or enter it, never write (a
    serving endpoint's clients): the directory is given that group and the group bits of
    ``mode`` (``0o750``, ``0o710``) — created so, or added to an existing one, since the
    caller was asked to open it; the missing parents it creates get the group's traverse bit.
    Without ``group``, ``mode`` may not open anything to the group or others."""
    if mode & ~0o750 or mode & 0o700 != 0o700 or (mode & 0o070 and group is None):
        raise ValueError(f"private_dir mode {mode:o}: owner rwx, at most group r-x, and group "
                         f"bits only with a group")
    p = Path(path)
    missing = []
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for q in reversed(missing):
        try:
            os.mkdir(q, 0o700)
        except FileExistsError:
            continue  # created meanwhile: checked below like any other
        except OSError as exc:
            raise StoreTrustError(f"cannot create the {what} {q} ({exc}); make its parent "
                                  f"writable by you, or point hwbackends at a directory you "
                                  f"own ({elsewhere or 'HWB_CACHE_DIR'})") from exc
        if group is not None:  # ours, just made: given the group it is being opened to
            _open_to(q, group, mode if q == Path(path) else 0o710, what)
    try:
        st = check_path(Path(path), what, gid, elsewhere=elsewhere)
    except FileNotFoundError:
        raise StoreTrustError(f"{what} {path} vanished as it was created; retry") from None
    if not stat.S_ISDIR(st.st_mode):
        raise StoreTrustError(f"{what} {path} is not a directory; remove it (rm {path}) and "
                              f"let hwbackends create it")
    if gid is None and st.st_uid != os.getuid():  # root's is trusted, but not ours to use
        raise StoreTrustError(f"{what} {path} is owned by {_user(st.st_uid)} (uid {st.st_uid}), "
                              f"not by you ({_user(os.getuid())}); remove it or point "
                              f"hwbackends at a directory of your own "
                              f"({elsewhere or 'HWB_CACHE_DIR'})")
    if group is not None and (st.st_gid != group or ~st.st_mode & mode & 0o070):
        _open_to(Path(path), group, stat.S_IMODE(st.st_mode) | (mode & 0o070), what, st.st_ino)
    elif closed and st.st_mode & 0o077:
        raise StoreTrustError(f"{what} {path} is open to others (mode "
                              f"{stat.filemode(st.st_mode)}); fix: chmod 700 {path}")
    return Path(path)


def _open_to(path: Path, group: int, mode: int, what: str, ino: int | None = None) -> None:
    """Give the directory ``path`` (this user's; ``ino``: the one just checked) the group
    ``group`` and ``mode``, through a descriptor: a symlink swapped in meanwhile is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreTrustError(f"{what} {path} cannot be opened ({exc}); remove it and retry") from exc
    try:
        if ino is not None and os.fstat(fd).st_ino != ino:
            raise StoreTrustError(f"{what} {path} was replaced while it was checked; retry")
        os.fchown(fd, -1, group)
        os.fchmod(fd, mode)
    except OSError as exc:
        raise StoreTrustError(f"cannot give {what} {path} the group {_group(group)} ({exc}); "
                              f"you must be a member of it") from exc
    finally:
        os.close(fd)


#: Symlinks followed while resolving a store root before it is refused as a loop.
MAX_LINKS = 40


def resolve_root(root: Path, gid: int | None) -> Path:
    """The store root ``root`` as a real path, checked component by component on the way and
    created (0700) where missing; the caller keeps the result and never goes through ``root``
    again (the root is *pinned*: no check-then-use).

    Every directory on the way must pass :func:`check_path` (those above the root may be
    sticky and world-writable, like ``/tmp``); every symlink on the way must be owned by this
    user or root (a link another user owns can be pointed elsewhere after it is checked) and
    is followed to a path checked the same way. The result holds no symlink and no directory
    that another user can change, so what it names cannot be swapped."""
    p = Path(root).expanduser()
    if not p.is_absolute():
        p = Path(os.getcwd()) / p
    cur = Path(p.anchor)
    check_path(cur, "directory above the store", gid, ancestor=True)
    todo, links = list(p.parts[1:]), 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            cur = cur.parent
            continue
        nxt = cur / name
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            try:
                os.mkdir(nxt, 0o700)
            except FileExistsError:
                pass  # created meanwhile: examined like any other
            except OSError as exc:
                raise StoreTrustError(f"cannot create the store directory {nxt} ({exc}); set "
                                      f"HWB_CACHE_DIR to a directory you can write") from exc
            todo.insert(0, name)
            continue
        except OSError as exc:
            raise StoreTrustError(f"store path {nxt} cannot be inspected ({exc})") from exc
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise StoreTrustError(f"store path {root} has more than {MAX_LINKS} symlinks "
                                      f"(a loop?); set HWB_CACHE_DIR to its real directory")
            _check_owner(nxt, st, f"symlink on the way to the store {root}:", gid)
            target = Path(os.readlink(nxt))
            if target.is_absolute():
                cur = Path(target.anchor)
                todo = list(target.parts[1:]) + todo
            else:
                todo = list(target.parts) + todo
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise StoreTrustError(f"store path {root}: {nxt} is not a directory; set "
                                  f"HWB_CACHE_DIR to a directory")
        check_path(nxt, "directory above the store", gid, ancestor=True)
        cur = nxt
    check_path(cur, "store directory", gid)
    return cur


def check_root(root: Path, gid: int | None) -> None:
    """A root pinned by :func:`resolve_root`, re-checked: still a real path (no component has
    become a symlink), and it and every directory above it pass :func:`check_path`
    (ancestors may be sticky and world-writable, like ``/tmp``)."""
    real = Path(os.path.realpath(root))
    if real != Path(root):
        raise StoreTrustError(f"store directory {root} now resolves to {real} (a component was "
                              f"replaced by a symlink after it was checked); nothing in it is "
                              f"loaded. Restore the directory or set HWB_CACHE_DIR to {real}")
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
    try:  # O_NONBLOCK: a FIFO planted as the key must not block this process forever
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            if not p.parent.exists():
                private_dir(p.parent, "directory of the store key")
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
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else
                "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file")
        raise StoreTrustError(
            f"store key {p} is {kind}; the key must be a regular file. Remove it (rm -r {p}: "
            f"a new key is created on first use and every artifact is rebuilt once) or set "
            f"HWB_KEY_FILE to a regular file only you can read")
    with os.fdopen(fd, "rb") as f:
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
    """Whether ``record`` carries :func:`sign`'s HMAC (compared in constant time)."""
    got = record.get("hmac")
    return isinstance(got, str) and hmac.compare_digest(got, sign(key, record))


def seal(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its ``hmac`` under this user's key (:func:`load_key`, :func:`sign`):
    for a plugin that keeps its own records under the store's rules (the FPGA bitstream
    store's manifests)."""
    body = {k: v for k, v in record.items() if k != "hmac"}
    return {**body, "hmac": sign(load_key(), body)}


def sealed(record: dict[str, Any]) -> bool:
    """Whether ``record`` carries this user's :func:`seal` and is unchanged since."""
    return verify(load_key(), record)


def check_trusted_dir(path: Path, what: str) -> Path:
    """``path`` resolved once (the caller keeps the result: no later lookup goes through a
    link again), refused unless it and every directory above it pass :func:`check_path`
    (ancestors may be sticky and world-writable, like ``/tmp``): a directory a plugin reads
    from but does not create, such as a checked-in store. :class:`FileNotFoundError` when it
    does not exist."""
    real = Path(os.path.realpath(path))
    st = check_path(real, what, None)
    if not stat.S_ISDIR(st.st_mode):
        raise StoreTrustError(f"{what} {path} is not a directory")
    for parent in real.parents:
        check_path(parent, f"directory above the {what}", None, ancestor=True)
    return real
