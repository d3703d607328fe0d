"""mgmtd service (id 1): membership, heartbeats, chain tables, routing."""

from __future__ import annotations

from loomfs.common.identity import Right
from loomfs.wire.message import Empty, Message, many, message, method
from loomfs.wire.types import SERVICE_MGMTD, ChainTable, NodeInfo, RoutingInfo, TargetInfo


@message
class TargetFormat(Message):
    """The identity of a target's storage: a random id its node created when it first formatted
    the target's directory (``storage.diskident``). mgmtd remembers the last one per target; a
    different one means the disk was replaced, wiped or reformatted: the target holds none of
    its chain's data and must be resynced before it serves (``mgmtd.diskident``)."""

    target_id: int = 0
    format_id: str = ""  # 32 hex digits ("" = not known: the node cannot tell)
    # this process created the id in an empty directory (a new disk): with no id recorded yet
    # (a store from before format ids) mgmtd still knows the target came back empty
    formatted_now: bool = False


@message
class RegisterNodeReq(Message):
    node_id: int = 0  # 0 = assign one
    kind: int = 0
    host: str = ""
    port: int = 0
    targets: list[TargetInfo] = many()  # storage nodes: the targets they serve
    metrics_port: int = 0  # where the node serves /metrics (0 = nowhere)
    # storage: its failure domain (rack, room...); mgmtd keeps a chain's replicas in distinct
    # domains when there are enough ("" = the node is a domain of its own)
    domain: str = ""
    target_formats: list[TargetFormat] = many()  # storage: each target's format id (absent: older node)


@message
class RegisterNodeRsp(Message):
    node_id: int = 0
    lease_s: float = 5.0
    heartbeat_interval_s: float = 1.0
    routing_version: int = 0
    revoked_targets: list[int] = many()  # not to be served yet (as HeartbeatRsp.revoked_targets)
    # targets mgmtd saw fail (a failed fsync) that this process did not verify: it must read them
    # back from the disk (engine.diskfail) before they serve again (TargetInfo.verified)
    verify_targets: list[int] = many()


@message
class HeartbeatReq(Message):
    node_id: int = 0
    targets: list[TargetInfo] = many()  # current usage and local state
    revoked_targets: list[int] = many()  # targets this node has stopped serving (HeartbeatRsp asked)
    routing_version: int = 0  # the routing this node serves by
    target_formats: list[TargetFormat] = many()  # as RegisterNodeReq.target_formats


@message
class HeartbeatRsp(Message):
    routing_version: int = 0
    lease_s: float = 5.0
    # targets of this node leaving their chains: stop serving them now (the chain change waits
    # for the next heartbeat saying so, or for the lease granted before to run out)
    revoked_targets: list[int] = many()
    verify_targets: list[int] = many()  # as RegisterNodeRsp.verify_targets (a node that missed it)


@message
class GetRoutingReq(Message):
    known_version: int = 0  # if equal to current, routing is omitted


@message
class GetRoutingRsp(Message):
    changed: bool = True
    routing: RoutingInfo | None = None


@message
class CreateChainTableReq(Message):
    replicas: int = 3
    table_id: int = 0  # 0 = next free id
    chains_per_target: int = 1  # reserved; each target belongs to one chain
    targets_per_node: int = 0  # at most this many free targets of each node (0 = all); EC tables use 1
    # an EC group's table (replicas=1): mgmtd swaps an empty spare into a chain whose target is
    # lost (mgmtd.ec). False: a replicated table, whatever its replicas; its chains are never
    # handed an empty target while a member that held their data may come back
    ec: bool = False


@message
class CreateChainTableRsp(Message):
    table: ChainTable | None = None


@message
class ListNodesRsp(Message):
    nodes: list[NodeInfo] = many()


