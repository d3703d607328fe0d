"""A whole cluster as real OS processes on 127.0.0.1: mgmtd, meta(s), storage nodes.

Used by ``loomfs local up/status/down`` and by integration tests. State lives in one
directory: one sub-directory per service (config.toml, data, log), pid files, and
``cluster.json`` (addresses, pids) that clients read (``loomfs.connect(DIR)``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tomli_w

from loomfs.common.routing import MgmtdSet, parse_addresses
from loomfs.errors import LoomError
from loomfs.net.auth import TLS_CA_FILE_ENV, TOKEN_FILE_ENV, AuthConfig, tls_contexts
from loomfs.net.credentials import (
    CredentialError,
    create_token,
    derive_key,
    load_secret_file,
    load_token_file,
    rights_for,
    write_secret_file,
    write_token_file,
)
from loomfs.net.faults import ENV_VAR as FAULTS_ENV_VAR
from loomfs.net.faults import Rule, write_rules
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.testing.certs import make_cert_set
from loomfs.wire import mgmtd as wm
from loomfs.wire.types import NodeKind, NodeState, RoutingInfo, TargetState

logger = logging.getLogger(__name__)

STATE_FILE = "cluster.json"
SECRET_FILE = "cluster.secret"
TOKEN_FILE = "admin.token"
_PROCESS_SECRET: bytes | None = None  # the secret new clusters of this process share
ADMIN_TOKEN_TTL_S = 365 * 86400.0  # a local cluster's admin token (renewed at start when under an hour is left)


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


class LocalCluster:
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

    # ---- credentials (docs/security.md) ---------------------------------------------------
    @property
    def secret_path(self) -> Path:
        return self.root / SECRET_FILE

    @property
    def token_path(self) -> Path:
        """The admin token of this cluster (clients of the tests and of ``loomfs local up``)."""
        return self.root / TOKEN_FILE

    def _ensure_credentials(self) -> None:
        """A cluster secret and an admin token (kept across restarts; mode 0600)."""
        global _PROCESS_SECRET
        if not self.auth:
            return
        if not self.secret_path.exists():
            # every new cluster of this process shares one secret: a client holding any of their
            # tokens ($LOOMFS_TOKEN_FILE names the latest) is accepted by all of them
            _PROCESS_SECRET = write_secret_file(self.secret_path, _PROCESS_SECRET)
        secret = load_secret_file(self.secret_path)
        try:
            cred = load_token_file(self.token_path)
            fresh = cred.claims.expires_at_s > time.time() + 3600 and derive_key(secret, cred.claims) == cred.key
        except CredentialError:
            fresh = False
        if not fresh:
            write_token_file(self.token_path, create_token(secret, uid=0, gid=0, rights=rights_for(admin=True),
                                                           ttl_s=ADMIN_TOKEN_TTL_S, now_s=time.time()))

    @property
    def tls_dir(self) -> Path:
        return self.root / "tls"

    def _ensure_tls(self) -> None:
        if self.tls and not (self.tls_dir / "server.pem").exists():
            make_cert_set(self.tls_dir)

    def _tls_settings(self) -> dict[str, str]:
        d = self.tls_dir
        return {"tls_cert_file": str(d / "server.pem"), "tls_key_file": str(d / "server.key"),
                "tls_ca_file": str(d / "ca.pem")} if self.tls else {}

    def client_auth(self) -> AuthConfig | None:
        """What this process's RPC clients of the cluster authenticate with (the admin token)."""
        if not self.auth and not self.tls:
            return None
        _, tls_client = tls_contexts("", "", str(self.tls_dir / "ca.pem")) if self.tls else (None, None)
        return AuthConfig(credential=load_token_file(self.token_path) if self.auth else None, tls_client=tls_client)

    def _rpc(self, **kw: Any) -> RpcClient:
        return RpcClient(TcpTransport(auth=self.client_auth()), **kw)

    def _set_token_env(self) -> None:
        """Clients made in this process (``loomfs.connect``) and the commands it runs use the
        admin token while the cluster runs; the previous value comes back at stop()."""
        if not (self.auth or self.tls) or self._env_set:
            return
        self._saved_env = {k: os.environ.get(k) for k in (TOKEN_FILE_ENV, TLS_CA_FILE_ENV)}
        if self.auth:
            os.environ[TOKEN_FILE_ENV] = str(self.token_path)
        if self.tls:
            os.environ[TLS_CA_FILE_ENV] = str(self.tls_dir / "ca.pem")
        self._env_set = True

    def _restore_token_env(self) -> None:
        if not self._env_set:
            return
        self._env_set = False
        ours = {TOKEN_FILE_ENV: str(self.token_path), TLS_CA_FILE_ENV: str(self.tls_dir / "ca.pem")}
        for k, saved in self._saved_env.items():
            if os.environ.get(k) == ours[k]:
                if saved is None or not os.path.exists(saved):  # (an earlier cluster's, removed since)
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = saved

    def _config(self, s: ServiceProc) -> dict[str, Any]:
        cfg = self._service_config(s)
        if self.auth or self.tls:
            rpc = dict(cfg.get("rpc", {}))
            if self.auth:
                rpc.setdefault("secret_file", str(self.secret_path))
            for k, v in self._tls_settings().items():
                rpc.setdefault(k, v)
            cfg["rpc"] = rpc
        return cfg

    def _service_config(self, s: ServiceProc) -> dict[str, Any]:
        mg = self.mgmtd_addresses
        if s.kind == "mgmtd":
            ha = {"store_url": self.mgmtd_store, "mgmtd": mg} if self.mgmtd_store else {}
            return {"host": "127.0.0.1", "port": s.port, "data_dir": s.dir, "lease_s": self.lease_s,
                    "heartbeat_interval_s": self.heartbeat_interval_s, "default_replicas": self.replicas,
                    "replace_after_s": self.replace_after_s,
                    "metrics_port": self.mgmtd_metrics_port if s.name == "mgmtd" else -1,
                    **ha, **self.mgmtd_config}
        if s.kind == "meta":
            # every meta serves the same namespace: one database (``meta_store``), or one
            # shared SQLite file on this host
            return {"host": "127.0.0.1", "port": s.port, "node_id": s.node_id, "mgmtd": mg,
                    "data_dir": s.dir, "gc_delay_s": self.gc_delay_s, "metrics_port": s.port + METRICS_OFFSET,
                    "store_url": self.meta_store or f"sqlite:///{self.root / 'meta.db'}", **self.meta_config}
        targets = [str(Path(s.dir, f"target{j}"))
                   for j in range(1, self.targets_per_node + self.ec_targets_per_node + 1)]
        return {"host": "127.0.0.1", "port": s.port, "node_id": s.node_id, "mgmtd": mg,
                "data_dir": s.dir, "targets": targets, "metrics_port": s.port + METRICS_OFFSET,
                **self.storage_config}

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> None:
        """Start every service (or restart a stopped cluster from its directory). If start-up
        fails, the processes started so far are stopped again (nothing is left behind)."""
        if self.state_path.exists():
            self._load_state()
            running = [s.name for s in self.services.values() if s.alive()]
            if running:  # not ours to stop
                raise LoomError(f"cluster at {self.root} is already running ({', '.join(running)})")
        try:
            self._start(timeout_s)
        except BaseException:
            try:
                if self.services:
                    self.stop()
                else:  # failed while planning (ports in use): leave no empty cluster.json behind,
                    # so the next ``local up`` here starts afresh instead of reading a cluster
                    # with no services and no credentials
                    self._restore_token_env()
                    self.state_path.unlink(missing_ok=True)
            except Exception as exc:  # keep the start-up error, which says what went wrong
                logger.warning("stopping after a failed start: %s", exc)
            raise

    def _start(self, timeout_s: float) -> None:
        if self.state_path.exists():
            self._load_state()
            running = [s.name for s in self.services.values() if s.alive()]
            if running:
                raise LoomError(f"cluster at {self.root} is already running ({', '.join(running)})")
            for s in self.services.values():
                s.pid = 0  # stopped earlier; only processes started from here on are watched
            # a restart binds the saved ports again: one taken since would leave that service
            # dead at start-up while mgmtd still lists it from before (so the waits pass)
            self._refuse_busy(self._saved_ports())
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            self._plan()
        self._ensure_credentials()
        self._ensure_tls()
        self._set_token_env()
        for s in self.services.values():
            Path(s.dir).mkdir(parents=True, exist_ok=True)
            with open(s.config_path, "wb") as f:
                tomli_w.dump(self._config(s), f)
        self.start_service("mgmtd")
        self._write_state()
        self._wait(lambda r: True, timeout_s, "mgmtd")
        for name in self.mgmtd_names[1:]:  # standbys, once the first one is primary
            self.start_service(name)
        for s in self.services.values():
            if s.kind == "storage":
                self.start_service(s.name)
        n = self.storage_nodes
        self._wait(lambda r: sum(1 for x in r.nodes if x.kind == NodeKind.STORAGE
                                 and x.state == NodeState.ALIVE) >= n, timeout_s, "storage nodes")
        self._ensure_chain_table(timeout_s)
        for s in self.services.values():
            if s.kind == "meta":
                self.start_service(s.name)
        m = self.meta_nodes
        self._wait(lambda r: sum(1 for x in r.nodes if x.kind == NodeKind.META
                                 and x.state == NodeState.ALIVE) >= m, timeout_s, "meta")
        self._wait_ping_meta(timeout_s)
        self._write_state()

    def service_argv(self, s: ServiceProc) -> list[str]:
        """The command that runs service ``s`` (a subclass may wrap it, e.g. in ``ip netns exec``);
        credentials reach services through their config files, not this command."""
        return [sys.executable, "-m", f"loomfs.{s.kind}.server", "--config", s.config_path]

    def start_service(self, name: str) -> ServiceProc:
        s = self.services[name]
        if s.alive():
            return s
        env = dict(os.environ)
        env.update(self.extra_env)
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if self.fault_injection:
            env[FAULTS_ENV_VAR] = str(self.faults_path(name))
            self._write_faults(name)
        log = open(s.log_path, "ab")
        proc = subprocess.Popen(
            self.service_argv(s),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env, cwd=s.dir,
        )
        log.close()
        s.pid = proc.pid
        # until the child has exec'd, /proc/PID/cmdline is still ours, and alive() would call a
        # perfectly healthy process dead (then stop() would SIGTERM it): wait for the exec
        end = time.monotonic() + 10.0
        while proc.poll() is None and not s.alive() and time.monotonic() < end:
            time.sleep(0.002)
        Path(s.dir, "pid").write_text(str(proc.pid))
        self._write_state()
        return s

    # ---- network faults (fault_injection=True) ------------------------------------------
    def faults_path(self, name: str) -> Path:
        return self.root / "faults" / f"{name}.json"

    def _write_faults(self, name: str) -> None:
        path = self.faults_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_rules(path, self._fault_rules.get(name, []))

    def cut(self, a: str, b: str, *, action: str = "blackhole", both_ways: bool = True,
            delay_ms: float = 0.0) -> None:
        """Cut the network from service ``a`` to service ``b`` (and back, by default):
        ``blackhole`` drops every frame (a partition), ``reset`` refuses connections,
        ``delay`` slows every frame. Takes effect within 0.1 s, on existing connections too."""
        if not self.fault_injection:
            raise LoomError("this cluster was started without fault_injection=True")
        pairs = [(a, b), (b, a)] if both_ways else [(a, b)]
        for src, dst in pairs:
            rules = [r for r in self._fault_rules.get(src, []) if r.to != self.services[dst].address]
            rules.append(Rule(self.services[dst].address, action, delay_ms))
            self._fault_rules[src] = rules
            self._write_faults(src)

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Remove the cut between ``a`` and ``b`` (both ways), or every cut."""
        for src in list(self._fault_rules):
            if a is None:
                self._fault_rules[src] = []
            elif src in (a, b):
                other = b if src == a else a
                drop = {self.services[other].address} if other else {s.address for s in self.services.values()}
                self._fault_rules[src] = [r for r in self._fault_rules[src] if r.to not in drop]
            self._write_faults(src)

    def stop_service(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
        s = self.services[name]
        if not s.alive():
            return
        try:
            os.kill(s.pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not s.alive():
                break
            _reap(s.pid)
            time.sleep(0.05)
        else:
            try:
                os.kill(s.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            time.sleep(0.1)
        _reap(s.pid)
        s.pid = 0  # stopped on purpose: not a crash

    # ---- fault injection -------------------------------------------------------------------
    def pause_service(self, name: str) -> None:
        """SIGSTOP: the process hangs (a gray failure) until ``resume_service``."""
        s = self.services[name]
        if s.alive():
            os.kill(s.pid, signal.SIGSTOP)

    def resume_service(self, name: str) -> None:
        s = self.services[name]
        if s.pid:
            os.kill(s.pid, signal.SIGCONT)

    def add_storage_node(self, timeout_s: float = 30.0) -> ServiceProc:
        """Start one more storage process; its targets register as spares."""
        storage = [x for x in self.services.values() if x.kind == "storage"]
        node_id = max([x.node_id for x in storage], default=0) + 1
        assert self.base_port is not None
        port = self.base_port + 9 + node_id
        if not _port_free(port):
            raise LoomError(f"port {port} for storage{node_id} is in use")
        s = ServiceProc(f"storage{node_id}", "storage", port, node_id, str(self.root / f"storage{node_id}"))
        self.services[s.name] = s
        self.storage_nodes += 1
        Path(s.dir).mkdir(parents=True, exist_ok=True)
        with open(s.config_path, "wb") as f:
            tomli_w.dump(self._config(s), f)
        self.start_service(s.name)
        self._wait(lambda r: any(n.node_id == node_id and n.state == NodeState.ALIVE for n in r.nodes),
                   timeout_s, s.name)
        return s

    def wait_routing(self, ok: Any, timeout_s: float, what: str) -> RoutingInfo:
        """Poll mgmtd's routing until ``ok(routing)``; raise LoomError after ``timeout_s``."""
        return self._wait(ok, timeout_s, what)

    def fully_replicated(self, r: RoutingInfo | None = None) -> bool:
        """Every chain has ``replicas`` serving targets (full redundancy)."""
        r = r or self.routing()
        states = {t.target_id: t.state for t in r.targets}
        replicas = {t.table_id: t.replicas for t in r.tables}  # an EC table's chains have one
        return bool(r.chains) and all(
            sum(1 for t in c.targets if states.get(t) == TargetState.SERVING) >= replicas.get(c.table_id, self.replicas)
            for c in r.chains
        )

    def kill_service(self, name: str) -> None:
        self.stop_service(name, signal.SIGKILL, timeout_s=5.0)

    def restart_service(self, name: str, timeout_s: float = 30.0) -> None:
        self.stop_service(name)
        self.start_service(name)
        self.wait_listening(name, timeout_s)

    def wait_listening(self, name: str, timeout_s: float = 30.0) -> None:
        s = self.services[name]
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not s.alive():
                self._check_crashed()
            try:
                with socket.create_connection(("127.0.0.1", s.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise LoomError(f"{name} is not listening on {s.address} after {timeout_s:.0f}s")

    def stop(self) -> None:
        """Stop exactly the processes this cluster started (meta first, mgmtd last)."""
        if not self.services and self.state_path.exists():
            self._load_state()
        order = sorted(self.services.values(), key=lambda s: {"meta": 0, "storage": 1, "mgmtd": 2}[s.kind])
        for s in order:
            self.stop_service(s.name)
        self._write_state()
        self._restore_token_env()

    @property
    def mgmtd_metrics_port(self) -> int:
        """mgmtd is not in routing, so its /metrics port is fixed: base + 9 (between meta and storage)."""
        assert self.base_port is not None
        return self.base_port + 9

    def status(self) -> list[dict[str, Any]]:
        if not self.services and self.state_path.exists():
            self._load_state()
        metrics: dict[tuple[str, int], int] = {}
        try:
            metrics = {(n.host, n.port): n.metrics_port for n in self.routing().nodes}
        except (LoomError, OSError):
            pass  # mgmtd down: no metrics ports to show
        out = []
        for s in self.services.values():
            alive = s.alive()
            mport = self.mgmtd_metrics_port if s.name == "mgmtd" else metrics.get(("127.0.0.1", s.port), 0)
            out.append({"name": s.name, "kind": s.kind, "pid": s.pid if alive else 0,
                        "address": s.address, "state": "running" if alive else "stopped",
                        "metrics": f"http://127.0.0.1:{mport}/metrics" if alive and mport else "",
                        "log": s.log_path})
        return out

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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

    @classmethod
    def from_dir(cls, root: str | Path) -> LocalCluster:
        c = cls(root)
        if not c.state_path.exists():
            raise LoomError(f"no local cluster at {c.root} (no {STATE_FILE}); run `loomfs local up`")
        c._load_state()
        return c

    # ---- health ----------------------------------------------------------------------------
    def routing(self) -> RoutingInfo:
        async def go() -> RoutingInfo:
            rpc = self._rpc(connect_timeout_s=1.0)
            try:
                mgmtd = MgmtdSet(rpc, parse_addresses(self.mgmtd_addresses))
                rsp = await mgmtd.call(wm.GET_ROUTING, wm.GetRoutingReq(), timeout_s=2.0, retry=False)
                assert rsp.body.routing is not None
                return rsp.body.routing
            finally:
                await rpc.close()

        return _run(go())

    def chunks_of(self, inode: int) -> list[tuple[int, Any]]:
        """(target_id, ChunkMeta) for every chunk of ``inode`` on every running storage node."""
        from loomfs.wire.storage import QUERY_CHUNKS, QueryChunksReq

        routing = self.routing()
        running = {s.node_id for s in self.services.values() if s.kind == "storage" and s.alive()}
        nodes = {n.node_id: n for n in routing.nodes
                 if n.node_id in running and n.state == NodeState.ALIVE}

        async def go() -> list[tuple[int, Any]]:
            rpc = self._rpc(connect_timeout_s=1.0)
            out: list[tuple[int, Any]] = []
            try:
                for t in routing.targets:
                    n = nodes.get(t.node_id)
                    if n is None:
                        continue  # stopped or dead: nothing to ask
                    rsp = await rpc.call(Address(n.host, n.port), QUERY_CHUNKS,
                                         QueryChunksReq(target_id=t.target_id, inode=inode), timeout_s=5.0)
                    out += [(t.target_id, c) for c in rsp.body.chunks]
            finally:
                await rpc.close()
            return out

        return _run(go())

    def _wait(self, ok: Any, timeout_s: float, what: str) -> RoutingInfo:
        end = time.monotonic() + timeout_s
        last: BaseException | None = None
        while time.monotonic() < end:
            self._check_crashed()
            try:
                r = self.routing()
                if ok(r):
                    return r
            except (LoomError, OSError) as exc:
                last = exc
            time.sleep(0.1)
        raise LoomError(f"timed out after {timeout_s:.0f}s waiting for {what} ({last}); logs in {self.root}")

    def _check_crashed(self) -> None:
        for s in self.services.values():
            if s.pid and not s.alive():
                _reap(s.pid)
                tail = Path(s.log_path).read_text(errors="replace")[-2000:] if Path(s.log_path).exists() else ""
                raise LoomError(f"{s.name} exited during start-up; log tail:\n{tail}")

    def _ensure_chain_table(self, timeout_s: float) -> None:
        r = self.routing()
        if r.tables:
            return

        async def go() -> None:
            rpc = self._rpc()
            try:
                ec = self.ec_targets_per_node
                mgmtd = MgmtdSet(rpc, parse_addresses(self.mgmtd_addresses))
                await mgmtd.call(wm.CREATE_CHAIN_TABLE,
                                 wm.CreateChainTableReq(replicas=self.replicas,
                                                        targets_per_node=self.targets_per_node if ec else 0),
                                 timeout_s=timeout_s)
                if ec:
                    await mgmtd.call(wm.CREATE_CHAIN_TABLE, wm.CreateChainTableReq(replicas=1, targets_per_node=ec),
                                     timeout_s=timeout_s)
            finally:
                await rpc.close()

        _run(go())

    def _wait_ping_meta(self, timeout_s: float) -> None:
        from loomfs.wire.message import Empty
        from loomfs.wire.meta import META_PING

        async def go() -> None:
            rpc = self._rpc(connect_timeout_s=1.0)
            end = time.monotonic() + timeout_s
            try:
                for s in self.services.values():
                    if s.kind != "meta":
                        continue
                    while True:
                        try:
                            await rpc.call(Address.parse(s.address), META_PING, Empty(), timeout_s=2.0,
                                           retry=False)
                            break
                        except (LoomError, OSError):
                            if time.monotonic() > end:
                                raise
                            await asyncio.sleep(0.1)
            finally:
                await rpc.close()

        _run(go())

    def __repr__(self) -> str:
        return f"LocalCluster({self.root} base_port={self.base_port} services={len(self.services)})"


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass


def _run(coro: Any) -> Any:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
