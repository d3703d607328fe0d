"""The MetaStore seam: a narrow transactional engine under the namespace.

An engine stores inodes, their extended attributes, directory entries, write sessions, read holds,
orphans, the GC queue, the trim queue,
truncate epochs, counters and workers' state, and runs reads and writes inside transactions.
It knows nothing about POSIX: every namespace
rule (errno choice, nlink accounting, layouts, symlinks) lives once in ``loomfs.meta.ops``.

Engines are chosen by URL and registered by scheme::

    store = MetaStore.open("sqlite:////abs/path/meta.db", synchronous="NORMAL")
    async with store.write() as txn:
        await txn.put_inode(attr)

Rule for callers: inside a transaction await only the transaction's own methods (never the
network), so a transaction is short and an embedded engine can run it inline.

What callers may rely on (``tests/conformance/test_metastore.py`` checks it per engine):

* ``write()`` returns only once its transaction is committed (durable as far as the engine's
  sync setting goes); after that every later ``read()`` sees it. An engine may commit several
  concurrent writes together (group commit): then a write's body may see the work of earlier
  writes of its group, and if the group's commit fails every write in it raises
  ``CommitFailed`` (EIO). A body that raises undoes only its own work; its error is raised
  once the work it may have read is committed (``CommitFailed`` instead if that failed).
* A write may raise ``TxnConflict`` (engines with optimistic concurrency across processes:
  PostgreSQL) before or at commit; none of its work is then stored, and the operation is
  re-run from its start (never only the transaction: its reads may be stale).
* ``read()`` sees committed data only: never a write that could still fail, never one that a
  failed commit rolled back. An engine may answer reads beside writes that are open or
  committing (SQLite: a read-only connection), so a read need not wait for them.
"""

from __future__ import annotations

import errno
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import msgpack

from loomfs.errors import LoomError
from loomfs.wire.frame import pack
from loomfs.wire.types import Attr, FileType, Layout

S = TypeVar("S", bound="type[MetaStore]")
_DIRECTORY = int(FileType.DIRECTORY)


class CommitFailed(LoomError):
    """The commit covering a write transaction failed: none of its work is stored (EIO)."""


class StoreUnavailable(LoomError):
    """The engine cannot reach its database (a server down or restarting): EIO. Nothing of
    the transaction is stored, unless the loss came during COMMIT (then: unknown)."""


# Set by the caller that re-runs an operation after conflicts (``loomfs.meta.service``): this
# task's write transactions should run alone, so that they cannot lose again. An engine with
# optimistic concurrency honours it (PostgreSQL: an exclusive gate every writer passes
# shared); the others ignore it.
WRITE_ALONE: ContextVar[bool] = ContextVar("loomfs_meta_write_alone", default=False)


# Set per run by the caller that re-runs operations (``loomfs.meta.service``): engines count
# here the write transactions they commit in this task (``note_commit``), so that a run that
# already stored something is not re-run from its start.
OP_COMMITS: ContextVar[list[int] | None] = ContextVar("loomfs_meta_op_commits", default=None)


def note_commit() -> None:
    """A write transaction of the current task committed (engines call this)."""
    holder = OP_COMMITS.get()
    if holder is not None:
        holder[0] += 1


class TxnConflict(LoomError):
    """A write transaction lost a conflict with a concurrent one (another meta server on the
    same database) and was rolled back: nothing of it is stored. The caller re-runs the
    whole operation (``loomfs.meta.service.retry_conflicts``); EAGAIN if it still loses."""

    default_errno = errno.EAGAIN


@dataclass(frozen=True, slots=True)
class DentryRow:
    name: str
    inode: int
    type: int


@dataclass(frozen=True, slots=True)
class GcEntry:
    """An unlinked file whose chunks still have to be removed."""

    inode: int
    layout: Layout
    length: int
    enqueued_ns: int


@dataclass(frozen=True, slots=True)
class TrimEntry:
    """A file whose chunks past ``length`` still have to be cut (see ``loomfs.meta.trim``).

    ``idle``: a stale writer's tail, cut at the file's length once no write session is open;
    otherwise a truncate's trim, cut at ``length`` before any later write may land.
    ``generation`` grows with every merge, so a performer can tell whether the entry it cut
    is still the one queued. ``claim_owner``/``claim_until_ns``: the performer that holds it
    (0 = none) and until when; a claim that ran out may be taken over.
    """

    inode: int
    layout: Layout
    length: int
    old_length: int
    idle: bool
    generation: int
    enqueued_ns: int
    claim_owner: int = 0
    claim_until_ns: int = 0


