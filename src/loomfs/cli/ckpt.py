"""``loomfs ckpt``: the checkpoints of a run directory on LoomFS (written by
``loomfs.checkpoint.LoomStorageWriter``). Paths are LoomFS paths (``loom:`` prefix optional):

    loomfs ckpt ls /runs/a                     # steps, times, sizes, which one is latest
    loomfs ckpt show /runs/a [--step 100]      # the manifest of latest (or of a step)
    loomfs ckpt verify /runs/a                 # re-read every byte against its CRC32C
    loomfs ckpt prune /runs/a --keep-last 3 --keep-every 1000 [--dry-run]
    loomfs ckpt rm /runs/a/step-000100-20261202T101500Z
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from loomfs.cli.common import connect, human_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ckpt", help="list, show, verify, remove and prune checkpoints of a run directory")
    verbs = p.add_subparsers(dest="ckpt_command", metavar="VERB", required=True)

    v = verbs.add_parser("ls", help="the run's checkpoints, oldest first")
    v.add_argument("run", metavar="RUN_DIR")
    v.set_defaults(func=cmd_ls)

    v = verbs.add_parser("show", help="a checkpoint's manifest (latest unless --step)")
    v.add_argument("run", metavar="RUN_DIR_OR_CKPT")
    v.add_argument("--step", type=int, default=None)
    v.set_defaults(func=cmd_show)

    v = verbs.add_parser("verify", help="re-read every byte against the stored CRC32C (latest unless --step)")
    v.add_argument("run", metavar="RUN_DIR_OR_CKPT")
    v.add_argument("--step", type=int, default=None)
    v.set_defaults(func=cmd_verify)

    v = verbs.add_parser("rm", help="remove checkpoint directories")
    v.add_argument("paths", metavar="CKPT_DIR", nargs="+")
    v.set_defaults(func=cmd_rm)

    v = verbs.add_parser("prune", help="keep the last N and every K-th step, delete the rest")
    v.add_argument("run", metavar="RUN_DIR")
    v.add_argument("--keep-last", type=int, required=True, help="keep the newest N complete checkpoints")
    v.add_argument("--keep-every", type=int, default=0, help="also keep steps that are multiples of K")
    v.add_argument("--staging-age", type=float, default=3600.0,
                   help="delete staging dirs of crashed saves older than this many seconds (default 3600)")
    v.add_argument("--dry-run", "-n", action="store_true", help="only list what would be deleted")
    v.add_argument("--archive-ec", type=_parse_ec, default=None, metavar="K+M",
                   help="rewrite kept checkpoints older than the last N erasure-coded (e.g. 4+2)")
    v.set_defaults(func=cmd_prune)


def _path(text: str) -> str:
    return text.removeprefix("loom:") or "/"


def _pick(fs: Any, run: str, step: int | None) -> str:
    from loomfs.checkpoint import _layout as L

    if step is None:
        return L.resolve(fs, run)
    found = [c for c in L.list_checkpoints(fs, run) if c.step == step and c.complete]
    if not found:
        raise FileNotFoundError(2, f"no complete checkpoint of step {step}", run)
    return found[-1].path


def cmd_ls(args: argparse.Namespace) -> int:
    from loomfs.checkpoint import _layout as L

    run = _path(args.run)
    with connect(args) as fs:
        latest = L.read_latest(fs, run)
        for c in L.list_checkpoints(fs, run):
            size = sum(fs.stat(L.join(c.path, n)).st_size for n in fs.listdir(c.path))
            flags = ("latest " if c.name == latest else "") + ("" if c.complete else "INCOMPLETE")
            print(f"{c.name}  step {c.step:>8}  {human_bytes(size):>10}  {flags}".rstrip())
        for name in L.list_staging(fs, run):
            print(f"{name}  (staging: in progress or crashed)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from loomfs.checkpoint import _layout as L

    with connect(args) as fs:
        ckpt = _pick(fs, _path(args.run), args.step)
        man = L.read_manifest(fs, ckpt)
    man["path"] = ckpt
    man["files"] = {n: {"items": len(v), "bytes": sum(x[1] for x in v)} for n, v in man.get("files", {}).items()}
    print(json.dumps(man, indent=2, sort_keys=True))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from loomfs.checkpoint import verify

    with connect(args) as fs:
        rep = verify(fs, _pick(fs, _path(args.run), args.step))
    for err in rep.errors:
        print(f"{rep.path}: {err}")
    print(f"{rep.path}: {rep.files} files, {rep.items} items, {human_bytes(rep.bytes_read)} read, "
          f"{len(rep.errors)} errors")
    return 1 if rep.errors else 0


def cmd_rm(args: argparse.Namespace) -> int:
    from loomfs.checkpoint import _layout as L

    with connect(args) as fs:
        for text in args.paths:
            path = _path(text).rstrip("/")
            name = path.rsplit("/", 1)[-1]
            if L.parse_step(name) is None and L.parse_staging_step(name) is None:
                raise ValueError(f"{text}: not a checkpoint directory (step-NNNNNN-<UTC> or .staging-...)")
            run = path.rsplit("/", 1)[0] or "/"
            if L.read_latest(fs, run) == name:
                fs.unlink(L.join(run, L.LATEST_NAME))  # readers fall back to the newest complete one
            fs.rmtree(path)
            print(f"removed {path}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from loomfs.checkpoint import prune

    with connect(args) as fs:
        plan = prune(fs, _path(args.run), keep_last=args.keep_last, keep_every=args.keep_every,
                     dry_run=args.dry_run, staging_age_s=args.staging_age, archive_ec=args.archive_ec)
    verb = "would delete" if args.dry_run else "deleted"
    for name in plan.delete:
        print(f"{verb} {name}")
    archived = set(plan.archive)
    for name in plan.keep:
        if name in archived:
            k, m = args.archive_ec
            print(f"{'would archive' if args.dry_run else 'archived'} {name} (ec {k}+{m})")
        else:
            print(f"kept {name}")
    return 0


def _parse_ec(text: str) -> tuple[int, int]:
    from loomfs.cli.layout import parse_ec

    k, m = parse_ec(text)
    if not k:
        raise argparse.ArgumentTypeError("--archive-ec wants K+M (e.g. 4+2)")
    return k, m
