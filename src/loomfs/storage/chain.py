"""CRAQ replication decisions for one chunk: events in, actions out, no I/O.

The service feeds each request (with this replica's position in the chain and the chunk's
local versions) to these functions and executes what comes back. Rules (DESIGN.md §4):

* every hop checks the chain version; a client write must reach the head;
* the head serialises writes per chunk and assigns ``update_ver = committed + 1``; it stages
  the update locally *before* forwarding it, so a version that reached a successor always
  exists at the head too (a failed local stage forwards nothing, and that version number
  named no content anywhere); a pending update left behind by a failed forward is pushed
  down the chain again (whole chunk) before a new update, so no version number is ever
  reused for other data;
* a client retry whose request tag the chunk already carries is not applied again: a tag on
  the committed version is answered at once, a tag on the pending version pushes that
  pending version down the chain (the tags live with the chunk on every replica);
* a forwarded update carries the chunk's length and CRC as the sender staged it; a "duplicate"
  (already committed here) with other content, or an update whose result here differs from
  the sender's, is refused with VERSION_MISMATCH and the sender replaces the whole chunk;
  an update older than the committed version is refused (never go backwards);
* every replica but the tail forwards and commits after its successor acked; the tail commits
  at once; a replica that is the tail (or the only member) and holds a leftover pending
  version commits it before anything else — the old tail may have committed and served it;
* reads: a non-tail replica holding a pending update refuses (the client retries at the
  tail); the tail commits a leftover pending version before serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from loomfs.wire.status import Status


class Role(Enum):
    SINGLE = "single"  # head and tail
    HEAD = "head"
    MIDDLE = "middle"
    TAIL = "tail"


@dataclass(frozen=True, slots=True)
class Position:
    """Where one target sits in one chain version (serving targets only, head first)."""

    chain_id: int
    chain_version: int
    target_id: int
    targets: tuple[int, ...]

    @property
    def _i(self) -> int:
        return self.targets.index(self.target_id)

    @property
    def is_head(self) -> bool:
        return self.targets[0] == self.target_id

    @property
    def is_tail(self) -> bool:
        return self.targets[-1] == self.target_id

    @property
    def role(self) -> Role:
        if self.is_head:
            return Role.SINGLE if self.is_tail else Role.HEAD
        return Role.TAIL if self.is_tail else Role.MIDDLE

    @property
    def successor(self) -> int | None:
        i = self._i
        return self.targets[i + 1] if i + 1 < len(self.targets) else None

    @property
    def predecessor(self) -> int | None:
        i = self._i
        return self.targets[i - 1] if i > 0 else None


def position_of(chain_id: int, chain_version: int, serving: list[int] | tuple[int, ...], target_id: int) -> Position | None:
    """This target's position, or None when it is not a serving member of the chain."""
    if target_id not in serving:
        return None
    return Position(chain_id, chain_version, target_id, tuple(serving))


class TagSeen(Enum):
    """Whether the chunk already carries a client request's tag."""

    NO = "no"
    COMMITTED = "committed"  # on the committed version: the request was applied
    PENDING = "pending"  # on the pending version: applied here, not yet committed


@dataclass(frozen=True, slots=True)
class Versions:
    """The chunk's local versions (0 = none) and the committed content's length and CRC."""

    commit_ver: int = 0
    pending_ver: int = 0
    length: int = 0
    crc: int = 0
    # versions the head leaves unused before its next one: a head that restarted and kept
    # serving (no other member to resync from) may have lost a pending version that a successor
    # committed; that number must not name other bytes
    gap: int = 0

    @property
    def has_pending(self) -> bool:
        return self.pending_ver > self.commit_ver


# ---- events ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class UpdateIn:
    """A write or truncate arriving at this replica."""

    chain_version: int
    forwarded: bool = False
    update_ver: int = 0  # forwarded only
    full_replace: bool = False
    expect_length: int = -1  # forwarded: the chunk as the sender staged it (-1 = not given)
    expect_crc: int = 0
    seen: TagSeen = TagSeen.NO  # client requests: is the request tag already on the chunk?


@dataclass(frozen=True, slots=True)
class ReadIn:
    chain_version: int


# ---- actions --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Refuse:
    status: Status
    reason: str


@dataclass(frozen=True, slots=True)
class AckCommitted:
    """Already applied here (a duplicate): answer with the committed state."""

    commit_ver: int


@dataclass(frozen=True, slots=True)
class Reforward:
    """Push the leftover pending update ``update_ver`` (whole chunk) to ``successor``, then
    commit it locally once acked (``successor`` None: this replica is the tail, commit now)."""

    update_ver: int
    successor: int | None


@dataclass(frozen=True, slots=True)
class Apply:
    """Stage ``update_ver``; forward to ``successor`` (None = tail: commit at once) and
    commit after the ack. ``repair``: the committed version ``update_ver`` here holds other
    content than the sender's — replace it (a whole-chunk replace only)."""

    update_ver: int
    successor: int | None
    repair: bool = False


