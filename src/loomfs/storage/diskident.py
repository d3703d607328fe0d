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
else (a new disk; a new file system's ``lost+found`` does not count): mgmtd uses it when it has
no id recorded yet (a store written before format ids). A directory that already held data but
no id (a target of older code) gets an id without ``formatted_now``: an upgrade, accepted as it is.

The file also names the target it was made for (a second line, ``target <id>``). A directory
whose file names another target (the order of ``targets`` changed, two mounts swapped), whose
file is unreadable or malformed, or that two targets of the node share, is refused
(``TargetDirError``: the process does not start) rather than given a new id, which would make
mgmtd treat a good copy as a new disk and resync over it (review, session 15). The operator
decides: put the directories back, or remove the file of a directory known to be empty.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from loomfs.errors import LoomError
from loomfs.wire.mgmtd import TargetFormat

logger = logging.getLogger(__name__)

FORMAT_ID_FILE = "loomfs-format-id"
_TMP_SUFFIX = ".tmp"
_ID = re.compile(r"[0-9a-f]{32}")
_OWNER = re.compile(r"target (\d{1,19})")
# what a new disk may hold besides the id (a new ext4/xfs file system's lost+found)
_NOT_DATA = frozenset({FORMAT_ID_FILE, FORMAT_ID_FILE + _TMP_SUFFIX, "lost+found"})


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TargetDirError(LoomError):
    """A target directory that must not be opened (see the module docstring)."""


def read_format_id(path: Path) -> str:
    """The target directory's format id; "" when it has none. Raises ``TargetDirError`` when
    the file is there but unreadable or malformed (never treated as missing)."""
    return _read(path)[0]


def _read(path: Path) -> tuple[str, int]:
    """(format id, the target id the file names or 0); ("", 0) when there is no file."""
    try:
        text = (path / FORMAT_ID_FILE).read_text(encoding="ascii")
    except FileNotFoundError:
        return "", 0
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetDirError(f"target directory {path}: format id unreadable ({exc}); not opened: an "
                             "operator decides (the file of a directory known to be empty may be removed)") from exc
    lines = text.split("\n")
    fid = lines[0].strip()
    tail = [ln.strip() for ln in lines[1:] if ln.strip()]
    owner = 0
    if len(tail) == 1 and (m := _OWNER.fullmatch(tail[0])):
        owner = int(m.group(1))
    elif tail:
        fid = ""  # malformed below
    if not _ID.fullmatch(fid):
        raise TargetDirError(f"target directory {path}: malformed format id {text[:80]!r}; not opened: an "
                             "operator decides (the file of a directory known to be empty may be removed)")
    return fid, owner


def load_or_create(path: str | os.PathLike[str], target_id: int = 0) -> tuple[str, bool]:
    """The format id of target directory ``path`` (created there if missing) and whether this
    call created it in a directory that held nothing else. ``target_id``: the target opening
    it (written with a new id; a file naming another target is refused). Call before the
    engine opens the directory (the engine creates its index and chunk folders)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    fid, owner = _read(p)
    if fid:
        if owner and target_id and owner != target_id:
            raise TargetDirError(f"target directory {p} belongs to target {owner}, not {target_id} (the order of "
                                 "the node's targets changed, or mounts were swapped); not opened")
        return fid, False
    fresh = not any(e.name not in _NOT_DATA for e in p.iterdir())
    fid = uuid.uuid4().hex
    tmp = p / (FORMAT_ID_FILE + _TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (fid + "\n" + (f"target {target_id}\n" if target_id else "")).encode("ascii"))
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
