"""mgmtd keeps an accepted "resync done" across a restart even when routing did not move
(no I/O: an in-memory SQLite store).

Simulator seed 227006: the report came while another member's revocation held the chain, so
the target stayed SYNCING and the routing version did not move; mgmtd saves its state only
when the version moves, so the restart that followed lost the report, and the node, which had
finished, never reported it again: the target stayed syncing forever."""

from __future__ import annotations

import asyncio

from loomfs.common.clock import ManualClock
from loomfs.mgmtd.service import MgmtdService
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore
from loomfs.net.rpc import CallContext
from loomfs.wire import mgmtd as w
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState
LEASE_S = 1.0


def _register(st: ClusterState, n: int, now_s: float) -> None:
    st.register(node_id=n, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + n,
                targets=[TargetInfo(target_id=n * 1000 + 1, path="/t")], now_s=now_s)


def test_a_sync_done_held_behind_a_revocation_survives_a_restart() -> None:
    clock = ManualClock(start_s=100.0)
    now = clock.monotonic
    st = ClusterState(lease_s=LEASE_S)
    for n in (1, 2, 3):
        _register(st, n, now())
    st.create_chain_table(replicas=3)
    store = MgmtdStore("sqlite:///:memory:")
    svc = MgmtdService(st, store, heartbeat_interval_s=0.3, clock=clock)
    svc.persist(force=True)
    # node 1's process restarts: its target resyncs from the chain
    clock.advance(0.2)
    _register(st, 1, now())
    for n in (2, 3):
        st.heartbeat(n, [], now())
    svc.tick()
    chain = st.chains[1]
    syncing = [t for t in chain.targets if st.targets[t].state == S.SYNCING]
    serving = [t for t in chain.targets if st.targets[t].state == S.SERVING]
    assert len(syncing) == 1 and len(serving) == 2, [st.targets[t] for t in chain.targets]
    # the head reports its serving successor unreachable (mgmtd reaches it): a fence, held
    # until the suspect's node says it stopped serving the target
    head, suspect = serving
    clock.advance(0.1)
    st.report_unreachable(reporter_node=head // 1000, reporter_target=head, suspect_target=suspect,
                          chain_id=1, chain_version=chain.version, suspect_reachable=True, now_s=now())
    deadline = now() + 5 * LEASE_S
    while not st.revoked_targets(suspect // 1000) and now() < deadline:  # its settle window
        clock.advance(0.1)
        for n in (1, 2, 3):
            st.heartbeat(n, [], now())
        svc.tick()
    assert st.revoked_targets(suspect // 1000) == [suspect] and st.targets[suspect].state == S.SERVING
    svc.persist()  # what the state is so far is saved (a heartbeat's commit would have)
    version, routing_version = chain.version, st.version
    ctx = CallContext(payload=memoryview(b""), request_id=1, peer="test", deadline=None)
    rsp = asyncio.run(svc.sync_report(w.SyncReportReq(target_id=syncing[0], chain_id=1, chain_version=version,
                                                      chunks_left=0, bytes_left=0, done=True), ctx))
    assert rsp.accepted
    assert st.targets[syncing[0]].state == S.SYNCING and st.version == routing_version  # held
    # mgmtd restarts from its store: the report is there
    again = ClusterState(lease_s=LEASE_S)
    store.load(again, now())
    assert again.targets[syncing[0]].sync_done_version == version
    store.close()
