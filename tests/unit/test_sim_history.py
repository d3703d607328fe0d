"""The chunk-history linearizability checker: hand-written cases, a brute-force oracle on small
random histories, histories from real sequential executions (50 seeds), and a time bound."""

from __future__ import annotations

import itertools
import random
import time

import pytest

from loomfs.testing.sim import Op, check_chunk_history, check_final_state
from loomfs.testing.sim.history import _Plan, _Search

_UNWRITTEN = 0xFF  # never appears in generated data, so a read containing it is impossible


def w(op_id: int, t0: float, t1: float | None, offset: int, data: bytes, *, ok: bool | None = True,
      client: int = 0) -> Op:  # fmt: skip
    return Op(op_id, client, "write", t0, t1, ok, offset=offset, data=data)


def tr(op_id: int, t0: float, t1: float | None, length: int, *, ok: bool | None = True,
       client: int = 0) -> Op:  # fmt: skip
    return Op(op_id, client, "truncate", t0, t1, ok, length=length)


def r(op_id: int, t0: float, t1: float | None, offset: int, length: int, result: bytes | None, *,
      ok: bool | None = True, client: int = 1) -> Op:  # fmt: skip
    return Op(op_id, client, "read", t0, t1, ok, offset=offset, length=length, result=result)


# --------------------------------------------------------------------------- hand-written


def test_empty_history_passes() -> None:
    assert check_chunk_history([]).ok
    assert check_final_state([], b"abc", initial=b"abc").ok
    assert not check_final_state([], b"abd", initial=b"abc").ok


def test_sequential_history_passes() -> None:
    ops = [
        w(1, 0, 1, 0, b"hello"),
        r(2, 2, 3, 0, 10, b"hello"),
        w(3, 4, 5, 3, b"p!"),
        r(4, 6, 7, 0, 5, b"help!"),
        w(5, 8, 9, 8, b"x"),  # past the end: zero-fill
        r(6, 10, 11, 0, 100, b"help!\0\0\0x"),
        tr(7, 12, 13, 2),
        r(8, 14, 15, 0, 5, b"he"),
        tr(9, 16, 17, 4),  # zero-extend
        r(10, 18, 19, 0, 5, b"he\0\0"),
    ]
    verdict = check_chunk_history(ops)
    assert verdict.ok, verdict.explanation
    assert verdict.states_explored == len(ops) + 1
    assert check_final_state(ops, b"he\0\0").ok


def test_read_of_value_never_written_fails() -> None:
    ops = [w(1, 0, 1, 0, b"aaaa"), r(2, 2, 3, 0, 4, b"abba")]
    verdict = check_chunk_history(ops)
    assert not verdict.ok
    assert "op 2" in verdict.explanation and "61626261" in verdict.explanation


def test_stale_read_fails() -> None:
    ops = [
        w(1, 0, 1, 0, b"old"),
        w(2, 2, 3, 0, b"new"),
        r(3, 4, 5, 0, 3, b"old"),  # invoked after write 2 was acknowledged
    ]
    verdict = check_chunk_history(ops)
    assert not verdict.ok
    assert "op 3" in verdict.explanation


def test_read_before_write_invoked_cannot_see_it() -> None:
    ops = [r(1, 0, 1, 0, 3, b"new"), w(2, 2, 3, 0, b"new")]
    assert not check_chunk_history(ops).ok


@pytest.mark.parametrize("seen", [b"old", b"new"])
def test_concurrent_write_and_read_either_order_passes(seen: bytes) -> None:
    ops = [
        w(1, 0, 1, 0, b"old"),
        w(2, 2, 5, 0, b"new", client=0),
        r(3, 3, 4, 0, 3, seen, client=1),
    ]
    assert check_chunk_history(ops).ok


