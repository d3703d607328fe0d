"""The EC rebuild worker (runs in meta): regenerates lost fragments onto a spare by itself.

mgmtd swaps an empty spare into an EC group's chain whose target's node has been dead
for ``replace_after_s`` (``loomfs.mgmtd.ec``): the chain keeps its id, gets a new target and a
new version. Chain replication cannot fill it; this worker does, with the EC scrub's repair
(``loomfs.client.ec_rebuild.scrub_file``). Each tick it compares the target of every chain of
an EC group's table (``ChainTable.ec`` in routing, never a replica count) with the target it
last knew complete (stored per chain in the metastore's worker state, ``ec_rebuild/<chain>``);
a chain whose target changed gets a *job*:

1. ``count``: page through every inode (``scan_inodes``) and count the EC files with a
   fragment on the chain (files and bytes: the progress' denominator);
2. ``repair``: page through them again and scrub each such file with repair (every stripe's
   k+m fragments read and checked, absent/corrupt/stale ones rewritten: the new target's);
   files open for write are left for later (a repair must not race the writer's stripes);
3. ``retry``: the files left for later, and those whose fragment on the chain could not be
   rewritten (another server down too), are tried again every ``retry_interval_s``; a file
   that fails ``attempts_max`` times is given up (logged; ``loomfs layout scrub`` reports it).

Then "rebuild done" is logged and the target recorded as complete. Progress (phase, inode
cursor, files/bytes done and total, the retry list) is saved in the job's record as it goes
(at least every ``save_every_s``), so a restarted meta continues at the cursor: at most the
file in progress is redone. Several meta servers share a store: a job is claimed (owner,
until) and renewed with every save; another server takes over once the claim ran out.
The rate is bounded (``bytes_per_s`` of file bytes scrubbed). ``records`` (the last read
of every chain's record) feeds ``/metrics`` (``RebuildCollector``) and ``loomfs admin rebuilds``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from loomfs.client.ec_rebuild import ScrubReport, scrub_file
from loomfs.client.storage_client import StorageClient
from loomfs.common.clock import SYSTEM_CLOCK, Clock
from loomfs.common.routing import Routing, RoutingClient
from loomfs.errors import LoomError
from loomfs.meta.store.base import MetaStore, TxnConflict
from loomfs.wire.types import Attr, FileType, TargetState

logger = logging.getLogger(__name__)

KEY_PREFIX = "ec_rebuild/"
PHASES = ("count", "repair", "retry")


@dataclass
class Job:
    target: int  # the chain's new target, being filled
    chain_version: int
    phase: str = "count"
    cursor: int = 0  # inodes <= cursor are done in this phase
    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0
    files_failed: int = 0  # given up after attempts_max
    retry: dict[int, int] = field(default_factory=dict)  # inode -> failed attempts (0: deferred, open)
    started_unix_s: float = 0.0


@dataclass
class Record:
    """One chain's rebuild state, as stored (msgpack of the dict)."""

    chain_id: int
    complete_target: int  # the target known to hold every fragment of the chain
    job: Job | None = None
    last: dict[str, Any] = field(default_factory=dict)  # the last finished job: target, files, bytes, failed, ...
    claim_owner: int = 0
    claim_until_ns: int = 0

    def pack(self) -> bytes:
        d = asdict(self)
        if self.job is not None:
            d["job"]["retry"] = list(self.job.retry.items())
        return bytes(msgpack.packb(d))

    @classmethod
    def unpack(cls, blob: bytes) -> Record:
        d = msgpack.unpackb(blob, strict_map_key=False)
        job = d.pop("job", None)
        rec = cls(**d)
        if job is not None:
            job["retry"] = {int(i): int(n) for i, n in job.get("retry", [])}
            rec.job = Job(**job)
        return rec


def key_of(chain_id: int) -> str:
    return f"{KEY_PREFIX}{chain_id}"


def ec_chains(routing: Routing) -> dict[int, tuple[int, int]]:
    """The EC tables' chains (``ChainTable.ec``; a replicated single-replica table's are not:
    mgmtd never swaps an empty spare into them): chain -> (target, chain version)."""
    out: dict[int, tuple[int, int]] = {}
    for c in routing.chains.values():
        t = routing.tables.get(c.table_id)
        if t is not None and t.ec and len(c.targets) == 1:
            out[c.chain_id] = (c.targets[0], c.version)
    return out


