"""Linearizability checker for one chunk's history (a byte array, as the simulator sees it).

Wing & Gong's search with Lowe's memoization (the Knossos "linear" approach): a depth-first
search over linearization orders that never revisits a (set of linearized ops, content) pair.
Pure: no I/O, no clock, no randomness; the same history always gives the same verdict.

The model is one byte array: ``write`` zero-fills up to its offset and overwrites (growing the
array if needed); ``truncate`` cuts or zero-extends; ``read`` returns ``content[off:off+len]``.

Ops with ``ok=True`` are *required*: each takes effect once between ``invoke_s`` and
``complete_s``. Writes and truncates with ``ok`` False or None are *optional*: they may take
effect once at any time after ``invoke_s``, or never. Reads that did not succeed constrain
nothing and are dropped. The search succeeds once every required op is linearized.
:func:`check_final_state` adds one more required op: a read of the whole chunk after
everything else, which must return the final content.

Reductions. Each is sound: any valid linearization can be rewritten, step by step, into one
the search still explores (the rewrite is named with each rule), so a pruned branch never
holds the only way to pass. ``tests/unit/test_sim_history.py`` checks them against brute force.

* Only *minimal* ops are candidates: ``invoke_s`` <= the least ``complete_s`` among the required
  ops not yet linearized (anything later would break real-time order).
* A read that is a candidate and matches the current content goes next, with no branching
  (rewrite: move it to the front of any valid continuation).
* Optional ops are applied only where it can matter (rewrites: drop an optional op whose effect
  no later read sees; move one past an op it commutes with):
  - only while some pending read could see it: it returned one of its bytes at that offset
    (and no required op due before the read overwrites them all), or a zero it fills in that
    nothing due before the read would have filled anyway, or, for a truncate, came back
    short or with a zero where it cuts;
  - only just before an op it does not commute with: the optional ops applied since the last
    required op must each conflict with that required op or with a later optional op;
  - commuting optional ops in a row are tried in one order only, as are identical ones
    (client retries: invoke order);
  - in the end game of :func:`check_final_state`, only while the optional ops left could
    still cover every byte that differs from the final content.
* Memo with dominance: reaching content ``s`` with required set ``R`` and optional set ``O``
  is pruned when ``(R, s)`` was already reached with an optional set that is a subset of
  ``O`` and no stricter placement rule (that state can do everything this one can). This also
  drops optional writes that were overwritten or changed nothing.

Two child orders take turns with growing budgets (required ops first; optional ops a read
already shows first), since each is fast on histories where the other flounders; either one
finishing decides. The optional-op rules are what keep many unknown outcomes tractable; they
work best when each write carries distinct data, so that a read shows which write it saw.

Content is kept in one ``bytearray`` mutated in place with an undo record per step, and its
memo key is ``(length, int.from_bytes(content) mod P)`` updated incrementally, so a step costs
O(bytes the op touches), not O(chunk size). P is a 127-bit safe prime, so 256 has order
(P-1)/2 modulo P and distinct contents collide only by chance (about 2**-126 per pair).

One module rather than several: the plan, the search and its pruning rules share one set of
arrays and one soundness argument, and read best side by side.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field

__all__ = ["Op", "Verdict", "check_chunk_history", "check_final_state"]

_P = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFF55F  # safe prime: (P-1)/2 is prime too
_KINDS = ("write", "truncate", "read")
_FIRST_BUDGET_STATES = 2_000  # per search order; grows 4x per round
_SAMPLES_MAX = 3  # distinct failing states kept for the explanation
_EXCERPT_BYTES = 8
_ZERO_TO_ONE = bytes([1] + [0] * 255)  # bytes.translate tables
_NONZERO_TO_ONE = bytes([0] + [1] * 255)
_NONZERO_RUN = re.compile(rb"[^\x00]+")


@dataclass(slots=True)
class Op:
    op_id: int
    client: int
    kind: str  # "write" | "truncate" | "read"
    invoke_s: float
    complete_s: float | None  # None: the result never came back
    ok: bool | None  # True acked; False failed; None unknown (False/None writes are optional)
    offset: int = 0  # write, read
    data: bytes = b""  # write
    length: int = 0  # truncate: new length; read: bytes asked
    result: bytes | None = None  # read: bytes returned


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    explanation: str
    states_explored: int


def check_chunk_history(
    ops: list[Op], *, initial: bytes = b"", max_states: int = 2_000_000
) -> Verdict:
    """Whether ``ops`` (one chunk's history) is linearizable against the byte-array model."""
    return _check(_Plan(ops, initial, None), max_states)


def check_final_state(
    ops: list[Op], final: bytes, *, initial: bytes = b"", max_states: int = 2_000_000
) -> Verdict:
    """Whether some linearization is consistent with the reads and ends with content ``final``."""
    return _check(_Plan(ops, initial, final), max_states)


def _check(plan: _Plan, max_states: int) -> Verdict:
    """Alternate the two search orders with budgets growing 4x until one of them decides."""
    used = 0
    budget = _FIRST_BUDGET_STATES
    while True:
        for evidence_first in (False, True):
            search = _Search(plan, evidence_first, min(budget, max_states - used))
            outcome = search.run()
            used += search.states
            if outcome is not None:
                explanation = "linearizable" if outcome else search.explain()
                return Verdict(ok=outcome, explanation=explanation, states_explored=used)
            if used >= max_states:
                return Verdict(
                    ok=False,
                    explanation=f"search limit reached ({max_states} states); verdict unknown; "
                    f"deepest: {search.explain()}",
                    states_explored=used,
                )
        budget *= 4


# --------------------------------------------------------------------------- internals

_WRITE, _TRUNCATE, _READ = 0, 1, 2
_Undo = tuple[int, int, int, int, bytes]  # old length, old hash, op, offset, bytes to put back
_Pending = tuple[int, int, int]  # optional op applied but not yet justified, and [d0, d1)
_Shown = tuple[int, int, list[tuple[int, int]]]  # read, where it shows the write, who hides it
_UNSEEN, _ZERO, _SHOWN = 0, 1, 2  # how a pending read could see an optional op


@dataclass(slots=True)
class _Frame:
    children: list[int]  # op indices still to try from this state
    undo: _Undo | None  # how to leave this state (None: the root)
    lo_invoke: int  # required ops before this position (invoke order) are all linearized
    lo_complete: int  # the same, in complete order
    pending: tuple[_Pending, ...]  # see _Search._children
    next_child: int = 0


@dataclass(slots=True)
class _Failure:
    depth: int = -1  # required ops linearized where the search got stuck
    op: int = -1  # the read that could not be linearized there
    views: list[tuple[int, bytes]] = field(default_factory=list)  # (content length, what it saw)


def _by_invoke(op: Op) -> tuple[float, int]:
    return (op.invoke_s, op.op_id)


def _validate(op: Op) -> None:
    if op.kind not in _KINDS:
        raise ValueError(f"op {op.op_id}: unknown kind {op.kind!r}")
    if op.complete_s is not None and op.complete_s < op.invoke_s:
        raise ValueError(f"op {op.op_id}: completes at {op.complete_s} before invoke {op.invoke_s}")
    if op.offset < 0 or op.length < 0:
        raise ValueError(f"op {op.op_id}: negative offset or length")


def _final_read(ops: list[Op], initial: bytes, final: bytes) -> Op:
    """A read of the whole chunk after everything else that must return ``final``."""
    reach = max(
        [len(initial), len(final)]
        + [op.offset + len(op.data) if op.kind == "write" else op.length for op in ops]
    )
    return Op(-1, -1, "read", math.inf, math.inf, True, length=reach + 1, result=final)


class _Plan:
    """The history as the search sees it: required ops (in invoke order) then optional ones,
    with their windows, byte ranges and possible observers. Computed once per check."""

    def __init__(self, ops: list[Op], initial: bytes, final: bytes | None):
        for op in ops:
            _validate(op)
        required = [
            op for op in ops if op.ok is True and (op.kind != "read" or op.result is not None)
        ]
        optional = [op for op in ops if op.ok is not True and op.kind != "read"]
        self.final_op = None if final is None else _final_read(ops, initial, final)
        if self.final_op is not None:
            required.append(self.final_op)
        required.sort(key=_by_invoke)
        optional.sort(key=_by_invoke)
        self.initial = initial
        self.ops: list[Op] = required + optional
        self.n_req = n_req = len(required)
        self.full_req = (1 << n_req) - 1
        # An acked op that never completed still comes before the final read.
        last_s = max([0.0] + [t for op in ops for t in (op.invoke_s, op.complete_s or 0.0)]) + 1
        self.invoke_s = [op.invoke_s for op in self.ops]
        self.complete_s = [
            math.inf if i >= n_req else last_s if op.complete_s is None else op.complete_s
            for i, op in enumerate(self.ops)
        ]
        self.by_complete = sorted(range(n_req), key=lambda i: (self.complete_s[i], i))
        self.kind = [_KINDS.index(op.kind) for op in self.ops]
        # write [lo, hi); truncate lo == hi == new length; read [lo, hi)
        self.lo = [op.length if op.kind == "truncate" else op.offset for op in self.ops]
        self.hi = [
            op.offset + len(op.data)
            if op.kind == "write"
            else op.length + (op.offset if op.kind == "read" else 0)
            for op in self.ops
        ]
        # Optional ops: rank orders distinct effects; identical ones go in invoke order.
        sigs = [(op.kind, op.offset, op.data, op.length) for op in optional]
        rank_of = {sig: r for r, sig in enumerate(sorted(set(sigs)))}
        self.rank = [-1] * n_req + [rank_of[sig] for sig in sigs]
        self.opt_prev: list[int] = []
        last: dict[tuple[str, int, bytes, int], int] = {}
        for j, sig in enumerate(sigs):
            self.opt_prev.append(last.get(sig, -1))
            last[sig] = j
        self.observers = [self._observers(op) for op in optional]
        self.final_key = (
            None if final is None else (len(final), int.from_bytes(final, "little") % _P)
        )
        self.pow_cache: dict[int, int] = {}

    def weight(self, offset: int) -> int:
        """256**offset mod P, the hash weight of the byte at ``offset``."""
        w = self.pow_cache.get(offset)
        if w is None:
            w = self.pow_cache[offset] = pow(256, offset, _P)
        return w

    def _observers(self, op: Op) -> tuple[list[_Shown], list[int]]:
        """Reads that could see optional ``op``: (those showing some of its bytes, with where,
        and the required ops due before them that overwrite or cut those bytes; those to check
        when it runs, for a zero fill or a truncate)."""
        later = [
            i
            for i in range(self.n_req)
            if self.kind[i] == _READ and self.complete_s[i] >= op.invoke_s
        ]
        if op.kind == "truncate":
            return [], [i for i in later if self.lo[i] < self.hi[i]]
        shown: list[_Shown] = []
        maybe_fill: list[int] = []
        a, b = op.offset, op.offset + len(op.data)
        for i in later:
            read = self.ops[i]
            result = read.result or b""
            where = _shown_at(op, result, read.offset)
            if where:
                hiders = []
                for x in range(self.n_req):
                    if self.complete_s[x] >= self.invoke_s[i] or self.kind[x] == _READ:
                        continue
                    lo = max(a, self.lo[x])  # a truncate cuts [length, ...)
                    hi = b if self.kind[x] == _TRUNCATE else min(b, self.hi[x])
                    if lo < hi and where & _span(lo - a, hi - a):
                        hiders.append((x, _span(lo - a, hi - a)))
                shown.append((i, where, hiders))
            elif read.offset < op.offset and result:
                # A read that reaches the write's first byte without showing it saw something
                # written (or cut) after it, which reached past the zero fill too.
                if not op.data or (
                    read is not self.final_op and read.offset + len(result) <= op.offset
                ):
                    maybe_fill.append(i)
        return shown, maybe_fill


class _Search:
    """One depth-first search over ``plan`` in one child order, within ``max_states``; the
    content lives in ``buf`` and changes in place."""

    def __init__(self, plan: _Plan, evidence_first: bool, max_states: int):
        self.plan = plan
        self.evidence_first = evidence_first
        self.max_states = max_states
        # the plan's arrays, bound here for speed
        self.ops, self.n_req, self.full_req = plan.ops, plan.n_req, plan.full_req
        self.final_op, self.final_key = plan.final_op, plan.final_key
        self.invoke_s, self.complete_s, self.by_complete = (
            plan.invoke_s,
            plan.complete_s,
            plan.by_complete,
        )
        self.kind, self.lo, self.hi = plan.kind, plan.lo, plan.hi
        self.rank, self.opt_prev, self.observers = plan.rank, plan.opt_prev, plan.observers
        self.buf = bytearray(plan.initial)
        self.h = int.from_bytes(plan.initial, "little") % _P
        self.req_mask = 0
        self.opt_mask = 0
        self.memo: dict[tuple[int, int, int], list[tuple[int, tuple[_Pending, ...]]]] = {}
        self.states = 0
        self.failure = _Failure()

    # ---- which pending read could see an optional op

    def _observable(self, k: int, lo_complete: int) -> int:
        """Whether applying optional op ``k`` now could still be seen by a pending read, and
        how (_SHOWN, _ZERO or _UNSEEN). An optional op that no read sees can be dropped from
        any linearization, so one that is unseen is never applied.

        A write is seen where a read returned one of its bytes at that offset (unless a
        required op due before the read overwrites or cuts all such bytes), or a zero it
        fills in; a truncate where a read came back short or with a zero where it cuts, or
        with a zero where it extends. A zero fill cannot show through a required op due before
        the read that reaches past the zero (a write ending beyond it, or any truncate): that
        op would have left the same zero, or cut it.
        """
        shown, maybe_fill = self.observers[k - self.n_req]
        mask, ops, buf = self.req_mask, self.ops, self.buf
        for i, where, hiders in shown:
            if not mask >> i & 1:
                for x, span in hiders:
                    if not mask >> x & 1:
                        where &= ~span
                if where:
                    return _SHOWN
        op, n = ops[k], len(buf)
        if op.kind == "write":
            lo, hi, cut = n, op.offset, False  # the zero fill
        else:
            lo, hi, cut = min(op.length, n), max(op.length, n), op.length < n
        if lo >= hi:
            return _UNSEEN
        for i in maybe_fill:
            if mask >> i & 1:
                continue
            read = ops[i]
            result, c, end = read.result or b"", read.offset, read.offset + read.length
            short = c + len(result)  # where the read found the end of the content
            if cut:
                if short < min(hi, end) and lo < end:
                    return _SHOWN  # came back short where the truncate cuts
                lo_z, hi_z = max(lo, c), min(hi, short)
                if lo_z < hi_z and _zero_over_nonzero(result, c, buf, lo_z, hi_z):
                    return _SHOWN  # a zero where the truncate cut a nonzero byte
                continue
            lo_z = max(lo, c, self._reach_before(i, lo_complete, hi))
            hi_z = min(hi, short)
            if lo_z < hi_z and result.find(0, lo_z - c, hi_z - c) >= 0:
                return _ZERO  # a zero where the op zero-fills
        return _UNSEEN

    def _reach_before(self, read: int, lo_complete: int, enough: int) -> int:
        """How far the required mutations still to come before ``read`` reach (a truncate:
        everywhere), capped at ``enough``."""
        reach = 0
        order, complete_s, mask, kind = self.by_complete, self.complete_s, self.req_mask, self.kind
        before_s = self.invoke_s[read]
        for j in range(lo_complete, self.n_req):
            x = order[j]
            if complete_s[x] >= before_s:
                break
            if mask >> x & 1 or kind[x] == _READ:
                continue
            reach = enough if kind[x] == _TRUNCATE else max(reach, self.hi[x])
            if reach >= enough:
                return enough
        return reach

    def _apply(self, i: int) -> tuple[_Undo, int, int]:
        """Apply op ``i``; returns the undo record and [d0, d1), the bytes it may have changed."""
        buf, op = self.buf, self.ops[i]
        old_len, old_h = len(buf), self.h
        undo: _Undo = (old_len, old_h, i, 0, b"")
        d0 = d1 = 0
        if op.kind == "write":
            offset, data = op.offset, op.data
            old = bytes(buf[offset : offset + len(data)])
            if offset > old_len:
                buf.extend(bytes(offset - old_len))
            buf[offset : offset + len(data)] = data
            delta = int.from_bytes(data, "little") - int.from_bytes(old, "little")
            self.h = (old_h + delta * self.plan.weight(offset)) % _P
            undo = (old_len, old_h, i, offset, old)
            d0, d1 = min(offset, old_len), offset + len(data)
        elif op.kind == "truncate":
            length = op.length
            if length < old_len:
                cut = bytes(buf[length:])
                del buf[length:]
                self.h = (old_h - int.from_bytes(cut, "little") * self.plan.weight(length)) % _P
                undo = (old_len, old_h, i, length, cut)
            else:
                buf.extend(bytes(length - old_len))
            d0, d1 = min(length, old_len), max(length, old_len)
        if i < self.n_req:
            self.req_mask |= 1 << i
        else:
            self.opt_mask |= 1 << (i - self.n_req)
        return undo, d0, d1

    def _undo(self, undo: _Undo) -> None:
        old_len, old_h, i, offset, old = undo
        buf = self.buf
        if len(buf) > old_len:
            del buf[old_len:]
        if old:  # a write's overwritten bytes, or the tail a truncate cut (re-appended)
            buf[offset : offset + len(old)] = old
        self.h = old_h
        if i < self.n_req:
            self.req_mask &= ~(1 << i)
        else:
            self.opt_mask &= ~(1 << (i - self.n_req))

    # ---- commutation (over-approximates conflict: "no conflict" must mean "commute")

    def _conflict(self, u: _Pending, y: int) -> bool:
        """Whether op ``y`` may not commute with pending optional op ``u``, applied just before."""
        i, d0, d1 = u
        kind, lo, hi = self.kind, self.lo, self.hi
        if kind[y] == _READ:
            return lo[y] < hi[y] and lo[y] < d1 and d0 < hi[y]
        if kind[i] == _WRITE:
            if kind[y] == _WRITE:
                return lo[y] < hi[i] and lo[i] < hi[y]
            return hi[i] > lo[y]  # the write reaches past the truncate's length
        if kind[y] == _WRITE:
            return hi[y] > lo[i]
        return lo[y] != lo[i]  # two truncates commute only to the same length

    def _final_reachable(self) -> bool:
        """In the end game (only optional ops and the final read left): whether those ops could
        still turn the content into the final content. Necessary: each byte that differs lies
        under a write left, and the writes left reach the final length (a truncate left:
        anything may go)."""
        assert self.final_op is not None and self.final_op.result is not None
        final, buf, n_req = self.final_op.result, self.buf, self.n_req
        ranges: list[tuple[int, int]] = []
        for j in range(len(self.ops) - n_req):
            if not self.opt_mask >> j & 1:
                k = n_req + j
                if self.kind[k] == _TRUNCATE:
                    return True
                ranges.append((self.lo[k], self.hi[k]))
        n, m = len(buf), len(final)
        if n > m or (m > n and max((hi for _, hi in ranges), default=0) < m):
            return False
        xor = int.from_bytes(buf, "little") ^ int.from_bytes(final[:n], "little")
        runs = [r.span() for r in _NONZERO_RUN.finditer(xor.to_bytes(n, "little"))]
        runs += [r.span() for r in _NONZERO_RUN.finditer(final, n)]  # spans count from 0
        covered: list[list[int]] = []  # union of the writes left, in order
        for lo, hi in sorted(ranges):
            if covered and lo <= covered[-1][1]:
                covered[-1][1] = max(covered[-1][1], hi)
            elif lo < hi:
                covered.append([lo, hi])
        starts = [lo for lo, _ in covered]
        for lo, hi in runs:
            at = bisect.bisect_right(starts, lo) - 1
            if at < 0 or covered[at][1] < hi:
                return False
        return True

    # ---- search

    def _visit(self, pending: tuple[_Pending, ...]) -> bool:
        """Record the current state; False when a visited state dominates it."""
        key = (self.req_mask, len(self.buf), self.h)
        sig = tuple((self.rank[i], d0, d1) for i, d0, d1 in pending)
        seen = self.memo.get(key)
        opt = self.opt_mask
        if seen is None:
            self.memo[key] = [(opt, sig)]
        else:
            for other, other_sig in seen:
                if other & ~opt == 0 and (not other_sig or other_sig == sig):
                    return False
            seen.append((opt, sig))
        self.states += 1
        return True

    def _advance(self, lo_invoke: int, lo_complete: int) -> tuple[int, int]:
        mask = self.req_mask
        while lo_invoke < self.n_req and mask >> lo_invoke & 1:
            lo_invoke += 1
        order = self.by_complete
        while lo_complete < self.n_req and mask >> order[lo_complete] & 1:
            lo_complete += 1
        return lo_invoke, lo_complete

    def _matches(self, read: Op) -> bool:
        if read is self.final_op:
            return (len(self.buf), self.h) == self.final_key and self.buf == read.result
        return self.buf[read.offset : read.offset + read.length] == read.result

    def _children(
        self, lo_invoke: int, lo_complete: int, pending: tuple[_Pending, ...]
    ) -> list[int]:
        """The ops to try next, in this search's order.

        ``pending`` lists the optional ops applied since the last required op. An optional op
        that commutes with everything up to and including the next required op could have been
        applied after it, so only that later placement is searched: the next required op must
        conflict with every pending op. Between optional ops that commute, only increasing rank
        is searched.
        """
        n_req, mask, invoke_s, conflict = self.n_req, self.req_mask, self.invoke_s, self._conflict
        bound = self.complete_s[self.by_complete[lo_complete]] if lo_complete < n_req else math.inf
        required: list[int] = []
        i = lo_invoke
        while i < n_req and invoke_s[i] <= bound:
            if not mask >> i & 1:
                op = self.ops[i]
                if op.kind != "read":
                    if all(conflict(u, i) for u in pending):
                        required.append(i)
                elif self._matches(op):
                    # A matching read goes now: never worse than later.
                    return [i] if all(conflict(u, i) for u in pending) else []
                else:
                    self._note_failure(i)
                    if op is self.final_op and not self._final_reachable():
                        return []
            i += 1
        required.sort(key=lambda k: (self.complete_s[k], k))
        shown: list[int] = []
        other: list[int] = []
        opt_mask, rank = self.opt_mask, self.rank
        last = pending[-1] if pending else None
        for j, prev in enumerate(self.opt_prev):
            k = n_req + j
            if invoke_s[k] > bound:
                break
            if opt_mask >> j & 1 or (prev >= 0 and not opt_mask >> prev & 1):
                continue
            if last is not None and rank[k] < rank[last[0]] and not conflict(last, k):
                continue
            seen = self._observable(k, lo_complete)
            if seen == _SHOWN and self.evidence_first:
                shown.append(k)
            elif seen:
                other.append(k)
        return shown + required + other

    def _note_failure(self, op: int) -> None:
        f = self.failure
        depth = self.req_mask.bit_count()
        if depth < f.depth or (depth == f.depth and op != f.op):
            return
        if depth > f.depth:
            self.failure = f = _Failure(depth=depth, op=op)
        if len(f.views) < _SAMPLES_MAX:
            read = self.ops[op]
            view = bytes(self.buf[read.offset : read.offset + read.length])
            if all(view != seen for _, seen in f.views):
                f.views.append((len(self.buf), view))

    def run(self) -> bool | None:
        """True: linearizable; False: not; None: out of budget."""
        self._visit(())
        if self.req_mask == self.full_req:
            return True
        lo_i, lo_c = self._advance(0, 0)
        stack = [_Frame(self._children(lo_i, lo_c, ()), None, lo_i, lo_c, ())]
        while stack:
            top = stack[-1]
            if top.next_child == len(top.children):
                stack.pop()
                if top.undo is not None:
                    self._undo(top.undo)
                continue
            child = top.children[top.next_child]
            top.next_child += 1
            undo, d0, d1 = self._apply(child)
            if child < self.n_req:
                pending: tuple[_Pending, ...] = ()
            else:
                kept = tuple(u for u in top.pending if not self._conflict(u, child))
                pending = (*kept, (child, d0, d1))
            if not self._visit(pending):
                self._undo(undo)
                continue
            if self.states > self.max_states:
                return None
            if self.req_mask == self.full_req:
                return True
            lo_i, lo_c = self._advance(top.lo_invoke, top.lo_complete)
            children = self._children(lo_i, lo_c, pending)
            if children:
                stack.append(_Frame(children, undo, lo_i, lo_c, pending))
            else:
                self._undo(undo)
        return False

    def explain(self) -> str:
        """Where the search got stuck deepest: the read, and what the content could be."""
        f = self.failure
        if f.op < 0:
            return "no read was ever stuck"
        op = self.ops[f.op]
        result = op.result or b""
        if op is self.final_op:
            lines = [
                f"not linearizable: with all {self.n_req - 1} acknowledged ops applied, the "
                f"final content ({_describe(result)}) is not reachable; reachable contents "
                "include:"
            ]
            for _, view in f.views:
                lines.append(f"  {len(view)} bytes; {_diff(view, result, 0, 'final')}")
            return "\n".join(lines)
        lines = [
            f"not linearizable: op {op.op_id}, client {op.client} read(offset={op.offset}, "
            f"length={op.length}) during [{_time(op.invoke_s)}, {_time(op.complete_s)}] returned "
            f"{_describe(result)}; no order allows it. After {f.depth} of {self.n_req} "
            "acknowledged ops the content could be:"
        ]
        for content_len, view in f.views:
            lines.append(
                f"  {content_len} bytes, giving {len(view)}; {_diff(view, result, op.offset, 'read')}"
            )
        return "\n".join(lines)


def _span(lo: int, hi: int) -> int:
    """Positions [lo, hi) as a mask with one byte per position (0x01: in)."""
    return int.from_bytes(b"\x01" * (hi - lo), "little") << (8 * lo)


def _shown_at(write: Op, seen: bytes, seen_offset: int) -> int:
    """Where ``seen`` (bytes at ``seen_offset``) holds ``write``'s byte at the same position, as
    a mask relative to the write's offset (see ``_span``); 0 for nowhere."""
    lo = max(write.offset, seen_offset)
    hi = min(write.offset + len(write.data), seen_offset + len(seen))
    if lo >= hi:
        return 0
    a = int.from_bytes(write.data[lo - write.offset : hi - write.offset], "little")
    b = int.from_bytes(seen[lo - seen_offset : hi - seen_offset], "little")
    same = (a ^ b).to_bytes(hi - lo, "little").translate(_ZERO_TO_ONE)
    return int.from_bytes(same, "little") << (8 * (lo - write.offset))


def _zero_over_nonzero(result: bytes, offset: int, buf: bytearray, lo: int, hi: int) -> bool:
    """Whether ``result`` (read at ``offset``) has a zero somewhere in [lo, hi) where ``buf``
    has a nonzero byte."""
    zeros = result[lo - offset : hi - offset].translate(_ZERO_TO_ONE)
    nonzeros = buf[lo:hi].translate(_NONZERO_TO_ONE)
    return int.from_bytes(zeros, "little") & int.from_bytes(nonzeros, "little") != 0


def _time(t_s: float | None) -> str:
    return "never" if t_s is None else f"{t_s:.6f}"


def _describe(data: bytes) -> str:
    more = "…" if len(data) > _EXCERPT_BYTES else ""
    return f"{len(data)} bytes {data[:_EXCERPT_BYTES].hex()}{more}"


def _diff(have: bytes, other: bytes, base: int, other_name: str) -> str:
    """Where ``other`` first departs from ``have`` (both start at chunk offset ``base``)."""
    at = next((k for k, (a, b) in enumerate(zip(have, other, strict=False)) if a != b), None)
    if at is None:
        at = min(len(have), len(other))
    excerpt = slice(at, at + _EXCERPT_BYTES)
    return (
        f"first difference at chunk offset {base + at}: content {have[excerpt].hex() or '(end)'}, "
        f"{other_name} {other[excerpt].hex() or '(end)'}"
    )
