"""A whole LoomFS cluster in one process on the simulated network and virtual time.

Real code throughout: mgmtd is ``MgmtdService`` + ``ClusterState`` + ``MgmtdStore`` (an
in-memory SQLite database that outlives mgmtd restarts, as the file would) with its tick loop;
each storage node is a ``StorageNode`` (RPC server, heartbeats, resyncer, scrubber) whose
targets sit on ``FaultyEngine``s; each client is a ``StorageClient`` with its own
``RoutingClient``. Every component gets the loop's clock and a seeded RNG.

Hosts are names on the ``SimNetwork``: ``mgmtd``, ``s1``..``sN`` (storage), ``c1``..``cK``
(clients). A crash kills every task of the host (``SimLoop.kill_host``), resets its
connections, marks its engines down and then drops their pending updates; a restart builds a
new process object over the same engines (the disks survive).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from loomfs.client.storage_client import StorageClient
from loomfs.common.clock import LOOP_CLOCK
from loomfs.common.routing import RoutingClient
from loomfs.config import RpcConfig, StorageConfig
from loomfs.errors import LoomError
from loomfs.mgmtd.service import MgmtdService
from loomfs.mgmtd.state import ClusterState
from loomfs.mgmtd.store import MgmtdStore
from loomfs.net.rpc import RpcClient, RpcServer
from loomfs.net.sim import LinkFaults, SimNetwork
from loomfs.net.transport import Address
from loomfs.storage.server import StorageNode
from loomfs.storage.target import StorageTarget, target_id_for
from loomfs.testing.sim.config import SimConfig
from loomfs.testing.sim.engine import EngineObserver, FaultyEngine
from loomfs.testing.sim.events import EventLog
from loomfs.testing.sim.loop import SimError, SimLoop
from loomfs.wire.message import Empty
from loomfs.wire.storage import STORAGE_PING
from loomfs.wire.types import Layout, TargetState

logger = logging.getLogger(__name__)

MGMTD_HOST = "mgmtd"
MGMTD_PORT = 8000
STORAGE_PORT = 8200
INODE = 0x5EED
DOOMED_BASE = 0xD00D0000  # deleted files of the removal workload: one inode per file, never reused


async def poll_until(pred: Callable[[], bool], *, step_s: float, timeout_s: float, what: str) -> None:
    """Wait (virtual time) until ``pred()``; SimError after ``timeout_s``."""
    end_s = asyncio.get_running_loop().time() + timeout_s
    while True:
        if pred():
            return
        if asyncio.get_running_loop().time() >= end_s:
            raise SimError(f"timed out after {timeout_s:.0f}s: {what}")
        await asyncio.sleep(step_s)


def storage_host(node_id: int) -> str:
    return f"s{node_id}"


def client_host(index: int) -> str:
    return f"c{index}"


@dataclass
class StorageHost:
    node_id: int
    host: str
    engines: list[FaultyEngine]
    node: StorageNode | None = None
    up: bool = False
    incarnation: int = 0


@dataclass
class MgmtdHost:
    state: ClusterState
    service: MgmtdService
    server: RpcServer
    probe_rpc: RpcClient


@dataclass
class SimClient:
    index: int
    host: str
    client_id: int
    rpc: RpcClient
    routing: RoutingClient
    storage: StorageClient
    lengths: dict[int, int] = field(default_factory=dict)  # chunk index -> last length seen


class SimCluster:
    def __init__(self, cfg: SimConfig, seed: int, log: EventLog, observer: EngineObserver):
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop), "SimCluster runs on a SimLoop"
        self.loop = loop
        self.cfg = cfg
        self.seed = seed
        self.log = log
        self.net = SimNetwork(seed=seed, faults=LinkFaults(latency_s=0.0003, jitter_s=0.0002))
        self.store = MgmtdStore("sqlite:///:memory:")
        self.mgmtd: MgmtdHost | None = None
        self.last_state: ClusterState | None = None  # kept while mgmtd is down
        self.mgmtd_incarnation = 0
        self.storage: dict[int, StorageHost] = {}
        self._formats: dict[int, int] = {}  # target id -> disks it has had (wipes)
        for node_id in range(1, cfg.storage_nodes + 1):
            engines = [FaultyEngine(target_id_for(node_id, i), self.rng(f"engine/{node_id}/{i}"), observer)
                       for i in range(cfg.targets_per_node)]
            for e in engines:
                e.format_id = self.new_format_id(e.target_id)
            self.storage[node_id] = StorageHost(node_id, storage_host(node_id), engines)
        self.clients: list[SimClient] = []
        self.layout = Layout()
        self.errors: list[str] = []  # harness-level problems (a task that would not die, ...)

    def rng(self, what: str) -> random.Random:
        """An RNG stream of its own per component, derived from the seed (str seeds are
        hashed with SHA-512, not PYTHONHASHSEED)."""
        return random.Random(f"{self.seed}/{what}")

    def new_format_id(self, target_id: int) -> str:
        """A disk's identity (``storage.diskident``): the next one for ``target_id``, from a stream
        of its own (the other streams' draws stay as they were)."""
        n = self._formats[target_id] = self._formats.get(target_id, -1) + 1
        return f"{self.rng(f'format/{target_id}/{n}').getrandbits(128):032x}"

    def spawn(self, host: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start ``coro`` as a task of ``host`` (killed with it, frozen with it)."""
        return self.loop.create_task(coro, context=self.net.context_of(host).copy())

    @property
    def state(self) -> ClusterState:
        """mgmtd's cluster state (the last one while mgmtd is down)."""
        assert self.last_state is not None
        return self.last_state

    @property
    def engines(self) -> dict[int, FaultyEngine]:
        return {e.target_id: e for sh in self.storage.values() for e in sh.engines}

    # ---- mgmtd --------------------------------------------------------------------------
    async def start_mgmtd(self) -> None:
        cfg = self.cfg
        self.mgmtd_incarnation += 1
        state = ClusterState(lease_s=cfg.lease_s, replace_after_s=cfg.replace_after_s)
        probe_rpc = RpcClient(self.net.transport(MGMTD_HOST), connect_timeout_s=min(1.0, cfg.lease_s / 2),
                              rng=self.rng(f"mgmtd/{self.mgmtd_incarnation}/probe"))
        probe_timeout_s = min(1.0, cfg.lease_s / 2)

        async def probe(host: str, port: int) -> bool:
            try:
                await probe_rpc.call(Address(host, port), STORAGE_PING, Empty(), timeout_s=probe_timeout_s,
                                     retry=False)
            except (LoomError, OSError):
                return False
            return True

        service = MgmtdService(state, self.store, heartbeat_interval_s=cfg.heartbeat_interval_s, clock=LOOP_CLOCK,
                               probe=probe)
        self.store.load(state, self.loop.time())
        service.persist()
        server = RpcServer("mgmtd", self.net.transport(MGMTD_HOST))
        server.add_service(service)
        await server.start(Address(MGMTD_HOST, MGMTD_PORT))
        self.mgmtd = MgmtdHost(state, service, server, probe_rpc)
        self.last_state = state
        self.spawn(MGMTD_HOST, self._mgmtd_ticks(service))

    async def _mgmtd_ticks(self, service: MgmtdService) -> None:
        while True:
            service.tick()
            await asyncio.sleep(self.cfg.heartbeat_interval_s / 2)

    async def crash_mgmtd(self) -> None:
        if self.mgmtd is None:
            return
        self.mgmtd = None
        self.net.crash_host(MGMTD_HOST)
        await self._reap(MGMTD_HOST)

    async def _reap(self, host: str) -> None:
        await self._await_dead(host, self.loop.kill_host(host))

    async def _await_dead(self, host: str, tasks: list[asyncio.Task[Any]]) -> None:
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        stuck = [t for t in tasks if not t.done()]
        if stuck:
            self.errors.append(f"{len(stuck)} tasks of {host} survived their crash: {stuck[0]!r}")

    # ---- storage ------------------------------------------------------------------------
    def _storage_config(self, node_id: int) -> StorageConfig:
        cfg = self.cfg
        return StorageConfig(
            host=storage_host(node_id), port=STORAGE_PORT, node_id=node_id, mgmtd=f"{MGMTD_HOST}:{MGMTD_PORT}",
            metrics_port=-1, scrub_bytes_per_s=cfg.scrub_bytes_per_s, scrub_interval_s=cfg.scrub_interval_s,
            suspect_after_s=cfg.suspect_after_s, max_chunk_size_bytes=max(cfg.chunk_size_bytes, 1 << 20),
            rpc=RpcConfig(connect_timeout_s=cfg.rpc_connect_timeout_s, call_timeout_s=cfg.rpc_call_timeout_s,
                          retry_attempts_max=3),
        )

    def start_storage(self, node_id: int) -> None:
        sh = self.storage[node_id]
        assert not sh.up
        sh.up = True
        sh.incarnation += 1
        for e in sh.engines:
            e.down = False
        self.spawn(sh.host, self._storage_main(sh))

    async def _storage_main(self, sh: StorageHost) -> None:
        targets = [StorageTarget(e.target_id, e, f"/sim/{sh.host}/t{i}", format_id=e.format_id)
                   for i, e in enumerate(sh.engines)]
        node = StorageNode(self._storage_config(sh.node_id), transport=self.net.transport(sh.host),
                           targets=targets, clock=LOOP_CLOCK, rng=self.rng(f"storage/{sh.node_id}/{sh.incarnation}"))
        sh.node = node
        await node.start()
        await node.register()
        await asyncio.gather(node.heartbeat_loop(), node.scrubber.run())

    def kill_storage_now(self, node_id: int) -> list[asyncio.Task[Any]]:
        """The instant of a crash (synchronous, so it can happen inside a commit): engines
        down, connections reset, every task of the node cancelled. Returns those tasks."""
        sh = self.storage[node_id]
        sh.up = False
        for e in sh.engines:
            e.down = True
        self.net.crash_host(sh.host)
        return self.loop.kill_host(sh.host)

    async def crash_storage(self, node_id: int, *, tear: bool = False,
                            killed: list[asyncio.Task[Any]] | None = None) -> list[str]:
        """Kill storage node ``node_id``'s process (or finish a ``kill_storage_now``): its
        pending updates are lost. Returns torn chunks (as text)."""
        sh = self.storage[node_id]
        if killed is None:
            if not sh.up:
                return []
            killed = self.kill_storage_now(node_id)
        await self._await_dead(sh.host, killed)
        sh.node = None
        torn = []
        for e in sh.engines:
            e.crash(tear=tear)
            if e.last_torn is not None:
                torn.append(f"t{e.target_id}:{e.last_torn}")
        return torn

    # ---- clients ------------------------------------------------------------------------
    def add_client(self, index: int) -> SimClient:
        cfg = self.cfg
        host = client_host(index)
        rpc = RpcClient(self.net.transport(host), connect_timeout_s=cfg.rpc_connect_timeout_s,
                        call_timeout_s=cfg.client_op_timeout_s, rng=self.rng(f"client/{index}/rpc"))
        # how often a client refreshes routing on its own (the default is 2 s): a client with old
        # routing is what reads from a replica that has left its chain
        refresh_s = self.rng(f"client/{index}/refresh").uniform(0.5, 4.0)
        routing = RoutingClient(rpc, [Address(MGMTD_HOST, MGMTD_PORT)], refresh_s=refresh_s)
        client_id = self.rng(f"client/{index}/id").getrandbits(62) | 1
        storage = StorageClient(rpc, routing, client_id, call_timeout_s=cfg.client_op_timeout_s,
                                rng=self.rng(f"client/{index}/storage"), clock=LOOP_CLOCK, watch_after_s=0.5)
        client = SimClient(index, host, client_id, rpc, routing, storage)
        self.clients.append(client)
        self.spawn(host, routing.run())
        return client

    # ---- start-up -----------------------------------------------------------------------
    async def start(self) -> None:
        await self.start_mgmtd()
        for node_id in self.storage:
            self.start_storage(node_id)
        await poll_until(lambda: all(n in self.state.nodes for n in self.storage), step_s=0.05, timeout_s=30.0,
                         what="storage nodes registering")
        assert self.mgmtd is not None
        table = self.state.create_chain_table(replicas=self.cfg.replicas)
        self.mgmtd.service.persist()
        chains = sorted(table.chain_ids)
        self.layout = Layout(chunk_size=self.cfg.chunk_size_bytes, stripe=len(chains), table_id=table.table_id,
                             replicas=self.cfg.replicas, chains=chains)
        self.log.add(f"chain table {table.table_id}: chains {chains}")
        for i in range(1, self.cfg.clients + 1):
            self.add_client(i)
        # every storage node knows the chains before the clients start
        await poll_until(lambda: all(sh.node is not None and sh.node.routing.has_routing
                                     and sh.node.routing.current.version >= self.state.version
                                     for sh in self.storage.values()),
                         step_s=0.05, timeout_s=30.0, what="storage nodes fetching routing")

    # ---- views ----------------------------------------------------------------------------
    def chain_summary(self) -> list[str]:
        st = self.state
        out = []
        for cid in sorted(st.chains):
            c = st.chains[cid]
            members = " ".join(f"{t}:{TargetState(st.targets[t].state).name.lower()}" for t in c.targets)
            out.append(f"chain {cid} v{c.version} [{members}]")
        return out

    def serving_members(self, chain_id: int) -> list[int]:
        st = self.state
        c = st.chains[chain_id]
        return [t for t in c.targets if st.targets[t].state == TargetState.SERVING]

    def node_of_target(self, target_id: int) -> int:
        return target_id // 1000

    def __repr__(self) -> str:
        up = sorted(n for n, sh in self.storage.items() if sh.up)
        return f"SimCluster(seed={self.seed} mgmtd={'up' if self.mgmtd else 'down'} storage_up={up})"
