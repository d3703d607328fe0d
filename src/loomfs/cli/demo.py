"""``loomfs demo``: write a sharded dataset and a checkpoint, read them back verified."""

from __future__ import annotations

import argparse
import hashlib
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from loomfs.cli.common import connect, human_bytes, parse_size, storage_fsync_settings, target
from loomfs.wire.types import TargetState

LOADER_THREADS = 4


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job: dataset shards + a checkpoint, written and verified")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--shard-size", type=parse_size, default=8 << 20)
    p.add_argument("--checkpoint-size", type=parse_size, default=256 << 20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--root", default="/demo")
    p.set_defaults(func=cmd_demo)


def _blob(rng: random.Random, n: int) -> bytes:
    piece = 1 << 20
    return b"".join(rng.randbytes(min(piece, n - off)) for off in range(0, n, piece))


def cmd_demo(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    with connect(args) as fs:
        root = args.root.rstrip("/") or "/demo"
        if fs.exists(root):
            fs.rmtree(root)
        fs.makedirs(f"{root}/dataset/train", exist_ok=True)
        fs.makedirs(f"{root}/checkpoints/step-1000", exist_ok=True)

        # 1. dataset shards: many DataLoader workers would each stream some of these
        shards = [_blob(rng, args.shard_size) for _ in range(args.shards)]
        digests = [hashlib.sha256(s).hexdigest() for s in shards]
        t0 = time.perf_counter()
        for i, s in enumerate(shards):
            with fs.open(f"{root}/dataset/train/shard-{i:05d}.bin", "wb") as f:
                f.write(s)
        w_ds = time.perf_counter() - t0
        total_ds = sum(len(s) for s in shards)

        # 2. a checkpoint written as one big file, then renamed into place (atomic publish)
        ckpt = _blob(rng, args.checkpoint_size)
        ckpt_digest = hashlib.sha256(ckpt).hexdigest()
        tmp = f"{root}/checkpoints/step-1000/model.pt.tmp"
        t0 = time.perf_counter()
        with fs.open(tmp, "wb") as f:
            mv = memoryview(ckpt)
            step = 16 << 20
            for off in range(0, len(ckpt), step):
                f.write(mv[off:off + step])
        fs.rename(tmp, f"{root}/checkpoints/step-1000/model.pt")
        w_ck = time.perf_counter() - t0
        del ckpt

        # 3. read everything back and verify: shards by 4 loader threads, like DataLoader workers
        bufs = [bytearray(args.shard_size) for _ in range(args.shards)]

        def read_shard(i: int) -> int:
            with fs.open(f"{root}/dataset/train/shard-{i:05d}.bin", "rb") as f:
                return int(f.readinto(bufs[i]))

        t0 = time.perf_counter()
        with ThreadPoolExecutor(LOADER_THREADS) as pool:
            sizes = list(pool.map(read_shard, range(args.shards)))
        r_ds = time.perf_counter() - t0
        got = [hashlib.sha256(memoryview(b)[:n]).hexdigest() for b, n in zip(bufs, sizes, strict=True)]
        bad = [i for i, (g, w) in enumerate(zip(got, digests, strict=True)) if g != w]
        if bad:
            raise SystemExit(f"shards {bad}: sha256 mismatch")
        whole = bytearray(args.checkpoint_size)  # restore = one big read straight into memory
        t0 = time.perf_counter()
        with fs.open(f"{root}/checkpoints/step-1000/model.pt", "rb") as f:
            n = f.readinto(whole)
        r_ck = time.perf_counter() - t0
        if n != args.checkpoint_size or hashlib.sha256(whole).hexdigest() != ckpt_digest:
            raise SystemExit("checkpoint: sha256 mismatch")
        del whole

        print("LoomFS demo: all data verified (sha256)")
        print(f"  dataset     {args.shards} shards, {human_bytes(total_ds)}: "
              f"write {_rate(total_ds, w_ds)}, read {_rate(total_ds, r_ds)}")
        print(f"  checkpoint  {human_bytes(args.checkpoint_size)}: "
              f"write {_rate(args.checkpoint_size, w_ck)}, read {_rate(args.checkpoint_size, r_ck)}")
        _where(args, fs, f"{root}/checkpoints/step-1000/model.pt")
        print(f"  namespace:  {fs.ls(root + '/dataset/train')[:3]} ... ({args.shards} files)")
        for line in durability_lines(target(args)):
            print("  " + line)
    return 0


def durability_lines(where: str) -> list[str]:
    """What an acknowledged write of this cluster guarantees, in plain words (README)."""
    fsyncs = storage_fsync_settings(where)
    durable = "durable-on-ack: run storage with fsync_on_commit = true (README, 'What an acknowledged write guarantees')"
    if fsyncs is None:
        return ["durability: set by each storage service's fsync_on_commit (default false: an acknowledged "
                "write is in every replica's page cache; it survives R-1 process or host failures, not a "
                "power loss of all replica hosts at once)", durable]
    if all(fsyncs):
        return ["durability: fsync_on_commit = true on every storage node: an acknowledged write is on the "
                "disks of all its replicas (survives a power loss of every replica host)"]
    return [f"durability: fsync_on_commit = false on {fsyncs.count(False)} of {len(fsyncs)} storage nodes: an "
            "acknowledged write is in every replica's page cache; it survives R-1 process or host failures, "
            "not a power loss of all replica hosts at once", durable]


def _rate(n: int, s: float) -> str:
    return f"{human_bytes(n / max(s, 1e-9))}/s"


def _where(args: argparse.Namespace, fs: Any, path: str) -> None:
    from loomfs.cli.admin import fetch_routing

    lay = fs.get_layout(path)
    r = fetch_routing(args)
    chains = {c.chain_id: c for c in r.chains}
    targets = {t.target_id: t for t in r.targets}
    nodes = {n.node_id: n for n in r.nodes}
    print(f"  where {path} lives: chunk size {human_bytes(lay.chunk_size)}, "
          f"striped over {len(lay.chains)} chains")
    for cid in lay.chains:
        c = chains.get(cid)
        if c is None:
            continue
        hops = []
        for t in c.targets:
            ti = targets[t]
            n = nodes.get(ti.node_id)
            state = TargetState(ti.state).name.lower()
            addr = f"{n.host}:{n.port}" if n else "?"
            hops.append(f"target {t} on node {ti.node_id} ({addr}, {state})")
        print(f"    chain {cid}: " + " -> ".join(hops))
    used = sum(t.used_bytes for t in r.targets)
    print(f"  storage used on all targets: {human_bytes(used)} "
          f"(includes {r.tables[0].replicas if r.tables else '?'} replicas)")
