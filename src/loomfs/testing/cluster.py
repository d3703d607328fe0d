"""A whole cluster as real OS processes on 127.0.0.1: mgmtd, meta(s), storage nodes.

Used by ``loomfs local up/status/down`` and by integration tests. State lives in one
directory: one sub-directory per service (config.toml, data, log), pid files, and
``cluster.json`` (addresses, pids) that clients read (``loomfs.connect(DIR)``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import tomli_w

from loomfs.errors import LoomError
from loomfs.net.faults import ENV_VAR as FAULTS_ENV_VAR
from loomfs.testing.cluster_config import ADMIN_TOKEN_TTL_S, SECRET_FILE, TOKEN_FILE
from loomfs.testing.cluster_faults import ClusterFaults
from loomfs.testing.cluster_state import (
    METRICS_OFFSET,
    STATE_FILE,
    ServiceProc,
    _port_free,
    _reap,
    find_base_port,
)
from loomfs.wire.types import NodeKind, NodeState

__all__ = ["ADMIN_TOKEN_TTL_S", "METRICS_OFFSET", "SECRET_FILE", "STATE_FILE", "TOKEN_FILE", "LocalCluster",
           "ServiceProc", "_reap", "find_base_port"]

logger = logging.getLogger(__name__)


class LocalCluster(ClusterFaults):
    """The cluster's processes: start (or restart from its directory), stop, kill, restart and
    add services. Its settings and state file are in ``ClusterState`` (``testing.cluster_state``),
    credentials and config files in ``ClusterConfig``, mgmtd queries and waits in
    ``ClusterWaits``, injected faults in ``ClusterFaults``."""

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

    def kill_service(self, name: str) -> None:
        self.stop_service(name, signal.SIGKILL, timeout_s=5.0)

    def restart_service(self, name: str, timeout_s: float = 30.0) -> None:
        self.stop_service(name)
        self.start_service(name)
        self.wait_listening(name, timeout_s)

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

    def stop(self) -> None:
        """Stop exactly the processes this cluster started (meta first, mgmtd last)."""
        if not self.services and self.state_path.exists():
            self._load_state()
        order = sorted(self.services.values(), key=lambda s: {"meta": 0, "storage": 1, "mgmtd": 2}[s.kind])
        for s in order:
            self.stop_service(s.name)
        self._write_state()
        self._restore_token_env()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @classmethod
    def from_dir(cls, root: str | Path) -> LocalCluster:
        c = cls(root)
        if not c.state_path.exists():
            raise LoomError(f"no local cluster at {c.root} (no {STATE_FILE}); run `loomfs local up`")
        c._load_state()
        return c

    def __repr__(self) -> str:
        return f"LocalCluster({self.root} base_port={self.base_port} services={len(self.services)})"
