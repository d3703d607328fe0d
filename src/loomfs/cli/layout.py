"""``loomfs layout set|get DIR``: per-directory layout inherited by new files."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from typing import Any

from loomfs.cli.common import connect, human_bytes, parse_size
from loomfs.wire.types import Layout


def parse_ec(text: str) -> tuple[int, int]:
    """``"4+2"`` -> (4, 2); ``"off"`` -> (0, 0) (replicated)."""
    if text in ("off", "none", "0"):
        return (0, 0)
    k, sep, m = text.partition("+")
    if not sep or not k.isdigit() or not m.isdigit() or int(k) < 1 or int(m) < 1:
        raise argparse.ArgumentTypeError(f"--ec wants K+M (e.g. 4+2) or off, got {text!r}")
    return (int(k), int(m))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("layout", help="show or set a directory's layout (chunk size, stripe, replicas)")
    lsub = p.add_subparsers(dest="layout_command", metavar="ACTION", required=True)
    s = lsub.add_parser("set", help="set the layout new files under DIR inherit")
    s.add_argument("path")
    s.add_argument("--chunk-size", type=parse_size, default=None, help="e.g. 1M, 4M (power of two)")
    s.add_argument("--stripe", type=int, default=None, help="number of chains a file spreads over")
    s.add_argument("--replicas", type=int, default=None, help="use a chain table with this many replicas")
    s.add_argument("--table", type=int, default=None, help="chain table id")
    s.add_argument("--ec", type=parse_ec, default=None, metavar="K+M",
                   help="erasure-code new files: K data + M parity fragments on K+M nodes (off: replicated)")
    s.add_argument("--durable", action=argparse.BooleanOptionalAction, default=None,
                   help="every replica fsyncs each write of new files before acking (checkpoints)")
    s.set_defaults(func=cmd_set)
    sc = lsub.add_parser("scrub", help="check every fragment of erasure-coded files under PATH (CRC32C, "
                                       "versions); --repair rewrites bad or lost ones (rebuild after a failure)")
    sc.add_argument("path")
    sc.add_argument("--repair", action="store_true", help="rewrite absent, corrupt or stale fragments")
    sc.set_defaults(func=cmd_scrub)
    cv = lsub.add_parser("convert", help="rewrite a file, or every file under a directory, erasure-coded or "
                                         "replicated (copy, then atomic rename over it; old chunks to GC)")
    cv.add_argument("path")
    cv.add_argument("--ec", type=parse_ec, required=True, metavar="K+M", help="K+M, or off for replicated")
    cv.add_argument("--chunk-size", type=parse_size, default=None, help="e.g. 1M (default: the file's)")
    cv.set_defaults(func=cmd_convert)
    g = lsub.add_parser("get", help="show the layout of a file or directory")
    g.add_argument("path")
    g.set_defaults(func=cmd_get)


def _show(path: str, lay: object) -> None:
    if lay is None:
        print(f"{path}: no layout")
        return
    if getattr(lay, "ec_k", 0):
        print(f"{path}: ec {lay.ec_k}+{lay.ec_m} chunk_size={human_bytes(lay.chunk_size)} "  # type: ignore[attr-defined]
              f"table={lay.table_id or 'any single-replica'} chains={list(lay.chains) or '-'}")  # type: ignore[attr-defined]
        return
    print(f"{path}: chunk_size={human_bytes(lay.chunk_size)} stripe={lay.stripe} "  # type: ignore[attr-defined]
          f"table={lay.table_id} replicas={lay.replicas or 'table default'} "  # type: ignore[attr-defined]
          f"chains={list(lay.chains) or '-'}"  # type: ignore[attr-defined]
          + (" durable" if getattr(lay, "durable", False) else ""))


def cmd_set(args: argparse.Namespace) -> int:
    if args.ec is not None and args.ec[0]:
        why = ec_capacity_problem(args, args.ec)
        if why:
            print(f"{args.path}: {why}")
            return 2
    with connect(args) as fs:
        if args.ec is not None:
            lay = fs.set_layout(args.path, ec_layout(fs.get_layout(args.path) or Layout(), args.ec,
                                                     chunk_size=args.chunk_size, table_id=args.table))
        else:
            lay = fs.set_layout(args.path, chunk_size=args.chunk_size, stripe=args.stripe,
                                replicas=args.replicas, table_id=args.table)
        if args.durable is not None:
            lay = fs.set_layout(args.path, durable=args.durable)
        _show(args.path, lay)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    with connect(args) as fs:
        _show(args.path, fs.get_layout(args.path))
    return 0


def ec_layout(cur: Layout, ec: tuple[int, int], *, chunk_size: int | None = None,
              table_id: int | None = None) -> Layout:
    """``cur`` turned erasure-coded (or back to replicated with ``(0, 0)``)."""
    k, m = ec
    if k:
        return dataclasses.replace(cur, chains=[], ec_k=k, ec_m=m, replicas=1, stripe=k + m, inline_max_bytes=0,
                                   chunk_size=chunk_size or cur.chunk_size,
                                   table_id=table_id if table_id is not None else 0)
    return dataclasses.replace(cur, chains=[], ec_k=0, ec_m=0, replicas=0, stripe=Layout().stripe,
                               inline_max_bytes=-1, chunk_size=chunk_size or cur.chunk_size,
                               table_id=table_id if table_id is not None else Layout().table_id)


def ec_files(fs: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, attr) of every erasure-coded file at or under ``path``."""
    if not fs.isdir(path):
        attr = fs.attr(path)
        if attr.layout is not None and attr.layout.ec_k:
            yield path, attr
        return
    for top, _dirs, files in fs.walk(path):
        for name in files:
            p = f"{top.rstrip('/')}/{name}"
            attr = fs.attr(p, follow_symlinks=False)
            if attr.layout is not None and attr.layout.ec_k and not attr.inline:
                yield p, attr