def test_concurrent_reads_must_agree_on_one_order() -> None:
    # Two writers race; reader A sees x then y, reader B (at the same time) sees y then x.
    ops = [
        w(1, 0, 10, 0, b"x", client=0),
        w(2, 0, 10, 0, b"y", client=1),
        r(3, 1, 2, 0, 1, b"x", client=2),
        r(4, 3, 4, 0, 1, b"y", client=2),
        r(5, 1, 2, 0, 1, b"y", client=3),
        r(6, 3, 4, 0, 1, b"x", client=3),
    ]
    assert not check_chunk_history(ops).ok
    assert check_chunk_history(ops[:4] + [r(5, 1, 2, 0, 1, b"x", client=3)]).ok


@pytest.mark.parametrize(("ok", "complete_s"), [(False, 2.0), (None, 2.0), (None, None)])
def test_unacknowledged_write_that_a_later_read_observes_passes(
    ok: bool | None, complete_s: float | None
) -> None:
    ops = [
        w(1, 0, 1, 0, b"old"),
        w(2, 1.5, complete_s, 0, b"new", ok=ok),
        r(3, 5, 6, 0, 3, b"new"),  # takes effect after it "failed": allowed
        r(4, 7, 8, 0, 3, b"new"),
    ]
    assert check_chunk_history(ops).ok
    assert check_chunk_history([*ops[:2], r(3, 5, 6, 0, 3, b"old")]).ok  # or never


def test_unacknowledged_write_cannot_act_before_its_invoke() -> None:
    ops = [r(1, 0, 1, 0, 3, b"new"), w(2, 2, None, 0, b"new", ok=None)]
    assert not check_chunk_history(ops).ok


def test_observed_then_unobserved_write_fails() -> None:
    ops = [
        w(1, 0, 1, 0, b"old"),
        w(2, 2, None, 0, b"new", ok=None),
        r(3, 3, 4, 0, 3, b"new"),
        r(4, 5, 6, 0, 3, b"old"),
    ]
    verdict = check_chunk_history(ops)
    assert not verdict.ok
    assert "op 4" in verdict.explanation


def test_retried_write_may_apply_twice() -> None:
    # A client's write timed out and was retried; both copies may land, around another write.
    ops = [
        w(1, 0, None, 0, b"aa", ok=None, client=0),
        w(2, 1, 2, 0, b"bb", client=1),
        r(3, 3, 4, 0, 2, b"aa", client=2),
        w(4, 5, None, 0, b"cc", ok=None, client=1),
        r(5, 6, 7, 0, 2, b"cc", client=2),
        w(6, 8, None, 0, b"aa", ok=None, client=0),  # the retry of op 1
        r(7, 9, 10, 0, 2, b"aa", client=2),
    ]
    assert check_chunk_history(ops).ok
    assert not check_chunk_history(ops[:-2] + [r(7, 9, 10, 0, 2, b"bb", client=2)]).ok


def test_truncate_then_read_past_end_returns_empty() -> None:
    ops = [
        w(1, 0, 1, 0, b"0123456789"),
        tr(2, 2, 3, 4),
        r(3, 4, 5, 6, 4, b""),
        r(4, 6, 7, 2, 10, b"23"),
    ]
    assert check_chunk_history(ops).ok
    stale = [*ops[:2], r(3, 4, 5, 6, 4, b"6789")]
    assert not check_chunk_history(stale).ok


def test_read_of_missing_chunk_returns_empty() -> None:
    assert check_chunk_history([r(1, 0, 1, 0, 4096, b"")]).ok
    assert not check_chunk_history([r(1, 0, 1, 0, 4096, b"\0")]).ok


def test_failed_and_unknown_reads_constrain_nothing() -> None:
    ops = [
        w(1, 0, 1, 0, b"abc"),
        r(2, 2, 3, 0, 3, b"zzz", ok=False),
        r(3, 2, None, 0, 3, b"zzz", ok=None),
        r(4, 2, 3, 0, 3, None),
    ]
    assert check_chunk_history(ops).ok


def test_unknown_write_seen_only_through_its_zero_fill() -> None:
    ops = [
        w(1, 0, 1, 0, b"ab"),
        w(2, 2, None, 6, b"zz", ok=None),
        r(3, 3, 4, 0, 4, b"ab\0\0"),  # only the unknown write can have made bytes 2..5
    ]
    assert check_chunk_history(ops).ok
    ops.append(r(4, 5, 6, 0, 8, b"ab"))  # ...and then the content is short again
    assert not check_chunk_history(ops).ok


