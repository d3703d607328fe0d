"""Batch operations: many paths per call, a result per path (one failure fails only its item).

Every rule is the namespace's own: reads resolve each path with ``walk`` and answer what
``stat``/``read`` answer (``_attr``, ``_inline_content``, CRC-checked); writes call
``Namespace.open`` (a put) and ``Namespace.unlink`` item by item.

Transactions. A read batch runs in one read transaction per ``READ_TXN_ITEMS`` paths (a
transaction sees one snapshot; the groups keep one batch from holding the store for long):
the walks first, a repeated directory lookup (files of one directory) answered from memory
(within a snapshot it cannot change), then the inodes in one query. A write batch runs each
item in its own write transaction (an item is exactly the single call), in request order;
when its paths are distinct the items run as concurrent steps, so the store's group commit
covers many of them with one COMMIT (one fsync at ``synchronous=FULL``) instead of one each;
their transactions still run in request order (``_in_order_or_together``).

Puts first look, in one read transaction, at the limit each file would get
(``Layout.inline_max_bytes``: the file's own, or the one ``inline_limit`` gives a new file in
its directory): an item too big for it is left untouched and answered ``FALLBACK`` (the
client writes it in chunks) instead of being opened for writing here. If the limit changed
in between and the open still went to chunks, its write session is closed at once and the
item is a fallback too (the file was created or truncated, empty; the client's write fills it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import os
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar, cast

from loomfs.common.identity import Identity
from loomfs.errors import LoomError, StatusError, status_for_exception
from loomfs.meta import perm
from loomfs.meta.caller import caller
from loomfs.meta.ops.base import DIR, FILE
from loomfs.meta.ops.inline import check_crc
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.ops.walk import searchable, walk
from loomfs.meta.paths import NAME_MAX_BYTES, PATH_MAX_BYTES, split_path
from loomfs.meta.store.base import DentryRow, InlineData, MetaTxn
from loomfs.meta.store.sqlite_inline import inline_files
from loomfs.wire import meta_batch as wb
from loomfs.wire.status import Status
from loomfs.wire.types import Attr

logger = logging.getLogger(__name__)

T = TypeVar("T")

READ_TXN_ITEMS = 512
PUT_FLAGS = os.O_CREAT | os.O_WRONLY | os.O_TRUNC


@dataclasses.dataclass(frozen=True, slots=True)
class Failed:
    """An item's error: a wire status and a short message."""

    status: int
    message: str

    @classmethod
    def of(cls, exc: LoomError) -> Failed:
        return cls(int(status_for_exception(exc)), wb.short_message(exc.strerror or str(exc)))


@dataclasses.dataclass(frozen=True, slots=True)
class Content:
    """A file read: its attributes, and its bytes when it is inline (None: in chunks)."""

    attr: Attr
    data: bytes | None
    crc: int = -1  # the data's CRC32C where known (checked against the stored one), else -1


@dataclasses.dataclass(frozen=True, slots=True)
class Inline:
    """A plain inline file's read without its attributes (``read_many(attrs=False)``, what
    READ_MANY answers for it): its bytes and their CRC32C, checked against the stored one."""

    data: bytes
    crc: int


class _NotRead(enum.Enum):
    NOT_READ = 0  # the inline row was not fetched: ``Namespace._inline_content`` answers it


_NOT_READ = _NotRead.NOT_READ
# names and paths up to these many characters cannot pass ``split_path``'s byte limits (UTF-8:
# at most 4 bytes a character), so the quick path checks them without encoding
_PLAIN_NAME_MAX = NAME_MAX_BYTES // 4
_PLAIN_PATH_MAX = PATH_MAX_BYTES // 4 - 1
_UNSEEN = object()
_Found = tuple[Attr, InlineData | None | _NotRead]


def _content_of(path: str, attr: Attr, inline: InlineData | None, who: Identity) -> Content | Failed:
    """READ's answer for a clean hit whose inline row came with it (``_Found``)."""
    try:
        if attr.type != FILE:
            raise StatusError(Status.EISDIR if attr.type == DIR else Status.ELOOP, path)
        if who.uid != 0:
            perm.need(attr, who, perm.R, path)
        if not attr.inline:
            return Content(attr, None)
        if inline is None:
            raise StatusError(Status.EIO, f"inode {attr.inode} is inline but has no data")
        return Content(attr, check_crc(attr.inode, inline), inline.crc)
    except LoomError as exc:
        return Failed.of(exc)


class Put(enum.Enum):
    DONE = 1  # stored inline
    FALLBACK = 2  # untouched (or created/truncated empty): too big for the file's inline limit


