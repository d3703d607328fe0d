"""Layout conversion (``loomfs layout convert``): rewrite files erasure-coded or replicated.

A file is converted by copy and atomic switch: its bytes are copied into a new file created in
a staging directory that carries the wanted layout (``/.loomfs-convert/<layout>``), the copy
is closed (committed), and the copy is renamed over the source only if the source is still
the file that was copied (same inode, size and mtime) and no writer has it open: checked in
the rename's own meta transaction (``RenameReq.expect_inode``), so a writer's change, even one
sent to storage and not reported yet, is never lost: the file is left as it was (EBUSY) and
a later run converts it. Readers see the old file or the new one, never a mix; the old
inode's chunks go to GC like any replaced file's. Mode and times are kept. A file with
several hard links is skipped (the rename would split them).

Blocking (runs on the caller's thread through the sync client), usable from checkpoint
retention: ``convert_file(fs, path, (4, 2))``.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import stat as stat_mod
import uuid
from dataclasses import dataclass
from typing import Any

from loomfs.errors import LoomError
from loomfs.wire.types import Layout

logger = logging.getLogger(__name__)

STAGING_DIR = "/.loomfs-convert"
COPY_BLOCK_BYTES = 16 << 20


@dataclass
class Converted:
    path: str
    bytes: int
    skipped: str = ""  # why the file was left as it was ("" = converted)


def _target_layout(cur: Layout, ec: tuple[int, int], chunk_size: int | None,
                   durable: bool | None = None) -> Layout:
    from loomfs.cli.layout import ec_layout

    lay = ec_layout(cur, ec, chunk_size=chunk_size)
    return lay if durable is None else dataclasses.replace(lay, durable=durable)


def _same_kind(lay: Layout | None, ec: tuple[int, int], chunk_size: int | None,
               durable: bool | None = None) -> bool:
    if lay is None:
        return False
    want_cs = chunk_size or lay.chunk_size
    return ((lay.ec_k, lay.ec_m) == ec and lay.chunk_size == want_cs
            and (durable is None or lay.durable == durable))


def staging_dir(fs: Any, ec: tuple[int, int], chunk_size: int, durable: bool = False) -> str:
    """The staging directory whose new files get the wanted layout (created on first use):
    one per layout, a durable one (checkpoints: every replica or fragment fsyncs each commit)
    apart, so a copy keeps its file's durability."""
    name = f"ec{ec[0]}+{ec[1]}" if ec[0] else "replicated"
    d = f"{STAGING_DIR}/{name}-{chunk_size >> 10}k" + ("-durable" if durable else "")
    fs.makedirs(d, exist_ok=True)
    lay = fs.get_layout(d)
    if not _same_kind(lay, ec, chunk_size, durable):
        fs.set_layout(d, _target_layout(lay or Layout(), ec, chunk_size, durable))
    return d


def convert_file(fs: Any, path: str, ec: tuple[int, int], *, chunk_size: int | None = None) -> Converted:
    """Rewrite ``path`` as ``ec`` = (k, m) (``(0, 0)``: replicated). Returns what was done."""
    attr = fs.attr(path, follow_symlinks=False)
    if not stat_mod.S_ISREG(fs.lstat(path).st_mode):
        return Converted(path, 0, "not a regular file")
    if _same_kind(attr.layout, ec, chunk_size):
        return Converted(path, 0, "already in that layout")
    if attr.nlink > 1:
        return Converted(path, 0, f"{attr.nlink} hard links")
    cs = chunk_size or (attr.layout.chunk_size if attr.layout is not None else Layout().chunk_size)
    durable = attr.layout is not None and attr.layout.durable  # kept: a checkpoint stays fsynced
    tmp = f"{staging_dir(fs, ec, cs, durable)}/{attr.inode:x}-{uuid.uuid4().hex[:12]}"
    copied = 0
    try:
        with fs.open(path, "rb") as src, fs.open(tmp, "wb") as dst:
            buf = memoryview(bytearray(COPY_BLOCK_BYTES))
            while n := src.readinto(buf):
                dst.write(buf[:n])
                copied += n
        # closed: every chunk of the copy is committed on all its replicas / fragments
        fs.chmod(tmp, stat_mod.S_IMODE(fs.lstat(path).st_mode))
        fs.utime(tmp, ns=(attr.atime_ns, attr.mtime_ns))
        try:
            fs.rename(tmp, path, expect=(attr.inode, attr.size, attr.mtime_ns))
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            raise LoomError(f"{path} changed or is open for writing; left as it was ({exc})",
                            path=path) from exc
    except BaseException:
        try:
            fs.unlink(tmp)
        except OSError:
            pass
        raise
    logger.info("%s: converted to %s (%d bytes)", path, f"ec {ec[0]}+{ec[1]}" if ec[0] else "replicated", copied)
    return Converted(path, copied)


def convert_tree(fs: Any, path: str, ec: tuple[int, int], *, chunk_size: int | None = None) -> list[Converted]:
    """Convert ``path`` (a file) or every regular file under it (a directory, whose layout for
    new files is set too)."""
    if not fs.isdir(path):
        return [convert_file(fs, path, ec, chunk_size=chunk_size)]
    cur = fs.get_layout(path) or Layout()
    fs.set_layout(path, _target_layout(cur, ec, chunk_size))
    out: list[Converted] = []
    for top, _dirs, files in fs.walk(path):
        if top.rstrip("/").startswith(STAGING_DIR):
            continue
        for name in files:
            out.append(convert_file(fs, f"{top.rstrip('/')}/{name}", ec, chunk_size=chunk_size))
    return out
