"""mgmtd state and primary lease in PostgreSQL (asyncpg): 2-3 mgmtd processes on one database.

URL: ``postgresql://user@host:port/db?schema=loomfs`` (or a unix socket, ``?host=DIR&port=N``);
``schema`` (default ``loomfs``) holds two tables, created at open:

- ``mgmtd_lease`` (one row): holder id, holder address, expiry (the database's clock).
- ``mgmtd_state`` (one row): the whole cluster state as msgpack (``store.encode_rows``).

Every operation is one statement (its own transaction). Acquire/renew is a conditional upsert
of the lease row; a save upserts the state row *only* if the lease row (locked ``FOR UPDATE``
in the same statement) still names the saver and has not expired, so a deposed primary can
never overwrite its successor's state.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import msgpack

from loomfs.mgmtd.lease import LeaseView
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import decode_rows, encode_rows

logger = logging.getLogger(__name__)

_SCHEMA_LOCK_KEY = 0x6C6F6F6D6D676D74  # "loommgmt": tables are created by one process at a time
_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, asyncio.TimeoutError)


def is_postgres_url(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres")


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PgHaStore:
    def __init__(self, url: str, *, timeout_s: float = 1.0, connect_timeout_s: float = 2.0):
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        self.schema = dict(query).get("schema", "loomfs")
        if not self.schema or self.schema.lower().startswith("pg_"):
            raise ValueError(f"mgmtd store schema {self.schema!r}: empty, or pg_ (reserved)")
        rest = [(k, v) for k, v in query if k != "schema"]
        self.dsn = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(rest), ""))
        # per statement and per connect: liveness only (a step that waits long just renews
        # late; whether this process may answer as primary is its local deadline's business)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._conn: Any = None
        self._lock = asyncio.Lock()  # one statement at a time on the one connection
        q = _quote_ident(self.schema)
        self._lease = f"{q}.mgmtd_lease"
        self._state = f"{q}.mgmtd_state"

    async def _connection(self) -> Any:
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        conn = await asyncpg.connect(self.dsn, timeout=self.connect_timeout_s,
                                     server_settings={"application_name": "loomfs-mgmtd"})
        try:
            async with conn.transaction():
                await conn.execute(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK_KEY})")
                await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote_ident(self.schema)}")
                await conn.execute(f"CREATE TABLE IF NOT EXISTS {self._lease} (id int PRIMARY KEY, "
                                   "holder text NOT NULL, address text NOT NULL, expires_at timestamptz NOT NULL)")
                await conn.execute(f"CREATE TABLE IF NOT EXISTS {self._state} (id int PRIMARY KEY, "
                                   "value bytea NOT NULL)")
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        return conn

    async def _run(self, what: str, sql: str, *args: Any) -> Any:
        """``fetchrow``; any database or connection error is an OSError (the connection is
        dropped and made again on the next call)."""
        async with self._lock:
            try:
                conn = await self._connection()
                return await conn.fetchrow(sql, *args, timeout=self.timeout_s)
            except _ERRORS as exc:
                await self._drop()
                raise ConnectionError(f"mgmtd store ({what}): {type(exc).__name__}: {exc}") from exc

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def acquire(self, holder: str, address: str, lease_s: float) -> LeaseView:
        row = await self._run(
            "acquire",
            f"INSERT INTO {self._lease} AS l (id, holder, address, expires_at) "
            "VALUES (1, $1, $2, clock_timestamp() + make_interval(secs => $3)) "
            "ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, address = excluded.address, "
            "expires_at = excluded.expires_at "
            "WHERE l.holder = excluded.holder OR l.expires_at < clock_timestamp() RETURNING address",
            holder, address, float(lease_s),
        )
        if row is not None:
            return LeaseView(True, address)
        row = await self._run("read lease", f"SELECT address FROM {self._lease} WHERE id = 1")
        return LeaseView(False, row["address"] if row is not None else "")

    async def release(self, holder: str) -> None:
        await self._run("release", f"UPDATE {self._lease} SET expires_at = '-infinity' "
                        "WHERE id = 1 AND holder = $1 RETURNING 1", holder)

    async def load(self, state: ClusterState, now_s: float) -> None:
        row = await self._run("load", f"SELECT value FROM {self._state} WHERE id = 1")
        if row is not None:
            decode_rows(msgpack.unpackb(row["value"]), state, now_s)

    async def save(self, state: ClusterState, holder: str) -> bool:
        blob = msgpack.packb([list(r) for r in encode_rows(state)])
        row = await self._run(
            "save",
            f"WITH l AS (SELECT 1 FROM {self._lease} WHERE id = 1 AND holder = $1 "
            "AND expires_at > clock_timestamp() FOR UPDATE) "
            f"INSERT INTO {self._state} (id, value) SELECT 1, $2 FROM l "
            "ON CONFLICT (id) DO UPDATE SET value = excluded.value RETURNING 1",
            holder, blob,
        )
        return row is not None

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), self.timeout_s)
            except _ERRORS:
                conn.terminate()

    def __repr__(self) -> str:
        return f"PgHaStore(schema {self.schema})"
