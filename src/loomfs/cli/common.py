"""Helpers shared by CLI commands: finding the cluster, formatting sizes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

DEFAULT_DIR = "loomfs-local"


def cluster_dir(args: argparse.Namespace) -> Path:
    d = getattr(args, "local_dir", None) or args.cluster_dir or os.environ.get("LOOMFS_CLUSTER")
    if d and ":" in d and not Path(d).exists():
        raise SystemExit(f"{d!r} looks like an address; use --mgmtd for a remote cluster")
    return Path(d or DEFAULT_DIR).resolve()


def target(args: argparse.Namespace) -> str:
    """What loomfs.connect() should get: a mgmtd address or a cluster directory."""
    if args.mgmtd:
        return str(args.mgmtd)
    env = os.environ.get("LOOMFS_CLUSTER")
    if args.cluster_dir:
        return str(Path(args.cluster_dir).resolve())
    if env:
        return env
    return str(Path(DEFAULT_DIR).resolve())


def connect(args: argparse.Namespace) -> Any:
    import loomfs

    return loomfs.connect(target(args))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)
