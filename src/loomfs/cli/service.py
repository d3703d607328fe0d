"""``loomfs service KIND --config FILE``: run one service in the foreground."""

from __future__ import annotations

import argparse
import importlib


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("service", help="run one service (mgmtd, meta, storage) in the foreground")
    p.add_argument("kind", choices=["mgmtd", "meta", "storage"])
    p.add_argument("--config", required=True, help="the service's TOML config file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    mod = importlib.import_module(f"loomfs.{args.kind}.server")
    mod.main(["--config", args.config])
    return 0
