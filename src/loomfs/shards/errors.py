"""Errors for bad shard bytes: each names the shard and the byte offset where reading failed."""

from __future__ import annotations

from loomfs.errors import ChecksumError, LoomError


class ShardError(LoomError):
    """A shard (tar, TFRecord, record file or its index) cannot be read as its format says.

    ``str(exc)`` reads ``"SHARD at byte OFFSET: PROBLEM"``; ``.shard`` and ``.offset`` hold
    the two (``offset`` is ``None`` when the problem has no position, e.g. a missing index).
    """

    def __init__(self, shard: str, offset: int | None = None, problem: str | None = None):
        if problem is None:  # one argument: a whole message (how a DataLoader re-raises a
            super().__init__(shard)  # worker's error: type(exc)(text), so the type survives)
            self.shard, self.offset, self.problem = "", offset, shard
            return
        where = f"{shard} at byte {offset}" if offset is not None else shard
        super().__init__(f"{where}: {problem}")
        self.shard = shard
        self.offset = offset
        self.problem = problem


class ShardTruncated(ShardError):
    """The shard ends in the middle of a header, member or record."""


class ShardCorrupt(ShardError, ChecksumError):
    """A checksum does not match or a header is not what the format allows."""