@dataclasses.dataclass(frozen=True, slots=True)
class PutItem:
    path: str
    data: bytes
    crc: int


class _Memo:
    """A read transaction whose repeated lookups come from memory (one snapshot: a lookup
    cannot change within it). Lives for one transaction."""

    __slots__ = ("_txn", "_rows", "_perms")

    def __init__(self, txn: MetaTxn):
        self._txn = txn
        self._rows: dict[tuple[int, str], DentryRow | None] = {}
        # a non-root caller's walks read the permissions of the same directories item after
        # item: each directory is read once per transaction
        self._perms: dict[int, tuple[int, int, int, int] | None] = {}

    async def get_perms(self, inodes: Sequence[int]) -> dict[int, tuple[int, int, int, int]]:
        missing = [i for i in inodes if i not in self._perms]
        if missing:
            got = await self._txn.get_perms(missing)
            for i in missing:
                self._perms[i] = got.get(i)
        return {i: p for i in inodes if (p := self._perms[i]) is not None}

    async def lookup(self, parent: int, name: str) -> DentryRow | None:
        key = (parent, name)
        try:
            return self._rows[key]
        except KeyError:
            row = self._rows[key] = await self._txn.lookup(parent, name)
            return row

    @property
    def txn(self) -> MetaTxn:
        return self._txn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)

    def __repr__(self) -> str:
        return f"_Memo({len(self._rows)} lookups over {self._txn!r})"


