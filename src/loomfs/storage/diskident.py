"""A target's format id: the identity of the storage its directory lives on.

When a storage process opens a target directory that holds no format id, it creates one: a
random 128-bit id (32 hex digits) in ``<target>/loomfs-format-id``, written to a temporary file,
fsynced, renamed into place and the directory fsynced, so it is there whole or not at all.
A replaced disk, a wiped or reformatted directory comes back without the file and gets a new
id; the node reports it (``wire.mgmtd.TargetFormat``, on registration and heartbeats) and mgmtd,
which remembers the last id it saw per target, treats a target whose id changed as empty: it
is resynced from a serving member of its chain, never made the chain's serving copy from its
own (empty) contents (``mgmtd.diskident``).

``formatted_now`` says the id was created by this process in a directory that held nothing
else (a new disk): mgmtd uses it when it has no id recorded yet (a store written before format
ids). A directory that already held data but no id (a target of older code) gets an id
without ``formatted_now``: an upgrade, accepted as it is.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from loomfs.wire.mgmtd import TargetFormat

logger = logging.getLogger(__name__)

FORMAT_ID_FILE = "loomfs-format-id"
_TMP_SUFFIX = ".tmp"
_ID = re.compile(r"[0-9a-f]{32}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_format_id(path: Path) -> str:
    """The target directory's format id; "" when it has none (or an unreadable one)."""
    try:
        text = (path / FORMAT_ID_FILE).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        logger.error("target directory %s: format id unreadable (%s): treated as a new disk", path, exc)
        return ""
    if not _ID.fullmatch(text):
        logger.error("target directory %s: malformed format id %r: treated as a new disk", path, text[:64])
        return ""
    return text


def load_or_create(path: str | os.PathLike[str]) -> tuple[str, bool]:
    """The format id of target directory ``path`` (created there if missing) and whether this
    call created it in a directory that held nothing else. Call before the engine opens the
    directory (the engine creates its index and chunk folders)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    fid = read_format_id(p)
    if fid:
        return fid, False
    fresh = not any(e.name != FORMAT_ID_FILE + _TMP_SUFFIX and e.name != FORMAT_ID_FILE for e in p.iterdir())
    fid = uuid.uuid4().hex
    tmp = p / (FORMAT_ID_FILE + _TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (fid + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, p / FORMAT_ID_FILE)
    _fsync_dir(p)
    if fresh:
        logger.info("target directory %s: new (empty): format id %s", p, fid)
    else:
        logger.warning("target directory %s: holds data but no format id (older code, or the id was lost): "
                       "format id %s", p, fid)
    return fid, fresh


class _HasFormat(Protocol):
    target_id: int
    format_id: str
    formatted_now: bool


def target_formats(targets: Iterable[_HasFormat]) -> list[TargetFormat]:
    """What a node reports to mgmtd (targets without an id, e.g. in-memory ones, are left out)."""
    return [TargetFormat(target_id=t.target_id, format_id=t.format_id, formatted_now=t.formatted_now)
            for t in targets if t.format_id]
