"""Path resolution over a transaction: components, symlinks (<= 40 hops), ENOENT/ENOTDIR/ELOOP.

The walk keeps the physical chain of directories it went through (``stack``), so a ``..`` in
a symlink target goes to the real parent, and rename can tell whether one path lies inside
another.

Search permission: for a caller other than root (``loomfs.meta.caller``), the walk notes
every directory it looks a name up in and, at its end (or before it reports an error),
reads their permission bits in one ``MetaTxn.get_perms`` and checks the x bit on each, in
walk order (EACCES).
Root walks as before: no extra work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from loomfs.common.identity import Identity
from loomfs.errors import StatusError
from loomfs.meta import perm, tenancy
from loomfs.meta.caller import CALLER
from loomfs.meta.paths import NAME_MAX_BYTES, split_target
from loomfs.meta.store.base import DentryRow, MetaTxn
from loomfs.wire.status import Status
from loomfs.wire.types import ROOT_INODE, FileType

SYMLINK_HOPS_MAX = 40

_DIR = int(FileType.DIRECTORY)
_LINK = int(FileType.SYMLINK)


@dataclass(slots=True)
class Resolved:
    """Where a path ends.

    ``parent``/``name`` are the directory and entry name of the last component (None when the
    path ends at the root or at a ``.``/``..`` of a symlink target); ``inode`` is None when
    the entry does not exist (the parent does). ``stack`` holds the directories walked
    through, root first, ending with ``parent``.
    """

    parent: int | None
    name: str | None
    inode: int | None
    type: int
    stack: list[int]
    must_be_dir: bool = False

    @property
    def exists(self) -> bool:
        return self.inode is not None

    @property
    def is_dir(self) -> bool:
        return self.inode is not None and self.type == _DIR


def _plain(parts: list[str], rows: list[DentryRow], follow_last: bool, searched: list[int] | None,
           root: int) -> Resolved | None:
    """Where a path of plain names (no ``.``/``..``) ends, from its ``lookup_path`` rows alone,
    when that is all there is to it: every directory found and the last name missing, a
    file, a directory, or a symlink not followed. None otherwise (a directory component
    missing or not a directory, a symlink to follow): the component loop answers those."""
    n = len(parts)
    m = len(rows)
    if m == n:
        last = rows[-1]
        if last.type == _LINK and follow_last:
            return None
        stack = [root]
        for k in range(m - 1):  # directories all (``lookup_path`` stops after the first that is not)
            stack.append(rows[k].inode)
        if searched is not None:
            searched.extend(stack)
        return Resolved(stack[-1], parts[-1], last.inode, last.type, stack)
    if m != n - 1 or (m and rows[-1].type != _DIR):
        return None
    stack = [root]
    for row in rows:
        stack.append(row.inode)
    if searched is not None:
        searched.extend(stack)
    return Resolved(stack[-1], parts[-1], None, 0, stack)


async def _prefetched(txn: MetaTxn, parts: list[str], root: int,
                      rows: list[DentryRow] | None = None) -> Callable[[int, str], Awaitable[DentryRow | None]]:
    """``txn.lookup``, with the path's plain components (up to a ``.``/``..``) fetched in one
    ``lookup_path`` first (one round trip on PostgreSQL); a name found missing is known too.
    ``rows``: that ``lookup_path``'s answer for the whole path, already read."""
    names: list[str] = []
    for comp in parts:
        if comp in (".", ".."):
            break
        names.append(comp)
    if len(names) < 2:
        return txn.lookup
    if rows is None:
        rows = await txn.lookup_path(root, names)
    known: dict[tuple[int, str], DentryRow | None] = {}
    parent = root
    for name, row in zip(names, rows, strict=False):
        known[(parent, name)] = row
        parent = row.inode
    if len(rows) < len(names) and (not rows or rows[-1].type == _DIR):
        known[(parent, names[len(rows)])] = None  # missing in a directory the path reached

    async def lookup(parent: int, name: str) -> DentryRow | None:
        key = (parent, name)
        if key in known:
            return known[key]
        return await txn.lookup(parent, name)

    return lookup


