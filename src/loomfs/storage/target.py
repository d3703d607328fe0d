"""One storage target: its engine plus per-chunk locks that serialise updates."""

from __future__ import annotations

import os

from loomfs.common.keylocks import KeyLocks
from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.types import ChunkKey

ChunkLocks = KeyLocks[ChunkKey]  # a lock per chunk: updates of one chunk are serialised


def target_id_for(node_id: int, index: int) -> int:
    """Target ids: node N serving targets [dir0, dir1, ...] has ids N*1000 + i + 1."""
    return node_id * 1000 + index + 1


def _disk_id(path: str) -> str:
    """The device of the file system holding ``path`` (targets on one disk share it)."""
    if not path:
        return ""
    try:
        return str(os.stat(path).st_dev)
    except OSError:
        return ""


class StorageTarget:
    def __init__(self, target_id: int, engine: ChunkEngine, path: str = ""):
        self.target_id = target_id
        self.engine = engine
        self.path = path
        self.locks = ChunkLocks()
        self.disk_id = _disk_id(path)

    def __repr__(self) -> str:
        return f"StorageTarget({self.target_id} {self.engine!r} locks={len(self.locks)})"