def has_fragment_on(attr: Attr, chain_id: int) -> bool:
    lay = attr.layout
    return (attr.type == FileType.FILE and lay is not None and lay.ec_k > 0 and not attr.inline
            and chain_id in lay.chains)


class LostClaim(Exception):
    """Another meta server took the job over (this one's claim ran out)."""


ScrubFn = Callable[[Attr], Awaitable[ScrubReport]]


async def clear_ec_reduced(store: MetaStore, inode: int, gen: int) -> None:
    """After a repairing scrub that found the whole file at full redundancy, having read its
    attributes at ``Layout.ec_reduced`` = ``gen`` first: reads need not compare versions any
    more, unless a reduced write marked it again meanwhile (``mark_ec_reduced``)."""
    from loomfs.meta.ops.files import mark_ec_reduced

    async with store.write() as txn:
        attr = await txn.get_inode(inode)
        if attr is not None:
            await mark_ec_reduced(txn, attr, False, gen)


class RebuildWorker:
    """``scrub``: how one file is scrubbed with repair (default: ``scrub_file`` through
    ``storage``; unit tests pass their own)."""

    def __init__(self, store: MetaStore, storage: StorageClient | None, routing: RoutingClient, *,
                 scrub: ScrubFn | None = None, owner: int = 0, interval_s: float = 2.0, bytes_per_s: float = 64 << 20,
                 page_inodes: int = 512, save_every_s: float = 1.0, claim_s: float = 30.0,
                 retry_interval_s: float = 5.0, attempts_max: int = 5, clock: Clock = SYSTEM_CLOCK):
        self.store = store
        self.storage = storage
        self.routing = routing
        self.scrub = scrub or self._scrub_file
        self.owner = owner or random.SystemRandom().getrandbits(62) + 1
        self.interval_s = interval_s
        self.bytes_per_s = bytes_per_s
        self.page_inodes = page_inodes
        self.save_every_s = save_every_s
        self.claim_s = claim_s
        self.retry_interval_s = retry_interval_s
        self.attempts_max = attempts_max
        self.clock = clock
        self.records: dict[int, Record] = {}  # the last read or save of each chain's record
        self.rebuilds_done_total = 0
        self.files_rebuilt_total = 0
        self.bytes_rebuilt_total = 0
        self._retry_at_s: dict[int, float] = {}  # chain -> monotonic time of its next retry round

    async def _scrub_file(self, a: Attr) -> ScrubReport:
        assert self.storage is not None
        rep = await scrub_file(self.storage, f"inode {a.inode}", a, repair=True)
        if rep.full_redundancy and a.layout is not None and a.layout.ec_reduced:
            await clear_ec_reduced(self.store, a.inode, a.layout.ec_reduced)
        return rep

    def _unix_s(self) -> float:
        return self.clock.now_ns() / 1e9

    # records ---------------------------------------------------------------------------
    async def _load(self) -> dict[int, Record]:
        async with self.store.read() as txn:
            rows = await txn.state_list(KEY_PREFIX)
        out: dict[int, Record] = {}
        for key, blob in rows:
            try:
                rec = Record.unpack(blob)
            except (ValueError, TypeError, KeyError) as exc:  # a record we cannot read: start it over
                logger.warning("ec rebuild: record %s unreadable (%s); dropped", key, exc)
                continue
            out[rec.chain_id] = rec
        self.records = out
        return out

    async def _save(self, rec: Record, *, claim: bool = True) -> None:
        """Store ``rec``, renewing this worker's claim; LostClaim if another one holds it."""
        now = self.clock.now_ns()
        async with self.store.write() as txn:
            blob = await txn.state_get(key_of(rec.chain_id))
            cur = Record.unpack(blob) if blob is not None else None
            if (cur is not None and cur.claim_owner not in (0, self.owner) and cur.claim_until_ns > now):
                self.records[rec.chain_id] = cur
                raise LostClaim(f"chain {rec.chain_id}: rebuild claimed by {cur.claim_owner:#x}")
            rec.claim_owner = self.owner if claim else 0
            rec.claim_until_ns = now + int(self.claim_s * 1e9) if claim else 0
            await txn.state_put(key_of(rec.chain_id), rec.pack())
        self.records[rec.chain_id] = rec

    # the loop ----------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except TxnConflict as exc:  # another meta server saved the same record: next round
                logger.debug("ec rebuild round: %s", exc)
            except Exception:
                logger.exception("ec rebuild round failed")
            await asyncio.sleep(self.interval_s)

    async def run_once(self) -> int:
        """Notice target changes, then work on the jobs this worker may claim (each to its
        end, or to its retry wait). Returns how many jobs finished."""
        if not self.routing.has_routing:
            return 0
        routing = self.routing.current
        chains = ec_chains(routing)
        records = await self._load()
        for chain_id, (target, version) in sorted(chains.items()):
            rec = records.get(chain_id)
            if rec is None:  # first sight: what the chain holds now is the baseline
                await self._save(Record(chain_id, complete_target=target), claim=False)
                continue
            job = rec.job
            if (job is None and target != rec.complete_target) or (job is not None and job.target != target):
                if job is not None:
                    logger.warning("ec rebuild: chain %d got target %d while rebuilding onto %d: starting over",
                                   chain_id, target, job.target)
                rec.job = Job(target=target, chain_version=version, started_unix_s=self._unix_s())
                logger.info("ec rebuild: chain %d v%d has a new target %d (was %d): rebuilding its fragments",
                            chain_id, version, target, rec.complete_target)
                try:
                    await self._save(rec)
                except LostClaim:
                    continue
        done = 0
        for chain_id in sorted(chains):
            rec = self.records.get(chain_id)
            if rec is None or rec.job is None:
                continue
            t = routing.targets.get(rec.job.target)
            if t is None or t.state != TargetState.SERVING or chains[chain_id][0] != rec.job.target:
                continue  # wait for the target to serve
            if rec.claim_owner not in (0, self.owner) and rec.claim_until_ns > self.clock.now_ns():
                continue  # another meta server works on it
            try:
                done += await self._work(rec)
            except LostClaim as exc:
                logger.info("ec rebuild: %s", exc)
        return done

    async def _work(self, rec: Record) -> int:
        job = rec.job
        assert job is not None
        await self._save(rec)  # claim
        if job.phase == "count":
            await self._count(rec, job)
        if job.phase == "repair":
            await self._repair_pass(rec, job)
        if job.phase == "retry":
            if job.retry and self.clock.monotonic() < self._retry_at_s.get(rec.chain_id, 0.0):
                return 0
            await self._retry_round(rec, job)
            if job.retry:
                self._retry_at_s[rec.chain_id] = self.clock.monotonic() + self.retry_interval_s
                await self._save(rec, claim=False)
                return 0
        seconds = self._unix_s() - job.started_unix_s
        rec.last = {"target": job.target, "files": job.files_done, "bytes": job.bytes_done,
                    "failed": job.files_failed, "seconds": round(seconds, 3), "done_unix_s": round(self._unix_s(), 3)}
        rec.complete_target = job.target
        rec.job = None
        await self._save(rec, claim=False)
        self.rebuilds_done_total += 1
        logger.info("ec rebuild done: chain %d target %d: %d files, %d bytes in %.1fs (%d given up)",
                    rec.chain_id, rec.complete_target, rec.last["files"], rec.last["bytes"], seconds,
                    rec.last["failed"])
        return 1

    async def _pages(self, after: int) -> AsyncIterator[list[Attr]]:
        while True:
            async with self.store.read() as txn:
                page = await txn.scan_inodes(after, self.page_inodes)
            if not page:
                return
            yield page
            after = page[-1].inode

    async def _count(self, rec: Record, job: Job) -> None:
        async for page in self._pages(job.cursor):
            for a in page:
                if has_fragment_on(a, rec.chain_id):
                    job.files_total += 1
                    job.bytes_total += a.size
            job.cursor = page[-1].inode
            await self._save(rec)
        job.phase, job.cursor = "repair", 0
        await self._save(rec)
        logger.info("ec rebuild: chain %d: %d files, %d bytes to rebuild onto target %d",
                    rec.chain_id, job.files_total, job.bytes_total, job.target)

    async def _repair_pass(self, rec: Record, job: Job) -> None:
        saved_s = self.clock.monotonic()
        async for page in self._pages(job.cursor):
            for a in page:
                if has_fragment_on(a, rec.chain_id):
                    await self._one(rec, job, a)
                job.cursor = a.inode
                if self.clock.monotonic() - saved_s >= self.save_every_s:
                    await self._save(rec)
                    saved_s = self.clock.monotonic()
            await self._save(rec)
            saved_s = self.clock.monotonic()
        job.phase, job.cursor = "retry", 0
        await self._save(rec)

    async def _retry_round(self, rec: Record, job: Job) -> None:
        for inode in sorted(job.retry):
            async with self.store.read() as txn:
                a = await txn.get_inode(inode)
            if a is None or not has_fragment_on(a, rec.chain_id):  # gone (or converted) meanwhile
                job.retry.pop(inode, None)
                job.files_done += 1
                continue
            await self._one(rec, job, a)
            await self._save(rec)

    async def _one(self, rec: Record, job: Job, a: Attr) -> None:
        """Scrub one file with repair; count it done, or put it on the retry list."""
        async with self.store.read() as txn:
            open_for_write = await txn.has_session(a.inode)
        if open_for_write:
            job.retry.setdefault(a.inode, 0)
            logger.info("ec rebuild: chain %d: inode %d is open for write; later", rec.chain_id, a.inode)
            return
        started_s = self.clock.monotonic()
        try:
            rep = await self.scrub(a)
            ok = rec.chain_id not in rep.unhealthy_chains
            why = f"{rep.lost_stripes} stripes lost, {rep.unreachable_fragments} fragments unreachable"
        except (LoomError, OSError) as exc:
            ok, why = False, str(exc)
        if ok:
            job.retry.pop(a.inode, None)
            job.files_done += 1
            job.bytes_done += a.size
            self.files_rebuilt_total += 1
            self.bytes_rebuilt_total += a.size
        else:
            attempts = job.retry.get(a.inode, 0) + 1
            if attempts >= self.attempts_max:
                job.retry.pop(a.inode, None)
                job.files_failed += 1
                logger.error("ec rebuild: chain %d: inode %d given up after %d attempts (%s); "
                             "`loomfs layout scrub --repair` it once its servers are back",
                             rec.chain_id, a.inode, attempts, why)
            else:
                job.retry[a.inode] = attempts
                logger.warning("ec rebuild: chain %d: inode %d not rebuilt yet (%s); retried later",
                               rec.chain_id, a.inode, why)
        if self.bytes_per_s > 0:  # background work: bounded rate
            pause_s = a.size / self.bytes_per_s - (self.clock.monotonic() - started_s)
            if pause_s > 0:
                await asyncio.sleep(pause_s)

    def __repr__(self) -> str:
        active = sum(1 for r in self.records.values() if r.job is not None)
        return (f"RebuildWorker(active={active} done={self.rebuilds_done_total} "
                f"files={self.files_rebuilt_total} bytes={self.bytes_rebuilt_total})")


