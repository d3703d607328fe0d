"""``loomfs admin table set-ec``: operator actions on chain tables that mgmtd never takes on its
own (docs/fault-tolerance.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from loomfs.wire import mgmtd as wm


def register(asub: argparse._SubParsersAction) -> None:
    t = asub.add_parser("table", help="chain table actions (set-ec)")
    tsub = t.add_subparsers(dest="table_command", metavar="ACTION", required=True)
    s = tsub.add_parser("set-ec", help="mark a single-replica table as an EC group's (lost targets get empty "
                                       "spares; the EC layer rebuilds them), or --off: replicated")
    s.add_argument("table", type=int, help="chain table id")
    s.add_argument("--off", action="store_true", help="mark it replicated (lost targets are kept)")
    s.add_argument("--yes", action="store_true", help="confirm")
    s.set_defaults(func=cmd_set_ec)


def cmd_set_ec(args: argparse.Namespace) -> int:
    from loomfs.cli.admin import _call

    if not args.yes:
        print("refused: add --yes (marked EC, a single-replica chain whose target is lost is handed an empty "
              "spare; only the EC layer can rebuild its data)", file=sys.stderr)
        return 2
    body = asyncio.run(_call(args, wm.SET_TABLE_EC, wm.SetTableEcReq(table_id=args.table, ec=not args.off,
                                                                       confirm=True)))
    what = "an EC group's table" if body.ec else "replicated"
    print(f"chain table {body.table_id}: {what}{'' if body.changed else ' (already)'}")
    return 0

