"""Clients writing, overwriting, appending to, truncating and reading a few shared chunks.

Every operation is recorded as a ``history.Op`` with its invoke and completion times (virtual),
per chunk, for the linearizability checker. Written bytes name the op that wrote them
(``"<op id in hex>|"`` repeated), so a wrong read shows whose data it saw. A failed or
timed-out update is recorded as unknown (``ok=None``): it may or may not have taken effect,
and may still take effect later (its frames can be held in the network).
"""

from __future__ import annotations

import asyncio
import random

from loomfs.errors import LoomError
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.testing.sim.cluster import DOOMED_BASE, INODE, SimClient, SimCluster
from loomfs.testing.sim.config import SimConfig
from loomfs.testing.sim.events import EventLog
from loomfs.testing.sim.history import Op


def pattern(op_id: int, length: int) -> bytes:
    """``length`` bytes that say which op wrote them."""
    unit = f"{op_id:x}|".encode()
    return (unit * (length // len(unit) + 1))[:length]


class Workload:
    def __init__(self, cluster: SimCluster, cfg: SimConfig, log: EventLog, rng: random.Random,
                 removed_inodes: set[int] | None = None):
        self.cluster = cluster
        self.removed_inodes = removed_inodes if removed_inodes is not None else set()
        self.unremoved: list[int] = []  # deleted files whose removal has not succeeded yet
        self.late: list[asyncio.Task[None]] = []  # late writers of deleted files
        self.removals = 0
        self.removed_chunks_held = 0  # chunks of successfully removed files found before the final removal
        self.cfg = cfg
        self.log = log
        self.rng = rng
        self.history: dict[int, list[Op]] = {i: [] for i in range(cfg.chunks)}
        self._next_op = 0
        self.unexpected: list[str] = []  # exceptions that are neither LoomError nor OSError
        self.acked = 0
        self.failed = 0

    def _op_id(self) -> int:
        self._next_op += 1
        return self._next_op

    async def run_client(self, client: SimClient, until_s: float) -> None:
        rng = random.Random(f"{self.cluster.seed}/workload/{client.index}")
        loop = asyncio.get_running_loop()
        while loop.time() < until_s:
            ok = await self.one_op(client, rng)
            # an application backs off after an error instead of hammering a sick chain
            pause_s = rng.uniform(0.0, self.cfg.think_s_max) if ok else rng.uniform(0.1, 0.4)
            await asyncio.sleep(pause_s)

    async def one_op(self, client: SimClient, rng: random.Random) -> bool:
        """One random op; False when it failed."""
        cfg = self.cfg
        index = rng.randrange(cfg.chunks)
        size = cfg.chunk_size_bytes
        r = rng.random()
        if r < 0.35:
            length = 1 + rng.randrange(cfg.write_bytes_max)
            if rng.random() < 0.1:
                length = size
            offset = rng.randrange(size - length + 1)
            op = await self.write(client, index, offset, length)
        elif r < 0.5:  # append at the end this client last saw
            length = 1 + rng.randrange(cfg.write_bytes_max)
            offset = min(client.lengths.get(index, 0), size - length)
            op = await self.write(client, index, offset, length)
        elif r < 0.6:
            cut = rng.random()
            length = 0 if cut < 0.1 else rng.randrange(size + 1) if cut < 0.5 else rng.randrange(size // 4 + 1)
            op = await self.truncate(client, index, length)
        elif r < 0.8:
            op = await self.read(client, index, 0, size)
        else:
            offset = rng.randrange(size)
            op = await self.read(client, index, offset,
                                 1 + rng.randrange(min(size - offset, 4 * cfg.write_bytes_max)))
        return op.ok is True

    async def write(self, client: SimClient, index: int, offset: int, length: int) -> Op:
        op_id = self._op_id()
        data = pattern(op_id, length)
        op = Op(op_id, client.index, "write", self._now(), None, None, offset=offset, data=data)
        self.history[index].append(op)
        self.log.add(f"c{client.index} op{op_id} write k{index} [{offset},{offset + length})")
        await self._finish(op, index, client.storage.write_chunk(
            self.cluster.layout, INODE, index, offset, memoryview(data)))
        if op.ok:
            client.lengths[index] = max(client.lengths.get(index, 0), offset + length)
        return op

    async def truncate(self, client: SimClient, index: int, length: int) -> Op:
        op_id = self._op_id()
        op = Op(op_id, client.index, "truncate", self._now(), None, None, length=length)
        self.history[index].append(op)
        self.log.add(f"c{client.index} op{op_id} truncate k{index} {length}")
        await self._finish(op, index, client.storage.truncate_chunk(self.cluster.layout, INODE, index, length))
        if op.ok:
            client.lengths[index] = length
        return op

    async def read(self, client: SimClient, index: int, offset: int, length: int) -> Op:
        op_id = self._op_id()
        op = Op(op_id, client.index, "read", self._now(), None, None, offset=offset, length=length)
        self.history[index].append(op)
        self.log.add(f"c{client.index} op{op_id} read k{index} [{offset},{offset + length})")
        buf = bytearray(length)
        n = await self._finish(op, index, client.storage.read_chunk(
            self.cluster.layout, INODE, index, offset, length, memoryview(buf)))
        if op.ok and n is not None:
            op.result = bytes(buf[:n])
            if offset == 0 and n < length:
                client.lengths[index] = n
        return op

    async def _finish(self, op: Op, index: int, call: object) -> int | None:
        assert asyncio.iscoroutine(call)
        try:
            result = await call
        except (LoomError, OSError) as exc:
            op.ok = False if op.kind == "read" else None  # an update's effect is unknown
            op.complete_s = self._now() if op.kind == "read" else None
            self.failed += 1
            self.log.add(f"c{op.client} op{op.op_id} failed: {type(exc).__name__} {_status(exc)}")
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a client bug: reported as a violation
            op.ok = None
            self.unexpected.append(f"op{op.op_id} ({op.kind} chunk {index}) raised {type(exc).__name__}: {exc}")
            self.log.add(f"c{op.client} op{op.op_id} raised {type(exc).__name__}")
            return None
        op.ok = True
        op.complete_s = self._now()
        self.acked += 1
        extra = f" -> {result} bytes" if op.kind == "read" else ""
        self.log.add(f"c{op.client} op{op.op_id} ok{extra}")
        return result if isinstance(result, int) else None

    # ---- deleted files: chunks removed while late writers still write them ------------------
    async def run_removals(self, until_s: float) -> None:
        """Meta's GC, roughly: a file's chunks are written, the file is deleted and its chunks
        removed (REMOVE_CHUNKS through each chain's head), while a writer that has not heard of
        the delete may still write one of them. Nothing is read back: the replicas must agree
        (convergence), whatever the order the removal and the late write took."""
        rng = random.Random(f"{self.cluster.seed}/workload/removals")
        clients = self.cluster.clients
        gc = clients[0]
        loop = asyncio.get_running_loop()
        gen = 0
        while loop.time() < until_s:
            inode, gen = DOOMED_BASE + gen, gen + 1
            chunks = 1 + rng.randrange(4)
            writer = rng.choice(clients)
            for index in range(chunks):
                await self._doomed_write(writer, inode, index, rng)
            await asyncio.sleep(rng.uniform(0.0, 0.2))
            if rng.random() < self.cfg.late_writes:  # a late writer, racing the removal
                late = rng.choice(clients)
                self.late.append(self.cluster.spawn(late.host, self._late_write(
                    late, inode, rng.randrange(chunks), rng.uniform(0.0, 0.02), rng)))
            self.unremoved.append(inode)
            await self._remove(gc, inode)
            await asyncio.sleep(rng.uniform(0.0, 0.3))

    async def finish_removals(self, timeout_s: float) -> None:
        """After the faults: every deleted file's chunks removed once more, until it took effect
        (meta's GC retries an entry until storage removed it; ``loomfs admin fsck --repair``
        removes orphans). Once more even where a removal succeeded: a late copy of a forwarded
        update (a retried RPC) can re-create a deleted file's chunk on the replica it reaches
        after the removal, an orphan on some replicas only (known: no tombstones,
        docs/fault-tolerance.md). Late writes end first."""
        if self.late:
            await asyncio.gather(*self.late, return_exceptions=True)
        self._note_leftovers()
        self.unremoved = sorted(self.removed_inodes)
        loop = asyncio.get_running_loop()
        end_s = loop.time() + timeout_s
        gc = self.cluster.clients[0]
        while self.unremoved and loop.time() < end_s:
            for inode in list(self.unremoved):
                await self._remove(gc, inode)
            if self.unremoved:
                await asyncio.sleep(0.25)

    def _note_leftovers(self) -> None:
        """Before the final removal hides them: chunks of files whose removal succeeded that a
        target still holds. Not a violation (a late copy of an update re-creates one, the known
        gap; a target back from outside its chain holds them until its resync), but in the trace
        and the stats (``removed_chunks_held``), so what the final removal masks stays visible.
        Reads engine state only (even of a target that is down): no event of the run changes,
        its trace gets these lines."""
        done = sorted(set(self.removed_inodes) - set(self.unremoved))
        for tid, engine in sorted(self.cluster.engines.items()):
            for inode in done:
                for st in MemoryEngine.list_chunks(engine, inode, limit=1 << 20):
                    self.removed_chunks_held += 1
                    self.log.add(f"gc: {inode:x}/{st.key.index} v{st.commit_ver}"
                                 + (f" pending v{st.pending_ver}" if st.has_pending else "")
                                 + f" still on t{tid} after its removal succeeded")

    async def _doomed_write(self, client: SimClient, inode: int, index: int, rng: random.Random) -> None:
        length = 1 + rng.randrange(self.cfg.write_bytes_max)
        offset = rng.randrange(self.cfg.chunk_size_bytes - length + 1)
        op_id = self._op_id()
        try:
            await client.storage.write_chunk(self.cluster.layout, inode, index, offset,
                                             memoryview(pattern(op_id, length)))
            self.log.add(f"c{client.index} op{op_id} write {inode:x}/{index} ok")
        except (LoomError, OSError) as exc:
            self.log.add(f"c{client.index} op{op_id} write {inode:x}/{index} failed: {type(exc).__name__}")

    async def _late_write(self, client: SimClient, inode: int, index: int, delay_s: float,
                          rng: random.Random) -> None:
        await asyncio.sleep(delay_s)
        await self._doomed_write(client, inode, index, rng)

    async def _remove(self, client: SimClient, inode: int) -> None:
        self.removed_inodes.add(inode)  # from now on its chunks may start their numbers again
        try:
            await client.storage.remove_chunks(self.cluster.layout, inode, 0)
        except (LoomError, OSError) as exc:
            self.log.add(f"gc: removal of {inode:x} failed: {type(exc).__name__} {_status(exc)}")
            return
        if inode in self.unremoved:
            self.unremoved.remove(inode)
        self.removals += 1
        self.log.add(f"gc: removed {inode:x}")

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def ops(self) -> int:
        return sum(len(v) for v in self.history.values())

    def __repr__(self) -> str:
        return f"Workload(ops={self.ops()} acked={self.acked} failed={self.failed})"


def _status(exc: BaseException) -> str:
    st = getattr(exc, "status", None)
    return st.name if st is not None else ""
