"""Forwarding chain updates to the successor, riding out chain changes, and reporting a
successor that does not answer (mgmtd takes it out of the chain)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from loomfs.common.clock import Clock
from loomfs.common.routing import Routing
from loomfs.errors import LoomError
from loomfs.net.rpc import RpcClient
from loomfs.storage import chain, planted
from loomfs.storage.routing import RoutingSource, write_chain
from loomfs.wire.message import Message, Method
from loomfs.wire.status import Status
from loomfs.wire.storage import RemoveChunksReq, TruncateReq, WriteReq
from loomfs.wire.types import TargetState

logger = logging.getLogger(__name__)


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("unreachability report failed: %s", task.exception())


class Left:
    """A chain change took this target out of the serving members."""

    def __repr__(self) -> str:
        return "LEFT"


LEFT = Left()


class ChainForwarder:
    """The forwarding half of a storage service (StorageService extends it)."""

    clock: Clock
    routing: RoutingSource
    rpc: RpcClient
    forward_timeout_s: float
    reconfig_wait_s: float  # a forward slower than this starts watching routing
    # a successor that fails or stays silent this long although it heartbeats (a network cut,
    # a hung process) is reported to mgmtd, which takes it out of the chain
    suspect_after_s: float
    report_unreachable: Callable[[chain.Position, int, str], Awaitable[None]] | None
    forwards_total: int
    reforwards_total: int
    replaces_total: int  # forwards redone as whole-chunk replaces (version gap at the successor)
    unreachable_reports_total: int
    _reported: set[tuple[int, int, int]]  # (chain, version, successor) already reported

    async def _forward(self, routing: Routing, successor: int, m: Method, req: Message,
                       payload: memoryview | None = None, payload_crc: int | None = None) -> Status:
        status, _ = await self._forward2(routing, successor, m, req, payload, payload_crc)
        return status

    async def _forward2(self, routing: Routing, successor: int, m: Method, req: Message,
                        payload: memoryview | None = None, payload_crc: int | None = None) -> tuple[Status, bool]:
        """(status, unreachable): ``unreachable`` when the successor itself did not answer."""
        self.forwards_total += 1
        try:
            address = routing.address_of(successor)
            await self.rpc.call(address, m, req, payload=payload, payload_crc=payload_crc,
                                timeout_s=self.forward_timeout_s, retry=True)  # bounded retries
        except LoomError as exc:
            logger.warning("forward %s to target %d failed: %s", m.name, successor, exc)
            if exc.status is None:
                return Status.CHAIN_UNAVAILABLE, True
            return exc.status, exc.status in (Status.DEADLINE_EXCEEDED, Status.SHUTTING_DOWN)
        return Status.OK, False

    async def _changed_position(self, pos: chain.Position, wait_s: float) -> chain.Position | Left | None:
        """Wait up to ``wait_s`` for routing with a newer version of ``pos``'s chain; return
        this target's new write position, ``LEFT`` when it is no longer a serving member (it
        must not commit or push on what it was forwarding: its chain has moved on without it),
        or None when nothing changed."""
        end = self.clock.monotonic() + wait_s
        while True:
            routing = await self.routing.get()
            info = routing.chains.get(pos.chain_id)
            if info is not None and info.version > pos.chain_version:
                me = routing.targets.get(pos.target_id)
                new = chain.position_of(pos.chain_id, info.version, write_chain(routing, pos.chain_id), pos.target_id)
                if new is None or me is None or (me.state != TargetState.SERVING
                                                 and not planted.on("syncing_commits_leftover")):
                    return LEFT
                return new
            if self.clock.monotonic() >= end:
                return None
            await asyncio.sleep(0.05)

    async def _forward_chain(
        self, pos: chain.Position, m: Method, req: WriteReq | TruncateReq | RemoveChunksReq,
        payload: memoryview | None, crc: int | None,
        replace: Callable[[chain.Position], Awaitable[Status]] | None = None,
    ) -> tuple[Status, chain.Position]:
        """Forward ``req`` to the successor; when it fails or hangs and the chain is
        reconfigured meanwhile, forward again (with the new chain version) to the new
        successor, or commit as the new tail. A successor that misses versions (a syncing
        target) gets the whole chunk instead (``replace``). Returns the final status and the
        position it was reached under."""
        deadline = self.clock.monotonic() + self.forward_timeout_s
        while True:
            succ = pos.successor
            if succ is None:
                return Status.OK, pos  # we became the tail
            routing = await self.routing.get()
            fwd = dataclasses.replace(req, forwarded=True, chain_version=pos.chain_version)
            call = asyncio.ensure_future(self._forward2(routing, succ, m, fwd, payload, crc))
            new_pos: chain.Position | Left | None = None
            started_s = self.clock.monotonic()
            done, _ = await asyncio.wait({call}, timeout=self.reconfig_wait_s)
            while not done:  # slow successor (hung? cut off?): watch for a chain change meanwhile
                new_pos = await self._changed_position(pos, 0.0)
                if new_pos is not None or self.clock.monotonic() > deadline:
                    call.cancel()
                    break
                if self.clock.monotonic() - started_s > self.suspect_after_s:
                    self.suspect(pos, succ, f"{m.name} unanswered for {self.clock.monotonic() - started_s:.1f}s")
                done, _ = await asyncio.wait({call}, timeout=0.05)
            status, unreachable = (Status.CHAIN_UNAVAILABLE, True) if call.cancelled() or not done \
                else call.result()
            if status is Status.VERSION_MISMATCH and replace is not None:
                self.replaces_total += 1
                status = await replace(pos)
            if status is Status.OK:
                return status, pos
            if new_pos is None and unreachable:  # our successor is gone or cut off: mgmtd will drop it
                self.suspect(pos, succ, f"{m.name} failed: {status.name}")
                left = deadline - self.clock.monotonic()
                new_pos = await self._changed_position(pos, max(0.0, min(left, self.reconfig_wait_s * 5)))
            if new_pos is None:
                return status, pos
            if isinstance(new_pos, Left):
                logger.info("chain %d v%d: target %d left the serving chain while forwarding: giving the update up",
                            pos.chain_id, pos.chain_version, pos.target_id)
                return (status if status is not Status.OK else Status.TARGET_NOT_SERVING), pos
            logger.info("chain %d v%d -> v%d while forwarding to target %d (%s): forwarding again",
                        pos.chain_id, pos.chain_version, new_pos.chain_version, succ, status.name)
            self.reforwards_total += 1
            pos = new_pos

    def suspect(self, pos: chain.Position, successor: int, why: str) -> None:
        """Tell mgmtd (once per chain version) that ``successor`` does not answer. If it is
        dead, its lease lapses anyway; if it still heartbeats (a cut between us), only this
        report gets it out of the chain."""
        key = (pos.chain_id, pos.chain_version, successor)
        if self.report_unreachable is None or key in self._reported:
            return
        if len(self._reported) > 4096:
            self._reported.clear()
        self._reported.add(key)
        self.unreachable_reports_total += 1
        logger.warning("chain %d v%d: successor target %d unreachable (%s): reporting to mgmtd",
                       pos.chain_id, pos.chain_version, successor, why)
        task = asyncio.ensure_future(self.report_unreachable(pos, successor, why))
        task.add_done_callback(_log_failure)