def test_unknown_truncate_seen_through_a_short_read_or_a_zero() -> None:
    base = [w(1, 0, 1, 0, b"abcdef"), tr(2, 2, None, 2, ok=None)]
    assert check_chunk_history([*base, r(3, 3, 4, 0, 6, b"ab")]).ok
    # cut, then zero-extended by an acked truncate: the zeros show the cut happened first
    extended = [*base, tr(3, 3, 4, 6), r(4, 5, 6, 0, 6, b"ab\0\0\0\0")]
    assert check_chunk_history(extended).ok
    assert check_final_state(extended[:3], b"ab\0\0\0\0").ok
    assert check_final_state(extended[:3], b"abcdef").ok
    assert check_final_state(extended[:3], b"ab").ok  # cut after the extension
    assert not check_final_state(extended[:3], b"abc").ok


def test_acked_op_that_never_completed_still_precedes_final_state() -> None:
    ops = [w(1, 0, None, 0, b"late")]
    assert check_final_state(ops, b"late").ok
    assert not check_final_state(ops, b"").ok


def test_lost_acknowledged_write_is_detected_by_final_state() -> None:
    ops = [w(1, 0, 1, 0, b"aaaa"), w(2, 2, 3, 2, b"bb"), r(3, 4, 5, 0, 4, b"aabb")]
    assert check_final_state(ops, b"aabb").ok
    verdict = check_final_state(ops, b"aaaa")
    assert not verdict.ok
    assert "final content" in verdict.explanation and "offset 2" in verdict.explanation


def test_final_state_may_include_or_omit_unacknowledged_writes() -> None:
    ops = [
        w(1, 0, 1, 0, b"aaaa"),
        w(2, 2, None, 4, b"zz", ok=None),
        tr(3, 2, 3, 1, ok=False),
        w(4, 4, 5, 1, b"b"),
    ]
    for final in (b"a", b"ab", b"abaa", b"abaazz", b"ab\0\0zz"):
        assert check_final_state(ops, final).ok, final
    assert not check_final_state(ops, b"aaaa").ok  # acked write 4 lost


def test_search_limit_is_never_a_pass() -> None:
    ops = [w(i, 0, 10, 0, bytes([i])) for i in range(1, 9)]
    ops.append(r(99, 11, 12, 0, 1, b"\x63"))
    verdict = check_chunk_history(ops, max_states=20)
    assert not verdict.ok
    assert "search limit reached" in verdict.explanation and "op 99" in verdict.explanation
    assert verdict.states_explored <= 22


def test_explanation_of_large_chunk_is_short() -> None:
    big = bytes(range(200)) * 300  # 60,000 bytes
    wrong = big[:1000] + b"\xff" + big[1001:]
    verdict = check_chunk_history([w(1, 0, 1, 0, big), r(2, 2, 3, 0, len(big), wrong)])
    assert not verdict.ok
    assert "offset 1000" in verdict.explanation and "60000 bytes" in verdict.explanation
    assert len(verdict.explanation) < 600


def test_malformed_op_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown kind"):
        check_chunk_history([Op(1, 0, "append", 0, 1, True)])
    with pytest.raises(ValueError, match="before invoke"):
        check_chunk_history([w(1, 5, 1, 0, b"x")])


# --------------------------------------------------------------------------- generators


def _apply(content: bytes, op: Op) -> bytes:
    if op.kind == "write":
        padded = content + bytes(max(0, op.offset - len(content)))
        return padded[: op.offset] + op.data + padded[op.offset + len(op.data) :]
    if op.kind == "truncate":
        return content[: op.length] + bytes(max(0, op.length - len(content)))
    return content


