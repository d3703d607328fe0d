"""Corrupted chunk files (detected, reads correct, repaired) and full targets (ENOSPC)."""

from __future__ import annotations

import errno
import hashlib
import random
import time
from pathlib import Path

import pytest
from faultkit import start_cluster
from test_storage_kill import _assert_replicas_agree

import loomfs
from loomfs.client.storage_client import replica_pick
from loomfs.testing import LocalCluster
from loomfs.wire.types import TargetState

pytestmark = [pytest.mark.integration]


def _write_files(fs: loomfs.LoomFS, base: str, rng: random.Random, count: int, size_max: int) -> dict[str, str]:
    fs.makedirs(base, exist_ok=True)
    fs.set_layout(base, chunk_size=64 << 10, stripe=2)
    want = {}
    for i in range(count):
        data = rng.randbytes(rng.randrange(1, size_max))
        with fs.open(f"{base}/f{i}", "wb") as f:
            f.write(data)
        want[f"{base}/f{i}"] = hashlib.sha256(data).hexdigest()
    return want


def _check(fs: loomfs.LoomFS, want: dict[str, str]) -> None:
    for p, digest in want.items():
        assert hashlib.sha256(fs.cat(p)).hexdigest() == digest, p


def _node_reads_go_to(c: LocalCluster, fs: loomfs.LoomFS, path: str) -> str:
    """The storage service whose replica the client reads chunk 0 of ``path`` from: every
    client sends reads of a chunk to one serving replica (``replica_pick``), so the rotten
    copy must be that one for reads to meet it."""
    ino = fs.stat(path).st_ino
    layout = fs.get_layout(path)
    assert layout is not None and layout.chains
    r = c.routing()
    info = {t.target_id: t for t in r.targets}
    chain = next(ch for ch in r.chains if ch.chain_id == layout.chains[0])
    serving = [t for t in chain.targets if info[t].state == TargetState.SERVING]
    target = serving[replica_pick(ino, 0, len(layout.chains)) % len(serving)]
    return f"storage{info[target].node_id}"


@pytest.mark.timeout(180)
def test_partial_reads_check_block_crcs(make_cluster: list[LocalCluster], seed: int) -> None:
    """Small random reads (not whole chunks) of a replica with a flipped byte: the block CRC
    catches it, the client reads another replica, the storage node repairs the chunk at once
    (the background scrubber is off here)."""
    c = start_cluster("blockcrc", storage_config={"scrub_bytes_per_s": 0})
    make_cluster.append(c)
    rng = random.Random(seed)
    fs = loomfs.connect(str(c.root))
    try:
        fs.makedirs("/blk", exist_ok=True)
        fs.set_layout("/blk", chunk_size=1 << 20, stripe=1)
        data = rng.randbytes(1 << 20)
        with fs.open("/blk/f", "wb") as f:
            f.write(data)
        node = _node_reads_go_to(c, fs, "/blk/f")  # reads of a chunk go to one replica (replica_pick)
        files = [p for p in Path(c.services[node].dir).glob("target*/chunks/*/*") if p.stat().st_size]
        assert len(files) == 1
        raw = bytearray(files[0].read_bytes())
        flip_at = rng.randrange(len(raw))
        raw[flip_at] ^= 0xFF
        files[0].write_bytes(bytes(raw))
        block = flip_at // (64 << 10)
        reads = 0
        log = Path(c.services[node].log_path)
        t0 = time.monotonic()
        with fs.open("/blk/f", "rb") as f:
            while time.monotonic() - t0 < 60:
                off = max(0, flip_at - rng.randrange(4096))
                f.seek(off)
                assert f.read(4096) == data[off:off + 4096], f"wrong bytes at {off}"
                reads += 1
                if "repaired from target" in log.read_text(errors="replace"):
                    break
        text = log.read_text(errors="replace")
        print(f"[fault] partial reads over a flipped byte (block {block}): {reads} reads, all correct; "
              f"{text.count('CRC mismatch')} block CRC mismatches logged; repaired "
              f"{'yes' if 'repaired from target' in text else 'no'} after {time.monotonic() - t0:.2f}s")
        assert "CRC mismatch" in text and "repaired from target" in text
        assert fs.cat("/blk/f") == data
        _assert_replicas_agree(c)
    finally:
        fs.close()


@pytest.mark.timeout(180)
def test_flipped_bytes_detected_served_and_repaired(make_cluster: list[LocalCluster], seed: int) -> None:
    c = start_cluster("bitrot", storage_config={"scrub_bytes_per_s": 200 << 20, "scrub_interval_s": 0.5})
    make_cluster.append(c)
    rng = random.Random(seed)
    fs = loomfs.connect(str(c.root))
    try:
        want = _write_files(fs, "/rot", rng, 12, 300_000)
        files = sorted(Path(c.services["storage1"].dir).glob("target*/chunks/*/*"))
        victims = rng.sample(files, min(8, len(files)))
        for f in victims:
            raw = bytearray(f.read_bytes())
            if not raw:
                continue
            for _ in range(3):
                raw[rng.randrange(len(raw))] ^= 0xFF
            f.write_bytes(bytes(raw))
        _check(fs, want)  # reads are correct: a bad replica fails its CRC and another one answers
        log = Path(c.services["storage1"].log_path)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            text = log.read_text(errors="replace")
            if text.count("repaired from target") >= len(victims):
                break
            time.sleep(0.3)
        text = log.read_text(errors="replace")
        print(f"[fault] bit rot: {len(victims)} chunk files corrupted; scrubber reported "
              f"{text.count('is corrupt')} and repaired {text.count('repaired from target')} "
              f"in {time.monotonic() - t0:.2f}s")
        assert text.count("repaired from target") >= len(victims)
        _check(fs, want)
        _assert_replicas_agree(c)
    finally:
        fs.close()


@pytest.mark.timeout(180)
def test_full_target_enospc_then_recovers(make_cluster: list[LocalCluster], seed: int) -> None:
    c = start_cluster("enospc", storage_config={"target_capacity_bytes": 3 << 20})
    make_cluster.append(c)
    rng = random.Random(seed)
    fs = loomfs.connect(str(c.root))
    try:
        fs.makedirs("/full", exist_ok=True)
        fs.set_layout("/full", chunk_size=256 << 10, stripe=2)
        want: dict[str, str] = {}
        err: OSError | None = None
        for i in range(100):
            data = rng.randbytes(400_000)
            try:
                with fs.open(f"/full/f{i}", "wb") as f:
                    f.write(data)
            except OSError as exc:
                err = exc
                break
            want[f"/full/f{i}"] = hashlib.sha256(data).hexdigest()
        assert err is not None, "the targets never filled up"
        print(f"[fault] disk full after {len(want)} files: {type(err).__name__}: {err}")
        assert err.errno == errno.ENOSPC and isinstance(err, loomfs.NoSpace)
        _check(fs, want)  # nothing acknowledged was harmed; reads continue
        _assert_replicas_agree(c)
        for p in list(want)[: len(want) // 2 + 1]:
            fs.unlink(p)
            del want[p]
        deadline = time.monotonic() + 30
        while True:  # GC frees the chunks after gc_delay_s
            try:
                data = rng.randbytes(400_000)
                with fs.open("/full/after", "wb") as f:
                    f.write(data)
                want["/full/after"] = hashlib.sha256(data).hexdigest()
                break
            except loomfs.NoSpace:
                assert time.monotonic() < deadline, "space never came back"
                time.sleep(0.5)
        _check(fs, want)
    finally:
        fs.close()
