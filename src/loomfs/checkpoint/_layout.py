"""A run directory's layout, with no torch import (the CLI uses it):

    RUN/step-000123-20261202T101500Z/   a complete checkpoint (renamed in whole from staging)
        .metadata                       DCP's pickled Metadata (written last, by rank 0)
        loomfs-checkpoint.json          manifest: step, time, world size, files and item CRCs
        __0_0.distcp ...                each rank's data files
    RUN/.staging-step-000124-...-NONCE/ a save in progress (or abandoned by a crash); its
        .alive-rank-N, .alive-commit    heartbeats of the saving ranks, rewritten every minute
    RUN/latest                          the newest complete checkpoint's name, updated last
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import errno
import json
import re
import uuid
from typing import Any

METADATA_NAME = ".metadata"
MANIFEST_NAME = "loomfs-checkpoint.json"
LATEST_NAME = "latest"
STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".staging-trash-"  # a staging directory renamed aside, being deleted
STAGING_AGE_S = 3600.0  # a staging directory with no sign of life this long was abandoned
HEARTBEAT_PREFIX = ".alive-"  # a saving rank's heartbeat file in its staging directory (``_heartbeat``)
HEARTBEAT_S = min(STAGING_AGE_S / 4, 60.0)  # how often a saving rank rewrites it
_STEP_RE = re.compile(r"^step-(\d+)-(\d{8}T\d{6}Z)$")
_STAGING_RE = re.compile(r"^\.staging-(step-(\d+)-\d{8}T\d{6}Z)-[0-9a-f]+$")


def join(*parts: str) -> str:
    out = parts[0].rstrip("/") or "/"
    for p in parts[1:]:
        out = (out.rstrip("/") + "/" + p.strip("/")) if out != "/" else "/" + p.strip("/")
    return out


def utc_stamp(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.UTC)
    return now.strftime("%Y%m%dT%H%M%SZ")


def step_name(step: int, stamp: str | None = None) -> str:
    if step < 0:
        raise ValueError(f"step must be >= 0, not {step}")
    return f"step-{step:06d}-{stamp or utc_stamp()}"


def staging_name(final: str) -> str:
    return f"{STAGING_PREFIX}{final}-{uuid.uuid4().hex[:12]}"


def parse_step(name: str) -> int | None:
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def parse_staging_step(name: str) -> int | None:
    m = _STAGING_RE.match(name)
    return int(m.group(2)) if m else None


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointInfo:
    name: str
    step: int
    stamp: str
    path: str
    complete: bool

    def __repr__(self) -> str:
        return f"CheckpointInfo({self.name!r}, complete={self.complete})"


def list_checkpoints(fs: Any, run: str) -> list[CheckpointInfo]:
    """The run's ``step-*`` directories, oldest first (by step, then time)."""
    out = []
    for name in fs.listdir(run):
        step = parse_step(name)
        if step is None:
            continue
        path = join(run, name)
        out.append(CheckpointInfo(name, step, name.rsplit("-", 1)[1], path,
                                  fs.exists(join(path, METADATA_NAME))))
    out.sort(key=lambda c: (c.step, c.stamp))
    return out


def list_staging(fs: Any, run: str) -> list[str]:
    return sorted(n for n in fs.listdir(run) if n.startswith(STAGING_PREFIX))


def last_modified(fs: Any, path: str) -> float:
    """The newest mtime of a directory and its entries (a save writing into it moves it)."""
    newest = fs.stat(path).st_mtime
    for name in fs.listdir(path):
        try:
            newest = max(newest, fs.stat(join(path, name)).st_mtime)
        except FileNotFoundError:
            continue
    return float(newest)


def heartbeat_name(rank: int | None) -> str:
    """A rank's heartbeat file (None: the coordinator's tiered commit)."""
    return f"{HEARTBEAT_PREFIX}{'commit' if rank is None else f'rank-{rank}'}"