def simulate(
    seed: int,
    n_ops: int,
    n_clients: int,
    *,
    size_bytes: int = 256,
    n_optional: int = 5,
    initial: bytes = b"",
) -> tuple[list[Op], bytes]:
    """A concurrent history from a real sequential execution: each applied op takes effect at a
    random point inside its window; reads report what the model held there."""
    rng = random.Random(seed)
    clock_s = [rng.uniform(0, 0.2) for _ in range(n_clients)]
    optional_at = set(rng.sample(range(n_ops), n_optional))
    effects: list[tuple[float, Op]] = []
    ops: list[Op] = []
    for op_id in range(n_ops):
        client = min(range(n_clients), key=lambda c: clock_s[c])
        invoke_s = clock_s[client]
        complete_s = invoke_s + rng.uniform(0.01, 0.3)
        clock_s[client] = complete_s + rng.uniform(0.0, 0.05)
        kind = rng.choices(["write", "truncate", "read"], weights=[5, 1, 4])[0]
        op = Op(op_id, client, kind, invoke_s, complete_s, True)
        if kind == "write":
            op.offset = rng.randrange(size_bytes)
            op.data = bytes(rng.randrange(255) for _ in range(rng.randint(1, 32)))
        elif kind == "truncate":
            op.length = rng.randrange(size_bytes + 1)
        else:
            op.offset = rng.randrange(size_bytes)
            op.length = rng.randint(1, 64)
        point_s = rng.uniform(invoke_s, complete_s)
        if op_id in optional_at:  # timeout, refusal or lost connection: may land, even later
            op.ok = rng.choice([False, None])
            op.complete_s = rng.choice([complete_s, None])
            point_s = invoke_s + rng.uniform(0, 2.0)
            if kind == "read" or rng.random() < 0.5:
                point_s = -1.0  # never takes effect
        if point_s >= 0:
            effects.append((point_s, op))
        ops.append(op)
    content = initial
    for _, op in sorted(effects, key=lambda e: e[0]):
        if op.kind == "read":
            op.result = content[op.offset : op.offset + op.length]
        content = _apply(content, op)
    return ops, content


def corrupt_one_read(ops: list[Op], seed: int) -> Op:
    rng = random.Random(seed)
    reads = [op for op in ops if op.kind == "read" and op.ok and op.result is not None]
    victim = rng.choice(reads)
    assert victim.result is not None
    data = bytearray(victim.result or b"\0")
    data[rng.randrange(len(data))] = _UNWRITTEN
    victim.result = bytes(data)
    return victim


# --------------------------------------------------------------------------- random histories


@pytest.mark.parametrize("seed", range(50))
def test_random_concurrent_history_passes_and_one_bad_read_fails(seed: int) -> None:
    ops, final = simulate(seed, n_ops=200, n_clients=3 + seed % 2)
    verdict = check_chunk_history(ops)
    assert verdict.ok, f"seed={seed}: {verdict.explanation}"
    assert check_final_state(ops, final).ok, f"seed={seed}"
    victim = corrupt_one_read(ops, seed)
    verdict = check_chunk_history(ops)
    assert not verdict.ok, f"seed={seed}: corrupted op {victim.op_id} passed"
    assert "not linearizable" in verdict.explanation


@pytest.mark.parametrize("seed", range(10))
def test_many_unknown_outcomes_stay_tractable(seed: int) -> None:
    # one op in ten times out or fails, half of those land anyway, some much later
    ops, final = simulate(seed, n_ops=150, n_clients=4, n_optional=15)
    verdict = check_chunk_history(ops)
    assert verdict.ok, f"seed={seed}: {verdict.explanation}"
    assert check_final_state(ops, final).ok, f"seed={seed}"
    corrupt_one_read(ops, seed)
    verdict = check_chunk_history(ops)
    assert not verdict.ok and "not linearizable" in verdict.explanation, f"seed={seed}"
    assert verdict.states_explored < 100_000


