"""``loomfs admin token create|show|revoke``: client tokens (docs/security.md).

A token is made from the cluster secret (``--secret-file``, else ``$LOOMFS_SECRET_FILE``, else the
local cluster's ``cluster.secret``); nothing is sent to the cluster. ``revoke`` appends the id to
the revocation file every service's ``rpc.revoked_file`` names.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from loomfs.net.auth import SECRET_FILE_ENV
from loomfs.net.credentials import (
    CredentialError,
    create_token,
    load_secret_file,
    load_token_file,
    rights_for,
    token_text,
    write_token_file,
)

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_ttl_s(text: str) -> float:
    """``3600``, ``90m``, ``12h``, ``30d``, ``2w`` -> seconds."""
    t = text.strip().lower()
    mult = _UNITS_S.get(t[-1:], 0)
    try:
        value = float(t[:-1] if mult else t) * (mult or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad ttl {text!r} (e.g. 3600, 90m, 12h, 30d)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("ttl must be positive")
    return value


def _groups(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(g) for g in text.split(",") if g.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"groups must be comma-separated gids, got {text!r}") from None


def register(asub: argparse._SubParsersAction) -> None:
    t = asub.add_parser("token", help="client tokens: create, show, revoke")
    tsub = t.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    c = tsub.add_parser("create", help="make a token from the cluster secret (printed, or written 0600)")
    c.add_argument("--uid", type=int, required=True)
    c.add_argument("--gid", type=int, required=True)
    c.add_argument("--groups", type=_groups, default=(), help="supplementary gids, comma-separated")
    c.add_argument("--tenant", default="", help="tenant (its root directory; '' = whole namespace)")
    kind = c.add_mutually_exclusive_group()
    kind.add_argument("--read-only", action="store_true", help="may read, never change anything")
    kind.add_argument("--admin", action="store_true", help="may also drain, create chain tables, run fsck")
    c.add_argument("--ttl", type=parse_ttl_s, default=parse_ttl_s("30d"), help="lifetime (default 30d)")
    c.add_argument("--secret-file", default=None, help="the cluster secret (default $LOOMFS_SECRET_FILE or "
                   "the local cluster's cluster.secret)")
    c.add_argument("--out", "-o", default=None, help="write the token file here (mode 0600) instead of stdout")
    c.set_defaults(func=cmd_create)
    s = tsub.add_parser("show", help="print a token file's claims (not its key)")
    s.add_argument("file")
    s.set_defaults(func=cmd_show)
    r = tsub.add_parser("revoke", help="refuse a token from now on, cluster-wide (mgmtd's list; every "
                        "service polls it within seconds), or in a revocation file")
    r.add_argument("token", help="a token id, or a token file")
    r.add_argument("--revoked-file", default=None,
                   help="append to this file (rpc.revoked_file) instead of telling mgmtd")
    r.set_defaults(func=cmd_revoke)


def _secret_file(args: argparse.Namespace) -> str:
    if args.secret_file:
        return str(args.secret_file)
    if os.environ.get(SECRET_FILE_ENV):
        return os.environ[SECRET_FILE_ENV]
    from loomfs.cli.common import cluster_dir

    path = cluster_dir(args) / "cluster.secret"
    if not path.exists():
        raise SystemExit(f"loomfs: no cluster secret: pass --secret-file (none at {path})")
    return str(path)


def cmd_create(args: argparse.Namespace) -> int:
    try:
        secret = load_secret_file(_secret_file(args))
    except CredentialError as exc:
        raise SystemExit(f"loomfs: {exc}") from None
    cred = create_token(secret, uid=args.uid, gid=args.gid, groups=args.groups, tenant=args.tenant,
                        rights=rights_for(read_only=args.read_only, admin=args.admin), ttl_s=args.ttl,
                        now_s=time.time())
    if args.out:
        write_token_file(args.out, cred)
        print(f"token {cred.claims.token_id} written to {args.out} (expires "
              f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(cred.claims.expires_at_s))}); "
              f"use it with LOOMFS_TOKEN_FILE={Path(args.out).resolve()}", file=sys.stderr)
    else:
        sys.stdout.write(token_text(cred))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    try:
        cred = load_token_file(args.file)
    except CredentialError as exc:
        raise SystemExit(f"loomfs: {exc}") from None
    claims = cred.claims.to_wire()
    claims["expires"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(cred.claims.expires_at_s))
    claims["rights_names"] = str(cred.claims.identity().rights)
    print(json.dumps(claims, indent=2))
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    token_id, until_s = args.token, 0.0
    if Path(args.token).is_file():
        try:
            cred = load_token_file(args.token)
        except CredentialError as exc:
            raise SystemExit(f"loomfs: {exc}") from None
        token_id, until_s = cred.claims.token_id, float(cred.claims.expires_at_s)
    if args.revoked_file:
        with open(args.revoked_file, "a") as f:
            f.write(f"{token_id}\n")
        print(f"token {token_id} revoked in {args.revoked_file} (services re-read it within a second)")
        return 0
    import asyncio

    from loomfs.cli.admin import _call
    from loomfs.wire import auth as wa

    rsp = asyncio.run(_call(args, wa.REVOKE_TOKEN, wa.RevokeTokenReq(token_id=token_id, until_s=until_s)))
    print(f"token {token_id} revoked ({len(rsp.token_ids)} revoked tokens in the cluster; services "
          "refuse it within a few seconds, on open connections too)")
    return 0
