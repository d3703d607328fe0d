"""PostgreSQL engine (asyncpg): many stateless meta servers on one database.

``postgresql://user@host:port/db?schema=loomfs&pool_max=16`` (or a unix socket:
``postgresql://user@/db?host=/run/postgresql&port=5432``). ``schema`` (default ``loomfs``)
is the PostgreSQL schema the namespace lives in, created and migrated at open
(``postgres_schema``); ``pool_max`` bounds the connections of this process.

Isolation: every write transaction is ``SERIALIZABLE`` (PostgreSQL's SSI), so concurrent
renames, O_EXCL creates and link/unlink from any number of meta servers behave as if run one
after another; read transactions are ``REPEATABLE READ READ ONLY`` (one snapshot of committed
data for a path walk; they never abort). A write that loses a conflict (SQLSTATE 40001, or a
deadlock, 40P01) is rolled back and raises ``TxnConflict``: the caller re-runs its whole
operation (``loomfs.meta.service.retry_conflicts``, a bounded number of times, with jittered
backoff). An operation that lost twice runs its writes *alone* (``WRITE_ALONE``): every write
transaction passes a gate (an advisory lock, taken shared in the same round trip as its
BEGIN); a lone writer takes it exclusive before its BEGIN, so it waits for the writers in
flight, new ones wait for it, and its snapshot is taken after all of them: it cannot lose
again, and a hot directory cannot starve it. No group commit here: each writer has its own connection and transaction, and
PostgreSQL commits concurrent transactions together in its WAL flush.

Connections belong to an event loop: the pool is made on first use in a loop, and made again
if the store is used from another loop (tests call ``asyncio.run`` several times).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import asyncpg

from loomfs.errors import LoomError, StatusError
from loomfs.meta.store.base import (
    WRITE_ALONE,
    CommitFailed,
    MetaStore,
    MetaTxn,
    StoreUnavailable,
    TxnConflict,
    note_commit,
)
from loomfs.meta.store.locks_postgres import PostgresLockTxn
from loomfs.meta.store.postgres_schema import (
    ADVISORY_LOCK_KEY,
    WRITE_GATE_KEY,
    migrate,
    quote_ident,
    sequence_name,
)
from loomfs.meta.store.postgres_txn import PostgresTxn, ReadOnlyTxn
from loomfs.wire.status import Status

__all__ = ["PostgresStore", "PostgresTxn", "ReadOnlyTxn", "StoreUnavailable"]

logger = logging.getLogger(__name__)

POOL_MAX = 16  # connections per process (each open transaction holds one)
FOLD_EVERY = 5000  # counter delta rows added by this process between folds
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_BEGIN_GATED = f"BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT pg_advisory_xact_lock_shared({WRITE_GATE_KEY})"
_CONFLICT = (asyncpg.SerializationError, asyncpg.DeadlockDetectedError)
_UNAVAILABLE = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError,
                asyncpg.exceptions.OperatorInterventionError, asyncpg.exceptions.TooManyConnectionsError)


# a value PostgreSQL cannot hold (an integer past int64, a NUL in a text): the caller's input,
# answered EINVAL, not INTERNAL or EIO (PostgreSQL hunt, session 14; SQLite answers BAD_REQUEST)
_BAD_VALUE = (asyncpg.exceptions.DataError, asyncpg.exceptions._base.DataError)


def _bad_value(exc: BaseException) -> StatusError:
    return StatusError(Status.EINVAL, f"a value the metastore cannot hold: {exc}")


def _int64_parts(total: int) -> list[int]:
    """``total`` as int64 values that add up to it (one, unless it is past int64)."""
    bound = (1 << 63) - 1
    parts = []
    while abs(total) > bound:
        step = bound if total > 0 else -bound
        parts.append(step)
        total -= step
    return [*parts, total]


def _unavailable(exc: BaseException) -> bool:
    """The database connection failed (not an error of the caller: LoomErrors are OSErrors)."""
    return isinstance(exc, _UNAVAILABLE) and not isinstance(exc, LoomError)


@MetaStore.register("postgresql")
@MetaStore.register("postgres")
class PostgresStore(MetaStore):
    """``commits``: write transactions committed; ``conflicts``: ones that lost a
    serialisation conflict (their callers re-run them)."""

    def __init__(self, dsn: str, *, schema: str = "loomfs", pool_max: int = POOL_MAX,
                 synchronous_commit: bool = True, connect_timeout_s: float = 10.0):
        if not schema or schema.lower().startswith("pg_"):
            raise ValueError(f"postgresql metastore schema {schema!r}: empty, or pg_ (reserved)")
        self.dsn = dsn
        self.schema = schema
        self.url = dsn if schema == "loomfs" else _with_query(dsn, schema=schema)
        self.pool_max = pool_max
        self.synchronous_commit = synchronous_commit
        self.connect_timeout_s = connect_timeout_s
        self._pool: asyncpg.Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool_lock: asyncio.Lock | None = None
        self._migrated = False
        self._sequences: set[str] = set()  # id counters whose sequence exists
        self.id_base: dict[str, int] = {}  # committed base of each id counter (postgres_txn.next_id)
        self.counter_rows_added = 0
        self._folding: asyncio.Task[None] | None = None
        # readers: idle connections inside BEGIN READ ONLY, a bound on reads at once, and the
        # tasks that end reads and put their connections back
        self._readers: list[Any] = []
        self._read_slots: asyncio.Semaphore | None = None
        self._recycling: set[asyncio.Task[None]] = set()
        self._closed = False
        self.commits = 0
        self.conflicts = 0
        self.commits_failed = 0
        self.alone_runs = 0  # write transactions run alone (WRITE_ALONE)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresStore:
        parts = urlsplit(url)
        scheme = parts.scheme.split("+", 1)[0]
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {k: v for k, v in query if k in ("schema", "pool_max")}
        rest = [(k, v) for k, v in query if k not in ours]
        dsn = urlunsplit(("postgresql" if scheme == "postgres" else scheme, parts.netloc, parts.path,
                          urlencode(rest), ""))
        kw: dict[str, Any] = {}
        if "schema" in ours:
            kw["schema"] = ours["schema"]
        if "pool_max" in ours:
            kw["pool_max"] = int(ours["pool_max"])
        sync = str(options.pop("synchronous", "NORMAL")).upper()  # the sqlite option, mapped
        kw["synchronous_commit"] = sync != "OFF"
        for k in ("pool_max", "connect_timeout_s"):
            if k in options:
                kw[k] = options.pop(k)
        if options:
            raise ValueError(f"unknown postgresql metastore options: {sorted(options)}")
        return cls(dsn, **kw)

    # --- connections ----------------------------------------------------------------------

    def _settings(self) -> dict[str, str]:
        # standard_conforming_strings: deferred writes carry their text values as literals
        return {"search_path": self.schema, "synchronous_commit": "on" if self.synchronous_commit else "off",
                "application_name": "loomfs-meta", "standard_conforming_strings": "on"}

    async def _connect_one(self) -> Any:
        return await asyncpg.connect(self.dsn, timeout=self.connect_timeout_s)

    async def pool(self) -> asyncpg.Pool:
        if self._closed:
            raise StoreUnavailable("the metastore is closed")
        loop = asyncio.get_running_loop()
        if self._pool is not None and self._loop is loop:
            return self._pool
        if self._pool_lock is None or self._loop is not loop:
            self._pool_lock = asyncio.Lock()
            self._loop = loop
            self._read_slots = asyncio.Semaphore(self.pool_max)
            readers, self._readers = self._readers, []  # of another loop: unusable here
            for r in readers:
                with contextlib.suppress(Exception):
                    r.terminate()
            if self._pool is not None:  # made in another loop: its connections are unusable here
                _abandon(self._pool)
                self._pool = None
        async with self._pool_lock:
            if self._pool is not None:
                return self._pool
            try:
                if not self._migrated:
                    conn = await self._connect_one()
                    try:
                        await migrate(conn, self.schema)
                    finally:
                        await conn.close()
                    self._migrated = True
                self._pool = await asyncpg.create_pool(
                    self.dsn, min_size=1, max_size=self.pool_max, server_settings=self._settings(),
                    timeout=self.connect_timeout_s, max_inactive_connection_lifetime=60.0,
                )
            except _UNAVAILABLE as exc:
                raise StoreUnavailable(f"metastore {self._where()} unreachable: {exc}") from exc
            return self._pool

    def _where(self) -> str:
        parts = urlsplit(self.dsn)
        return f"{parts.hostname or unquote(parts.query)}{parts.path} schema {self.schema}"

    async def id_sequence(self, counter: str) -> str:
        """The sequence of id counter ``counter``, made (outside any transaction) on first use."""
        seq = sequence_name(counter)
        if seq in self._sequences:
            return seq
        conn = await self._connect_one()
        try:
            async with conn.transaction():
                # under the migration lock: two servers never race the CREATE
                await conn.execute("SELECT pg_advisory_xact_lock($1)", ADVISORY_LOCK_KEY)
                q = quote_ident(self.schema)
                await conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {q}.{seq}")
                await conn.execute(f"INSERT INTO {q}.id_counters (name, seq) VALUES ($1, $2) "
                                   "ON CONFLICT (name) DO NOTHING", counter, seq)
        finally:
            await conn.close()
        self._sequences.add(seq)
        return seq

    # --- transactions ---------------------------------------------------------------------

    @asynccontextmanager
    async def read(self) -> AsyncIterator[MetaTxn]:
        """On a reader connection that is already inside ``BEGIN ... READ ONLY`` (its snapshot
        is taken by the first statement, so it sees every commit before it); the COMMIT and the
        next BEGIN go in one message after the caller has its answer."""
        await self.pool()  # migrated, same loop
        assert self._read_slots is not None
        await self._read_slots.acquire()
        conn: Any = None
        ok = False
        try:
            conn = self._readers.pop() if self._readers else await self._new_reader()
            yield PostgresLockTxn(conn, False, self)
            ok = True
        except Exception as exc:
            if isinstance(exc, _BAD_VALUE):
                raise _bad_value(exc) from exc
            if _unavailable(exc):
                raise StoreUnavailable(f"metastore read failed: {exc}") from exc
            raise
        finally:
            if conn is None:
                self._read_slots.release()
            else:
                task = asyncio.get_running_loop().create_task(self._recycle_reader(conn, ok))
                self._recycling.add(task)
                task.add_done_callback(self._recycling.discard)

    async def _new_reader(self) -> Any:
        try:
            conn = await asyncpg.connect(self.dsn, timeout=self.connect_timeout_s, server_settings=self._settings())
            await conn.execute(_BEGIN_READ)
        except Exception as exc:
            if _unavailable(exc):
                raise StoreUnavailable(f"metastore {self._where()} unreachable: {exc}") from exc
            raise
        return conn

    async def _recycle_reader(self, conn: Any, ok: bool) -> None:
        """End a read transaction and open the next (one round trip), then keep the connection."""
        try:
            await conn.execute(("COMMIT;" if ok else "ROLLBACK;") + _BEGIN_READ)
        except Exception as exc:  # a broken connection: the next read opens a new one
            logger.debug("metastore: reader connection dropped: %s", exc)
            conn.terminate()
        else:
            if self._closed or self._loop is not asyncio.get_running_loop():
                await _close_quietly(conn)
            else:
                self._readers.append(conn)
        finally:
            if self._read_slots is not None:
                self._read_slots.release()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[MetaTxn]:
        pool = await self.pool()
        try:
            conn = await pool.acquire()
        except Exception as exc:
            if _unavailable(exc):
                raise StoreUnavailable(f"metastore unreachable: {exc}") from exc
            raise
        alone = WRITE_ALONE.get()
        gated = False
        try:
            try:
                if alone:  # waits for the writers in flight; new ones wait at their BEGIN
                    await conn.execute("SELECT pg_advisory_lock($1)", WRITE_GATE_KEY)
                    gated = True
                    self.alone_runs += 1
                # one round trip: BEGIN, and (not alone) the gate passed shared
                await conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE" if alone else _BEGIN_GATED)
            except Exception as exc:
                if _unavailable(exc):
                    raise StoreUnavailable(f"metastore write failed: {exc}") from exc
                raise
            txn = PostgresLockTxn(conn, True, self)
            try:
                yield txn
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
                if isinstance(exc, _CONFLICT):
                    self.conflicts += 1
                    raise TxnConflict(f"serialisation conflict: {exc}") from exc
                if isinstance(exc, _BAD_VALUE):
                    raise _bad_value(exc) from exc
                if _unavailable(exc):
                    raise StoreUnavailable(f"metastore write failed: {exc}") from exc
                raise
            try:
                # the deferred writes and the COMMIT: one message, one round trip
                await conn.execute(";".join([*txn.pending, "COMMIT"]))
                txn.pending.clear()
            except _CONFLICT as exc:
                self.conflicts += 1
                with contextlib.suppress(Exception):  # not back to the pool inside a failed transaction
                    await conn.execute("ROLLBACK")
                raise TxnConflict(f"serialisation conflict at commit: {exc}") from exc
            except _BAD_VALUE as exc:
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
                raise _bad_value(exc) from exc
            except Exception as exc:
                self.commits_failed += 1
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
                raise CommitFailed(f"metastore commit failed: {exc}") from exc
            self.commits += 1
            note_commit()
            if txn.added:
                for name in txn.added:
                    self.id_base.pop(name, None)
                if self.counter_rows_added >= FOLD_EVERY and self._folding is None:
                    self.counter_rows_added = 0
                    self._folding = asyncio.get_running_loop().create_task(self._fold())
        finally:
            if gated:
                with contextlib.suppress(Exception):
                    await conn.execute("SELECT pg_advisory_unlock($1)", WRITE_GATE_KEY)
            await pool.release(conn)

    async def _fold(self) -> None:
        try:
            await self.fold_counters()
        except Exception as exc:  # next time
            logger.warning("metastore: folding counter deltas failed: %s", exc)
        finally:
            self._folding = None

    async def fold_counters(self) -> int:
        """Sum the counter delta rows into one row per counter; returns the rows removed.
        READ COMMITTED: a row deleted by a concurrent fold is skipped, so each is summed once."""
        pool = await self.pool()
        async with pool.acquire() as conn, conn.transaction(isolation="read_committed"):
            rows = await conn.fetch("DELETE FROM counter_deltas RETURNING name, delta")
            sums: dict[str, int] = {}
            for name, delta in rows:
                sums[name] = sums.get(name, 0) + delta
            if sums:  # a sum past int64 goes back as several rows (the table holds deltas)
                await conn.executemany("INSERT INTO counter_deltas (name, delta) VALUES ($1, $2)",
                                       [(name, part) for name, total in sums.items() for part in _int64_parts(total)])
            return len(rows)

    async def release(self) -> None:
        """Close this loop's connections now (a later call in any loop opens new ones)."""
        here = self._loop is asyncio.get_running_loop()
        if self._recycling and here:
            await asyncio.wait(list(self._recycling))
        readers, self._readers = self._readers, []
        for r in readers:
            if here:
                await _close_quietly(r)
            else:  # its loop is gone: the socket closes when collected
                with contextlib.suppress(Exception):
                    r.terminate()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if here:
            try:
                await asyncio.wait_for(pool.close(), 10.0)
            except (TimeoutError, *_UNAVAILABLE):
                pool.terminate()
        else:
            _abandon(pool)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._folding is not None:
            with contextlib.suppress(Exception):
                await self._folding
        await self.release()

    def __repr__(self) -> str:
        return f"PostgresStore({self._where()} commits={self.commits} conflicts={self.conflicts})"


async def _close_quietly(conn: Any) -> None:
    try:
        await asyncio.wait_for(conn.close(), 5.0)
    except Exception:
        conn.terminate()


def _abandon(pool: asyncpg.Pool) -> None:
    """Drop a pool whose loop is gone (closed): its sockets close when collected."""
    with contextlib.suppress(RuntimeError):
        pool.terminate()


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query, keep_blank_values=True), *params.items()]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))
