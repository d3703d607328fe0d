"""``loomfs`` command line: one module per command group, this file only dispatches."""

from __future__ import annotations

import argparse
import os
import sys

from loomfs.cli import (
    admin,
    bench,
    ckpt,
    dashboard,
    demo,
    fs,
    layout,
    local,
    mount,
    pack,
    service,
    top,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loomfs",
        description="LoomFS: a distributed file system for AI training and inference.",
    )
    p.add_argument(
        "--dir", "-C", dest="cluster_dir", default=None,
        help="local cluster directory (default: $LOOMFS_CLUSTER, else ./loomfs-local)",
    )
    p.add_argument("--mgmtd", default=None, help="mgmtd address HOST:PORT (instead of --dir)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in (local, fs, admin, layout, demo, bench, top, dashboard, service, pack, mount, ckpt):
        mod.register(sub)
    return p


def describe(exc: OSError) -> str:
    """'PATH: No such file or directory (detail)' from any OSError."""
    std = os.strerror(exc.errno) if exc.errno else ""
    detail = exc.strerror or ""
    parts = [str(exc.filename)] if getattr(exc, "filename", None) else []
    text = std or detail or str(exc)
    if detail and detail != std and detail not in parts:
        text += f" ({detail})"
    parts.append(text)
    return ": ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"loomfs {args.command}: {describe(exc)}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
