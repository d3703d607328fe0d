"""PostgreSQL engine, the schema: numbered migrations, applied once under an advisory lock.

``loomfs_schema`` holds the version a database is at. Each migration is a list of statements
that brings version N-1 to N; a store applies the ones it is missing at open, in one
transaction, holding ``pg_advisory_xact_lock`` so that meta servers starting together apply
each once. A database at a newer version than this code knows is refused (``SchemaTooNew``).

Layout of the data (every integer a bigint; names sort by UTF-8 bytes: ``COLLATE "C"``):

* ``counter_deltas``: statistics counters as an append-only list of deltas, no index. A
  create adds a row instead of updating a shared one, so concurrent creates do not collide
  on a hot row (serialisable transactions would abort each other); ``fold_counters`` sums
  the rows now and then (READ COMMITTED: each row is summed once even when folds race).
* id counters (``next_id``): a sequence each (``loomfs_id_<name>``, listed in
  ``id_counters``), plus the counter's deltas as a base (``add_counter`` moves it). Sequences
  are outside transactions: an id taken by a transaction that rolls back is not reused.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from loomfs.meta.store.locks_schema import POSTGRES_STATEMENTS as POSTGRES_LOCK_STATEMENTS

SCHEMA_VERSION = 6
ADVISORY_LOCK_KEY = 0x4C4F4F4D_46530001  # "LOOMFS" + 1: migrations
WRITE_GATE_KEY = 0x4C4F4F4D_46530002  # every write passes it shared; a lone writer holds it alone

MIGRATIONS: list[list[str]] = [
    # 1: the first schema
    [
        """CREATE TABLE inodes (
            id bigint PRIMARY KEY, type bigint NOT NULL, mode bigint NOT NULL, nlink bigint NOT NULL,
            uid bigint NOT NULL, gid bigint NOT NULL, size bigint NOT NULL, atime_ns bigint NOT NULL,
            mtime_ns bigint NOT NULL, ctime_ns bigint NOT NULL, layout bytea, symlink text NOT NULL,
            inline boolean NOT NULL DEFAULT false)""",
        """CREATE TABLE inline_data (
            inode bigint PRIMARY KEY, data bytea NOT NULL, crc bigint NOT NULL, version bigint NOT NULL,
            chunks_dirty boolean NOT NULL)""",
        """CREATE TABLE dentries (
            parent bigint NOT NULL, name text COLLATE "C" NOT NULL, inode bigint NOT NULL,
            type bigint NOT NULL, PRIMARY KEY (parent, name))""",
        """CREATE TABLE sessions (
            inode bigint NOT NULL, session_id bigint NOT NULL, client_id bigint NOT NULL,
            opened_ns bigint NOT NULL, PRIMARY KEY (inode, session_id))""",
        "CREATE INDEX sessions_by_client ON sessions (client_id)",
        "CREATE INDEX sessions_by_time ON sessions (opened_ns)",
        """CREATE TABLE gc_queue (
            inode bigint PRIMARY KEY, layout bytea, length bigint NOT NULL, enqueued_ns bigint NOT NULL)""",
        "CREATE INDEX gc_by_time ON gc_queue (enqueued_ns)",
        "CREATE TABLE counter_deltas (name text NOT NULL, delta bigint NOT NULL)",
        "CREATE TABLE id_counters (name text PRIMARY KEY, seq text NOT NULL)",
        "CREATE TABLE trunc_epochs (inode bigint PRIMARY KEY, epoch bigint NOT NULL)",
        """CREATE TABLE trim_queue (
            inode bigint PRIMARY KEY, layout bytea, length bigint NOT NULL, old_length bigint NOT NULL,
            idle boolean NOT NULL, generation bigint NOT NULL, enqueued_ns bigint NOT NULL,
            claim_owner bigint NOT NULL, claim_until_ns bigint NOT NULL)""",
        "CREATE INDEX trim_by_time ON trim_queue (enqueued_ns)",
    ],
    # 2: background workers' progress (the EC rebuild)
    ["CREATE TABLE worker_state (key text COLLATE \"C\" PRIMARY KEY, value bytea NOT NULL)"],
    # 3: extended attributes (bytea names sort bytewise); device numbers in their own column
    # (decimal text in ``symlink`` before)
    [
        "CREATE TABLE xattrs (inode bigint NOT NULL, name bytea NOT NULL, value bytea NOT NULL, "
        "PRIMARY KEY (inode, name))",
        "ALTER TABLE inodes ADD COLUMN rdev bigint NOT NULL DEFAULT 0",
        "UPDATE inodes SET rdev = symlink::bigint, symlink = '' WHERE type IN (6, 7) "
        "AND symlink ~ '^[0-9]{1,18}$'",
    ],
    # 4: read holds (leased like write sessions) and orphans (files open somewhere whose last
    # name went): POSIX unlink-while-open across clients
    [
        """CREATE TABLE holds (
            inode bigint NOT NULL, hold_id bigint NOT NULL, client_id bigint NOT NULL,
            opened_ns bigint NOT NULL, PRIMARY KEY (inode, hold_id))""",
        "CREATE INDEX holds_by_client ON holds (client_id)",
        "CREATE INDEX holds_by_time ON holds (opened_ns)",
        "CREATE TABLE orphans (inode bigint PRIMARY KEY, since_ns bigint NOT NULL)",
    ],
    # 5: cross-client locks (flock, POSIX byte ranges) and their clients' leases
    # (``locks_schema``, ``loomfs.meta.locks``)
    POSTGRES_LOCK_STATEMENTS,
    # 6: inline files' migration claims (``InlineData.claim_owner``: several meta processes)
    [
        "ALTER TABLE inline_data ADD COLUMN IF NOT EXISTS claim_owner bigint NOT NULL DEFAULT 0, "
        "ADD COLUMN IF NOT EXISTS claim_until_ns bigint NOT NULL DEFAULT 0",
    ],
]
assert len(MIGRATIONS) == SCHEMA_VERSION


class SchemaTooNew(RuntimeError):
    """The database was written by a newer LoomFS (its schema version is above ours)."""


def sequence_name(counter: str) -> str:
    """The sequence behind id counter ``counter`` (a safe identifier whatever the name)."""
    if re.fullmatch(r"[a-z0-9_]{1,40}", counter):
        return f"loomfs_id_{counter}"
    return f"loomfs_id_{hashlib.sha1(counter.encode()).hexdigest()[:20]}"


async def migrate(conn: Any, schema: str) -> int:
    """Create ``schema`` if needed and apply the missing migrations; returns the version
    found before. ``conn``: an asyncpg connection outside a transaction."""
    q = quote_ident(schema)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", ADVISORY_LOCK_KEY)
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q}")
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {q}.loomfs_schema (version bigint NOT NULL)")
        found = await conn.fetchval(f"SELECT max(version) FROM {q}.loomfs_schema")
        version = int(found or 0)
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(f"metastore schema {schema!r} is at version {version}; this LoomFS knows "
                               f"up to {SCHEMA_VERSION}")
        await conn.execute(f"SET LOCAL search_path TO {q}")
        for n in range(version, SCHEMA_VERSION):
            for stmt in MIGRATIONS[n]:
                await conn.execute(stmt)
        if version < SCHEMA_VERSION:
            await conn.execute(f"DELETE FROM {q}.loomfs_schema")
            await conn.execute(f"INSERT INTO {q}.loomfs_schema (version) VALUES ($1)", SCHEMA_VERSION)
    return version


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
