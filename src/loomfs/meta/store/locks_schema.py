"""The lock tables (``loomfs.meta.locks``), as a schema step of each engine: SQLite 5 -> 6,
PostgreSQL 4 -> 5.

* ``locks``: one row per held range: (inode, kind, client, owner, first_byte) -> type, last_byte, pid.
  ``kind`` 1 = flock (whole file, one row per owner), 2 = POSIX record lock (byte ranges,
  ``first_byte``..``last_byte`` inclusive, ``last_byte`` = 2**63-1 for "to the end of the file"). ``owner`` is
  the kernel's 64-bit lock owner stored as a signed bigint.
* ``lock_clients``: one row per client holding locks, with the time its lease ends. A client
  whose lease ran out has lost every lock it had: its rows go at the next look at them.

This module imports nothing of the engines, so the engines' migration lists can name it.
"""

from __future__ import annotations

import sqlite3

SQLITE_STATEMENTS = [
    "CREATE TABLE IF NOT EXISTS locks (inode INTEGER NOT NULL, kind INTEGER NOT NULL, client_id INTEGER NOT NULL, "
    "owner INTEGER NOT NULL, first_byte INTEGER NOT NULL, type INTEGER NOT NULL, last_byte INTEGER NOT NULL, "
    "pid INTEGER NOT NULL, PRIMARY KEY (inode, kind, client_id, owner, first_byte)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS locks_by_client ON locks (client_id)",
    "CREATE TABLE IF NOT EXISTS lock_clients (client_id INTEGER PRIMARY KEY, expires_ns INTEGER NOT NULL)",
]

POSTGRES_STATEMENTS = [
    """CREATE TABLE locks (
        inode bigint NOT NULL, kind bigint NOT NULL, client_id bigint NOT NULL, owner bigint NOT NULL,
        first_byte bigint NOT NULL, type bigint NOT NULL, last_byte bigint NOT NULL, pid bigint NOT NULL,
        PRIMARY KEY (inode, kind, client_id, owner, first_byte))""",
    "CREATE INDEX locks_by_client ON locks (client_id)",
    "CREATE TABLE lock_clients (client_id bigint PRIMARY KEY, expires_ns bigint NOT NULL)",
]


def sqlite_add_locks(conn: sqlite3.Connection) -> None:
    """SQLite 5 -> 6: cross-client locks (flock, POSIX byte ranges) and their clients' leases."""
    for stmt in SQLITE_STATEMENTS:
        conn.execute(stmt)