@dataclass(frozen=True, slots=True)
class Commit:
    update_ver: int


@dataclass(frozen=True, slots=True)
class Serve:
    pass


@dataclass(frozen=True, slots=True)
class Settle:
    """A read at the tail found a leftover pending version: commit it (under the chunk lock,
    deciding again there), then serve."""

    pending_ver: int


Action = Refuse | AckCommitted | Reforward | Apply | Commit | Serve | Settle


def _check_membership(pos: Position | None, chain_version: int) -> Refuse | None:
    if pos is None:
        return Refuse(Status.TARGET_NOT_SERVING, "target is not a serving member of the chain")
    if chain_version != pos.chain_version:
        return Refuse(
            Status.STALE_CHAIN_VERSION,
            f"chain {pos.chain_id}: request has v{chain_version}, replica has v{pos.chain_version}",
        )
    return None


def on_update(pos: Position | None, local: Versions, ev: UpdateIn) -> list[Action]:
    """Decide what to do with a write/truncate. Returns one Refuse/AckCommitted, or the
    steps to run in order (at most one Reforward, then one Apply or AckCommitted)."""
    refused = _check_membership(pos, ev.chain_version)
    if refused is not None:
        return [refused]
    assert pos is not None
    if not ev.forwarded:
        if not pos.is_head:
            return [Refuse(Status.NOT_HEAD, f"target {pos.target_id} is not the head of chain {pos.chain_id}")]
        if ev.seen is TagSeen.COMMITTED:
            return [AckCommitted(local.commit_ver)]
        succ = pos.successor
        if local.has_pending:
            # push the leftover down (or commit it as the only member: the old tail may have
            # committed and served it); a retry of the very request it carries ends there
            first: list[Action] = [Reforward(local.pending_ver, succ)]
            if ev.seen is TagSeen.PENDING:
                return [*first, AckCommitted(local.pending_ver)]
            return [*first, Apply(local.pending_ver + 1, succ)]
        return [Apply(local.commit_ver + 1 + local.gap, succ)]
    if pos.is_head:
        return [Refuse(Status.STALE_CHAIN_VERSION, f"target {pos.target_id} is head of chain {pos.chain_id}: not forwarded to")]
    if ev.update_ver < local.commit_ver:
        return [Refuse(Status.VERSION_MISMATCH,
                       f"update v{ev.update_ver} is older than committed v{local.commit_ver} (never go backwards)")]
    if ev.update_ver == local.commit_ver:
        same = ev.expect_length < 0 or (ev.expect_length, ev.expect_crc) == (local.length, local.crc)
        if same:
            return [AckCommitted(local.commit_ver)]
        if ev.full_replace:
            return [Apply(ev.update_ver, pos.successor, repair=True)]
        return [Refuse(Status.VERSION_MISMATCH,
                       f"v{ev.update_ver} is committed here with other content "
                       f"({local.length} bytes crc {local.crc:08x}, sender {ev.expect_length} bytes "
                       f"crc {ev.expect_crc:08x})")]
    if ev.update_ver != local.commit_ver + 1 and not ev.full_replace:
        return [
            Refuse(
                Status.VERSION_MISMATCH,
                f"update v{ev.update_ver} does not follow committed v{local.commit_ver}",
            )
        ]
    return [Apply(ev.update_ver, pos.successor)]


def on_successor_result(update_ver: int, status: Status) -> Action:
    """The successor answered a forward (OK or a failure status): commit or give up, keeping
    the pending update so a later write or a chain change re-forwards it."""
    if status is Status.OK:
        return Commit(update_ver)
    if status in (Status.STALE_CHAIN_VERSION, Status.VERSION_MISMATCH):
        return Refuse(status, f"successor refused update v{update_ver}: {status.name}")
    return Refuse(Status.CHAIN_UNAVAILABLE, f"successor failed update v{update_ver}: {status.name}")


def on_remove(pos: Position | None, ev: UpdateIn) -> list[Action]:
    """RemoveChunks: same routing checks as an update; forward, then apply after the ack."""
    refused = _check_membership(pos, ev.chain_version)
    if refused is not None:
        return [refused]
    assert pos is not None
    if not ev.forwarded and not pos.is_head:
        return [Refuse(Status.NOT_HEAD, f"target {pos.target_id} is not the head of chain {pos.chain_id}")]
    if ev.forwarded and pos.is_head:
        return [Refuse(Status.STALE_CHAIN_VERSION, f"target {pos.target_id} is head of chain {pos.chain_id}")]
    return [Apply(0, pos.successor)]


def on_read(pos: Position | None, local: Versions, ev: ReadIn) -> Action:
    refused = _check_membership(pos, ev.chain_version)
    if refused is not None:
        return refused
    assert pos is not None
    if local.has_pending:
        if pos.is_tail:
            return Settle(local.pending_ver)
        return Refuse(
            Status.NOT_COMMITTED,
            f"target {pos.target_id} holds pending v{local.pending_ver} > committed v{local.commit_ver}",
        )
    return Serve()
