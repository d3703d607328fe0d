"""Retention: keep the last N checkpoints and every K-th step; verify one against its CRCs.
No torch import (the CLI uses it)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from loomfs.checkpoint import _layout as L
from loomfs.checkpoint._format_light import crc

VERIFY_BLOCK_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class PrunePlan:
    keep: list[str]
    delete: list[str]  # checkpoint directories, then abandoned staging directories
    # kept checkpoints older than the last ``keep_last`` (the every-K-th ones): converted to an
    # erasure-coded layout when ``prune`` is given ``archive_ec`` (cold: 1.5x space, not 3x)
    archive: list[str] = dataclasses.field(default_factory=list)

    def __repr__(self) -> str:
        return f"PrunePlan(keep={len(self.keep)}, delete={len(self.delete)}, archive={len(self.archive)})"


def plan_prune(checkpoints: list[L.CheckpointInfo], *, keep_last: int, keep_every: int = 0,
               latest: str | None = None) -> PrunePlan:
    """Pure: which checkpoints to keep (the last ``keep_last`` complete ones, every step that
    is a multiple of ``keep_every``, what ``latest`` names) and which to delete (the rest,
    incomplete ones older than the newest complete one included)."""
    if keep_last < 1:
        raise ValueError("keep_last must be >= 1 (the latest checkpoint is always kept)")
    complete = [c for c in checkpoints if c.complete]
    keep = {c.name for c in complete[-keep_last:]}
    if keep_every > 0:
        keep |= {c.name for c in complete if c.step % keep_every == 0}
    if latest is not None:
        keep.add(latest)
    newest = complete[-1] if complete else None
    delete = []
    for c in checkpoints:
        if c.name in keep:
            continue
        if not c.complete and (newest is None or (c.step, c.stamp) > (newest.step, newest.stamp)):
            keep.add(c.name)  # possibly a save in progress
            continue
        delete.append(c.name)
    recent = {c.name for c in complete[-keep_last:]} | ({latest} if latest is not None else set())
    archive = [c.name for c in complete if c.name in keep and c.name not in recent]
    return PrunePlan(keep=[c.name for c in checkpoints if c.name in keep], delete=delete, archive=archive)


def prune(fs: Any, run: str, *, keep_last: int, keep_every: int = 0, dry_run: bool = False,
          staging_age_s: float = L.STAGING_AGE_S, archive_ec: tuple[int, int] | None = None) -> PrunePlan:
    """Apply ``plan_prune`` to ``run``; also delete staging directories whose newest heartbeat
    is ``staging_age_s`` old (saves that crashed; ``L.staging_idle_s``; keep it well above
    ``L.HEARTBEAT_S``, the period a saving rank rewrites its heartbeat at). ``archive_ec`` =
    (k, m): the kept checkpoints older than the last ``keep_last`` are rewritten erasure-coded (``loomfs.client.ec_convert``: copy,
    check, atomic rename per file; already converted files are skipped). ``dry_run``: only say
    what would go."""
    plan = plan_prune(L.list_checkpoints(fs, run), keep_last=keep_last, keep_every=keep_every,
                      latest=L.read_latest(fs, run))
    now = time.time()
    stale = []
    for n in L.list_staging(fs, run):  # its newest heartbeat: a save in progress rewrites one
        try:
            if L.staging_idle_s(fs, L.join(run, n), now) >= staging_age_s:
                stale.append(n)
        except FileNotFoundError:
            continue
    plan = PrunePlan(keep=plan.keep, delete=plan.delete + stale, archive=plan.archive if archive_ec else [])
    if not dry_run:
        for name in plan.delete:  # renamed aside first: atomic for a save still writing into it
            L.remove_aside(fs, run, name)
        if archive_ec is not None:
            from loomfs.client.ec_convert import convert_tree

            for name in plan.archive:
                convert_tree(fs, L.join(run, name), archive_ec)
    return plan


@dataclasses.dataclass(slots=True)
class VerifyReport:
    path: str
    files: int = 0
    items: int = 0
    bytes_read: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)

    def __repr__(self) -> str:
        return f"VerifyReport({self.path!r}, items={self.items}, errors={len(self.errors)})"


def verify(fs: Any, ckpt: str) -> VerifyReport:
    """Re-read every byte of every item against the CRC32C in the manifest."""
    ckpt = L.resolve(fs, ckpt)
    rep = VerifyReport(ckpt)
    man = L.read_manifest(fs, ckpt)
    if not fs.exists(L.join(ckpt, L.METADATA_NAME)):
        rep.errors.append(f"{L.METADATA_NAME}: missing")
    for name, items in sorted(man.get("files", {}).items()):
        rep.files += 1
        try:
            f = fs.open(L.join(ckpt, name), "rb")
        except OSError as exc:
            rep.errors.append(f"{name}: {exc}")
            continue
        with f:
            for offset, length, want in items:
                rep.items += 1
                f.seek(offset)
                value, left = 0, length
                while left:
                    block = f.read(min(left, VERIFY_BLOCK_BYTES))
                    if not block:
                        break
                    value = crc(block, value)
                    left -= len(block)
                    rep.bytes_read += len(block)
                if left:
                    rep.errors.append(f"{name}@{offset}: file ends {left} bytes early")
                elif value != want:
                    rep.errors.append(f"{name}@{offset}+{length}: crc32c {value:#010x} != {want:#010x}")
    return rep
