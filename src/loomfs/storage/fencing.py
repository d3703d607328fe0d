"""Who may serve or change what on a storage node: the lease gate and resync-copy fencing.

A node writes for half a lease after mgmtd answered a heartbeat sent at ``sent_s`` and reads for
``READ_LEASE_FRACTION`` of it (mgmtd counts from later), and serves nothing before it registered
(a restarted process rejoins its chains as syncing). A resync copy is accepted only for the
current chain version, at a SYNCING target, from its predecessor in the write chain.
"""

from __future__ import annotations

from loomfs.common.clock import Clock
from loomfs.common.identity import Identity, Right
from loomfs.common.routing import Routing
from loomfs.errors import StatusError
from loomfs.storage import chain, planted
from loomfs.storage.target import StorageTarget
from loomfs.wire.status import Status
from loomfs.wire.types import TargetState

READ_LEASE_FRACTION = 0.8


def chain_peers_only(identity: Identity, what: str) -> None:
    """Forwarded updates, resync copies, rollbacks and repair reads (``exact_ver``: a version
    the tail may never have committed) come from chain peers (the head orders a chunk's
    versions and dedupes retries): EPERM for anyone without SERVICE, admins included."""
    if not identity.can(Right.SERVICE):
        raise StatusError(Status.EPERM, f"a forwarded or resync {what} is for chain peers only "
                          f"(token {identity.token_id or identity.uid})")


class Fencing:
    clock: Clock
    ready: bool
    writable_until_s: float
    readable_until_s: float

    def check_writable(self) -> None:
        self.check_ready()
        if self.clock.monotonic() > self.writable_until_s:
            raise StatusError(Status.TARGET_NOT_SERVING, "storage node lost mgmtd for half a lease: not writable")

    def check_readable(self) -> None:
        """Reads stop once the lease lapsed: mgmtd may have given the chain a new tail that
        commits versions this replica never sees."""
        self.check_ready()
        if self.clock.monotonic() > self.readable_until_s and not planted.on("reads_ignore_lease"):
            raise StatusError(Status.TARGET_NOT_SERVING, "storage node's lease lapsed: not readable")

    def check_ready(self) -> None:
        if not self.ready and not planted.on("reads_ignore_lease"):
            raise StatusError(Status.TARGET_NOT_SERVING, "storage node has not registered with mgmtd yet")

    def lease_granted(self, sent_s: float, lease_s: float) -> None:
        """mgmtd answered a registration/heartbeat sent at ``sent_s``: writes are allowed for
        half the lease, reads for ``READ_LEASE_FRACTION`` of it (mgmtd counts from later)."""
        self.writable_until_s = sent_s + lease_s / 2
        self.readable_until_s = sent_s + lease_s * READ_LEASE_FRACTION

    def _check_sync_sender(self, target: StorageTarget, pos: chain.Position | None, routing: Routing,
                           chain_version: int, sender: int) -> None:
        if planted.on("unfenced_resync"):
            return
        if pos is None or chain_version != pos.chain_version:
            raise StatusError(Status.STALE_CHAIN_VERSION,
                              f"resync copy for chain v{chain_version}, target {target.target_id} is at "
                              f"v{pos.chain_version if pos else '-'}")
        ti = routing.targets.get(target.target_id)
        if ti is None or ti.state != TargetState.SYNCING:
            raise StatusError(Status.TARGET_NOT_SERVING, f"target {target.target_id} is not syncing")
        if pos.predecessor != sender:
            raise StatusError(Status.TARGET_NOT_SERVING,
                              f"resync copy from target {sender}, the predecessor is {pos.predecessor}")
