"""Per-component configuration: frozen dataclasses, units in the names.

Precedence: defaults < TOML file < environment (``LOOMFS_<COMPONENT>_<FIELD>``) < flags.
Every service reads its own TOML file (``loomfs local up`` writes one per process).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class RpcConfig:
    connect_timeout_s: float = 3.0
    call_timeout_s: float = 30.0
    retry_attempts_max: int = 6
    max_payload_bytes: int = 64 << 20
    # authentication (docs/security.md). Services: the cluster secret file (hex, mode 0600);
    # with it the service refuses peers that prove neither the secret nor a token, and proves
    # the secret to the services it calls. Clients: a token file (``loomfs admin token create``;
    # default $LOOMFS_TOKEN_FILE). revoked_file: token ids refused (one per line).
    secret_file: str = ""
    token_file: str = ""
    revoked_file: str = ""
    # TLS on every connection: this process's certificate and key (services), and the CA that
    # signed the services' certificates (everyone). Empty = plain TCP.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class MgmtdConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    store_url: str = "sqlite:///mgmtd.db"  # relative paths are under data_dir
    data_dir: str = "."
    heartbeat_interval_s: float = 1.0
    lease_s: float = 5.0  # a node silent this long is marked dead
    default_replicas: int = 3
    replace_after_s: float = 600.0  # an offline target is replaced by a spare after this (0 = never)
    unreachable_hold_s: float = 0.0  # a target its predecessor cannot reach stays out this long (0 = 2 leases)
    metrics_port: int = 0  # Prometheus /metrics: 0 = any free port (advertised to mgmtd), -1 = off
    rpc: RpcConfig = field(default_factory=RpcConfig)
    # several mgmtd (docs/mgmtd-ha.md): every mgmtd address of the cluster, comma-separated (this
    # one's included); more than one needs a postgresql:// store_url, shared by all of them
    mgmtd: str = ""
    primary_lease_s: float = 2.0  # the primary's lease in the store: a standby takes over within it


@dataclass(frozen=True, slots=True, kw_only=True)
class MetaConfig:
    host: str = "127.0.0.1"
    port: int = 8100
    node_id: int = 0
    mgmtd: str = "127.0.0.1:8000"  # comma-separated list allowed
    store_url: str = "sqlite:///meta.db"
    data_dir: str = "."
    gc_delay_s: float = 60.0  # unlinked data is removed this long after the unlink
    gc_interval_s: float = 1.0
    default_chunk_size_bytes: int = 4 << 20
    default_stripe: int = 16
    # files up to this size keep their bytes in meta (a directory's layout may say otherwise;
    # 0 = off). Capped at the chunk size and 1 MiB.
    default_inline_max_bytes: int = 64 << 10
    sqlite_synchronous: str = "NORMAL"  # FULL to fsync every commit
    root_squash: bool = False  # uid 0 from a token without ADMIN acts as nobody (docs/security.md "Authorisation")
    metrics_port: int = 0  # Prometheus /metrics: 0 = any free port (advertised to mgmtd), -1 = off
    rpc: RpcConfig = field(default_factory=RpcConfig)


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageConfig:
    host: str = "127.0.0.1"
    port: int = 8200
    node_id: int = 1
    mgmtd: str = "127.0.0.1:8000"
    data_dir: str = "."
    targets: list[str] = field(default_factory=list)  # one directory per target
    fsync_on_commit: bool = False  # True: fsync chunk files before acking
    max_chunk_size_bytes: int = 64 << 20
    target_capacity_bytes: int = 0  # per target; 0 = the disk's free space (ENOSPC beyond it)
    scrub_bytes_per_s: int = 16 << 20  # background CRC scrub rate per node (0 = off)
    scrub_interval_s: float = 3600.0  # pause between full scrub passes
    scrub_first_pass_after_s: float = 0.0  # first pass this long after start (0 = min(interval, 60 s))
    resync_bytes_per_s: int = 0  # 0 = unthrottled
    suspect_after_s: float = 5.0  # a forward unanswered this long reports the successor to mgmtd
    # chunk writes from clients (not services or admin tokens) must carry a write grant meta issued
    # for the inode (loomfs.common.grants); a grant that is present is always checked. Only with a
    # cluster secret (without one nothing is checked). False: a transition for older meta servers.
    write_grants_required: bool = True
    # chunk READs from clients must carry a read grant meta issued for the inode (POSIX r checked
    # there); a present one is always checked. Only with a cluster secret; services and admin
    # tokens need none. False: a transition for older clients (docs/security.md "Read grants").
    read_grants_required: bool = True
    domain: str = ""  # failure domain (rack, room...): chains keep their replicas in distinct domains when there are enough; "" = the node is its own domain
    metrics_port: int = 0  # Prometheus /metrics: 0 = any free port (advertised to mgmtd), -1 = off
    rpc: RpcConfig = field(default_factory=RpcConfig)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    mgmtd: str = "127.0.0.1:8000"
    routing_refresh_s: float = 2.0
    write_buffer_bytes_max: int = 256 << 20  # dirty data held per client before writers wait
    readahead_chunks: int = 8
    parallel_chunks_max: int = 32  # chunk RPCs in flight per file operation
    # erasure-coded writes (docs/ec.md): 0 = a stripe is acknowledged once all k+m fragments
    # committed; k+1..k+m-1 = opt-in: fragments on chains routing shows down are skipped while
    # at least this many commit (redundancy reduced until `loomfs layout scrub --repair`)
    ec_ack_fragments_min: int = 0
    # consistency (docs/consistency.md): "strict" (close-to-open: every stat/open asks meta)
    # or "relaxed" (attributes, entries and data cached for a TTL) for the connection, and
    # per path prefix (the longest matching prefix wins)
    consistency: str = "strict"
    relaxed_prefixes: list[str] = field(default_factory=list)
    strict_prefixes: list[str] = field(default_factory=list)
    attr_cache_ttl_s: float = 1.0  # relaxed: how long an attribute answer is reused
    negative_cache_ttl_s: float = -1.0  # relaxed: ENOENT answers (-1 = attr_cache_ttl_s)
    entry_cache_ttl_s: float = -1.0  # relaxed: directory listings (-1 = attr_cache_ttl_s)
    attr_cache_entries_max: int = 65536
    listing_cache_entries_max: int = 1024  # listings of up to listing_cache_names_max names each
    listing_cache_names_max: int = 16384
    # whole-file data keyed by (inode, size, mtime, ctime), in both modes (strict: only for a
    # version meta just confirmed); 0 bytes = off
    data_cache_bytes_max: int = 64 << 20
    data_cache_entries_max: int = 16384
    data_cache_entry_bytes_max: int = 4 << 20  # bigger files are not cached
    disk_cache_dir: str = ""  # a local directory for a checksummed data cache ("" = off)
    disk_cache_bytes_max: int = 10 << 30
    # a file opened with "w" buffers up to this much and is created at close with its bytes
    # (one round trip; inline in meta when it fits the directory's limit); 0 = create at open
    inline_put_max_bytes: int = 64 << 10
    rpc: RpcConfig = field(default_factory=RpcConfig)


def _coerce(tp: Any, value: Any) -> Any:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_dict(tp, value)
    origin = typing.get_origin(tp)
    if origin is list:
        if isinstance(value, str):
            return [v for v in value.split(",") if v]
        return list(value)
    if tp is bool and isinstance(value, str):
        return value.lower() in ("1", "true", "yes", "on")
    if tp in (int, float, str) and not isinstance(value, tp):
        return tp(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown settings {sorted(unknown)}")
    return cls(**{k: _coerce(hints[k], v) for k, v in data.items()})


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def load(cls: type[T], path: str | Path | None = None, *, env_prefix: str = "", **overrides: Any) -> T:
    data: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    if env_prefix:
        for fld in dataclasses.fields(cls):  # type: ignore[arg-type]
            key = f"LOOMFS_{env_prefix}_{fld.name}".upper()
            if key in os.environ:
                data[fld.name] = os.environ[key]
    data.update({k: v for k, v in overrides.items() if v is not None})
    return from_dict(cls, data)


def resolve_under(data_dir: str, url: str) -> str:
    """``sqlite:///meta.db`` relative to the data dir -> absolute sqlite URL."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url[len(prefix) :].startswith("/"):
        return prefix + str(Path(data_dir, url[len(prefix) :]).resolve())
    return url
