"""Files at rest (issue 13 item 5): chunk files, chunk indexes and the mgmtd database are
readable by the service's user only (0600 files, 0700 directories), whatever the umask."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import crc32c

from loomfs.mgmtd.store import MgmtdStore
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.file_index import private_db_file
from loomfs.storage.engine.types import ChunkKey


def _mode(p: Path | str) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_chunk_files_and_index_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        target = tmp_path / "target1"
        e = FileEngine(target, fd_cache_max=4)
        data = b"secret" * 100
        e.stage_write(ChunkKey(7, 0), 1, 0, data, data_crc=crc32c.crc32c(data))
        asyncio.run(e.commit(ChunkKey(7, 0), 1))
        files = [p for p in target.rglob("*") if p.is_file()]
        dirs = [target, *(p for p in target.rglob("*") if p.is_dir())]
        assert any(p.name.startswith("7.0.") for p in files) and any(p.name == "index.sqlite" for p in files)
        assert {str(p.relative_to(target)): oct(_mode(p)) for p in files if _mode(p) != 0o600} == {}
        assert {str(p): oct(_mode(p)) for p in dirs if _mode(p) != 0o700} == {}
    finally:
        os.umask(old)


def test_mgmtd_database_is_private_and_old_files_are_fixed(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        db = tmp_path / "mgmtd.db"
        MgmtdStore(f"sqlite:///{db}")
        assert _mode(db) == 0o600
        for p in tmp_path.glob("mgmtd.db-*"):
            assert _mode(p) == 0o600, p
        legacy = tmp_path / "old.sqlite"
        legacy.write_bytes(b"")
        os.chmod(legacy, 0o644)
        private_db_file(legacy)
        assert _mode(legacy) == 0o600
    finally:
        os.umask(old)


def test_meta_sqlite_database_is_private(tmp_path: Path) -> None:
    from loomfs.meta.store.sqlite import SqliteStore

    old = os.umask(0o022)
    try:
        db = tmp_path / "meta" / "meta.db"
        store = SqliteStore(str(db))
        try:
            names = sorted(p.name for p in db.parent.iterdir())
            assert "meta.db" in names and "meta.db-wal" in names, names
            assert {n: oct(_mode(db.parent / n)) for n in names if _mode(db.parent / n) != 0o600} == {}
        finally:
            asyncio.run(store.close())
    finally:
        os.umask(old)
