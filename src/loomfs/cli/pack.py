"""``loomfs pack`` and ``loomfs unpack``: many small files <-> shards with an index.

Paths are local unless written ``loom:/path`` (the cluster of ``-C``/``--mgmtd``/
``$LOOMFS_CLUSTER``) or ``loom://HOST:PORT/path``:

    loomfs pack ./images loom:/datasets/images --shard-size 256M
    loomfs pack 'loom:/raw/**/*.jpg' loom:/datasets/jpg --format tfrecord
    loomfs unpack loom:/datasets/images ./images-again
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from loomfs.cli.common import human_bytes, parse_size, target


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pack", help="pack many small files into shards (WebDataset tar or TFRecord) with an index")
    p.add_argument("source", metavar="SRC_DIR_OR_GLOB",
                   help="a directory or glob; local, or loom:/path on LoomFS (quote globs)")
    p.add_argument("dest", metavar="DEST", help="directory for the shards and index.json (loom:/path for LoomFS)")
    p.add_argument("--shard-size", default="256M", help="bytes per shard, e.g. 256M, 1G (default 256M)")
    p.add_argument("--format", choices=("tar", "tfrecord"), default="tar", help="shard format (default tar)")
    p.add_argument("--prefix", default="shard-", help="shard file name prefix (default shard-)")
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("unpack", help="write the samples of shards back as files")
    p.add_argument("source", metavar="SHARDS",
                   help="a packed dataset's directory, or a directory/glob of .tar/.tfrecord/.rec shards")
    p.add_argument("dest", metavar="DEST_DIR", help="directory for the files (loom:/path for LoomFS)")
    p.set_defaults(func=cmd_unpack)


def _where(text: str, args: argparse.Namespace) -> tuple[Any, str]:
    from loomfs.shards.store import location

    if text.startswith("loom:"):
        return location(text, target(args))
    return location(text, None, default="file")


class _Ticker:
    """A one-line progress report on a terminal (nothing when stderr is not one)."""

    def __init__(self, verb: str):
        self.verb = verb
        self.t0 = time.monotonic()
        self.last = 0.0
        self.on = sys.stderr.isatty()

    def __call__(self, samples: int, nbytes: int) -> None:
        now = time.monotonic()
        if self.on and now - self.last >= 0.5:
            self.last = now
            print(f"\r{self.verb} {samples} samples, {human_bytes(nbytes)}", end="", file=sys.stderr)

    def done(self) -> None:
        if self.on and self.last:
            print("\r\033[K", end="", file=sys.stderr)


def cmd_pack(args: argparse.Namespace) -> int:
    from loomfs.shards.store import close_clients

    try:
        return _pack(args)
    finally:
        close_clients()


def cmd_unpack(args: argparse.Namespace) -> int:
    from loomfs.shards.store import close_clients

    try:
        return _unpack(args)
    finally:
        close_clients()


def _pack(args: argparse.Namespace) -> int:
    from loomfs.shards.pack import pack

    src, source = _where(args.source, args)
    dst, dest = _where(args.dest, args)
    try:
        shard_bytes = parse_size(args.shard_size)
    except ValueError:
        print(f"loomfs pack: bad --shard-size {args.shard_size!r} (e.g. 256M, 1G)", file=sys.stderr)
        return 2
    tick = _Ticker("packed")
    try:
        result = pack(src, source, dst, dest, fmt=args.format, shard_bytes=shard_bytes, prefix=args.prefix,
                      progress=tick)
    except ValueError as exc:
        tick.done()
        print(f"loomfs pack: {exc}", file=sys.stderr)
        return 2
    tick.done()
    m = result.manifest
    rate = result.bytes / max(result.seconds, 1e-9)
    print(f"packed {m.samples} samples into {len(m.shards)} {m.format} shard(s), {human_bytes(result.bytes)}, "
          f"at {dst.url(dest)} in {result.seconds:.2f}s ({human_bytes(rate)}/s)")
    return 0


def _unpack(args: argparse.Namespace) -> int:
    from loomfs.shards.pack import unpack

    src, source = _where(args.source, args)
    dst, dest = _where(args.dest, args)
    t0 = time.monotonic()
    tick = _Ticker("unpacked")
    try:
        n = unpack(src, source, dst, dest, progress=tick)
    except ValueError as exc:
        tick.done()
        print(f"loomfs unpack: {exc}", file=sys.stderr)
        return 2
    tick.done()
    print(f"unpacked {n} samples to {dst.url(dest)} in {time.monotonic() - t0:.2f}s")
    return 0