REGISTER_NODE = method(SERVICE_MGMTD, 1, "register_node", RegisterNodeReq, RegisterNodeRsp, idempotent=True)
HEARTBEAT = method(SERVICE_MGMTD, 2, "heartbeat", HeartbeatReq, HeartbeatRsp, idempotent=True)
GET_ROUTING = method(SERVICE_MGMTD, 3, "get_routing", GetRoutingReq, GetRoutingRsp, idempotent=True)
CREATE_CHAIN_TABLE = method(SERVICE_MGMTD, 4, "create_chain_table", CreateChainTableReq, CreateChainTableRsp)
LIST_NODES = method(SERVICE_MGMTD, 5, "list_nodes", Empty, ListNodesRsp, idempotent=True)
MGMTD_PING = method(SERVICE_MGMTD, 6, "ping", Empty, Empty, idempotent=True)


@message
class SyncReportReq(Message):
    """A predecessor reports resync progress of its syncing successor ``target_id``."""

    target_id: int = 0
    chain_id: int = 0
    chain_version: int = 0  # the chain version the sync ran under
    chunks_left: int = 0
    bytes_left: int = 0
    done: bool = False


@message
class SyncReportRsp(Message):
    accepted: bool = False  # False: the chain changed; the reporter should re-check routing
    routing_version: int = 0


@message
class DrainReq(Message):
    node_id: int = 0
    undrain: bool = False


@message
class DrainRsp(Message):
    targets_to_move: int = 0  # targets of the node still in chains


SYNC_REPORT = method(SERVICE_MGMTD, 7, "sync_report", SyncReportReq, SyncReportRsp, idempotent=True)
DRAIN_NODE = method(SERVICE_MGMTD, 8, "drain_node", DrainReq, DrainRsp, idempotent=True)


@message
class ReportUnreachableReq(Message):
    """Chain member ``target_id`` (on ``node_id``) could not reach its successor
    ``suspect_target_id`` under ``chain_version`` although both are in the routing."""

    node_id: int = 0
    target_id: int = 0
    suspect_target_id: int = 0
    chain_id: int = 0
    chain_version: int = 0
    reason: str = ""


@message
class ReportUnreachableRsp(Message):
    fenced_target_id: int = 0  # the target taken out of the chain (0 = report stale, nothing done)
    routing_version: int = 0


REPORT_UNREACHABLE = method(SERVICE_MGMTD, 9, "report_unreachable", ReportUnreachableReq, ReportUnreachableRsp,
                            idempotent=True)


@message
class SetTableEcReq(Message):
    """Mark chain table ``table_id`` as an EC group's table (or not): only such tables get empty
    spares swapped in for lost targets (mgmtd.ec). For tables created before the flag existed."""

    table_id: int = 0
    ec: bool = True
    confirm: bool = False  # required: marked EC, a single-replica chain's target is replaced when lost


@message
class SetTableEcRsp(Message):
    table_id: int = 0
    ec: bool = False
    changed: bool = False


@message
class AcceptChainLossReq(Message):
    """Operator action: every member of chain ``chain_id`` lost its disk (all blank,
    mgmtd.diskident); let the chain serve again from an empty member, accepting that its data
    is gone. Refused while any alive member holds data."""

    chain_id: int = 0
    confirm: bool = False  # required
    # also give up members on dead nodes that were not found blank (they may hold the data, if
    # they ever come back): without it such a member makes the call refuse
    give_up_dead: bool = False


@message
class AcceptChainLossRsp(Message):
    target_id: int = 0  # the empty member that serves now
    given_up: list[int] = many()  # dead members given up (give_up_dead), treated as blank
    chain_version: int = 0
    routing_version: int = 0
    accepted_losses: int = 0  # chains accepted as lost by mgmtd so far (all incarnations)


SET_TABLE_EC = method(SERVICE_MGMTD, 10, "set_table_ec", SetTableEcReq, SetTableEcRsp, idempotent=True,
                      needs=Right.ADMIN)
ACCEPT_CHAIN_LOSS = method(SERVICE_MGMTD, 11, "accept_chain_loss", AcceptChainLossReq, AcceptChainLossRsp,
                           needs=Right.ADMIN)
