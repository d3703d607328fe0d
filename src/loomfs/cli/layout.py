"""``loomfs layout set|get DIR``: per-directory layout inherited by new files."""

from __future__ import annotations

import argparse

from loomfs.cli.common import connect, human_bytes, parse_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("layout", help="show or set a directory's layout (chunk size, stripe, replicas)")
    lsub = p.add_subparsers(dest="layout_command", metavar="ACTION", required=True)
    s = lsub.add_parser("set", help="set the layout new files under DIR inherit")
    s.add_argument("path")
    s.add_argument("--chunk-size", type=parse_size, default=None, help="e.g. 1M, 4M (power of two)")
    s.add_argument("--stripe", type=int, default=None, help="number of chains a file spreads over")
    s.add_argument("--replicas", type=int, default=None, help="use a chain table with this many replicas")
    s.add_argument("--table", type=int, default=None, help="chain table id")
    s.set_defaults(func=cmd_set)
    g = lsub.add_parser("get", help="show the layout of a file or directory")
    g.add_argument("path")
    g.set_defaults(func=cmd_get)


def _show(path: str, lay: object) -> None:
    if lay is None:
        print(f"{path}: no layout")
        return
    print(f"{path}: chunk_size={human_bytes(lay.chunk_size)} stripe={lay.stripe} "  # type: ignore[attr-defined]
          f"table={lay.table_id} replicas={lay.replicas or 'table default'} "  # type: ignore[attr-defined]
          f"chains={list(lay.chains) or '-'}")  # type: ignore[attr-defined]


def cmd_set(args: argparse.Namespace) -> int:
    with connect(args) as fs:
        lay = fs.set_layout(args.path, chunk_size=args.chunk_size, stripe=args.stripe,
                            replicas=args.replicas, table_id=args.table)
        _show(args.path, lay)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    with connect(args) as fs:
        _show(args.path, fs.get_layout(args.path))
    return 0
