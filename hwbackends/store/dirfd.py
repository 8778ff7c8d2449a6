"""Reading, sizing and removing a directory tree through directory file descriptors, never
following a symlink: what the artifact store uses to list, prune and evict.

A path such as ``root/objects/ab/abcd…`` is opened one component at a time, each with
``O_NOFOLLOW | O_DIRECTORY`` relative to the one before (:func:`open_under`), so a component
replaced by a link (``objects/ab -> /elsewhere``) is found as a link (:class:`NotFollowed`)
instead of being walked into; listing uses ``os.scandir`` on those fds (``follow_symlinks=False``
everywhere), and removal renames and ``shutil.rmtree``\\ s relative to a directory fd. Nothing
outside the tree that was opened is ever read, changed or removed.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotFollowed(OSError):
    """A path component is a symlink (``is_link``) or not a directory: not followed."""

    def __init__(self, name: str, is_link: bool):
        super().__init__(errno.ELOOP if is_link else errno.ENOTDIR,
                         "a symlink, not followed" if is_link else "not a directory", name)
        self.is_link = is_link


@dataclass(frozen=True)
class Link:
    """A symlink found in a tree: where (relative to the tree's root) and what it names (read
    with ``readlink``, never followed)."""

    path: str
    target: str


def open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    """A directory fd of ``name`` (relative to ``dir_fd``), not following a final symlink.
    :class:`FileNotFoundError` when absent; :class:`NotFollowed` for a link or a non-directory."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                is_link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                is_link = exc.errno == errno.ELOOP
            raise NotFollowed(str(name), is_link) from None
        raise


def open_under(root: Path, parts: Sequence[str]) -> int:
    """The fd of ``root/parts[0]/parts[1]/…``, each component opened relative to the one
    before (:func:`open_dir`): no component is followed if it is a link. ``root`` itself is
    the caller's pinned real directory."""
    fd = open_dir(root)
    try:
        for part in parts:
            nxt = open_dir(part, fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def opened(root: Path, parts: Sequence[str] = ()) -> Iterator[int]:
    """:func:`open_under` as a context manager (the fd is closed on exit)."""
    fd = open_under(root, parts)
    try:
        yield fd
    finally:
        os.close(fd)


def entries(fd: int) -> list[os.DirEntry]:
    """What the directory ``fd`` holds, sorted by name (its ``DirEntry``\\ s answer
    ``is_dir``/``stat`` without following links when asked with ``follow_symlinks=False``)."""
    with os.scandir(fd) as it:
        return sorted(it, key=lambda e: e.name)


def link_at(fd: int, name: str, rel: str) -> Link:
    try:
        return Link(rel, os.readlink(name, dir_fd=fd))
    except OSError:
        return Link(rel, "?")


def tree_bytes(fd: int, rel: str, links: list[Link]) -> int:
    """Bytes allocated under the directory ``fd`` (``rel``: its path for reports); symlinks
    are counted at their own size, appended to ``links`` and never followed."""
    total = 0
    for e in entries(fd):
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:  # removed meanwhile
            continue
        total += st.st_blocks * 512
        if stat.S_ISLNK(st.st_mode):
            links.append(link_at(fd, e.name, f"{rel}/{e.name}"))
        elif stat.S_ISDIR(st.st_mode):
            try:
                sub = open_dir(e.name, fd)
            except OSError:  # removed, or swapped for a link meanwhile: not followed
                continue
            try:
                total += tree_bytes(sub, f"{rel}/{e.name}", links)
            finally:
                os.close(sub)
    return total


def read_small(fd: int, name: str, limit: int = 16 << 20) -> bytes | None:
    """The bytes of the regular file ``name`` in the directory ``fd`` (not a link, not a FIFO,
    at most ``limit`` bytes), else ``None``."""
    try:
        f = os.open(name, FILE_FLAGS, dir_fd=fd)
    except OSError:
        return None
    with os.fdopen(f, "rb") as fh:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        return fh.read(limit + 1)[:limit]


def remove_at(fd: int, name: str) -> None:
    """Remove ``name`` from the directory ``fd``: a directory with everything under it
    (``shutil.rmtree`` relative to the fd: links inside are unlinked, never followed), any
    other thing (a file, a symlink) unlinked. Gone already is fine."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=fd, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)


def evict(parent_fd: int, name: str, trash_fd: int, trash_name: str,
          keep: Callable[[os.stat_result], bool] | None = None) -> bool:
    """Rename ``name`` (in ``parent_fd``) to ``trash_name`` (in ``trash_fd``) so no reader sees
    half of it, then ask ``keep`` about what was moved (its ``lstat``, taken after the rename:
    a use recorded up to that moment shows): put it back if ``keep`` says so, else remove it.
    Returns whether it was removed (``False``: absent, or kept)."""
    try:
        os.rename(name, trash_name, src_dir_fd=parent_fd, dst_dir_fd=trash_fd)
    except FileNotFoundError:
        return False
    if keep is not None:
        try:
            st = os.stat(trash_name, dir_fd=trash_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if keep(st):
            try:
                os.rename(trash_name, name, src_dir_fd=trash_fd, dst_dir_fd=parent_fd)
                return False
            except OSError:  # a new commit took its place meanwhile: that one stays
                pass
    remove_at(trash_fd, trash_name)
    return True