async def walk(txn: MetaTxn, parts: list[str], *, follow_last: bool) -> Resolved:
    """Resolve ``parts`` from the root (the caller's tenant's root, ``loomfs.meta.tenancy``).
    Intermediate symlinks are always followed. A caller without search permission on a
    directory the path crosses gets EACCES."""
    who = CALLER.get()
    root = tenancy.root_of(await tenancy.tenant_number(txn, who.tenant)) if who.tenant else ROOT_INODE
    if who.uid == 0:
        return await _walk(txn, parts, follow_last, None, root)
    searched: list[int] = []
    try:
        r = await _walk(txn, parts, follow_last, searched, root)
    except StatusError:
        await searchable(txn, searched, who)  # EACCES before what lies behind the directory
        raise
    await searchable(txn, searched, who)
    return r


async def searchable(txn: MetaTxn, searched: list[int], who: Identity) -> None:
    """EACCES unless ``who`` may search every directory in ``searched`` (one ``get_perms``:
    (type, mode, uid, gid) rows, no ``Attr`` objects)."""
    if not searched:
        return
    rows = await txn.get_perms(list(dict.fromkeys(searched)))
    try:
        ordered = [rows[ino] for ino in searched]
    except KeyError as exc:
        raise StatusError(Status.EIO, f"walk went through missing directory inode {exc}") from None
    perm.search_rows(ordered, who, "path lookup")


async def _walk(txn: MetaTxn, parts: list[str], follow_last: bool, searched: list[int] | None,
                root: int = ROOT_INODE) -> Resolved:
    stack = [root]
    if not parts:
        return Resolved(None, None, root, _DIR, stack)
    rows: list[DentryRow] | None = None
    if len(parts) > 1 and "." not in parts and ".." not in parts and isinstance(txn, MetaTxn):
        # the usual path: its entries in one ``lookup_path``, and nothing more to do
        rows = await txn.lookup_path(root, parts)
        r = _plain(parts, rows, follow_last, searched, root)
        if r is not None:
            return r
    pending: deque[str] = deque(parts)
    hops = 0
    must_be_dir = False
    lookup = await _prefetched(txn, parts, root, rows) if isinstance(txn, MetaTxn) else txn.lookup
    while pending:
        comp = pending.popleft()
        last = not pending
        if comp == ".":
            if last:
                return Resolved(None, None, stack[-1], _DIR, stack)
            continue
        if comp == "..":
            if len(stack) > 1:
                stack.pop()
            if last:
                return Resolved(None, None, stack[-1], _DIR, stack)
            continue
        cur = stack[-1]
        if searched is not None:
            searched.append(cur)
        row = await lookup(cur, comp)
        if row is None:
            if last:
                return Resolved(cur, comp, None, 0, stack, must_be_dir)
            raise StatusError(Status.ENOENT, f"no such directory component {comp!r}")
        t = row.type
        if t == _DIR:
            if last:
                return Resolved(cur, comp, row.inode, t, stack)
            stack.append(row.inode)
            continue
        if t == _LINK and (follow_last or not last):
            hops += 1
            if hops > SYMLINK_HOPS_MAX:
                raise StatusError(Status.ELOOP, "too many levels of symbolic links")
            link = await txn.get_inode(row.inode)
            if link is None:
                raise StatusError(Status.EIO, f"dangling dentry {comp!r} -> inode {row.inode}")
            absolute, tparts, trailing = split_target(link.symlink_target)
            for name in tparts:  # a request's own names were checked (``split_path``); a target's were not
                if len(name) > NAME_MAX_BYTES // 4 and len(name.encode("utf-8", "surrogatepass")) > NAME_MAX_BYTES:
                    raise StatusError(Status.ENAMETOOLONG, f"name too long in the target of {comp!r}")
            if absolute:
                del stack[1:]
            if last:  # a slash at the end of any link of the last name's chain asks for a directory
                must_be_dir = must_be_dir or trailing
            if not tparts:
                # target "/" (or only slashes)
                if last:
                    return Resolved(None, None, stack[-1], _DIR, stack)
                continue
            pending.extendleft(reversed(tparts))
            continue
        # a file, or a symlink we do not follow
        if last:
            if must_be_dir:
                raise StatusError(Status.ENOTDIR, f"{comp!r} is not a directory")
            return Resolved(cur, comp, row.inode, t, stack)
        raise StatusError(Status.ENOTDIR, f"{comp!r} is not a directory")
    raise AssertionError("unreachable")  # pragma: no cover
