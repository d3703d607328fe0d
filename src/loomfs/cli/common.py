"""Helpers shared by CLI commands: finding the cluster, formatting sizes."""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path
from typing import Any

DEFAULT_DIR = "loomfs-local"


def cluster_dir(args: argparse.Namespace) -> Path:
    d = getattr(args, "local_dir", None) or args.cluster_dir or os.environ.get("LOOMFS_CLUSTER")
    if d and ":" in d and not Path(d).exists():
        raise SystemExit(f"{d!r} looks like an address; use --mgmtd for a remote cluster")
    return Path(d or DEFAULT_DIR).resolve()


START_HINT = "start one with `loomfs local up`, or pass --dir DIR / --mgmtd HOST:PORT"


class NoCluster(SystemExit):
    """No cluster where the command looked: a one-line hint, exit status 1 (no traceback)."""

    def __init__(self, where: str, hint: str = START_HINT):
        self.where, self.hint = where, hint
        super().__init__(f"loomfs: no LoomFS cluster at {where}: {hint}")


def target(args: argparse.Namespace, hint: str = START_HINT) -> str:
    """What loomfs.connect() should get: a mgmtd address or a cluster directory. A directory
    that holds no ``cluster.json`` (and is not an address) ends the command with a one-line
    hint (``NoCluster``) instead of a traceback from deeper down."""
    use_token_file(getattr(args, "token_file", None))
    if getattr(args, "mgmtd", None):
        return str(args.mgmtd)
    env = os.environ.get("LOOMFS_CLUSTER")
    if getattr(args, "cluster_dir", None):
        raw = str(args.cluster_dir)
        if looks_like_address(raw) and not Path(raw).exists():
            return raw  # ``--dir HOST:PORT``: meant as --mgmtd
        where = str(Path(raw).resolve())
    elif env:
        where = env
    else:
        where = str(Path(DEFAULT_DIR).resolve())
    if looks_like_address(where) and not Path(where).exists():
        return where
    if not (Path(where) / "cluster.json").is_file():
        raise NoCluster(where, hint)
    use_cluster_token(Path(where))
    return where


def use_token_file(path: str | None) -> None:
    """``--token-file FILE``: this command's connections (and the processes it starts) prove it."""
    if path:
        from loomfs.net import auth

        os.environ[auth.TOKEN_FILE_ENV] = str(Path(path).resolve())


def use_cluster_token(root: Path) -> None:
    """A local cluster directory's admin token for this command's connections, unless the
    user gave a token of that cluster ($LOOMFS_TOKEN_FILE, --token-file; ``auth.cluster_token_file``)."""
    from loomfs.net import auth

    token = auth.cluster_token_file(root)
    if token:
        os.environ[auth.TOKEN_FILE_ENV] = token


def looks_like_address(text: str) -> bool:
    """``HOST:PORT[,HOST:PORT...]``: every part ends in ``:digits``."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    return bool(parts) and all(x.rpartition(":")[2].isdigit() and ":" in x for x in parts)


def connect(args: argparse.Namespace, hint: str = START_HINT) -> Any:
    import loomfs

    return loomfs.connect(target(args, hint))


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


def storage_fsync_settings(where: str) -> list[bool] | None:
    """``fsync_on_commit`` of each storage service of a local cluster directory (its
    ``storage*/config.toml``; this process's ``LOOMFS_STORAGE_FSYNC_ON_COMMIT`` is what
    ``local up`` passed on); None when ``where`` is an address or holds no storage config."""
    root = Path(where)
    configs = sorted(root.glob("storage*/config.toml")) if root.is_dir() else []
    if not configs:
        return None
    env = os.environ.get("LOOMFS_STORAGE_FSYNC_ON_COMMIT")
    out = []
    for c in configs:
        value = bool(tomllib.loads(c.read_text()).get("fsync_on_commit", False))
        if env is not None:
            value = env.lower() in ("1", "true", "yes", "on")
        out.append(value)
    return out
