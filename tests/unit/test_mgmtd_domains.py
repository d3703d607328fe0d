"""Failure domains in mgmtd placement (no I/O): chains keep their replicas in distinct domains
(racks) whenever the free targets allow it; spares come from a domain the chain lacks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from loomfs.errors import InvalidArgument
from loomfs.mgmtd.state import ClusterState, plan_chains
from loomfs.mgmtd.store import MgmtdStore
from loomfs.mgmtd.transitions import Member, pick_spare, plan_chain
from loomfs.wire.types import NodeKind, TargetInfo, TargetState

S = TargetState


def _racks(racks: int, nodes_per_rack: int, targets: int) -> tuple[dict[int, list[int]], dict[int, str]]:
    """Node ids numbered rack by rack (the layout that put 95% of chains inside one rack)."""
    free, domains = {}, {}
    for r in range(racks):
        for i in range(nodes_per_rack):
            n = r * nodes_per_rack + i + 1
            free[n] = [n * 1000 + j for j in range(1, targets + 1)]
            domains[n] = f"rack{r}"
    return free, domains


def _spans(chain: list[int], domains: dict[int, str]) -> int:
    return len({domains.get(t // 1000) or t // 1000 for t in chain})


def _max_distinct_chains(counts: list[int], replicas: int) -> int:
    """The most chains of ``replicas`` distinct domains that per-domain target counts allow:
    the largest k with sum(min(c, k)) >= replicas * k."""
    return max(k for k in range(sum(counts) // replicas + 1) if sum(min(c, k) for c in counts) >= replicas * k)


def test_rack_by_rack_node_ids_still_give_chains_across_racks() -> None:
    free, domains = _racks(racks=4, nodes_per_rack=5, targets=3)
    chains = plan_chains(free, 3, domains)
    assert len(chains) == 4 * 5 * 3 // 3  # every target used
    assert all(_spans(c, domains) == 3 for c in chains)
    assert all(len({t // 1000 for t in c}) == 3 for c in chains)
    without = plan_chains(free, 3)  # the old placement on the same ids: mostly inside one rack
    assert sum(_spans(c, domains) < 3 for c in without) > len(without) // 2


def test_domains_repeat_only_when_too_few_are_left() -> None:
    # rack a: 6 nodes, racks b and c: 2 nodes; 2 targets each. At most 4 chains can span three
    # racks (b and c hold 4 targets each); the other targets of rack a still form chains, on
    # distinct nodes
    free, domains = {}, {}
    for n, rack in enumerate(["a"] * 6 + ["b"] * 2 + ["c"] * 2, start=1):
        free[n], domains[n] = [n * 1000 + 1, n * 1000 + 2], rack
    chains = plan_chains(free, 3, domains)
    assert sum(_spans(c, domains) == 3 for c in chains) == 4
    assert len(chains) == 20 // 3
    assert all(len({t // 1000 for t in c}) == 3 for c in chains)


def test_two_racks_three_replicas_use_both_racks_in_every_chain() -> None:
    free, domains = _racks(racks=2, nodes_per_rack=3, targets=2)
    chains = plan_chains(free, 3, domains)
    assert len(chains) == 4 and all(_spans(c, domains) == 2 for c in chains)


@pytest.mark.parametrize("seed", range(40))
def test_as_many_domain_distinct_chains_as_the_counts_allow(seed: int) -> None:
    rng = random.Random(seed)
    replicas = rng.randint(2, 4)
    free: dict[int, list[int]] = {}
    domains: dict[int, str] = {}
    for n in range(1, rng.randint(replicas, 24) + 1):
        free[n] = [n * 1000 + j for j in range(1, rng.randint(0, 5) + 1)]
        if rng.random() < 0.9:  # a few unlabelled nodes: domains of their own
            domains[n] = f"r{rng.randint(1, 6)}"
    chains = plan_chains(free, replicas, domains)
    used = [t for c in chains for t in c]
    assert len(used) == len(set(used)) and set(used) <= {t for ts in free.values() for t in ts}
    assert all(len({t // 1000 for t in c}) == replicas for c in chains)
    counts: dict[object, int] = {}
    for n, ts in free.items():
        key = domains.get(n) or n
        counts[key] = counts.get(key, 0) + len(ts)
    best = _max_distinct_chains([c for c in counts.values() if c], replicas)
    assert sum(_spans(c, domains) == replicas for c in chains) == best, (seed, chains)


def test_without_labels_the_chains_are_the_node_level_ones() -> None:
    free = {n: [n * 1000 + j for j in range(1, 5)] for n in range(1, 8)}
    assert plan_chains(free, 3, {n: f"own{n}" for n in free}) == plan_chains(free, 3) == plan_chains(free, 3, {})


def _register(st: ClusterState, n: int, domain: str, targets: int = 1) -> None:
    st.register(node_id=n, kind=NodeKind.STORAGE, host="10.0.0.1", port=9000 + n, now_s=0.0, domain=domain,
                targets=[TargetInfo(target_id=n * 1000 + i + 1, path=f"/t{i}") for i in range(targets)])


def test_chain_table_uses_registered_domains_and_the_store_keeps_them(tmp_path: Path) -> None:
    st = ClusterState(lease_s=5.0)
    for n in range(1, 7):
        _register(st, n, f"rack{(n - 1) // 3}", targets=2)  # nodes 1-3 rack0, 4-6 rack1
    st.create_chain_table(replicas=2)
    domains = {n: st.nodes[n].domain for n in st.nodes}
    assert all(_spans(c.targets, domains) == 2 for c in st.chains.values())
    store = MgmtdStore(f"sqlite:///{tmp_path}/m.db")
    store.save(st)
    store.close()
    st2 = ClusterState(lease_s=5.0)
    MgmtdStore(f"sqlite:///{tmp_path}/m.db").load(st2, now_s=10.0)
    assert {n: r.domain for n, r in st2.nodes.items()} == domains
    _register(st2, 1, "rack9")  # a relabelled node: the new label counts from now on
    assert st2.nodes[1].domain == "rack9"
    with pytest.raises(InvalidArgument):
        _register(st2, 7, "x" * 129)


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_node_advertising_an_unspecified_address_is_refused(host: str) -> None:
    st = ClusterState(lease_s=5.0)
    with pytest.raises(InvalidArgument, match="not reachable"):
        st.register(node_id=1, kind=NodeKind.STORAGE, host=host, port=8200, targets=[], now_s=0.0)
    assert not st.nodes


def _member(tid: int, node: int, domain: str, state: S = S.SERVING, **kw: object) -> Member:
    return Member(target_id=tid, node_id=node, state=state, domain=domain, **kw)  # type: ignore[arg-type]


def test_spare_from_a_domain_the_chain_lacks_even_on_a_busier_node() -> None:
    spares = [_member(11, 5, "rack0"), _member(12, 6, "rack2")]
    load = {5: 0, 6: 9}
    assert pick_spare(spares, {1, 2}, load, {"rack0", "rack1"}).target_id == 12  # type: ignore[union-attr]
    assert pick_spare(spares, {1, 2}, load).target_id == 11  # type: ignore[union-attr]  # no domains: load
    # every spare in a used domain: still a spare (on an unused node), the least loaded
    assert pick_spare(spares, {1, 2}, load, {"rack0", "rack2"}).target_id == 11  # type: ignore[union-attr]


def test_an_offline_replica_is_replaced_from_the_domain_it_leaves() -> None:
    members = [_member(1, 1, "rack0"), _member(2, 2, "rack1"),
               _member(3, 3, "rack2", S.OFFLINE, alive=False, offline_since_s=0.0)]
    spares = [_member(40, 4, "rack0"), _member(50, 5, "rack2")]
    plan = plan_chain(members, spares=spares, replicas=3, now_s=100.0, replace_after_s=10.0,
                      node_load={4: 0, 5: 5})
    assert plan.removed == [3] and plan.added == [50]  # rack2 again, though node 4 is idler