@pytest.mark.parametrize("seed", range(10))
def test_random_history_with_lost_acked_write_fails_final_state(seed: int) -> None:
    ops, final = simulate(seed, n_ops=100, n_clients=3, n_optional=3)
    end_s = max(op.complete_s or op.invoke_s for op in ops)
    last = w(1000, end_s + 1, end_s + 2, 0, bytes([_UNWRITTEN]) * 4)  # acked, then lost
    ops.append(last)
    assert check_final_state(ops, _apply(final, last)).ok, f"seed={seed}"
    verdict = check_final_state(ops, final)
    assert not verdict.ok, f"seed={seed}"
    assert "final content" in verdict.explanation


def brute_force(ops: list[Op], initial: bytes, final: bytes | None) -> bool:
    """Every subset of optional ops, every order: the definition, for tiny histories."""
    required = [op for op in ops if op.ok and (op.kind != "read" or op.result is not None)]
    optional = [op for op in ops if not op.ok and op.kind != "read"]

    def end_s(op: Op) -> float:
        return op.complete_s if op.ok and op.complete_s is not None else float("inf")

    for k in range(len(optional) + 1):
        for subset in itertools.combinations(optional, k):
            for order in itertools.permutations(required + list(subset)):
                if any(
                    end_s(later) < earlier.invoke_s
                    for i, earlier in enumerate(order)
                    for later in order[i + 1 :]
                ):
                    continue
                content = initial
                for op in order:
                    if op.kind == "read" and content[op.offset : op.offset + op.length] != op.result:
                        break
                    content = _apply(content, op)
                else:
                    if final is None or content == final:
                        return True
    return False


@pytest.mark.parametrize("seed", range(300))
def test_agrees_with_brute_force_on_tiny_histories(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = [b"a", b"b", b"ab", b"\0"]
    ops: list[Op] = []
    for op_id in range(rng.randint(1, 6)):
        invoke_s = float(rng.randint(0, 6))
        complete_s: float | None = invoke_s + rng.randint(0, 3)
        ok: bool | None = rng.choice([True, True, True, False, None])
        if not ok and rng.random() < 0.5:
            complete_s = None
        kind = rng.choice(["write", "write", "truncate", "read", "read"])
        op = Op(op_id, op_id % 3, kind, invoke_s, complete_s, ok, offset=rng.randint(0, 2))
        op.data = rng.choice(alphabet)
        op.length = rng.randint(0, 3)
        op.result = rng.choice([b"", b"a", b"b", b"ab", b"ba", b"\0a"]) if kind == "read" else None
        ops.append(op)
    initial = rng.choice([b"", b"b"])
    final = rng.choice([b"", b"a", b"ab", b"b", b"\0ab", b"aab"])
    for end in (None, final):
        expected = brute_force(ops, initial, end)
        if end is None:
            assert check_chunk_history(ops, initial=initial).ok == expected
        else:
            assert check_final_state(ops, end, initial=initial).ok == expected
        for evidence_first in (False, True):  # each search order decides alone
            assert _Search(_Plan(ops, initial, end), evidence_first, 10**6).run() == expected


# --------------------------------------------------------------------------- time bounds


def test_150_op_4_client_history_checks_within_a_second() -> None:
    ops, final = simulate(1234, n_ops=150, n_clients=4, size_bytes=4096, n_optional=8)
    start_s = time.perf_counter()
    verdict = check_chunk_history(ops)
    victim = corrupt_one_read(ops, 1234)
    failed = check_chunk_history(ops)
    elapsed_s = time.perf_counter() - start_s
    assert verdict.ok, verdict.explanation
    assert not failed.ok, f"corrupted op {victim.op_id} passed"
    assert elapsed_s < 1.0, f"took {elapsed_s:.3f} s"


def test_large_chunk_steps_cost_what_the_op_touches() -> None:
    initial = bytes(rng_byte % 255 for rng_byte in range(65536))
    ops, final = simulate(7, n_ops=150, n_clients=4, size_bytes=65536, initial=initial)
    start_s = time.perf_counter()
    verdict = check_final_state(ops, final, initial=initial)
    elapsed_s = time.perf_counter() - start_s
    assert verdict.ok, verdict.explanation
    assert elapsed_s < 1.0, f"took {elapsed_s:.3f} s"