async def _in_order_or_together(store: Any, paths: Sequence[str], steps: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run the items' ``steps``: together when every path is distinct and the store runs
    write transactions one after another in the order they start (``serial_writes``:
    SQLite's one write connection; their transactions then share group COMMITs: one COMMIT,
    and one fsync at ``synchronous=FULL``, for many items instead of one each), else one
    after another (PostgreSQL could commit concurrent ones in another order). Together,
    they start in order and a step runs until its transaction waits for its COMMIT, so the
    transactions still run in request order. A step's unexpected error is raised once all
    are done."""
    if not getattr(store, "serial_writes", False) or len(set(paths)) != len(paths):
        return [await step for step in steps]
    results = await asyncio.gather(*steps, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return cast(list[T], results)


class BatchOps:
    """Batches over one ``Namespace``; results are per item, in request order."""

    def __init__(self, ns: Namespace):
        self.ns = ns

    async def stat_many(
        self, paths: Sequence[str], *, follow_symlinks: bool = True, body_bytes_max: int = wb.REPLY_BODY_BYTES_MAX
    ) -> list[Attr | Failed]:
        """What STAT answers, for a prefix of ``paths`` (at least one) whose reply fits
        ``body_bytes_max``."""
        out: list[Attr | Failed] = []
        used = 0
        for start in range(0, len(paths), READ_TXN_ITEMS):
            if start:
                await asyncio.sleep(0)  # let other calls at the store between groups
            async with self.ns.store.read() as txn:
                group = paths[start : start + READ_TXN_ITEMS]
                for found in await self._attrs(txn, group, follow_symlinks, False):
                    assert not isinstance(found, Inline)  # only light lookups give them
                    item = found if isinstance(found, Failed) else found[0]
                    cost = wb.ITEM_ERROR_BYTES_MAX if isinstance(item, Failed) else wb.attr_bytes_max(item)
                    if out and used + cost > body_bytes_max:
                        return out
                    used += cost
                    out.append(item)
        return out

    async def read_many(
        self, paths: Sequence[str], *, follow_symlinks: bool = True, body_bytes_max: int = wb.REPLY_BODY_BYTES_MAX,
        data_bytes_max: int = wb.READ_MANY_DATA_BYTES_MAX, attrs: bool = True,
    ) -> list[Content | Inline | Failed]:
        """What READ answers, for a prefix of ``paths`` (at least one) whose reply fits the
        bounds; a directory is EISDIR, a symlink not followed ELOOP. ``attrs=False``: a plain
        inline file is an ``Inline`` (its bytes, no attributes: READ_MANY's reply carries none
        for it), found by the engine's light lookup where it has one (``sqlite_inline``: no
        attribute objects built; ~half of a KV-cache index batch's CPU in meta)."""
        out: list[Content | Inline | Failed] = []
        used = data = 0
        who = caller()
        for start in range(0, len(paths), READ_TXN_ITEMS):
            if start:
                await asyncio.sleep(0)
            async with self.ns.store.read() as txn:
                group = paths[start : start + READ_TXN_ITEMS]
                resolved = await self._attrs(txn, group, follow_symlinks, True, light=not attrs)
                for path, found in zip(group, resolved, strict=True):
                    if isinstance(found, Failed | Inline):
                        item: Content | Inline | Failed = found
                    elif found[1] is _NOT_READ:
                        item = await self._content(txn, path, found[0])
                    else:
                        item = _content_of(path, found[0], found[1], who)
                    cost = 2 * wb.INDEX_BYTES_MAX  # its length and CRC
                    size = 0
                    if isinstance(item, Failed):
                        cost += wb.ITEM_ERROR_BYTES_MAX
                    elif item.data is None:
                        assert isinstance(item, Content)
                        cost += wb.INDEXED_ATTR_OVERHEAD_BYTES + wb.attr_bytes_max(item.attr)
                    else:
                        size = len(item.data)
                    if out and (used + cost > body_bytes_max or data + size > data_bytes_max):
                        return out
                    used += cost
                    data += size
                    out.append(item)
        return out

    async def _content(self, txn: MetaTxn, path: str, attr: Attr) -> Content | Failed:
        try:
            if attr.type != FILE:
                raise StatusError(Status.EISDIR if attr.type == DIR else Status.ELOOP, path)
            who = caller()
            if who.uid != 0:
                perm.need(attr, who, perm.R, path)
            return Content(attr, await self.ns._inline_content(txn, attr))
        except LoomError as exc:
            return Failed.of(exc)

    async def _attrs(self, txn: MetaTxn, paths: Sequence[str], follow_symlinks: bool,
                     with_inline: bool, *, light: bool = False) -> list[_Found | Inline | Failed]:
        """What each path resolves to, in one transaction: (attributes, inline row or
        ``_NOT_READ``). Clean hits come from the engine's batch lookup (``entries_in``:
        the names of one directory in one statement, once the directory is resolved); the
        rest walk one by one, then their inodes come in one query. ``light``: plain inline
        files the caller may read are ``Inline`` (``sqlite_inline.inline_files``)."""
        memo = _Memo(txn)
        out: list[_Found | Inline | Failed | None] = [None] * len(paths)
        entries_in = getattr(self.ns.store, "entries_in", None)
        if entries_in is not None:
            await self._quick(memo, entries_in, paths, with_inline, out, light)
        found: list[tuple[int, int | Failed]] = []
        for k, path in enumerate(paths):
            if out[k] is not None:
                continue
            try:
                r = await walk(cast(MetaTxn, memo), split_path(path), follow_last=follow_symlinks)
                if r.inode is None:
                    raise StatusError(Status.ENOENT, path)
                found.append((k, r.inode))
            except LoomError as exc:
                found.append((k, Failed.of(exc)))
        if not found:
            return cast(list[_Found | Inline | Failed], out)
        attrs = await txn.get_inodes([f for _, f in found if not isinstance(f, Failed)])
        for k, f in found:
            if isinstance(f, Failed):
                out[k] = f
                continue
            attr = attrs.get(f)
            if attr is None:
                try:
                    attr = await self.ns._attr(txn, f)  # the namespace's answer to a dangling entry
                except LoomError as exc:
                    out[k] = Failed.of(exc)
                    continue
            out[k] = (attr, _NOT_READ)
        return cast(list[_Found | Inline | Failed], out)

    async def _quick(self, memo: _Memo, entries_in: Any, paths: Sequence[str], with_inline: bool,
                     out: list[_Found | Inline | Failed | None], light: bool = False) -> None:
        """Fill ``out`` with the clean hits: each path's directory resolved once (a walk, as
        the path's own walk would go), then each directory's names in one ``entries_in``.
        Anything else (an error on the way, a symlink last, a missing entry) stays None: the
        item's own walk answers it. The last component is never followed here: a symlink is
        not a clean hit."""
        dirs: dict[str, int | None] = {}
        by_dir: dict[int, list[tuple[int, str]]] = {}
        for k, path in enumerate(paths):
            # ``split_path``'s checks, the parent's once per batch: a name or path long enough
            # for its byte-length checks to matter, or anything odd, walks on its own
            cut = path.rfind("/")
            name = path[cut + 1 :]
            if (cut < 0 or len(path) > _PLAIN_PATH_MAX or not name or len(name) > _PLAIN_NAME_MAX
                    or name == "." or name == ".." or "\x00" in name):
                continue
            parent = path[:cut]  # "" for the root's entries
            d = dirs.get(parent, _UNSEEN)
            if d is _UNSEEN:
                d = dirs[parent] = await self._parent_dir(memo, parent)
            if d is not None:
                by_dir.setdefault(cast(int, d), []).append((k, name))
        who = caller()
        for d, items in by_dir.items():
            if light:
                plain = inline_files(memo.txn, d, [name for _, name in items], who)
                if plain:
                    rest: list[tuple[int, str]] = []
                    for k, name in items:
                        got = plain.get(name)
                        if got is None:
                            rest.append((k, name))
                        else:
                            out[k] = Inline(got[0], got[1])
                    if not rest:
                        continue
                    items = rest
            hits = entries_in(memo.txn, d, [name for _, name in items], with_inline=with_inline)
            if hits is None:
                return  # not this engine's transaction
            for k, name in items:
                hit = hits.get(name)
                if hit is not None:
                    out[k] = hit

    async def _parent_dir(self, memo: _Memo, parent: str) -> int | None:
        """``_dir_of`` the text before a path's last slash ("" for the root's entries; "/"
        itself is a path that began "//": not normalised)."""
        if parent == "":
            return await self._dir_of(memo, [])
        if parent == "/":
            return None
        try:
            parts = split_path(parent)
        except LoomError:
            return None
        return await self._dir_of(memo, parts)

    async def _dir_of(self, memo: _Memo, parts: list[str]) -> int | None:
        """The directory ``parts`` leads to, if the caller may search it; None for anything
        else (the items under it walk on their own and meet the error themselves)."""
        try:
            r = await walk(cast(MetaTxn, memo), parts, follow_last=True)
            if r.inode is None or r.type != DIR:
                return None
            who = caller()
            if who.uid != 0:
                await searchable(cast(MetaTxn, memo), [r.inode], who)
        except LoomError:
            return None
        return r.inode

    async def put_many(
        self, items: Sequence[PutItem], *, mode: int = 0o644, uid: int = 0, gid: int = 0, client_id: int = 0,
    ) -> list[Put | Failed]:
        """Store each item as the whole content of its file, in order (see the module
        docstring for fallbacks and for items that run together)."""
        plan = await self._put_plan(items)

        async def one(item: PutItem, planned: Put | Failed | None) -> Put | Failed:
            if planned is not None:
                return planned
            try:
                o = await self.ns.open(item.path, PUT_FLAGS, mode=mode, uid=uid, gid=gid, client_id=client_id,
                                       data=item.data, data_crc=item.crc)
            except LoomError as exc:
                return Failed.of(exc)
            if o.session_id:  # the limit changed since the look: a write open in chunks
                try:
                    await self.ns.report(o.attr.inode, o.session_id, -1, end=True)
                except LoomError as exc:  # the session expires by itself
                    logger.warning("meta: put_many of %s: closing its write session failed: %s", item.path, exc)
            return Put.FALLBACK if o.session_id else Put.DONE

        return await _in_order_or_together(self.ns.store, [item.path for item in items],
                                           [one(item, planned) for item, planned in zip(items, plan, strict=True)])

    async def _put_plan(self, items: Sequence[PutItem]) -> list[Put | Failed | None]:
        """Per item: FALLBACK (too big to be inline), the error its path's walk gives, or
        None (put it)."""
        plan: list[Put | Failed | None] = []
        for start in range(0, len(items), READ_TXN_ITEMS):
            if start:
                await asyncio.sleep(0)
            async with self.ns.store.read() as txn:
                memo = cast(MetaTxn, _Memo(txn))
                for item in items[start : start + READ_TXN_ITEMS]:
                    try:
                        limit = await self._put_limit(memo, item.path)
                    except LoomError as exc:
                        plan.append(Failed.of(exc))
                        continue
                    too_big = limit is not None and (limit <= 0 or len(item.data) > limit)
                    plan.append(Put.FALLBACK if too_big else None)
        return plan

    async def _put_limit(self, txn: MetaTxn, path: str) -> int | None:
        """The inline limit a put of ``path`` meets (None: let the open answer, an error)."""
        r = await walk(txn, split_path(path), follow_last=True)  # O_CREAT without O_EXCL follows
        if r.inode is not None:
            attr = await self.ns._attr(txn, r.inode)
            if attr.type != FILE:
                return None
            return attr.layout.inline_max_bytes if attr.layout is not None else 0
        if r.parent is None or r.name is None or r.must_be_dir:
            return None
        return self.ns.inline_limit(await self.ns._attr(txn, r.parent))

    async def unlink_many(self, paths: Sequence[str]) -> list[tuple[int, bool] | Failed]:
        """``Namespace.unlink`` of each path, in order: (inode, its data went to GC) or the error."""
        async def one(path: str) -> tuple[int, bool] | Failed:
            try:
                return cast(tuple[int, bool], await self.ns.unlink(path))
            except LoomError as exc:
                return Failed.of(exc)

        return await _in_order_or_together(self.ns.store, paths, [one(p) for p in paths])

    def __repr__(self) -> str:
        return f"BatchOps({self.ns!r})"
