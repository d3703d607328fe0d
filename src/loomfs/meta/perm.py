"""POSIX permission rules over ``Attr`` + ``Identity`` (no I/O; issue 13 item 2).

Every function is pure: it looks at attributes the operation already loaded and at the
caller, and answers a bool or raises ``StatusError`` with the errno Linux gives (EACCES for a
missing permission bit, EPERM where only the owner or root may act). uid 0 is root: it passes
every check except executing a file with no x bit (Linux's CAP_DAC_OVERRIDE/CAP_FOWNER/
CAP_CHOWN). ``effective`` turns a token's uid 0 into ``nobody`` under root squash.

The namespace calls these through ``loomfs.meta.caller`` (the caller of the running call).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from typing import Protocol

from loomfs.common.identity import Identity, Right
from loomfs.errors import StatusError
from loomfs.wire.status import Status
from loomfs.wire.types import Attr, FileType

R = 4  # read
W = 2  # write
X = 1  # execute / search
NOBODY = 65534  # uid and gid a squashed root becomes

_DIR = int(FileType.DIRECTORY)
_FILE = int(FileType.FILE)
_S_ISUID = stat.S_ISUID
_S_ISGID = stat.S_ISGID
_S_ISVTX = stat.S_ISVTX
_S_IXGRP = stat.S_IXGRP


class Owned(Protocol):
    """What the rules read of an inode (``Attr`` fits)."""

    @property
    def type(self) -> int: ...

    @property
    def mode(self) -> int: ...

    @property
    def uid(self) -> int: ...

    @property
    def gid(self) -> int: ...


def effective(who: Identity, *, root_squash: bool) -> Identity:
    """The identity permission checks use: with ``root_squash``, uid 0 from a credential
    without ADMIN (or SERVICE) rights acts as ``nobody``."""
    if root_squash and who.uid == 0 and not who.rights & (Right.ADMIN | Right.SERVICE):
        return dataclasses.replace(who, uid=NOBODY, gid=NOBODY, groups=())
    return who


def allowed(attr: Owned, who: Identity, want: int) -> bool:
    """Whether ``who`` has every bit of ``want`` (R|W|X) on ``attr`` (the owner's bits for the
    owner, the group's for a member of the file's group, the others' otherwise)."""
    uid = who.uid
    mode = attr.mode
    if uid == 0:
        # root reads and writes anything, searches any directory, executes a file only if
        # some x bit is set
        return not (want & X and attr.type != _DIR and not mode & 0o111)
    if uid == attr.uid:
        bits = mode >> 6
    elif attr.gid == who.gid or attr.gid in who.groups:
        bits = mode >> 3
    else:
        bits = mode
    return bits & want == want


def need(attr: Owned, who: Identity, want: int, what: str) -> None:
    """``allowed`` or EACCES."""
    if not allowed(attr, who, want):
        raise StatusError(Status.EACCES, f"{what}: permission denied")


def search(dirs: list[Owned], who: Identity, what: str) -> None:
    """Search (x) permission on every directory a walk looked a name up in, in walk order."""
    if who.uid == 0:
        return
    for d in dirs:
        if not allowed(d, who, X):
            raise StatusError(Status.EACCES, f"{what}: search permission denied")


def search_rows(rows: list[tuple[int, int, int, int]], who: Identity, what: str) -> None:
    """``search`` over (type, mode, uid, gid) rows (the store's light read; all directories)."""
    uid = who.uid
    if uid == 0:
        return
    gid, groups = who.gid, who.groups
    for _type, mode, o_uid, o_gid in rows:
        bits = mode >> 6 if uid == o_uid else mode >> 3 if (o_gid == gid or o_gid in groups) else mode
        if not bits & X:
            raise StatusError(Status.EACCES, f"{what}: search permission denied")


def open_bits(flags: int) -> int:
    """The permission bits an ``open`` with ``os.O_*`` ``flags`` needs on an existing file
    (O_TRUNC needs write even with O_RDONLY, as on Linux)."""
    acc = flags & os.O_ACCMODE
    want = R if acc == os.O_RDONLY else W if acc == os.O_WRONLY else R | W
    if flags & os.O_TRUNC:
        want |= W
    return want


def may_create(parent: Attr, who: Identity, what: str) -> None:
    """A new name in ``parent``: write and search permission on it."""
    need(parent, who, W | X, what)


def is_owner(attr: Attr, who: Identity) -> bool:
    return who.uid == 0 or who.uid == attr.uid


def may_delete(parent: Attr, victim: Attr, who: Identity, what: str) -> None:
    """A name of ``victim`` leaves ``parent`` (unlink, rmdir, the source and a replaced target of
    rename): write and search on ``parent``; in a sticky directory only the owner of the
    directory or of the victim (or root) may (EPERM)."""
    need(parent, who, W | X, what)
    if parent.mode & _S_ISVTX and who.uid not in (0, parent.uid, victim.uid):
        raise StatusError(Status.EPERM, f"{what}: sticky directory, not the owner")


def may_move_dir(moved: Attr, who: Identity, what: str) -> None:
    """A directory moved to another parent: its '..' changes, which needs write on it."""
    need(moved, who, W, what)


def may_link(source: Attr, who: Identity, what: str) -> None:
    """A hard link to ``source`` (Linux's fs.protected_hardlinks=1): the owner or root, or a
    caller who may read and write a regular file that is neither setuid nor setgid-executable."""
    if is_owner(source, who):
        return
    safe = (source.type == _FILE and not source.mode & _S_ISUID
            and (source.mode & (_S_ISGID | _S_IXGRP)) != (_S_ISGID | _S_IXGRP))
    if not (safe and allowed(source, who, R | W)):
        raise StatusError(Status.EPERM, f"{what}: hard link to a file the caller may not write")


def new_owner(parent: Attr, who: Identity, type: int, mode: int) -> tuple[int, int, int]:
    """(uid, gid, mode) of an object ``who`` creates in ``parent``: the caller's uid; the
    directory's gid when it is set-group-ID (and a new subdirectory is set-group-ID too),
    the caller's gid otherwise; a file's setgid bit dropped when the caller is not in its
    group (Linux's inode_init_owner)."""
    mode &= 0o7777
    if parent.mode & _S_ISGID:
        gid = parent.gid
        if type == _DIR:
            mode |= _S_ISGID
    else:
        gid = who.gid
    if (type != _DIR and (mode & (_S_ISGID | _S_IXGRP)) == (_S_ISGID | _S_IXGRP)
            and who.uid != 0 and not who.in_group(gid)):
        mode &= ~_S_ISGID
    return who.uid, gid, mode


def chmod_mode(attr: Attr, who: Identity, mode: int, what: str) -> int:
    """The mode a chmod by ``who`` sets: only the owner or root (EPERM); setgid cleared when a
    non-root caller is not in the file's group."""
    if not is_owner(attr, who):
        raise StatusError(Status.EPERM, f"{what}: chmod by a non-owner")
    mode &= 0o7777
    if who.uid != 0 and not who.in_group(attr.gid):
        mode &= ~_S_ISGID
    return mode


def chown_attrs(attr: Attr, who: Identity, uid: int, gid: int, what: str) -> tuple[int, int, int]:
    """(uid, gid, mode) after a chown(uid, gid) by ``who`` (-1: unchanged). A new owner only
    by root; a new group by root, or by the owner to a group they are in (EPERM). A
    non-directory loses setuid, and setgid when group-executable (Linux's notify_change)."""
    if uid < 0 and gid < 0:
        return attr.uid, attr.gid, attr.mode
    owner = who.uid == attr.uid
    if who.uid != 0:
        if uid >= 0 and not (owner and uid == attr.uid):
            raise StatusError(Status.EPERM, f"{what}: only root changes a file's owner")
        if gid >= 0 and not (owner and (gid == attr.gid or who.in_group(gid))):
            raise StatusError(Status.EPERM, f"{what}: chgrp by a non-owner or to a group the caller is not in")
    new_uid = attr.uid if uid < 0 else uid
    new_gid = attr.gid if gid < 0 else gid
    mode = attr.mode
    if attr.type != _DIR:
        mode &= ~_S_ISUID
        if mode & (_S_ISGID | _S_IXGRP) == (_S_ISGID | _S_IXGRP):
            mode &= ~_S_ISGID
    return new_uid, new_gid, mode


def may_set_times(attr: Attr, who: Identity, *, now: bool, what: str) -> None:
    """utimes: explicit times only by the owner or root (EPERM); "now" also by a caller with
    write permission (EACCES)."""
    if is_owner(attr, who):
        return
    if not now:
        raise StatusError(Status.EPERM, f"{what}: setting explicit times by a non-owner")
    need(attr, who, W, what)


def may_list(d: Attr, who: Identity, what: str) -> None:
    """readdir: read permission on the directory."""
    need(d, who, R, what)
