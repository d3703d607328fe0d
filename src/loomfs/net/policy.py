"""Which rights each privileged RPC needs: one table for the whole cluster.

``Method.needs`` (set where a method is declared) and this table are combined by
``RpcServer.register``; a caller whose identity lacks the rights gets EPERM. Methods of every
service are listed here by name so the wire modules of other components stay untouched, and a
reviewer sees in one place what an admin token, a user token and a read-only token may do.

``ADMIN`` is met by admin tokens and by services (``SERVICE`` holds every right); ``SERVICE`` only
by a peer that proved the cluster secret. ``NONE`` (absent): any authenticated caller.
"""

from __future__ import annotations

from loomfs.common.identity import Right
from loomfs.wire.message import Method
from loomfs.wire.types import SERVICE_META, SERVICE_MGMTD, SERVICE_STORAGE

POLICY: dict[tuple[int, str], Right] = {
    # mgmtd: membership and reports come from services only; layout changes are administration
    (SERVICE_MGMTD, "register_node"): Right.SERVICE,
    (SERVICE_MGMTD, "heartbeat"): Right.SERVICE,
    (SERVICE_MGMTD, "sync_report"): Right.SERVICE,
    (SERVICE_MGMTD, "report_unreachable"): Right.SERVICE,  # fences a target out of its chain
    (SERVICE_MGMTD, "create_chain_table"): Right.ADMIN,
    (SERVICE_MGMTD, "drain_node"): Right.ADMIN,
    (SERVICE_MGMTD, "revoke_token"): Right.ADMIN,
    (SERVICE_MGMTD, "list_revoked"): Right.SERVICE,
    # meta: fsck's view of the GC queue
    (SERVICE_META, "gc_queued"): Right.ADMIN,
    # meta: read grants for storage (meta/readgrants.py) are for callers that may read
    (SERVICE_META, "read_grants"): Right.READ,
    # storage: chunk changes need WRITE (and a write grant, checked by storage), reads READ
    (SERVICE_STORAGE, "write"): Right.WRITE,
    (SERVICE_STORAGE, "truncate"): Right.WRITE,
    (SERVICE_STORAGE, "remove_chunks"): Right.WRITE,
    (SERVICE_STORAGE, "read"): Right.READ,
    (SERVICE_STORAGE, "query_chunks"): Right.READ,
    (SERVICE_STORAGE, "report_corrupt"): Right.READ,
}


def needs_of(m: Method) -> Right:
    """The rights a caller must hold to call ``m``: its declaration's and the policy's."""
    return Right(m.needs | POLICY.get((m.service, m.name), Right.NONE))
