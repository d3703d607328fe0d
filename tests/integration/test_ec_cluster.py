"""Erasure-coded files on a real 6-storage-node cluster with RS(4, 2) (issue 11).

One cluster for the module: 6 storage nodes, each with 2 targets in the 3-replica table and
one target in a single-replica table that EC groups are drawn from. The test that kills two
servers runs last.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import loomfs
from loomfs.cli.layout import ec_layout
from loomfs.client.ec_convert import convert_file, convert_tree
from loomfs.client.ec_file import STATS
from loomfs.client.ec_io import FragmentIO
from loomfs.client.ec_rebuild import ScrubReport, scrub_file
from loomfs.client.ec_stripe import (
    payload,
    repairs_settled,
    resolve,
    stamp,
    stripe_buffer_bytes,
    write_fragments,
)
from loomfs.client.storage_client import StorageClient
from loomfs.config import ClientConfig
from loomfs.ec.codec import make_codec
from loomfs.ec.stripe import Geometry
from loomfs.errors import LoomError
from loomfs.testing import LocalCluster
from loomfs.wire.types import Layout, NodeState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CS = 1 << 20  # 1 MiB fragments: a stripe is 4 MiB of data
SEED = int(os.environ.get("LOOMFS_EC_SEED", "0")) or random.randrange(1 << 30)


@pytest.fixture(scope="module")
def ec_cluster() -> Iterator[LocalCluster]:
    root = tempfile.mkdtemp(prefix="loomfs-it-ec-")
    c = LocalCluster(root, storage_nodes=6, ec_targets_per_node=1, gc_delay_s=1.0, lease_s=3.0,
                     replace_after_s=8.0)
    try:
        c.start(timeout_s=60)
    except BaseException:
        c.stop()
        raise
    yield c
    c.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def efs(ec_cluster: LocalCluster) -> Iterator[loomfs.LoomFS]:
    fs = loomfs.connect(str(ec_cluster.root))
    fs.makedirs("/cold", exist_ok=True)
    fs.set_layout("/cold", ec_layout(Layout(chunk_size=CS), (4, 2)))
    yield fs
    fs.close()


def _rng(name: str) -> random.Random:
    print(f"[ec] seed {SEED} ({name})")
    return random.Random(f"{SEED}:{name}")


def _fragment_files(c: LocalCluster, inode: int, index: int) -> list[Path]:
    return sorted(Path(c.root).glob(f"storage*/target*/chunks/{inode & 0xFF:02x}/{inode:x}.{index:x}.*"))


def test_layout_and_placement(efs: loomfs.LoomFS, ec_cluster: LocalCluster) -> None:
    lay = efs.get_layout("/cold")
    assert lay is not None and (lay.ec_k, lay.ec_m, lay.replicas) == (4, 2, 1)
    with efs.open("/cold/placed", "wb") as f:
        f.write(b"x")
    fl = efs.attr("/cold/placed").layout
    assert fl is not None and fl.ec_k == 4 and len(fl.chains) == 6
    r = ec_cluster.routing()
    chains = {c.chain_id: c for c in r.chains}
    node_of = {t.target_id: t.node_id for t in r.targets}
    assert len({node_of[chains[c].targets[0]] for c in fl.chains}) == 6  # distinct nodes
    efs.makedirs("/wide", exist_ok=True)
    efs.set_layout("/wide", ec_layout(Layout(chunk_size=CS), (5, 2)))
    with pytest.raises(OSError) as e:
        efs.open("/wide/f", "wb").close()
    assert "7 storage nodes" in str(e.value)


def test_write_read_overwrite_append(efs: loomfs.LoomFS, ec_cluster: LocalCluster) -> None:
    rng = _rng("rw")
    data = bytearray(rng.randbytes(32 * CS + 12345))  # 8 full stripes and a partial one
    with efs.open("/cold/big", "wb") as f:
        for pos in range(0, len(data), 3 * CS + 17):  # writes that straddle stripes
            f.write(data[pos : pos + 3 * CS + 17])
    assert efs.stat("/cold/big").st_size == len(data)
    with efs.open("/cold/big", "rb") as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
    with efs.open("/cold/big", "rb") as f:
        for _ in range(20):
            off = rng.randrange(len(data))
            n = rng.randrange(1, 2 * CS)
            f.seek(off)
            assert f.read(n) == data[off : off + n]
    with efs.open("/cold/big", "r+b") as f:  # read-modify-write of two stripes
        for _ in range(3):
            off = rng.randrange(len(data) - 5000)
            patch = rng.randbytes(rng.randrange(1, 5000))
            f.seek(off)
            f.write(patch)
            data[off : off + len(patch)] = patch
    g, inode = Geometry(4, 2, CS), efs.attr("/cold/big").inode
    staged = [p for s in range(g.stripes(len(data))) for i in g.stripe_chunks(s, shadow=True)
              for p in _fragment_files(ec_cluster, inode, i)]
    assert staged and all(p.stat().st_size == 0 for p in staged)  # shadow copies emptied after use
    with efs.open("/cold/big", "ab") as f:
        f.write(b"tail" * 1000)
    data += b"tail" * 1000
    with efs.open("/cold/big", "rb") as f:
        assert f.read() == data
    for size in (9 * CS + 123, 2 * CS + 5):  # shrink into a stripe: whole stripes cut, the last re-encoded
        with efs.open("/cold/big", "r+b") as f:
            f.truncate(size)
        del data[size:]
        assert efs.stat("/cold/big").st_size == size
        with efs.open("/cold/big", "rb") as f:
            assert f.read() == data
    with efs.open("/cold/big", "r+b") as f:  # grown again: what was cut reads as zeros
        f.seek(9 * CS)  # stripe 1 (cut to empty chunks by the trim) stays a hole
        f.write(b"end")
    data += bytes(9 * CS - len(data)) + b"end"
    with efs.open("/cold/big", "rb") as f:
        assert f.read() == data
    assert efs.run(_fragments_clean(efs, "/cold/big", 2))  # every fragment good after the cuts
    with efs.open("/cold/big", "wb") as f:  # O_TRUNC, then rewritten
        f.write(b"again")
    with efs.open("/cold/big", "rb") as f:
        assert f.read() == b"again"


def test_truncate_by_path_then_extend_reads_zeros(efs: loomfs.LoomFS) -> None:
    """A truncate with no writer open (by path, as a mount's setattr does) re-encodes the
    stripe holding the new end in meta's trim: an extend reads zeros past the cut, never the
    old bytes (docs/ec.md, known defect 3 of session 13)."""
    rng = _rng("trunc-path")
    data = bytearray(rng.randbytes(6 * CS + 777))  # a full stripe and part of the next
    with efs.open("/cold/trunc", "wb") as f:
        f.write(data)
    for size, grow in ((5 * CS + 3, 6 * CS), (CS // 2, 3 * CS), (0, CS)):
        efs.truncate("/cold/trunc", size)
        del data[size:]
        efs.truncate("/cold/trunc", grow)  # an extend by path: a hole past the old end
        data += bytes(grow - size)
        with efs.open("/cold/trunc", "rb") as f:
            got = f.read()
        assert len(got) == len(data) and got == data, f"after truncate to {size} and extend to {grow}"
    assert efs.run(_fragments_clean(efs, "/cold/trunc", 1))


def test_sparse_and_partial_stripes_read_zeros(efs: loomfs.LoomFS) -> None:
    want = bytearray(9 * CS + 1)
    with efs.open("/cold/sparse", "wb") as f:
        for off, piece in ((0, b"a" * 100), (CS + 10, b"b" * 10), (9 * CS, b"c")):
            f.seek(off)
            f.write(piece)
            want[off : off + len(piece)] = piece
    with efs.open("/cold/sparse", "rb") as f:
        assert f.read() == want
    assert efs.read_many(["/cold/sparse"]) == [want]  # batch reads take the EC path too
    assert efs.cat("/cold/sparse") == want
    with efs.open("/cold/sparse", "r+b") as f:  # read-modify-write next to the short fragment
        f.seek(3 * CS)
        f.write(b"d" * 5)
        want[3 * CS : 3 * CS + 5] = b"d" * 5
    with efs.open("/cold/sparse", "rb") as f:
        assert f.read() == want
        f.seek(100)
        assert f.read(200) == bytes(200)  # past fragment 0's bytes: zeros, never its trailer


def test_corrupt_fragment_is_detected_and_repaired(efs: loomfs.LoomFS, ec_cluster: LocalCluster) -> None:
    rng = _rng("corrupt")
    data = rng.randbytes(8 * CS)
    with efs.open("/cold/rot", "wb") as f:
        f.write(data)
    inode = efs.attr("/cold/rot").inode
    victims = [(0, 1), (1, 4)]  # (stripe, fragment): a data fragment and a parity fragment
    for s, j in victims:
        (path,) = _fragment_files(ec_cluster, inode, Geometry(4, 2, CS).chunk_index(s, j))
        raw = bytearray(path.read_bytes())
        for _ in range(3):
            raw[rng.randrange(64, len(raw))] ^= 0xFF
        path.write_bytes(bytes(raw))
    before = STATS.repaired_fragments_total
    with efs.open("/cold/rot", "rb") as f:
        assert f.read() == data  # the data fragment's bad CRC made stripe 0 degraded

    efs.run(_resolve_all(efs, "/cold/rot", 2))  # stripe 1's parity is found by a full check
    efs.run(repairs_settled())
    assert STATS.repaired_fragments_total >= before + 2
    ok = efs.run(_fragments_clean(efs, "/cold/rot", 2))
    assert ok, "repaired fragments should read back with good headers and CRC32C"


async def _io(fs: loomfs.LoomFS, path: str) -> FragmentIO:
    attr = await fs.client.stat(path)
    assert attr.layout is not None
    storage = fs.client.storage
    assert isinstance(storage, StorageClient)
    return FragmentIO(storage, attr.layout, attr.inode)


async def _resolve_all(fs: loomfs.LoomFS, path: str, stripes: int) -> None:
    io = await _io(fs, path)
    codec = make_codec(4, 2)
    buf = bytearray(stripe_buffer_bytes(io.geometry))
    for s in range(stripes):
        await resolve(io, codec, STATS, s, buf, full=True)


async def _fragments_clean(fs: loomfs.LoomFS, path: str, stripes: int) -> bool:
    from loomfs.client.ec_stripe import _read_whole  # the fragment checker resolve uses

    io = await _io(fs, path)
    buf = bytearray(stripe_buffer_bytes(io.geometry))
    for s in range(stripes):
        found = await _read_whole(io, buf, s, range(6), shadow=False)
        if len(found) != 6 or len({getattr(h, "version", None) for h in found.values()}) != 1:
            return False
    return True


def _inode_files(c: LocalCluster, inode: int) -> list[Path]:
    return sorted(Path(c.root).glob(f"storage*/target*/chunks/{inode & 0xFF:02x}/{inode:x}.*"))


def test_convert_replicated_to_ec_and_back(efs: loomfs.LoomFS, ec_cluster: LocalCluster) -> None:
    rng = _rng("convert")
    efs.makedirs("/warm/sub", exist_ok=True)
    files = {"/warm/a": rng.randbytes(5 * CS + 7), "/warm/sub/b": rng.randbytes(100), "/warm/sub/c": b""}
    for p, d in files.items():
        with efs.open(p, "wb") as f:
            f.write(d)
    efs.chmod("/warm/a", 0o600)
    old_inode = efs.attr("/warm/a").inode
    done = convert_tree(efs, "/warm", (4, 2))
    assert sorted(c.path for c in done if not c.skipped) == sorted(files)
    for p, d in files.items():
        lay = efs.attr(p).layout
        assert lay is not None and (lay.ec_k, lay.ec_m) == (4, 2), p
        with efs.open(p, "rb") as f:
            assert f.read() == d, p
    assert efs.attr("/warm/a").inode != old_inode  # a new copy, switched by rename
    assert efs.stat("/warm/a").st_mode & 0o777 == 0o600
    lay = efs.get_layout("/warm")
    assert lay is not None and lay.ec_k == 4  # new files in the tree too
    assert convert_file(efs, "/warm/a", (4, 2)).skipped == "already in that layout"
    ec_inode = efs.attr("/warm/a").inode
    assert _inode_files(ec_cluster, ec_inode)
    back = convert_file(efs, "/warm/a", (0, 0))
    assert not back.skipped and back.bytes == len(files["/warm/a"])
    lay = efs.attr("/warm/a").layout
    assert lay is not None and lay.ec_k == 0 and lay.replicas != 1
    with efs.open("/warm/a", "rb") as f:
        assert f.read() == files["/warm/a"]
    deadline = time.monotonic() + 60  # the replaced EC copy's fragments go to GC
    while _inode_files(ec_cluster, ec_inode) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _inode_files(ec_cluster, ec_inode)
    staged = efs.listdir("/.loomfs-convert")
    assert staged and all(efs.listdir(f"/.loomfs-convert/{d}") == [] for d in staged)  # no copies left


def test_convert_never_loses_an_open_writers_bytes(efs: loomfs.LoomFS) -> None:
    """A writer that sent bytes to storage and has not reported them (open, flushed, no
    fsync): the conversion's copy misses them, so its switch is refused (the rename checks
    in meta's transaction that no writer has the file open) and the file is left as it was;
    once the writer closed, a later run converts it with every byte (docs/ec.md, known defect
    4 of session 13)."""
    rng = _rng("convert-open")
    first, more = rng.randbytes(CS + 5), rng.randbytes(3000)
    efs.makedirs("/openconv/tmp", exist_ok=True)
    with efs.open("/openconv/f", "wb") as f:
        f.write(first)
    inode = efs.attr("/openconv/f").inode
    with efs.open("/openconv/f", "r+b") as w:
        w.seek(len(first))
        w.write(more)
        w.flush()
        with pytest.raises(LoomError, match="open for writing"):
            convert_file(efs, "/openconv/f", (4, 2))
        assert efs.attr("/openconv/f").inode == inode
    done = convert_file(efs, "/openconv/f", (4, 2))
    assert not done.skipped and done.bytes == len(first) + len(more)
    with efs.open("/openconv/f", "rb") as f:
        assert f.read() == first + more
    with efs.open("/openconv/f", "wb") as f:  # changed after the copy started: refused too
        f.write(b"v1")
    a = efs.attr("/openconv/f")
    with efs.open("/openconv/f", "r+b") as f:
        f.write(b"v2")
    with efs.open("/openconv/tmp/x", "wb") as f:
        f.write(b"new")
    with pytest.raises(OSError) as e:
        efs.rename("/openconv/tmp/x", "/openconv/f", expect=(a.inode, a.size, a.mtime_ns))
    assert e.value.errno == errno.EBUSY
    with efs.open("/openconv/f", "rb") as f:
        assert f.read() == b"v2"


def test_convert_keeps_a_durable_file_durable(efs: loomfs.LoomFS) -> None:
    """A checkpoint's files are durable (every replica or fragment fsyncs each commit): an
    archive conversion to EC kept the bytes but lost the flag (checkpoint hunt, session 14)."""
    efs.makedirs("/durconv", exist_ok=True)
    cur = efs.get_layout("/durconv") or Layout()
    efs.set_layout("/durconv", dataclasses.replace(cur, durable=True))
    with efs.open("/durconv/ckpt", "wb") as f:
        f.write(b"w" * 5000)
    lay = efs.attr("/durconv/ckpt").layout
    assert lay is not None and lay.durable
    assert not convert_file(efs, "/durconv/ckpt", (4, 2)).skipped
    lay = efs.attr("/durconv/ckpt").layout
    assert lay is not None and (lay.ec_k, lay.durable) == (4, True)
    efs.set_layout("/durconv", cur)  # and a plain file stays plain
    with efs.open("/durconv/plain2", "wb") as f:
        f.write(b"p")
    assert not convert_file(efs, "/durconv/plain2", (4, 2)).skipped
    lay = efs.attr("/durconv/plain2").layout
    assert lay is not None and (lay.ec_k, lay.durable) == (4, False)
    with efs.open("/durconv/ckpt", "rb") as f:
        assert f.read() == b"w" * 5000


def _cli(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loomfs.cli.main", "--dir", str(c.root), *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_layout_set_convert_scrub(efs: loomfs.LoomFS, ec_cluster: LocalCluster) -> None:
    efs.makedirs("/clidir", exist_ok=True)
    with efs.open("/clidir/f", "wb") as f:
        f.write(b"q" * (2 * CS + 3))
    out = _cli(ec_cluster, "layout", "set", "/clidir", "--ec", "4+2", "--chunk-size", "1M")
    assert out.returncode == 0 and "ec 4+2 chunk_size=1.0 MiB" in out.stdout, out.stdout + out.stderr
    bad = _cli(ec_cluster, "layout", "set", "/clidir", "--ec", "4-2")
    assert bad.returncode != 0 and "--ec wants K+M" in bad.stderr
    wide = _cli(ec_cluster, "layout", "set", "/clidir", "--ec", "6+3")  # 9 > the nodes the table spans
    assert wide.returncode == 2 and "ec 6+3 needs 9 storage nodes" in wide.stdout, wide.stdout + wide.stderr
    out = _cli(ec_cluster, "layout", "convert", "/clidir", "--ec", "4+2", "--chunk-size", "1M")
    assert out.returncode == 0 and "/clidir/f: converted" in out.stdout, out.stdout + out.stderr
    out = _cli(ec_cluster, "layout", "get", "/clidir/f")
    assert "ec 4+2" in out.stdout
    out = _cli(ec_cluster, "layout", "scrub", "/clidir")
    assert out.returncode == 0 and "/clidir/f: 1 stripes, 0 bad fragments" in out.stdout and ": ok" in out.stdout, out.stdout
    with efs.open("/clidir/f", "rb") as f:
        assert f.read() == b"q" * (2 * CS + 3)


def test_crash_mid_stripe_never_mixes_versions(efs: loomfs.LoomFS) -> None:
    """An overwrite cut short at each point: the stripe decodes to exactly the old or exactly
    the new bytes, never a mix, and the next reader/writer finishes or discards it."""
    rng = _rng("crash")
    old = rng.randbytes(4 * CS)  # one full stripe
    new = rng.randbytes(4 * CS)
    g = Geometry(4, 2, CS)
    for case in ("shadow-partial", "inplace-partial"):
        path = f"/cold/crash-{case}"
        with efs.open(path, "wb") as f:
            f.write(old)

        async def crash(case: str = case, path: str = path) -> bytes:
            io = await _io(efs, path)
            codec = make_codec(4, 2)
            buf = bytearray(stripe_buffer_bytes(g))
            for j in range(4):
                payload(g, buf, j)[:] = new[j * CS : (j + 1) * CS]
            codec.encode([payload(g, buf, j) for j in range(4)], [payload(g, buf, j) for j in range(4, 6)])
            stamp(g, buf, 0, 4 * CS, time.time_ns())
            if case == "shadow-partial":  # died while staging: 3 of 6 shadow fragments landed
                await write_fragments(io, buf, 0, 4 * CS, shadow=True, fragments=[0, 2, 5])
            else:  # staged completely, died after 2 of 6 in-place fragments
                await write_fragments(io, buf, 0, 4 * CS, shadow=True)
                await write_fragments(io, buf, 0, 4 * CS, shadow=False, fragments=[1, 4])
            out = bytearray(stripe_buffer_bytes(g))
            res = await resolve(io, codec, STATS, 0, out)
            assert res is not None
            await repairs_settled()
            return b"".join(bytes(payload(g, out, j)) for j in range(4))

        decoded = efs.run(crash())
        want = old if case == "shadow-partial" else new
        assert decoded == want, case
        with efs.open(path, "rb") as f:  # after the repair, healthy reads agree
            assert f.read() == want, case
        with efs.open(path, "r+b") as f:  # and the stripe can be overwritten again
            f.write(b"Z" * 10)
        with efs.open(path, "rb") as f:
            assert f.read() == b"Z" * 10 + want[10:], case


_WRITER = """
import sys, loomfs
root, path, sb = sys.argv[1], sys.argv[2], int(sys.argv[3])
fs = loomfs.connect(root)
gen = 1
while True:
    with fs.open(path, "r+b") as f:
        for s in range(4):
            f.seek(s * sb)
            f.write(bytes([gen % 251 + 1]) * sb)  # a whole stripe of one byte value
    print("gen", gen, flush=True)
    gen += 1
"""


def test_writer_killed_mid_overwrite_leaves_whole_stripes(efs: loomfs.LoomFS, ec_cluster: LocalCluster) -> None:
    """Real crashes: a writer process overwriting stripes is SIGKILLed at a random moment,
    several times. Every stripe then decodes to one generation's bytes (never a mix), and
    after a repairing check healthy reads agree with it."""
    rng = _rng("killwriter")
    sb = 4 * CS
    with efs.open("/cold/victim", "wb") as f:
        f.write(bytes([7]) * (4 * sb))
    cut_short = 0
    for _round in range(4):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(ec_cluster.root), "/cold/victim", str(sb)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # it overwrote everything once: now kill it mid-flight
            assert line.startswith("gen"), line
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            proc.kill()
            proc.wait(timeout=10)

        async def check() -> tuple[list[set[int]], int]:
            io = await _io(efs, "/cold/victim")
            codec = make_codec(4, 2)
            buf = bytearray(stripe_buffer_bytes(io.geometry))
            seen, torn = [], 0
            for s in range(4):
                res = await resolve(io, codec, STATS, s, buf, full=True)
                assert res is not None and res.stripe_len == sb
                torn += bool(res.from_shadow or res.bad)
                seen.append({b for j in range(4) for b in set(bytes(payload(io.geometry, buf, j)))})
            await repairs_settled()
            return seen, torn

        seen, torn = efs.run(check())
        cut_short += torn
        assert all(len(values) == 1 for values in seen), seen  # each stripe: one generation
        with efs.open("/cold/victim", "rb") as f:
            for s in range(4):
                assert set(f.read(sb)) == seen[s], s
    print(f"[ec] stripes found cut short mid-overwrite (and completed or rolled back): {cut_short}")


def _rebuild_rows(c: LocalCluster) -> dict[int, dict[str, object]]:
    """The meta servers' EC rebuild progress, as ``loomfs admin rebuilds --json`` reads it."""
    from loomfs.cli.admin import _rebuild_rows as rows

    return asyncio.run(rows(c.routing()))


def test_rebuild_onto_a_spare(efs: loomfs.LoomFS, ec_cluster: LocalCluster) -> None:
    """A server dies; mgmtd gives its EC chain an empty spare on a new node; meta's rebuild
    worker regenerates the lost fragments there by itself (no command): full redundancy again,
    every byte the same, progress and "done" in `loomfs admin rebuilds`; then `layout scrub`
    finds nothing to repair, and a fragment lost afterwards is restored by `scrub --repair`."""
    rng = _rng("rebuild")
    files = {f"/cold/rb{i}": rng.randbytes(rng.randrange(CS, 9 * CS)) for i in range(3)}
    for p, d in files.items():
        with efs.open(p, "wb") as f:
            f.write(d)
    spare_node = ec_cluster.add_storage_node()
    victim = f"storage{rng.randrange(1, 7)}"
    dead_node = ec_cluster.services[victim].node_id
    r0 = ec_cluster.routing()
    node_of = {t.target_id: t.node_id for t in r0.targets}
    ec_table = next(t for t in r0.tables if t.ec)  # routing flags the EC group's table
    lost_chain = next(c.chain_id for c in r0.chains
                      if c.table_id == ec_table.table_id and node_of[c.targets[0]] == dead_node)
    on_chain = {p for p in files if lost_chain in (efs.attr(p).layout or Layout()).chains}
    print(f"[ec] killing {victim} (node {dead_node}); spare node {spare_node.node_id}")
    ec_cluster.kill_service(victim)
    ec_cluster.wait_routing(lambda r: all(n.state != NodeState.ALIVE for n in r.nodes if n.node_id == dead_node),
                            30, "victim marked dead")
    # before mgmtd swaps a spare in (replace_after_s): an opted-in writer skips the dead chain
    reduced = loomfs.connect(str(ec_cluster.root), config=ClientConfig(ec_ack_fragments_min=5))
    try:
        storage = reduced.client.storage
        assert isinstance(storage, StorageClient)
        reduced.run(storage.routing.refresh())
        before = STATS.reduced_stripes_total
        files["/cold/rb-reduced"] = rng.randbytes(2 * 4 * CS + 99)
        with reduced.open("/cold/rb-reduced", "wb") as f:
            f.write(files["/cold/rb-reduced"])
        assert STATS.reduced_stripes_total == before + 3  # 3 stripes, each with 5 of 6 fragments
        assert reduced.cat("/cold/rb-reduced") == files["/cold/rb-reduced"]
        on_chain.add("/cold/rb-reduced")
    finally:
        reduced.close()

    def swapped(r: object) -> bool:
        nodes = {t.target_id: t.node_id for t in r.targets}  # type: ignore[attr-defined]
        chain = next(c for c in r.chains if c.chain_id == lost_chain)  # type: ignore[attr-defined]
        return bool(chain.targets) and nodes[chain.targets[0]] != dead_node

    r = ec_cluster.wait_routing(swapped, 60, "a spare in the lost EC chain")
    new_target = next(c for c in r.chains if c.chain_id == lost_chain).targets[0]
    assert {t.target_id: t.node_id for t in r.targets}[new_target] == spare_node.node_id

    deadline = time.monotonic() + 60  # meta's worker notices the new target and rebuilds it
    row: dict[str, object] = {}
    while time.monotonic() < deadline:
        row = _rebuild_rows(ec_cluster).get(lost_chain, {})
        if row.get("phase") == "done" and row.get("target") == new_target:
            break
        time.sleep(0.3)
    print(f"[ec] rebuild of chain {lost_chain}: {row}")
    assert row.get("phase") == "done" and row.get("target") == new_target, row
    # every EC file with a fragment there (earlier tests' files too) was rebuilt, none left
    assert int(row["files_done"]) >= len(on_chain) and row["files_left"] == 0 and row["files_failed"] == 0  # type: ignore[call-overload]
    assert int(row["bytes_done"]) >= sum(len(files[p]) for p in on_chain)  # type: ignore[call-overload]
    admin = _cli(ec_cluster, "admin", "rebuilds")
    assert admin.returncode == 0 and "done" in admin.stdout, admin.stdout + admin.stderr

    async def scrub(paths: list[str], repair: bool) -> list[ScrubReport]:
        storage = efs.client.storage
        assert isinstance(storage, StorageClient)
        await storage.routing.refresh()
        return [await scrub_file(storage, p, await efs.client.stat(p), repair=repair) for p in paths]

    again = efs.run(scrub(list(files), False))  # no manual repair ran: the worker did it all
    assert all(x.full_redundancy and x.bad_fragments == 0 for x in again), again
    out = _cli(ec_cluster, "layout", "scrub", "/cold")
    assert out.returncode == 0 and " 0 bad fragments" in out.stdout, out.stdout + out.stderr
    assert all(": ok" in line or "stripes" not in line for line in out.stdout.splitlines()), out.stdout
    for p, d in files.items():
        with efs.open(p, "rb") as f:
            assert f.read() == d, p

    # the manual path still works: a fragment rotten on the new target, restored by the scrub
    attr = efs.attr("/cold/rb0")
    assert attr.layout is not None
    g = Geometry(4, 2, CS)
    j = next(j for j in range(6) if attr.layout.chains[g.chunk_index(0, j) % 6] == lost_chain)
    new_dir = next(t.path for t in r.targets if t.target_id == new_target)
    (path,) = [p for p in _fragment_files(ec_cluster, attr.inode, g.chunk_index(0, j))
               if str(p).startswith(new_dir.rstrip("/") + "/")]  # not the dead server's copy
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    fixed = efs.run(scrub(["/cold/rb0"], True))
    assert fixed[0].repaired_fragments == 1 and fixed[0].full_redundancy, fixed
    with efs.open("/cold/rb0", "rb") as f:
        assert f.read() == files["/cold/rb0"]


def test_kill_two_servers_read_everything(efs: loomfs.LoomFS, ec_cluster: LocalCluster) -> None:
    rng = _rng("kill")
    files = {f"/cold/k{i}": rng.randbytes(rng.randrange(1, 6 * CS)) for i in range(4)}
    for p, d in files.items():
        with efs.open(p, "wb") as f:
            f.write(d)
    victims = rng.sample(sorted(s.name for s in ec_cluster.services.values() if s.kind == "storage" and s.alive()), 2)
    print(f"[ec] killing {victims}")
    degraded_before = STATS.degraded_stripes_total
    for v in victims:
        ec_cluster.kill_service(v)
    for p, d in files.items():  # at once: dead connections fail fast
        with efs.open(p, "rb") as f:
            assert f.read() == d, p
    down = {ec_cluster.services[v].node_id for v in victims}
    ec_cluster.wait_routing(
        lambda r: all(n.state != NodeState.ALIVE for n in r.nodes if n.node_id in down), 30, "victims offline")
    for p, d in files.items():  # and once routing knows
        with efs.open(p, "rb") as f:
            assert f.read() == d, p
    assert STATS.degraded_stripes_total > degraded_before