def cmd_scrub(args: argparse.Namespace) -> int:
    from loomfs.client.ec_rebuild import scrub_file

    worst = 0
    with connect(args) as fs:
        for p, attr in ec_files(fs, args.path):
            rep = fs.run(scrub_file(fs.client.storage, p, attr, repair=args.repair))
            if args.repair and rep.full_redundancy and attr.layout is not None and attr.layout.ec_reduced:
                # every fragment checked and good: reads need not compare versions any more
                # (unless a reduced write marked the file again meanwhile: meta keeps that)
                fs.run(fs.client.meta.sync(attr.inode, -1, ec_reduced_done=attr.layout.ec_reduced))
            state = "ok" if rep.full_redundancy else ("LOST STRIPES" if rep.lost_stripes else "degraded")
            print(f"{p}: {rep.stripes} stripes, {rep.bad_fragments} bad fragments, {rep.repaired_fragments} "
                  f"repaired, {rep.unreachable_fragments} unreachable, {rep.lost_stripes} lost: {state}")
            worst = max(worst, 0 if rep.full_redundancy else (2 if rep.lost_stripes else 1))
    return worst


def cmd_convert(args: argparse.Namespace) -> int:
    from loomfs.client.ec_convert import convert_tree

    failed = 0
    with connect(args) as fs:
        try:
            done = convert_tree(fs, args.path, args.ec, chunk_size=args.chunk_size)
        except OSError as exc:
            print(f"{args.path}: {exc}")
            return 1
        for c in done:
            print(f"{c.path}: " + (f"skipped ({c.skipped})" if c.skipped else f"converted, {human_bytes(c.bytes)}"))
    return failed


def ec_capacity_problem(args: argparse.Namespace, ec: tuple[int, int]) -> str:
    """Why the cluster cannot place ``ec`` files, or "": no EC group's table (``ChainTable.ec``;
    a replicated single-replica table is none) on k+m nodes, or, with ``--table``, that
    single-replica table spans fewer (meta takes a table named explicitly as it is)."""
    from loomfs.cli.admin import fetch_routing

    r = fetch_routing(args)
    node_of = {t.target_id: t.node_id for t in r.targets}
    named = getattr(args, "table", None)
    best = 0
    for table in r.tables:
        if (table.table_id != named or table.replicas != 1) if named else not table.ec:
            continue
        chains = [c for c in r.chains if c.table_id == table.table_id and c.targets]
        best = max(best, len({node_of.get(c.targets[0]) for c in chains}))
    k, m = ec
    if best >= k + m:
        return ""
    what = f"chain table {named} (single-replica)" if named else "the EC group's table"
    if best == 0:
        if named:
            return f"ec {k}+{m}: chain table {named} is no single-replica table of this cluster"
        return (f"ec {k}+{m} needs an EC group's chain table on {k + m} storage nodes; this cluster has none "
                "(loomfs admin create-chain-table --replicas 1 --targets-per-node 1 --ec, or mark an old one: "
                "loomfs admin table set-ec TABLE --yes)")
    return f"ec {k}+{m} needs {k + m} storage nodes; {what} spans {best}"
