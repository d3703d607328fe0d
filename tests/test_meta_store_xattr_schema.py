"""The schema step that brought extended attributes and device numbers (SQLite 3 -> 4,
PostgreSQL 2 -> 3): stores written before it are migrated, device numbers kept as decimal
text in ``symlink`` move to the ``rdev`` column."""

from __future__ import annotations

from pathlib import Path

from loomfs.meta.store.base import MetaStore
from loomfs.wire.types import FileType
from schema_steps import Check, postgres_step, sqlite_step

CHR = int(FileType.CHAR_DEVICE)
BLK = int(FileType.BLOCK_DEVICE)
LNK = int(FileType.SYMLINK)


def _rows(rdev_text: str) -> list[tuple[int, int, str]]:
    # a char device, a block device, a symlink whose target is digits (stays a target)
    return [(20, CHR, rdev_text), (21, BLK, "2049"), (22, LNK, "1234")]


def _moved(rdev: int, xattr_inode: int) -> Check:
    async def check(s: MetaStore) -> None:
        async with s.read() as t:
            got = await t.get_inodes([20, 21, 22])
        assert (got[20].rdev, got[20].symlink_target) == (rdev, "")
        assert (got[21].rdev, got[21].symlink_target) == (2049, "")
        assert (got[22].rdev, got[22].symlink_target) == (0, "1234")
        async with s.write() as t:
            await t.put_xattr(xattr_inode, b"user.k", b"v")
        async with s.read() as t:
            assert await t.list_xattrs(xattr_inode) == [(b"user.k", 1)]
            assert await t.get_xattr(xattr_inode, b"user.k") == b"v"

    return check


def test_sqlite_version_3_store_gets_xattrs_and_rdev(tmp_path: Path) -> None:
    sqlite_step(tmp_path, 3, [
        "DROP TABLE xattrs",
        "DROP TABLE holds",  # and what later versions added
        "DROP TABLE orphans",
        "DROP TABLE IF EXISTS locks",  # and the lock tables (later still)
        "DROP TABLE IF EXISTS lock_clients",
        "ALTER TABLE inodes DROP COLUMN rdev",
        *(("INSERT INTO inodes VALUES (?, ?, 384, 1, 0, 0, 0, 1, 1, 1, NULL, ?, 0)", row) for row in _rows("259")),
    ], _moved(259, 20))


def test_postgres_version_2_schema_gets_xattrs_and_rdev(pg_url: str) -> None:
    postgres_step(pg_url, 2, [
        "DROP TABLE {q}.xattrs",
        "DROP TABLE {q}.holds",  # and what later versions added
        "DROP TABLE {q}.orphans",
        "DROP TABLE {q}.locks",  # and the lock tables (later still)
        "DROP TABLE {q}.lock_clients",
        "ALTER TABLE {q}.inodes DROP COLUMN rdev",
        *(("INSERT INTO {q}.inodes VALUES ($1, $2, 384, 1, 0, 0, 0, 1, 1, 1, NULL, $3, false)", row)
          for row in _rows("65535")),
    ], _moved(65535, 21))
