"""What a ``LocalCluster`` is: its settings (the constructor), its services
(``ServiceProc``: name, kind, port, directory, pid) and their ports, and the state file
(``cluster.json``) that keeps both across ``loomfs local up/down`` and that clients read.

The base of ``LocalCluster`` (``testing.cluster``): ``ClusterConfig`` (credentials, config
files), ``ClusterWaits`` (mgmtd queries, waits, status) and ``ClusterFaults`` build on it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loomfs.errors import LoomError
from loomfs.net.faults import Rule

STATE_FILE = "cluster.json"


@dataclass
class ServiceProc:
    name: str  # mgmtd, meta1, storage1...
    kind: str  # mgmtd | meta | storage
    port: int
    node_id: int
    dir: str
    pid: int = 0

    @property
    def config_path(self) -> str:
        return str(Path(self.dir, "config.toml"))

    @property
    def log_path(self) -> str:
        return str(Path(self.dir, "service.log"))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.pid > 0 and _pid_runs(self.pid, self.config_path)


def _pid_runs(pid: int, config_path: str) -> bool:
    """True if ``pid`` is alive and is the process we started (its cmdline names our config)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.split(") ", 1)[-1].startswith("Z"):
        return False
    return config_path.encode() in cmdline


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# every meta and storage service serves /metrics on its own port + this (mgmtd: base + 9)
METRICS_OFFSET = 100


