"""Replication hunt (session 15), simulator seed 303012 (profile "replace"): a spare that joins a
chain must be resynced before it serves, whatever it did in a chain it was in before.

mgmtd remembered a finished resync as the *chain version* it was reported under
(``TargetRecord.sync_done_version``), compared with the version of whatever chain the target is
in now. A target that finished a resync in chain 1 at v3, was replaced there (offline too long)
and joined chain 2 as a spare when chain 2 was at v3 too went SERVING at once, with none of
chain 2's chunks: it served "no chunk" (zeros) for acknowledged writes, and it counted as one of
the R replicas. The state machine alone, no I/O."""

from __future__ import annotations

from loomfs.mgmtd.state import ClusterState
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState
REPLACE_AFTER_S = 1.0


def _register(st: ClusterState, node_id: int, now_s: float) -> None:
    st.register(node_id=node_id, kind=NodeKind.STORAGE, host="h", port=9000 + node_id,
                targets=[TargetInfo(target_id=node_id * 1000 + 1, path="/t")], now_s=now_s)


def _beat(st: ClusterState, nodes: list[int], now_s: float) -> None:
    for n in nodes:
        st.heartbeat(n, [], now_s)
    st.tick(now_s)


def test_a_spare_that_finished_a_resync_in_another_chain_is_resynced_in_its_new_one() -> None:
    st = ClusterState(lease_s=1.0, replace_after_s=REPLACE_AFTER_S)
    for n in (1, 2, 3, 4):
        _register(st, n, 0.0)
    st.create_chain_table(replicas=2)  # two chains of two targets
    a, b = sorted(st.chains)
    x = st.chains[a].targets[-1]  # will leave chain a and join chain b as a spare
    x_node = x // 1000
    now = 0.0
    alive = [1, 2, 3, 4]
    # x finishes a resync in chain a under the version chain b will have when x joins it (b's
    # version + 2: one of b's members goes offline, then x joins); a restart and resync moves a
    # chain's version by 2, a member's death, return and resync by 3
    def advance(seconds: float, nodes: list[int]) -> None:
        nonlocal now
        end = now + seconds
        while now < end:  # mgmtd ticks and the live nodes heartbeat every 0.25 s
            now = min(end, now + 0.25)
            _beat(st, nodes, now)

    def resync(chain_id: int, target: int, *, die: bool) -> None:
        nonlocal now
        if die:
            advance(2.0, [n for n in alive if n != target // 1000])
            assert st.targets[target].state == S.OFFLINE
        now += 0.1
        _register(st, target // 1000, now)
        _beat(st, alive, now)
        assert st.targets[target].state == S.SYNCING, st.targets[target]
        assert st.sync_report(target_id=target, chain_id=chain_id, chain_version=st.chains[chain_id].version,
                              chunks_left=0, bytes_left=0, done=True, now_s=now)
        assert st.targets[target].state == S.SERVING

    resync(a, x, die=False)
    while (gap := st.targets[x].sync_done_version - (st.chains[b].version + 2)) != 0:
        if gap < 0:
            resync(a, x, die=False)
        else:
            resync(b, st.chains[b].targets[-1], die=gap % 2 == 1)
    assert st.targets[x].sync_done_version == st.chains[b].version + 2
    # x's node dies; chain a replaces it after REPLACE_AFTER_S (no spare yet: a fifth node comes)
    alive.remove(x_node)
    _register(st, 5, now)
    advance(2.0 + REPLACE_AFTER_S + 0.5, alive + [5])
    assert x not in st.chains[a].targets
    # x's node is back (x is a spare now); a member of chain b on another node dies
    alive.append(x_node)
    _register(st, x_node, now)
    _beat(st, alive + [5], now)
    assert st.targets[x].chain_id == 0
    gone = next(t for t in st.chains[b].targets if t // 1000 != x_node)
    alive.remove(gone // 1000)
    advance(2.0, alive + [5])
    assert st.targets[gone].state == S.OFFLINE
    advance(REPLACE_AFTER_S + 0.5, alive + [5])
    assert x in st.chains[b].targets, [st.targets[t] for t in st.chains[b].targets]
    # nobody reported a resync of x in chain b: it must not serve there
    assert st.targets[x].state != S.SERVING, f"spare {x} serves chain {b} unsynced: {st.targets[x]}"