def progress_rows(records: Iterable[Record]) -> list[dict[str, Any]]:
    """One row per chain with a job or a finished one: what ``/metrics`` and admin show."""
    rows: list[dict[str, Any]] = []
    for r in sorted(records, key=lambda r: r.chain_id):
        if r.job is not None:
            j = r.job
            rows.append({"chain": r.chain_id, "target": j.target, "phase": j.phase,
                         "files_done": j.files_done, "files_left": max(0, j.files_total - j.files_done),
                         "bytes_done": j.bytes_done, "bytes_left": max(0, j.bytes_total - j.bytes_done),
                         "files_failed": j.files_failed, "files_retry": len(j.retry)})
        elif r.last:
            rows.append({"chain": r.chain_id, "target": r.last.get("target", r.complete_target), "phase": "done",
                         "files_done": r.last.get("files", 0), "files_left": 0,
                         "bytes_done": r.last.get("bytes", 0), "bytes_left": 0,
                         "files_failed": r.last.get("failed", 0), "files_retry": 0})
    return rows


ROW_GAUGES = ("files_done", "files_left", "bytes_done", "bytes_left", "files_failed", "files_retry")


class RebuildCollector(Collector):
    """``loomfs_ec_rebuild_<field>{chain,target,phase}`` per chain, plus totals."""

    def __init__(self, worker: RebuildWorker):
        self.worker = worker

    def collect(self) -> Iterable[Metric]:
        rows = progress_rows(self.worker.records.values())
        for name in ROW_GAUGES:
            g = GaugeMetricFamily(f"loomfs_ec_rebuild_{name}", f"EC rebuild onto a chain's new target: {name}",
                                  labels=["chain", "target", "phase"])
            for r in rows:
                g.add_metric([str(r["chain"]), str(r["target"]), r["phase"]], r[name])
            yield g
        yield GaugeMetricFamily("loomfs_ec_rebuilds_active", "chains being rebuilt",
                                value=sum(1 for r in rows if r["phase"] != "done"))
        yield GaugeMetricFamily("loomfs_ec_rebuilds_done", "rebuilds finished by this meta process",
                                value=self.worker.rebuilds_done_total)