def _ephemeral_low(default: int = 32768) -> int:
    """The first port the kernel hands to outgoing connections (``ip_local_port_range``)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def find_base_port(span: int, start: int = 20000, stop: int | None = None) -> int:
    """A free range of ``span`` ports below the ephemeral range: a port checked free there can
    still be taken by an outgoing connection before the service binds it (EADDRINUSE at
    start-up, seen in CI with a PostgreSQL-backed cluster)."""
    import random

    if stop is None:
        stop = _ephemeral_low()
        if stop - span <= start:
            stop = 60000
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(start, stop - span)
        if all(_port_free(base + i) for i in range(span)):
            return base
    raise LoomError("no free port range found")


class ClusterState:
    """A local cluster's settings, services and state file."""

    def __init__(
        self,
        root: str | Path,
        *,
        storage_nodes: int = 3,
        targets_per_node: int = 2,
        replicas: int = 3,
        meta_nodes: int = 1,
        base_port: int | None = None,
        gc_delay_s: float = 5.0,
        heartbeat_interval_s: float = 1.0,
        lease_s: float = 5.0,
        extra_env: dict[str, str] | None = None,
        replace_after_s: float = 600.0,
        storage_config: dict[str, Any] | None = None,
        client_config: dict[str, Any] | None = None,
        mgmtd_config: dict[str, Any] | None = None,
        meta_config: dict[str, Any] | None = None,
        fault_injection: bool = False,
        ec_targets_per_node: int = 0,
        meta_store: str | None = None,
        mgmtd_servers: int = 1,
        mgmtd_store: str | None = None,
        auth: bool = True,
        tls: bool = False,
    ):
        """``meta_store``: the metastore URL every meta server uses (``postgresql://...``: N
        stateless meta servers on one database); default one SQLite file in ``root``.
        ``mgmtd_servers``: mgmtd processes (more than one: ``mgmtd_store`` is a
        ``postgresql://`` URL they share, one primary elected by lease, docs/mgmtd-ha.md).
        ``auth``: the services share a cluster secret (``ROOT/cluster.secret``) and refuse peers
        without credentials; ``ROOT/admin.token`` is an admin token, which this process's
        clients use (``$LOOMFS_TOKEN_FILE`` while the cluster runs; docs/security.md).
        ``tls``: every connection in TLS (a throw-away CA and certificate for 127.0.0.1 under
        ``ROOT/tls``, made with openssl; clients of this process get ``$LOOMFS_TLS_CA_FILE``)."""
        if mgmtd_servers > 1 and not (mgmtd_store or "").startswith(("postgresql://", "postgres://")):
            raise ValueError(f"{mgmtd_servers} mgmtd servers need a postgresql:// mgmtd_store")
        self.root = Path(root).resolve()
        self.meta_store = meta_store
        self.mgmtd_servers = mgmtd_servers
        self.mgmtd_store = mgmtd_store
        self.storage_nodes = storage_nodes
        self.targets_per_node = targets_per_node
        self.replicas = replicas
        self.meta_nodes = meta_nodes
        self.base_port = base_port
        self.gc_delay_s = gc_delay_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.lease_s = lease_s
        self.extra_env = extra_env or {}
        self.replace_after_s = replace_after_s
        self.storage_config = dict(storage_config or {})  # extra StorageConfig settings (tests)
        self.client_config = dict(client_config or {})
        self.mgmtd_config = dict(mgmtd_config or {})
        self.meta_config = dict(meta_config or {})  # extra MetaConfig settings (tests: root_squash)
        # every process reads network-fault rules from faults/<name>.json (see ``cut``)
        self.fault_injection = fault_injection
        self._fault_rules: dict[str, list[Rule]] = {}
        self.services: dict[str, ServiceProc] = {}
        # extra targets per node for a single-replica chain table (erasure-coded files, loomfs.ec)
        self.ec_targets_per_node = ec_targets_per_node
        self.auth = auth
        self.tls = tls
        self._saved_env: dict[str, str | None] = {}
        self._env_set = False

    # ---- layout ---------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.root / STATE_FILE

    @property
    def mgmtd_address(self) -> str:
        """The first mgmtd (``mgmtd_addresses``: all of them, for clients)."""
        return self.services["mgmtd"].address

    @property
    def mgmtd_names(self) -> list[str]:
        return [s.name for s in self.services.values() if s.kind == "mgmtd"]

    @property
    def mgmtd_addresses(self) -> str:
        return ",".join(self.services[n].address for n in self.mgmtd_names)

    def _plan(self) -> None:
        span = METRICS_OFFSET + 20 + self.storage_nodes
        base = self.base_port if self.base_port is not None else find_base_port(span)
        services = [0, *range(1, 1 + self.meta_nodes), 9, *range(10, 10 + self.storage_nodes)]
        metrics = [i + METRICS_OFFSET for i in services if i not in (0, 9)]  # meta and storage
        self._refuse_busy([base + i for i in services + metrics])
        self.base_port = base
        svcs = [ServiceProc("mgmtd", "mgmtd", base, 0, str(self.root / "mgmtd"))]
        for i in range(1, self.meta_nodes + 1):
            svcs.append(ServiceProc(f"meta{i}", "meta", base + i, 100 + i, str(self.root / f"meta{i}")))
        for i in range(1, self.storage_nodes + 1):
            svcs.append(ServiceProc(f"storage{i}", "storage", base + 9 + i, i, str(self.root / f"storage{i}")))
        # mgmtd 2..N after the storage ports (the span leaves room for them)
        svcs += [ServiceProc(f"mgmtd{i}", "mgmtd", base + 8 + self.storage_nodes + i, 0, str(self.root / f"mgmtd{i}"))
                 for i in range(2, self.mgmtd_servers + 1)]
        self.services = {s.name: s for s in svcs}

    def _saved_ports(self) -> list[int]:
        """The ports a restart binds: every service's, meta's and storage's /metrics, mgmtd's."""
        ports = [s.port for s in self.services.values()]
        ports += [s.port + METRICS_OFFSET for s in self.services.values() if s.kind in ("meta", "storage")]
        return ports + ([self.mgmtd_metrics_port] if self.base_port is not None else [])

    @staticmethod
    def _refuse_busy(ports: list[int]) -> None:
        busy = sorted(p for p in set(ports) if not _port_free(p))
        if busy:
            raise LoomError(f"ports already in use: {busy} (pick another --base-port)", errno=errno.EADDRINUSE)

    @property
    def mgmtd_metrics_port(self) -> int:
        """mgmtd is not in routing, so its /metrics port is fixed: base + 9 (between meta and storage)."""
        assert self.base_port is not None
        return self.base_port + 9

    # ---- state file ------------------------------------------------------------------------
    def _write_state(self) -> None:
        data = {
            "mgmtd": self.mgmtd_addresses,
            "mgmtd_servers": self.mgmtd_servers,
            "mgmtd_store": self.mgmtd_store,
            "base_port": self.base_port,
            "storage_nodes": self.storage_nodes,
            "targets_per_node": self.targets_per_node,
            "ec_targets_per_node": self.ec_targets_per_node,
            "replicas": self.replicas,
            "meta_nodes": self.meta_nodes,
            "meta_store": self.meta_store,
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "lease_s": self.lease_s,
            "replace_after_s": self.replace_after_s,
            "storage_config": self.storage_config,
            "meta_config": self.meta_config,
            "auth": self.auth,
            "tls": self.tls,
            "services": [asdict(s) for s in self.services.values()],
        }
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.state_path)

    def _load_state(self) -> None:
        data = json.loads(self.state_path.read_text())
        self.base_port = data["base_port"]
        self.storage_nodes = data["storage_nodes"]
        self.targets_per_node = data["targets_per_node"]
        self.ec_targets_per_node = data.get("ec_targets_per_node", 0)
        self.replicas = data["replicas"]
        self.meta_nodes = data["meta_nodes"]
        self.meta_store = data.get("meta_store")
        self.mgmtd_servers = data.get("mgmtd_servers", 1)
        self.mgmtd_store = data.get("mgmtd_store")
        self.heartbeat_interval_s = data.get("heartbeat_interval_s", self.heartbeat_interval_s)
        self.lease_s = data.get("lease_s", self.lease_s)
        self.replace_after_s = data.get("replace_after_s", self.replace_after_s)
        self.storage_config = data.get("storage_config", self.storage_config)
        self.meta_config = data.get("meta_config", self.meta_config)
        self.auth = data.get("auth", False)  # clusters made before auth existed run without
        self.tls = data.get("tls", False)
        self.services = {d["name"]: ServiceProc(**d) for d in data["services"]}
