"""``loomfs admin tenant create NAME --uid U --gid G | list``: tenants' root directories
(``loomfs.meta.tenancy``). Needs an ADMIN token (a local cluster's own admin token is used
by default). A tenant's users then get tokens naming it (``loomfs admin token create
--tenant NAME``) and see its root as "/"."""

from __future__ import annotations

import argparse
import json
import sys

from loomfs.cli.common import connect
from loomfs.wire import meta as wmeta
from loomfs.wire.message import Empty


def register(asub: argparse._SubParsersAction) -> None:
    p = asub.add_parser("tenant", help="tenants: create one (its root directory), list them")
    tsub = p.add_subparsers(dest="tenant_command", metavar="ACTION", required=True)
    c = tsub.add_parser("create", help="create a tenant and its empty root directory")
    c.add_argument("name", help="1-64 of [A-Za-z0-9._-]")
    c.add_argument("--uid", type=int, default=0, help="owner of the tenant's root directory")
    c.add_argument("--gid", type=int, default=0)
    c.add_argument("--mode", type=lambda s: int(s, 8), default=0o755, help="octal (default 755)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_create)
    ls = tsub.add_parser("list", help="list tenants: number, root owner and mode")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)


def _row(t: wmeta.TenantInfo) -> dict[str, object]:
    r = t.root
    return {"name": t.name, "number": t.number, "root_inode": r.inode if r else 0,
            "uid": r.uid if r else -1, "gid": r.gid if r else -1, "mode": f"{r.mode:o}" if r else ""}


def cmd_create(args: argparse.Namespace) -> int:
    fs = connect(args)
    try:
        req = wmeta.TenantCreateReq(name=args.name, uid=args.uid, gid=args.gid, mode=args.mode)
        t = fs.run(fs.client.meta.call(wmeta.TENANT_CREATE, req))
    except OSError as exc:
        print(f"loomfs: tenant create {args.name}: {exc}", file=sys.stderr)
        return 1
    finally:
        fs.close()
    row = _row(t)
    print(json.dumps(row) if args.json else
          f"tenant {row['name']} created: number {row['number']}, root owned by {row['uid']}:{row['gid']} "
          f"mode {row['mode']}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    fs = connect(args)
    try:
        rsp = fs.run(fs.client.meta.call(wmeta.TENANT_LIST, Empty()))
    except OSError as exc:
        print(f"loomfs: tenant list: {exc}", file=sys.stderr)
        return 1
    finally:
        fs.close()
    rows = [_row(t) for t in rsp.tenants]
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            print(f"{r['number']:>5}  {r['name']:<24} root {r['uid']}:{r['gid']} {r['mode']}")
    return 0
