"""One engine under test for the ChunkEngine conformance suites: open, crash, reopen, corrupt.

Kinds: ``memory``, ``file``, ``file-fsync`` (fsync on commit), ``file-direct`` (O_DIRECT on).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.file import FileEngine
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.storage.engine.types import ChunkKey


class Harness:
    def __init__(self, kind: str, path: Path):
        self.kind, self.path = kind, path
        self.engine: ChunkEngine = self._open()

    def _open(self) -> ChunkEngine:
        if self.kind == "memory":
            return MemoryEngine()
        return FileEngine(self.path, fsync_on_commit=self.kind == "file-fsync",
                          direct_io=self.kind == "file-direct", fd_cache_max=4)

    def crash(self) -> ChunkEngine:
        """Power cut + restart: uncommitted state is lost."""
        e = self.engine
        if isinstance(e, MemoryEngine):
            e.crash()
        else:
            assert isinstance(e, FileEngine)
            e.simulate_crash()
            self.engine = self._open()
        return self.engine

    def reopen(self) -> ChunkEngine:
        """Close and open again (a clean restart); the memory engine just stays."""
        if isinstance(self.engine, FileEngine):
            self.engine.close()
            self.engine = self._open()
        return self.engine

    def corrupt(self, key: ChunkKey, offset: int) -> None:
        """Flip one committed byte behind the engine's back."""
        e = self.engine
        if isinstance(e, MemoryEngine):
            e.corrupt(key, offset)
            return
        files = list((self.path / "chunks").rglob(f"{key.inode:x}.{key.index:x}.*"))
        assert len(files) == 1, files
        with open(files[0], "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0xFF]))


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)
