"""What the file engine keeps in memory per chunk: the committed version's index row, and a
pending (staged, not yet committed) update."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass


@dataclass(slots=True)
class Meta:
    commit_ver: int
    length: int
    crc: int
    file_ver: int
    blocks: bytes | None  # packed block CRCs; None = not known yet (a row from schema 0)
    tags: bytes  # packed request tags


@dataclass(slots=True)
class Pending:
    ver: int
    length: int
    crc: int
    file_ver: int
    fd: int
    in_place: bool  # appended to the committed file past its committed length
    blocks: bytes
    tags: bytes
    synced: Future[None] | None = None  # the data file's flush, started at staging (durable writes)
    row_maybe: bool = False  # a durable commit of it failed after its index row may have been written
