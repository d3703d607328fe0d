"""uid/gid mapping between this node's users and the ids stored in meta (no I/O).

``-o uid_map=1000:5000/1001:5001,gid_map=100:5000``: local uid 1000 is stored as 5000 and a
file meta says 5000 owns shows as 1000 here. Ids not in a map pass unchanged. The kernel
checks permissions (``default_permissions``) against the mapped (local) ids, so one cluster
can be mounted on nodes whose users have different numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class IdMap:
    to_cluster: dict[int, int] = field(default_factory=dict)
    to_local: dict[int, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> IdMap:
        """``"1000:5000/1001:5001"`` (LOCAL:CLUSTER pairs); each side at most once."""
        out, back = {}, {}
        for pair in filter(None, spec.split("/")):
            local_s, sep, cluster_s = pair.partition(":")
            if not sep:
                raise ValueError(f"id map entry {pair!r}: use LOCAL:CLUSTER")
            local, cluster = int(local_s), int(cluster_s)
            if local < 0 or cluster < 0:
                raise ValueError(f"id map entry {pair!r}: negative id")
            if local in out or cluster in back:
                raise ValueError(f"id map entry {pair!r}: an id mapped twice")
            out[local], back[cluster] = cluster, local
        return cls(out, back)

    def cluster(self, local_id: int) -> int:
        """A local id as meta stores it (-1, 'unchanged', stays -1)."""
        return self.to_cluster.get(local_id, local_id)

    def local(self, cluster_id: int) -> int:
        return self.to_local.get(cluster_id, cluster_id)

    def __bool__(self) -> bool:
        return bool(self.to_cluster)
