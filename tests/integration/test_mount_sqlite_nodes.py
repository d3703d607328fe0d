"""SQLite on one database file from two mounts of one cluster at once (two "nodes"): its
fcntl locks are held at meta, each lock is a sync point (``loomfs.mount.revalidate``: the
file's client files reopened from meta, the kernel's pages dropped), and an O_CREAT open of a
name another node unlinked after this kernel's lookup (the rollback journal) is looked up
again (ESTALE) instead of failing. Two processes, one per mount, each run N transactions
``max(v) + 1``: the table ends with 1..2N, once each, and passes its integrity check."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from test_mount_locks import fresh, two  # noqa: F401 - two: the module's fixture of two mounts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROUNDS = 20
TXNS = textwrap.dedent("""
    import sqlite3, sys
    path, rounds, me = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with sqlite3.connect(path, timeout=60, isolation_level=None) as c:
        for i in range(rounds):
            c.execute("BEGIN IMMEDIATE")
            v = c.execute("SELECT coalesce(max(v), 0) FROM t").fetchone()[0]
            c.execute("INSERT INTO t VALUES (?, ?)", (v + 1, me))
            c.execute("COMMIT")
    c.close()
    print("done", flush=True)
""")


@pytest.mark.parametrize("journal", ["delete", "truncate"])
def test_sqlite_transactions_from_two_mounts(two: tuple[str, str], journal: str) -> None:  # noqa: F811
    a, b = two
    pa, pb = fresh(a, b, f"sqlite-{journal}")
    pa.unlink()
    with contextlib.closing(sqlite3.connect(pa)) as c:
        c.execute(f"PRAGMA journal_mode={journal}")
        c.execute("CREATE TABLE t (v INTEGER PRIMARY KEY, who TEXT)")
        c.commit()
    procs = [subprocess.Popen([sys.executable, "-c", TXNS, str(p), str(ROUNDS), who], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for p, who in ((pa, "A"), (pb, "B"))]
    try:
        for p in procs:
            out, err = p.communicate(timeout=200)
            assert p.returncode == 0 and out.strip() == "done", err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for path in (pa, pb):
        with contextlib.closing(sqlite3.connect(path, timeout=60)) as c:
            rows = c.execute("SELECT v, who FROM t ORDER BY v").fetchall()
            assert [v for v, _ in rows] == list(range(1, 2 * ROUNDS + 1))
            assert sorted(who for _, who in rows) == ["A"] * ROUNDS + ["B"] * ROUNDS
            assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
