"""Metadata ops/s by metastore and number of meta servers (issue 12, item 7).

Starts its own clusters, one after another, each with one storage node: 1 meta server on
SQLite (the file on this host), then 1 and 2 stateless meta servers on one private
PostgreSQL server (``loomfs.testing.pgserver``, started here and stopped at the end). On each
it runs the mdtest phases (create, stat, readdir, unlink of empty files) with ``procs``
client processes, in one directory per process and in one shared directory (where
PostgreSQL's serialisable transactions collide and re-run). Every figure is held against the
raw loopback round trips of the same run (x2 pairs for several processes): a metadata call
is at least one round trip.

Client processes pick a meta server at random each (``MetaClient``), so with 2 servers the
load is spread, not split exactly. This machine has 2 cores: the clients, the meta servers
and PostgreSQL share them, so more servers here show the cost of the extra hop and of
conflicts more than the scaling a cluster of hosts would get.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from loomfs.bench.parallel import parallel_mdtest
from loomfs.bench.workloads import Result
from loomfs.testing.cluster import LocalCluster
from loomfs.testing.pgserver import PgServer

# (label, engine, meta servers)
CONFIGS: tuple[tuple[str, str, int], ...] = (("sqlite_1meta", "sqlite", 1), ("postgres_1meta", "postgresql", 1),
                                             ("postgres_2meta", "postgresql", 2))
PHASES = ("create", "stat", "readdir", "unlink")


def steps(configs: tuple[tuple[str, str, int], ...] = CONFIGS) -> int:
    """Progress steps of one run (the PostgreSQL start, then per cluster: up, 2 directory modes)."""
    return 1 + 3 * len(configs)


def run_metaservers(lim: dict[str, float], *, files: int, procs: int = 4,
                    step: Callable[[str], None] = lambda s: None,
                    configs: tuple[tuple[str, str, int], ...] = CONFIGS) -> list[Result]:
    """``files`` per process, ``procs`` client processes (at most 4 on this machine)."""
    procs = max(1, min(procs, 4))
    out: list[Result] = []
    # /tmp: as root the private PostgreSQL runs as user postgres, who must reach the directory
    root = tempfile.mkdtemp(prefix="loomfs-bench-meta-", dir="/tmp" if os.path.isdir("/tmp") else None)
    pg: PgServer | None = None
    try:
        if any(engine == "postgresql" for _, engine, _ in configs):
            step("metaservers: private PostgreSQL server")
            pg = PgServer(f"{root}/pg").start()
        for label, engine, servers in configs:
            store = None
            if engine == "postgresql":
                assert pg is not None
                store = pg.url(schema=label)
            cluster = LocalCluster(f"{root}/{label}", storage_nodes=1, targets_per_node=1, replicas=1,
                                   meta_nodes=servers, meta_store=store)
            step(f"metaservers: {servers} meta server(s) on {engine}, cluster up")
            cluster.start(timeout_s=120)
            try:
                for shared in (False, True):
                    mode = "shared" if shared else "perproc"
                    step(f"metaservers: {label}, {procs} processes, {mode} dir")
                    md = parallel_mdtest(("loomfs", str(cluster.root)), f"/mm{mode}", procs, files, shared=shared)
                    out += _results(md, lim, label, engine, servers, procs, files, mode)
            finally:
                cluster.stop()
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def _results(md: dict[str, float], lim: dict[str, float], label: str, engine: str, servers: int, procs: int,
             files: int, mode: str) -> list[Result]:
    rtt_key = "round_trips_per_s" if procs == 1 else "round_trips_2pairs_per_s"
    rtt = lim.get(rtt_key) or lim.get("round_trips_per_s", 0.0)
    limit_name = "raw round trips" + ("" if procs == 1 else " x2")
    extra: dict[str, Any] = {"engine": engine, "meta_servers": servers, "procs": procs,
                             "files_per_proc": files, "dir": mode}
    from loomfs.bench.suite import readdir_limit  # (suite imports this module)

    out = []
    for phase in PHASES:
        name, value = (readdir_limit(lim, min(procs, 2)) if phase == "readdir" and "loopback_tcp_Bps" in lim
                       else (limit_name, rtt))
        out.append(Result(f"meta_{phase}_{label}_{mode}", md[phase], "entries/s" if phase == "readdir" else "ops/s",
                          name, value, dict(extra)))
    return out
