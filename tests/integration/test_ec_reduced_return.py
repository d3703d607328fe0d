"""A reduced-redundancy EC overwrite (``ec_ack_fragments_min``) on a real 6-node cluster,
then the skipped fragment's server comes back (before any spare replaced it) with the old
bytes: reads of the file compare versions (``Layout.ec_reduced``) and serve the new bytes;
``loomfs layout scrub --repair`` rewrites the old fragment and clears the mark (docs/ec.md).
Before, a healthy read served the returning server's old fragment inside the new data."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_ec_cluster import CS, _cli, _rng, ec_cluster  # noqa: F401  (the module's own cluster)

import loomfs
from loomfs.cli.layout import ec_layout
from loomfs.client.storage_client import StorageClient
from loomfs.config import ClientConfig
from loomfs.testing import LocalCluster
from loomfs.wire.types import Layout, NodeState, TargetState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def rfs(ec_cluster: LocalCluster) -> Iterator[loomfs.LoomFS]:  # noqa: F811
    fs = loomfs.connect(str(ec_cluster.root))
    fs.makedirs("/cold", exist_ok=True)
    fs.set_layout("/cold", ec_layout(Layout(chunk_size=CS), (4, 2)))
    yield fs
    fs.close()


def test_a_server_back_with_a_skipped_fragment_is_not_served(rfs: loomfs.LoomFS,
                                                            ec_cluster: LocalCluster) -> None:  # noqa: F811
    rng = _rng("reduced-return")
    old = rng.randbytes(2 * 4 * CS)  # two full stripes
    with rfs.open("/cold/r", "wb") as f:
        f.write(old)
    lay = rfs.attr("/cold/r").layout
    assert lay is not None and lay.ec_k == 4 and not lay.ec_reduced
    r0 = ec_cluster.routing()
    node_of = {t.target_id: t.node_id for t in r0.targets}
    chain0 = next(c for c in r0.chains if c.chain_id == lay.chains[0])  # data fragment 0 of stripe 0
    node = node_of[chain0.targets[0]]
    victim = next(name for name, s in ec_cluster.services.items() if s.kind == "storage" and s.node_id == node)
    ec_cluster.kill_service(victim)
    ec_cluster.wait_routing(lambda r: all(n.state != NodeState.ALIVE for n in r.nodes if n.node_id == node),
                            30, "victim marked dead")
    new = rng.randbytes(len(old))
    reduced = loomfs.connect(str(ec_cluster.root), config=ClientConfig(ec_ack_fragments_min=5))
    try:
        storage = reduced.client.storage
        assert isinstance(storage, StorageClient)
        reduced.run(storage.routing.refresh())
        with reduced.open("/cold/r", "r+b") as f:  # an overwrite in place, acknowledged at close
            f.write(new)
    finally:
        reduced.close()
    marked = rfs.attr("/cold/r").layout
    assert marked is not None and marked.ec_reduced > 0
    ec_cluster.start_service(victim)  # back before any spare: its fragment holds the old bytes
    ec_cluster.wait_listening(victim, 30)
    ec_cluster.wait_routing(
        lambda r: any(c.chain_id == chain0.chain_id and c.targets and
                      next(t for t in r.targets if t.target_id == c.targets[0]).state == TargetState.SERVING
                      for c in r.chains), 30, "the victim's chain serving again")
    fresh = loomfs.connect(str(ec_cluster.root))
    try:
        assert fresh.cat("/cold/r") == new
    finally:
        fresh.close()
    out = _cli(ec_cluster, "layout", "scrub", "--repair", "/cold/r")
    assert out.returncode == 0, out.stdout + out.stderr
    cleared = rfs.attr("/cold/r").layout
    assert cleared is not None and cleared.ec_reduced == 0  # every fragment good again
    fresh = loomfs.connect(str(ec_cluster.root))
    try:
        assert fresh.cat("/cold/r") == new  # a healthy read (no versions compared) now
    finally:
        fresh.close()
