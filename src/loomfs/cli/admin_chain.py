"""``loomfs admin table set-ec`` and ``loomfs admin chain accept-loss``: operator actions on chain
tables and chains that mgmtd never takes on its own (docs/fault-tolerance.md)."""

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
    c = asub.add_parser("chain", help="chain actions (accept-loss)")
    csub = c.add_subparsers(dest="chain_command", metavar="ACTION", required=True)
    a = csub.add_parser("accept-loss", help="a chain whose members all lost their disks serves again, empty: "
                                            "its data is given up for good")
    a.add_argument("chain", type=int, help="chain id")
    a.add_argument("--yes-lose-data", action="store_true", help="confirm: the chain's data is gone for good")
    a.add_argument("--give-up-dead", action="store_true",
                   help="also give up members on dead nodes that were not found blank (they may hold the data "
                        "if their node comes back)")
    a.set_defaults(func=cmd_accept_loss)


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


def cmd_accept_loss(args: argparse.Namespace) -> int:
    from loomfs.cli.admin import _call

    if not args.yes_lose_data:
        print(f"refused: chain {args.chain}'s data would be given up for good; add --yes-lose-data", file=sys.stderr)
        return 2
    body = asyncio.run(_call(args, wm.ACCEPT_CHAIN_LOSS,
                             wm.AcceptChainLossReq(chain_id=args.chain, confirm=True,
                                                   give_up_dead=args.give_up_dead)))
    gone = f"; given up (dead): {', '.join(map(str, body.given_up))}" if body.given_up else ""
    print(f"chain {args.chain} v{body.chain_version}: serves from empty target {body.target_id}{gone} "
          f"({body.accepted_losses} chain(s) accepted as lost so far)")
    return 0