def staging_idle_s(fs: Any, path: str, now: float) -> float:
    """How long the staging directory ``path`` showed no sign of life at ``now``: since its
    newest heartbeat (each saving rank rewrites one every ``HEARTBEAT_S``: on LoomFS a file
    being written shows no new mtime until its close, nor does its directory); a directory
    without heartbeats (a save from before them) by the newest mtime of it and its entries."""
    names = fs.listdir(path)
    beats = [n for n in names if n.startswith(HEARTBEAT_PREFIX)]
    if not beats:
        return now - last_modified(fs, path)
    newest = None
    for name in beats:
        try:
            mtime = float(fs.stat(join(path, name)).st_mtime)
        except FileNotFoundError:  # being committed: its heartbeats are removed just before the rename
            return 0.0
        newest = mtime if newest is None else max(newest, mtime)
    assert newest is not None
    return now - newest


def remove_aside(fs: Any, run: str, name: str) -> bool:
    """Delete ``run/name`` by first renaming it aside (atomic): a save still writing into it
    then fails at its next create or its commit rename, instead of committing a directory
    that lost files to a half-done ``rmtree``. False when it was gone already."""
    trash = join(run, f"{TRASH_PREFIX}{uuid.uuid4().hex[:12]}")
    try:
        fs.rename(join(run, name), trash, no_replace=True)
    except FileNotFoundError:
        return False
    fs.rmtree(trash)
    return True


def read_latest(fs: Any, run: str) -> str | None:
    try:
        name = fs.cat(join(run, LATEST_NAME)).decode().strip()
    except FileNotFoundError:
        return None
    return name if parse_step(name) is not None else None


LATEST_ATTEMPTS = 20  # conditional renames of ``latest`` refused by a concurrent move


def _newer(a: str, b: str) -> bool:
    return (parse_step(a), a) > (parse_step(b), b)


def write_latest(fs: Any, run: str, name: str) -> bool:
    """Point ``latest`` at ``name`` (atomically: a fsynced temp file renamed over it), unless
    it already names a newer step. True when it was moved.

    On LoomFS the rename is conditional (``expect``: still the ``latest`` that was read, or
    ``no_replace`` when there was none), so two savers racing never move it backwards: the
    one whose read went stale reads again. Other file systems: read, compare, rename."""
    path = join(run, LATEST_NAME)
    tmp = join(run, f".{LATEST_NAME}.tmp-{uuid.uuid4().hex[:12]}")
    written = False
    try:
        for _ in range(LATEST_ATTEMPTS):
            attr = None
            if hasattr(fs, "attr"):
                try:
                    attr = fs.attr(path)  # before the content: a move after it fails the rename
                except FileNotFoundError:
                    attr = None
            cur = read_latest(fs, run)
            if cur is not None and _newer(cur, name):
                return False
            if not written:
                with fs.open(tmp, "wb") as f:
                    f.write(name.encode() + b"\n")
                    f.fsync()
                written = True
            if not hasattr(fs, "attr"):
                fs.rename(tmp, path)
                written = False
                return True
            try:
                if attr is None:
                    fs.rename(tmp, path, no_replace=True)
                else:
                    fs.rename(tmp, path, expect=(attr.inode, attr.size, attr.mtime_ns))
            except FileExistsError:  # another saver made the first one: look again
                continue
            except FileNotFoundError:  # it went (an operator's rm) between the look and the rename
                continue
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                continue  # moved since it was read: look again
            written = False
            return True
        raise OSError(errno.EBUSY, f"latest kept moving ({LATEST_ATTEMPTS} attempts)", path)
    finally:
        if written:
            try:
                fs.unlink(tmp)
            except FileNotFoundError:
                pass


def resolve(fs: Any, path: str) -> str:
    """A checkpoint directory from ``path``: itself when it holds ``.metadata``; else, as a run
    directory, what ``latest`` names (when complete), else its newest complete checkpoint."""
    if fs.exists(join(path, METADATA_NAME)):
        return path
    name = read_latest(fs, path) if fs.isdir(path) else None
    if name is not None and fs.exists(join(path, name, METADATA_NAME)):
        return join(path, name)
    done = [c for c in list_checkpoints(fs, path) if c.complete] if fs.isdir(path) else []
    if not done:
        raise FileNotFoundError(2, "no complete checkpoint", path)
    return done[-1].path


def read_manifest(fs: Any, ckpt: str) -> dict[str, Any]:
    data = json.loads(fs.cat(join(ckpt, MANIFEST_NAME)))
    if not isinstance(data, dict):
        raise ValueError(f"{ckpt}: bad manifest")
    return data
