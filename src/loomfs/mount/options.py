"""``-o`` mount options: what LoomFS's mount understands and what goes to the kernel."""

from __future__ import annotations

from dataclasses import dataclass, field

from loomfs.mount.idmap import IdMap

# libfuse rejects any max_read=N with pyfuse3 ("init() and fuse_session_new() requested
# different maximum read size (0 vs N)"): request sizes come from max_pages (1 MiB with
# libfuse 3.14) and, for reads, the bdi's read_ahead_kb


@dataclass(frozen=True, slots=True, kw_only=True)
class MountOptions:
    attr_timeout_s: float = 1.0  # kernel caches attributes this long (JuiceFS's default)
    entry_timeout_s: float = 1.0  # and names -> inodes
    negative_timeout_s: float = 0.0  # and "no such name" (0: not cached)
    # the mount answers "no such name" without asking meta this long after it learned the name
    # absent (a miss, a directory it made or listed in full: loomfs.mount.names; 0: never).
    # None: by the consistency mode, 0 for strict (another client's new name is seen by the next
    # call, as strict promises) and entry_timeout_s for relaxed (names may be a TTL old)
    absent_timeout_s: float | None = None
    loop: str = "shared"  # "shared": FUSE on the client's loop; "separate": its own, bridged
    max_tasks: int = 64  # FUSE requests served at once
    read_ahead_kb: int = 1024  # the mount's bdi read-ahead (1 MiB requests; 0 = leave it)
    readdir_page: int = 1024  # directory entries read from meta per READDIR (huge directories stream)
    prefetch_chunks: int = 8  # chunks a sequential reader's handle fetches ahead (0: the client's read-ahead)
    prefetch_mb: int = 256  # prefetch buffers of all handles together
    consistency: str = "strict"  # the mount's client: "strict" (close-to-open) or "relaxed"
    # the kernel page cache at open: "auto" keeps it when the file is the version it held
    # (strict) or always (relaxed paths); "keep" always; "none" drops it at every open
    cache: str = "auto"
    direct_io: bool = False  # every read and write goes to the mount (no page cache, no read-ahead)
    # read-only opens bypass the page cache (streamed datasets: no copy into and out of it;
    # a MAP_SHARED mmap of such an open fails with ENODEV, MAP_PRIVATE works)
    direct_read: bool = False
    read_only: bool = False  # ro: the kernel refuses writes (EROFS) and so does the mount
    uid_map: IdMap = field(default_factory=IdMap)  # local <-> stored uids (loomfs.mount.idmap)
    gid_map: IdMap = field(default_factory=IdMap)
    # flock/fcntl locks: "cluster" (held at meta, seen by every mount and client:
    # loomfs.mount.locks; falls back to "local" when pyfuse3/libfuse are not the known ones)
    # or "local" (the kernel's, within this mount only)
    locks: str = "cluster"
    lock_lease_s: float = 30.0  # a dead mount's locks go this long after its last renewal
    kernel: frozenset[str] = field(default_factory=frozenset)  # passed to FUSE as given

    def __post_init__(self) -> None:
        if self.absent_timeout_s is None:
            ttl = self.entry_timeout_s if self.consistency == "relaxed" else 0.0
            object.__setattr__(self, "absent_timeout_s", ttl)

    @property
    def absent_ttl_s(self) -> float:
        """``absent_timeout_s`` once the mode's default is applied (never None)."""
        return self.absent_timeout_s or 0.0

    @classmethod
    def parse(cls, items: list[str] | None) -> MountOptions:
        """``['attr_timeout=2,allow_other', 'ro']`` -> options (unknown ones go to FUSE)."""
        kw: dict[str, object] = {}
        kernel = {"default_permissions"}
        for item in items or []:
            for opt in filter(None, (o.strip() for o in item.split(","))):
                key, _, value = opt.partition("=")
                if key in ("attr_timeout", "entry_timeout", "negative_timeout", "absent_timeout"):
                    kw[f"{key}_s"] = float(value)
                elif key == "loop":
                    if value not in ("shared", "separate"):
                        raise ValueError(f"loop={value!r}: use shared or separate")
                    kw["loop"] = value
                elif key in ("max_tasks", "read_ahead_kb", "readdir_page", "prefetch_chunks", "prefetch_mb"):
                    kw[key] = int(value)
                elif key == "consistency":
                    if value not in ("strict", "relaxed"):
                        raise ValueError(f"consistency={value!r}: use strict or relaxed")
                    kw["consistency"] = value
                elif key == "cache":
                    if value not in ("auto", "keep", "none"):
                        raise ValueError(f"cache={value!r}: use auto, keep or none")
                    kw["cache"] = value
                elif key == "locks":
                    if value not in ("cluster", "local"):
                        raise ValueError(f"locks={value!r}: use cluster or local")
                    kw["locks"] = value
                elif key == "lock_lease":
                    kw["lock_lease_s"] = float(value)
                elif key in ("uid_map", "gid_map"):
                    kw[key] = IdMap.parse(value)
                elif key in ("direct_io", "direct_read"):
                    kw[key] = True
                elif key == "ro":
                    kw["read_only"] = True
                    kernel.add(opt)
                elif key == "no_default_permissions":
                    kernel.discard("default_permissions")
                elif key == "max_read":
                    raise ValueError("max_read breaks pyfuse3's init; use read_ahead_kb")
                else:
                    kernel.add(opt)
        return cls(kernel=frozenset(kernel), **kw)  # type: ignore[arg-type]

    def fuse_options(self, fsname: str) -> set[str]:
        return {f"fsname={fsname}", "subtype=loomfs", *self.kernel}
