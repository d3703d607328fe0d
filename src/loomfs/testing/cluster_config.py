"""A local cluster's credentials (cluster secret, admin token, TLS certificates; docs/security.md),
what this process's clients authenticate with, and each service's config file.

Part of ``LocalCluster`` (``testing.cluster``), on top of ``ClusterState``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

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
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.testing.certs import make_cert_set
from loomfs.testing.cluster_state import METRICS_OFFSET, ClusterState, ServiceProc

SECRET_FILE = "cluster.secret"
TOKEN_FILE = "admin.token"
_PROCESS_SECRET: bytes | None = None  # the secret new clusters of this process share
ADMIN_TOKEN_TTL_S = 365 * 86400.0  # a local cluster's admin token (renewed at start when under an hour is left)


class ClusterConfig(ClusterState):
    """Credentials and config files of a local cluster."""

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

    # ---- config files ----------------------------------------------------------------------
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