@dataclass(frozen=True, slots=True)
class InlineData:
    """An inline file's content (``loomfs.meta.ops.inline``).

    ``version`` grows with every change (a migration to chunks checks it did not move);
    ``chunks_dirty``: storage may hold chunks of this inode (a migration that did not
    finish, a file that was in chunks before): they are cut before the next migration
    writes, and removed by GC when the file goes. ``claim_owner``/``claim_until_ns``: the
    migration claim (a meta process's migration copying the content to chunks until then;
    owner 0 with a time: a copy that hung, whose write may still land until then), which
    every move of the file to chunks waits for."""

    data: bytes
    crc: int
    version: int = 1
    chunks_dirty: bool = False
    claim_owner: int = 0
    claim_until_ns: int = 0


@dataclass(frozen=True, slots=True)
class LockRow:
    """One held lock range of one owner (``loomfs.meta.locks``): ``first``..``last`` inclusive;
    ``owner`` as stored (signed 64-bit)."""

    client_id: int
    owner: int
    type: int
    first: int
    last: int
    pid: int = 0


class MetaTxn(ABC):
    """One transaction. Methods of a read transaction that write raise."""

    # inodes -------------------------------------------------------------------------
    @abstractmethod
    async def get_inode(self, inode: int) -> Attr | None: ...

    @abstractmethod
    async def get_inodes(self, inodes: Sequence[int]) -> dict[int, Attr]: ...

    async def get_perms(self, inodes: Sequence[int]) -> dict[int, tuple[int, int, int, int]]:
        """Per existing inode, ``(type, mode, uid, gid)``: what permission checks read (a walk's
        directories), without building ``Attr`` objects; missing inodes are absent. Engines
        answer it in one query; this default maps ``get_inodes``."""
        return {i: (a.type, a.mode, a.uid, a.gid) for i, a in (await self.get_inodes(inodes)).items()}

    @abstractmethod
    async def put_inode(self, attr: Attr) -> None:
        """Insert or replace the whole inode row."""

    @abstractmethod
    async def touch_inode(self, inode: int, *, mtime_ns: int, ctime_ns: int, nlink_delta: int = 0) -> None:
        """Set mtime/ctime and add ``nlink_delta`` to nlink (directory entry changes)."""

    @abstractmethod
    async def delete_inode(self, inode: int) -> None:
        """Delete the inode row and its extended attributes."""

    # inline data (at most one row per inode) ------------------------------------------
    @abstractmethod
    async def get_inline(self, inode: int) -> InlineData | None: ...

    @abstractmethod
    async def put_inline(self, inode: int, inline: InlineData) -> None:
        """Insert or replace the inode's inline content."""

    @abstractmethod
    async def delete_inline(self, inode: int) -> None: ...

    # extended attributes (names are bytes, compared bytewise; the namespace rules, limits and
    # create/replace flags live in ``loomfs.meta.ops.xattrs``) ---------------------------
    @abstractmethod
    async def get_xattr(self, inode: int, name: bytes) -> bytes | None: ...

    @abstractmethod
    async def list_xattrs(self, inode: int) -> list[tuple[bytes, int]]:
        """The inode's attributes as (name, value size in bytes), names in byte order."""

    @abstractmethod
    async def put_xattr(self, inode: int, name: bytes, value: bytes) -> None:
        """Insert or replace the value of (inode, name)."""

    @abstractmethod
    async def delete_xattr(self, inode: int, name: bytes) -> bool:
        """Delete (inode, name); whether it was there."""

    # directory entries ------------------------------------------------------------------
    @abstractmethod
    async def lookup(self, parent: int, name: str) -> DentryRow | None: ...

    async def lookup_path(self, parent: int, names: Sequence[str]) -> list[DentryRow]:
        """The entries along ``names`` from directory ``parent``: ``names[0]`` in ``parent``,
        each next name in the directory the entry before it is. Stops after the first entry
        that is not a directory, and before the first name that is missing. One lookup each
        here; an engine over a network answers in one round trip (PostgreSQL)."""
        out: list[DentryRow] = []
        for name in names:
            row = await self.lookup(parent, name)
            if row is None:
                break
            out.append(row)
            if row.type != _DIRECTORY:
                break
            parent = row.inode
        return out

    @abstractmethod
    async def list_dentries(self, parent: int, after: str, limit: int) -> list[DentryRow]:
        """Entries of ``parent`` with name > ``after`` (UTF-8 byte order), at most ``limit``."""

    @abstractmethod
    async def has_dentries(self, parent: int) -> bool: ...

    @abstractmethod
    async def put_dentry(self, parent: int, name: str, inode: int, type: int) -> None:
        """Insert or replace the entry (parent, name)."""

    @abstractmethod
    async def delete_dentry(self, parent: int, name: str) -> None: ...

    # counters -------------------------------------------------------------------------
    @abstractmethod
    async def next_id(self, counter: str) -> int:
        """Increment a named counter and return the new value (ids start above ``seed``)."""

    @abstractmethod
    async def add_counter(self, name: str, delta: int) -> None: ...

    @abstractmethod
    async def counters(self) -> dict[str, int]: ...

    # write sessions ---------------------------------------------------------------------
    # A session row's time is when it was opened or last renewed by its client (a lease):
    # the GC worker drops sessions not renewed for a lease, so a writer that vanished (lost
    # OPEN reply, failed CLOSE, crashed client) does not keep an unlinked file forever.
    @abstractmethod
    async def add_session(self, inode: int, session_id: int, client_id: int, opened_ns: int) -> None: ...

    @abstractmethod
    async def session_client(self, inode: int, session_id: int) -> int | None:
        """The client id of session ``session_id`` on ``inode``, None if there is none."""

    @abstractmethod
    async def renew_sessions(self, client_id: int, session_ids: Sequence[int], now_ns: int) -> int:
        """Set the time of those sessions (and read holds) of ``client_id`` to ``now_ns``;
        returns how many exist."""

    @abstractmethod
    async def expire_sessions(self, renewed_before_ns: int, limit: int) -> list[tuple[int, int, int]]:
        """Delete at most ``limit`` sessions (and at most ``limit`` read holds) last renewed
        before the time; returns their (inode, session_id, client_id)."""

    @abstractmethod
    async def remove_session(self, inode: int, session_id: int) -> bool: ...

    @abstractmethod
    async def has_session(self, inode: int) -> bool: ...

    @abstractmethod
    async def session_count(self, inode: int) -> int:
        """How many write sessions ``inode`` has."""

    @abstractmethod
    async def remove_client_sessions(self, client_id: int) -> int: ...

    # read holds -------------------------------------------------------------------------
    # A client that keeps a file open for reading and wants it kept if its last name goes
    # (the FUSE mount: POSIX unlink-while-open) holds it. Holds are leases like write
    # sessions, in the same id space: ``renew_sessions`` renews both, ``expire_sessions``
    # expires both, ``remove_client_sessions`` removes both. A hold grants nothing else:
    # ``session_client``, ``has_session`` and ``session_count`` see write sessions only.
    @abstractmethod
    async def add_hold(self, inode: int, hold_id: int, client_id: int, opened_ns: int) -> None: ...

    @abstractmethod
    async def remove_hold(self, inode: int, hold_id: int) -> bool: ...

    @abstractmethod
    async def holders(self, inode: int) -> int:
        """How many write sessions and read holds ``inode`` has."""

    # orphans ----------------------------------------------------------------------------
    # An orphan: a file whose last name went while it had holders (write sessions or read
    # holds). Its inode row stays (``nlink`` 0), so calls by inode go on working; once no
    # holder is left the namespace drops it like an unlinked file (``loomfs.meta.orphans``).
    @abstractmethod
    async def orphan_put(self, inode: int, since_ns: int) -> None: ...

    @abstractmethod
    async def orphan_since(self, inode: int) -> int | None:
        """When ``inode`` became an orphan (its last name went), None if it is none."""

    @abstractmethod
    async def orphan_delete(self, inode: int) -> None: ...

    @abstractmethod
    async def orphans_unheld(self, limit: int) -> list[int]:
        """Orphans with neither a write session nor a read hold left, at most ``limit``."""

    @abstractmethod
    async def orphan_list(self, after: int, limit: int) -> list[tuple[int, int]]:
        """Orphans with inode > ``after`` in inode order, as (inode, since_ns), at most ``limit``."""

    # GC queue -------------------------------------------------------------------------
    @abstractmethod
    async def gc_put(self, entry: GcEntry) -> None: ...

    @abstractmethod
    async def gc_get(self, inode: int) -> GcEntry | None: ...

    @abstractmethod
    async def gc_due(self, enqueued_before_ns: int, limit: int) -> list[GcEntry]:
        """Oldest entries enqueued at or before the time whose inode has no write session."""

    @abstractmethod
    async def gc_delete(self, inode: int) -> None: ...

    @abstractmethod
    async def gc_count(self) -> int: ...

    # truncate epochs ------------------------------------------------------------------
    # Per inode, how many times the file was shrunk (0 = never; no row is kept for 0).
    @abstractmethod
    async def trunc_epoch(self, inode: int) -> int: ...

    @abstractmethod
    async def set_trunc_epoch(self, inode: int, epoch: int) -> None:
        """Set the epoch; 0 forgets the inode."""

    # trim queue (at most one entry per inode) -----------------------------------------
    @abstractmethod
    async def trim_put(self, entry: TrimEntry) -> None:
        """Insert or replace the inode's entry."""

    @abstractmethod
    async def trim_get(self, inode: int) -> TrimEntry | None: ...

    @abstractmethod
    async def trim_due(self, now_ns: int, limit: int) -> list[TrimEntry]:
        """Oldest entries whose claim ran out by ``now_ns`` (``claim_until_ns <= now_ns``),
        idle ones only when their inode has no write session; at most ``limit``."""

    @abstractmethod
    async def trim_delete(self, inode: int) -> None: ...

    @abstractmethod
    async def trim_count(self) -> int: ...

    # scans ------------------------------------------------------------------------------
    @abstractmethod
    async def scan_inodes(self, after: int, limit: int) -> list[Attr]:
        """Inodes with id > ``after`` in id order, at most ``limit`` (background workers page
        through every inode: the EC rebuild looks for the files with a fragment on a chain)."""

    # locks (``loomfs.meta.locks`` has the rules; tables: ``locks_schema``) -------------------
    # Both engines' transactions implement these (locks_sqlite, locks_postgres).
    @abstractmethod
    async def locks_on(self, inode: int, kind: int) -> list[LockRow]:
        """Every lock of ``kind`` on ``inode`` (any client, any owner), by ``first``."""

    @abstractmethod
    async def locks_replace(self, inode: int, kind: int, client_id: int, owner: int,
                            rows: Sequence[LockRow]) -> None:
        """The owner's locks of ``kind`` on ``inode`` become ``rows`` (none: all go)."""

    @abstractmethod
    async def lock_clients_expiry(self, client_ids: Sequence[int]) -> dict[int, int]:
        """When the lease of each of those clients ends (ns); clients without a row are absent."""

    @abstractmethod
    async def lock_client_put(self, client_id: int, expires_ns: int) -> None:
        """Insert or replace the client's lease end."""

    @abstractmethod
    async def lock_client_drop(self, client_id: int) -> int:
        """Delete the client's lease and every lock it holds; returns how many locks."""

    @abstractmethod
    async def lock_clients_expired(self, now_ns: int, limit: int) -> list[int]:
        """Clients whose lease ended at or before ``now_ns``, at most ``limit``."""

    # worker state (small named blobs: a background worker's progress) ------------------
    @abstractmethod
    async def state_get(self, key: str) -> bytes | None: ...

    @abstractmethod
    async def state_put(self, key: str, value: bytes) -> None:
        """Insert or replace the blob under ``key``."""

    @abstractmethod
    async def state_delete(self, key: str) -> None: ...

    @abstractmethod
    async def state_list(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every (key, blob) whose key starts with ``prefix``, in key order."""


class MetaStore(ABC):
    """A transactional engine, opened by URL: ``MetaStore.open("sqlite:///...")``."""

    _engines: ClassVar[dict[str, type[MetaStore]]] = {}
    url: str = ""
    # whether a write may raise ``TxnConflict`` (optimistic concurrency across processes);
    # meta wraps its namespace in ``service.ConflictRetrying`` only for an engine where it may
    conflicts_possible: ClassVar[bool] = True

    @classmethod
    def register(cls, scheme: str) -> Callable[[S], S]:
        def deco(engine: S) -> S:
            cls._engines[scheme] = engine
            return engine

        return deco

    @classmethod
    def open(cls, url: str, **options: Any) -> MetaStore:
        scheme, sep, _ = url.partition("://")
        if not sep:
            raise ValueError(f"metastore URL needs a scheme: {url!r}")
        scheme = scheme.split("+", 1)[0]
        if scheme not in cls._engines:
            # engines register themselves on import
            from loomfs.meta import store as _store  # noqa: F401

        engine = cls._engines.get(scheme)
        if engine is None:
            raise ValueError(f"no metastore engine for {scheme!r} (known: {sorted(cls._engines)})")
        return engine.from_url(url, **options)

    @classmethod
    @abstractmethod
    def from_url(cls, url: str, **options: Any) -> MetaStore: ...

    @abstractmethod
    def read(self) -> AbstractAsyncContextManager[MetaTxn]: ...

    @abstractmethod
    def write(self) -> AbstractAsyncContextManager[MetaTxn]: ...

    @abstractmethod
    async def close(self) -> None: ...

    def quick_attr(self, root: int, names: Sequence[str], *, follow_last: bool, with_inline: bool = False,
                   perms: bool = False) -> QuickHit | None:
        """A shortcut for the commonest reads, stat and READ of a plain path: the attributes of
        the inode ``names`` lead to from directory ``root`` (``with_inline``: and its inline
        row; ``perms``: and the (type, mode, uid, gid) of ``root`` and of every directory
        crossed, in walk order, for the search checks), read in one consistent snapshot
        without opening a transaction; None whenever the engine cannot answer so (none here:
        the caller walks as usual). Only a clean hit is answered: every component found, each
        but the last a directory, the last not a symlink to follow, its inode row (and, for an
        inline inode, its inline row) there. Everything else (errors included) is the caller's
        ordinary walk."""
        return None


@dataclass(frozen=True, slots=True)
class QuickHit:
    """``MetaStore.quick_attr``'s answer."""

    attr: Attr
    inline: InlineData | None = None
    dirs: list[tuple[int, int, int, int]] | None = None  # (type, mode, uid, gid), root first


# Layout codec shared by engines: a compact msgpack list, decoded through a bounded cache
# (many files share a handful of layouts).
_LAYOUT_CACHE_MAX = 4096
_layout_cache: dict[bytes, Layout] = {}


def encode_layout(layout: Layout | None) -> bytes | None:
    if layout is None:
        return None
    tail: list[int] = []
    if layout.ec_k or layout.durable:  # older layouts keep their shorter encoding
        tail = [layout.ec_k, layout.ec_m]
        if layout.durable or layout.ec_reduced:
            tail.append(1 if layout.durable else 0)
        if layout.ec_reduced:
            tail.append(layout.ec_reduced)
    return pack(  # this thread's reused Packer: packb builds one with a 1 MiB buffer per call
        [layout.chunk_size, layout.stripe, layout.table_id, layout.replicas, list(layout.chains),
         layout.inline_max_bytes, *tail]
    )


def decode_layout(blob: bytes | None) -> Layout | None:
    if blob is None:
        return None
    layout = _layout_cache.get(blob)
    if layout is None:
        fields = msgpack.unpackb(blob)
        cs, stripe, tid, rep, chains = fields[:5]
        inline_max = fields[5] if len(fields) > 5 else -1  # written before inline data: the default
        ec_k, ec_m = (fields[6], fields[7]) if len(fields) > 7 else (0, 0)  # erasure-coded layouts only
        durable = bool(fields[8]) if len(fields) > 8 else False  # durable layouts only
        ec_reduced = int(fields[9]) if len(fields) > 9 else 0  # EC files written reduced only
        layout = Layout(chunk_size=cs, stripe=stripe, table_id=tid, replicas=rep, chains=list(chains),
                        inline_max_bytes=inline_max, ec_k=ec_k, ec_m=ec_m, durable=durable, ec_reduced=ec_reduced)
        if len(_layout_cache) >= _LAYOUT_CACHE_MAX:
            _layout_cache.clear()
        _layout_cache[bytes(blob)] = layout
    return layout
