"""A LocalCluster whose every service runs on its own network-namespace host (issue 12 item 4).

Each mgmtd, meta and storage process gets a ``NetnsLab`` host of its own and binds (and
registers with mgmtd) that host's address, on the production ports (mgmtd 8000, meta
8100, storage 8200 on every host: the addresses differ, so nothing clashes). Client hosts
run test programs. Everything else is LocalCluster's (configs, start order, waits,
cluster.json, credentials: auth ON, each service's TOML names the cluster secret): a client connects with ``loomfs.connect(cluster.root)`` from
any host (with ``client_env()``: the admin token), or from this process (the root namespace
reaches the bridge; LocalCluster sets ``$LOOMFS_TOKEN_FILE`` while the cluster runs).

PostgreSQL (metastore, mgmtd lease store) runs in the root namespace; services reach it by
its unix socket (``PgServer.url()``: pathname unix sockets are not per network namespace),
so a cut host still reaches the database. Cuts here are for storage, meta and client hosts.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loomfs.errors import LoomError
from loomfs.net.auth import TOKEN_FILE_ENV
from loomfs.testing.cluster import LocalCluster, ServiceProc
from loomfs.testing.netns import Host, NetnsLab

PORTS = {"mgmtd": 8000, "meta": 8100, "storage": 8200}
METRICS_OFFSET = 1  # /metrics on port + 1 (mgmtd 8001, meta 8101, storage 8201, as in deploy/k8s)


@dataclass
class HostedProc(ServiceProc):
    host: str = "127.0.0.1"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class NetnsCluster(LocalCluster):
    """``NetnsCluster(root, lab, storage_nodes=3, meta_nodes=2, mgmtd_servers=2, ...)``: the
    LocalCluster options, each service on a host named after it (``mgmtd``, ``mgmtd2``,
    ``meta1``, ``storage1``...). ``stop()`` stops the services; the lab is the caller's."""

    def __init__(self, root: str | Path, lab: NetnsLab, *, domains: dict[str, str] | None = None, **kwargs: Any):
        """``domains``: storage service name -> failure-domain label (``StorageConfig.domain``)."""
        if kwargs.get("tls"):
            raise ValueError("NetnsCluster: tls=True makes a certificate for 127.0.0.1 only; not on hosts")
        super().__init__(root, **kwargs)
        self.lab = lab
        self.domains = dict(domains or {})
        self.host_of: dict[str, Host] = {}

    # ---- layout: one host per service, production ports --------------------------------------
    def _plan(self) -> None:
        self.base_port = PORTS["mgmtd"]  # (LocalCluster's mgmtd /metrics: base + 9, overridden below)
        plan = [("mgmtd", "mgmtd", 0)]
        plan += [(f"meta{i}", "meta", 100 + i) for i in range(1, self.meta_nodes + 1)]
        plan += [(f"storage{i}", "storage", i) for i in range(1, self.storage_nodes + 1)]
        plan += [(f"mgmtd{i}", "mgmtd", 0) for i in range(2, self.mgmtd_servers + 1)]
        self.services = {}
        for name, kind, node_id in plan:
            self.services[name] = self._hosted(name, kind, node_id)

    def _hosted(self, name: str, kind: str, node_id: int) -> HostedProc:
        host = self.lab.hosts.get(name) or self.lab.add_host(name)
        self.host_of[name] = host
        return HostedProc(name, kind, PORTS[kind], node_id, str(self.root / name), host=host.address)

    def _config(self, s: ServiceProc) -> dict[str, Any]:
        cfg = super()._config(s)  # credentials and every other setting LocalCluster gives
        assert isinstance(s, HostedProc)
        cfg["host"] = s.host
        if s.kind == "storage" and s.name in self.domains:
            cfg["domain"] = self.domains[s.name]
        cfg["metrics_port"] = s.port + METRICS_OFFSET if s.name == "mgmtd" or s.kind != "mgmtd" else -1
        return cfg

    @property
    def mgmtd_metrics_port(self) -> int:
        return PORTS["mgmtd"] + METRICS_OFFSET

    # ---- processes ----------------------------------------------------------------------------
    def service_argv(self, s: ServiceProc) -> list[str]:
        """LocalCluster's command, inside the service's host (``ip netns exec`` execs it: the
        pid LocalCluster holds is the service's)."""
        return self.lab.command(self.host_of[s.name], super().service_argv(s))

    def start_service(self, name: str) -> ServiceProc:
        """LocalCluster's, then wait until ``ip`` has exec'd the service: LocalCluster's own wait
        ends at ``ip netns exec ... --config`` (its command line names the config too), and while
        the kernel swaps in python /proc/PID/cmdline reads empty, which would look like a crash."""
        s = super().start_service(name)
        end = time.monotonic() + 10.0
        while time.monotonic() < end and s.pid and not (_exec_done(s.pid) and s.alive()):
            if not os.path.exists(f"/proc/{s.pid}"):
                break
            time.sleep(0.002)
        return s

    def client_env(self) -> dict[str, str]:
        """The environment for a client program on a client host: this source tree and the
        cluster's admin token (``$LOOMFS_TOKEN_FILE``; without it an auth cluster refuses)."""
        src = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=src + (os.pathsep + os.environ["PYTHONPATH"]
                                                  if os.environ.get("PYTHONPATH") else ""))
        if self.auth:
            env[TOKEN_FILE_ENV] = str(self.token_path)
        return env

    def wait_listening(self, name: str, timeout_s: float = 30.0) -> None:
        s = self.services[name]
        assert isinstance(s, HostedProc)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not s.alive():
                self._check_crashed()
            try:
                with socket.create_connection((s.host, s.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise LoomError(f"{name} is not listening on {s.address} after {timeout_s:.0f}s")

    def status(self) -> list[dict[str, Any]]:
        """LocalCluster's rows with each service's own address in its /metrics URL."""
        rows = super().status()
        ports: dict[tuple[str, int], int] = {}
        try:
            ports = {(n.host, n.port): n.metrics_port for n in self.routing().nodes}
        except (LoomError, OSError):
            pass  # no mgmtd: no metrics ports to show
        for row in rows:
            s = self.services[row["name"]]
            assert isinstance(s, HostedProc)
            port = self.mgmtd_metrics_port if s.kind == "mgmtd" else ports.get((s.host, s.port), 0)
            row["metrics"] = f"http://{s.host}:{port}/metrics" if row["state"] == "running" and port else ""
        return rows

    def add_storage_node(self, timeout_s: float = 30.0) -> ServiceProc:
        raise NotImplementedError("NetnsCluster: plan the storage hosts up front (storage_nodes=N)")

    # ---- hosts --------------------------------------------------------------------------------
    def host(self, name: str) -> Host:
        """The host of service ``name``, or a client host made by ``add_client_host``."""
        return self.host_of.get(name) or self.lab.hosts[name]

    def add_client_host(self, name: str) -> Host:
        return self.lab.hosts.get(name) or self.lab.add_host(name)

    def kill_host(self, name: str) -> None:
        """SIGKILL everything on the host; a service on it counts as crashed, not stopped."""
        self.lab.kill(self.host(name))
        if name in self.services:
            from loomfs.testing.cluster import _reap

            _reap(self.services[name].pid)

    def pause_host(self, name: str) -> None:
        self.lab.pause(self.host(name))

    def resume_host(self, name: str) -> None:
        self.lab.resume(self.host(name))

    def cut_host(self, name: str) -> None:
        self.lab.cut(self.host(name))

    def heal_host(self, name: str) -> None:
        self.lab.heal(self.host(name))

    def __repr__(self) -> str:
        return f"NetnsCluster({self.root} {self.lab!r} services={len(self.services)})"


def _exec_done(pid: int) -> bool:
    """``ip netns exec`` has become the program (``/proc/PID/exe`` is no longer ``ip``)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) != "ip"
    except OSError:
        return False
