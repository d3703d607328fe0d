"""One storage target: its engine plus per-chunk locks that serialise updates."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator

from loomfs.common.keylocks import KeyLocks
from loomfs.errors import LoomError, StatusError
from loomfs.storage.engine.base import ChunkEngine
from loomfs.storage.engine.types import ChunkKey
from loomfs.wire.status import Status

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
    def __init__(self, target_id: int, engine: ChunkEngine, path: str = "", *, format_id: str = "",
                 formatted_now: bool = False):
        self.target_id = target_id
        self.engine = engine
        self.path = path
        self.locks = ChunkLocks()
        self.disk_id = _disk_id(path)
        # the identity of the storage under ``path`` (storage.diskident; "" = none, e.g. in memory)
        # and whether this process created it in an empty directory (a new disk)
        self.format_id = format_id
        self.formatted_now = formatted_now

    @property
    def failed(self) -> str:
        """Why a failed fsync took this target out of service ("" = it serves)."""
        return self.engine.failed

    def check_in_service(self) -> None:
        """A failed target serves nothing: its disk may not hold what its memory says."""
        if self.engine.failed:
            raise StatusError(Status.TARGET_NOT_SERVING,
                              f"target {self.target_id} is out of service ({self.engine.failed})")

    @contextlib.contextmanager
    def disk_errors(self) -> Iterator[None]:
        """A disk error that failed the target reaches the caller as TARGET_NOT_SERVING (the
        client, or the predecessor, retries on the chain without it), not as EIO."""
        try:
            yield
        except (OSError, sqlite3.Error) as exc:
            if self.engine.failed and not isinstance(exc, LoomError):
                raise StatusError(Status.TARGET_NOT_SERVING,
                                  f"target {self.target_id} is out of service ({self.engine.failed})") from exc
            raise

    def __repr__(self) -> str:
        failed = " FAILED" if self.engine.failed else ""
        return f"StorageTarget({self.target_id}{failed} {self.engine!r} locks={len(self.locks)})"
