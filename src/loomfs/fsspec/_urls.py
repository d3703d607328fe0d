"""``loom://`` URLs and the one blocking client per cluster the fsspec layer shares.

``loom://HOST:PORT[,HOST:PORT]/path`` names a cluster by its mgmtd address(es);
``loom:///path`` (no host) means ``$LOOMFS_CLUSTER`` (an address list or a local cluster
directory, see ``loomfs.client.sync.resolve_mgmtd``), or, when that is unset, the one
cluster this process already opened (``resolve_cluster``). Paths inside are absolute and
'/'-separated; glob characters are kept (fsspec expands them).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from loomfs.client.sync import LoomFS, connect, resolve_mgmtd
from loomfs.common.routing import parse_addresses
from loomfs.config import ClientConfig

PROTOCOL = "loom"
PREFIX = PROTOCOL + "://"

_clients: dict[tuple[str, str, str], LoomFS] = {}
_clients_lock = threading.Lock()


def _reset_lock() -> None:
    global _clients_lock
    _clients_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock)


def is_cluster(authority: str) -> bool:
    """Whether a URL's authority names a cluster: ``HOST:PORT[,HOST:PORT...]``."""
    try:
        return bool(parse_addresses(authority))
    except ValueError:
        return False


def split_url(url: str) -> tuple[str, str]:
    """``'loom://h:1/a/b'`` -> ``('h:1', '/a/b')``; ``'loom:///a'`` -> ``('', '/a')``; a
    path without the protocol -> ``('', path)``. An authority that is not ``HOST:PORT``
    (mgmtd addresses always carry a port) is the path's first component: ``'loom://a/b'``
    is ``'/a/b'``, as left by URL joins that fold ``loom:///a/b``'s empty authority."""
    if url.startswith(PREFIX):
        rest = url[len(PREFIX):]
        slash = rest.find("/")
        authority, path = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
        if not authority or is_cluster(authority):
            return authority, path
        return "", "/" + rest
    if url.startswith(PROTOCOL + ":"):
        return "", url[len(PROTOCOL) + 1:]
    return "", url


def strip_path(path: str) -> str:
    """A path as fsspec passes it around: absolute, no duplicate or trailing '/' (the root
    stays '/'); '.', '..' and glob characters are left for the client and fsspec."""
    _, p = split_url(path)
    parts = [c for c in p.split("/") if c]
    return "/" + "/".join(parts)


def resolve_cluster(cluster: str | None) -> str:
    """The mgmtd address list for a ``cluster`` option: as given, else ``$LOOMFS_CLUSTER``,
    else the one cluster this process already opened through ``loom://HOST:PORT`` URLs
    (so ``"loom://" + path``, how some libraries rebuild URLs from listed paths, still
    reaches it). Raises ValueError when none (or several) could be meant."""
    if cluster or os.environ.get("LOOMFS_CLUSTER"):
        return resolve_mgmtd(cluster or None)
    with _clients_lock:
        known = sorted({key[0] for key, fs in _clients.items() if not fs.closed})
    if len(known) == 1:
        return known[0]
    raise ValueError(
        "loom:///path names no cluster: use loom://HOST:PORT/path, pass cluster=... (fsspec "
        "storage option), or set LOOMFS_CLUSTER"
        + (f" (this process uses several: {', '.join(known)})" if known else "")
    )


def shared_client(mgmtd: str, consistency: str | None = None, config: ClientConfig | None = None) -> LoomFS:
    """The blocking client the fsspec layer uses for one cluster (and consistency mode):
    made on first use, kept for the process (it re-creates itself after ``fork``)."""
    key = (mgmtd, consistency or "", repr(config) if config is not None else "")
    with _clients_lock:
        fs = _clients.get(key)
        if fs is None or fs.closed:
            fs = _clients[key] = connect(mgmtd, config=config, consistency=consistency)
        return fs


def url_options(url: str) -> dict[str, Any]:
    """fsspec storage options a URL carries: its cluster, when it names one."""
    host, _ = split_url(url)
    return {"cluster": host} if host else {}


def close_clients() -> None:
    """Close the clients the fsspec layer shares (at exit they close by themselves); a
    filesystem used afterwards connects again."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for fs in clients:
        fs.close()
