"""A client program for the multi-host scenario, run on a client host (its own namespace).

``python mh_worker.py CLUSTER_DIR NAME OUT_DIR``: writes new files /mh/NAME/fI with bytes that
follow from (NAME, I) alone, and after each write reads back one earlier file and checks
every byte. An acknowledged write (close returned) is appended to OUT_DIR/NAME.acked
("path size", flushed) *after* the ack, so every line names bytes the cluster promised to
keep. Errors that reach the program (past the client's retries) go to NAME.errors with
the time. Stops when OUT_DIR/stop exists; OUT_DIR/NAME.done then holds the counts.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

SIZES = (3_000, 48_000, 200_000, 1_300_000)  # inline in meta, and 1 chunk on a chain


def content(name: str, i: int) -> bytes:
    rng = random.Random(f"{name}/{i}")
    return rng.randbytes(SIZES[i % len(SIZES)] + rng.randrange(1000))


def diff(got: bytes, expect: bytes) -> str:
    """Where ``got`` first differs from ``expect``, and what the bad bytes look like."""
    if got == expect:
        return "same"
    n = min(len(got), len(expect))
    first = next((k for k in range(n) if got[k] != expect[k]), n)
    last = max((k for k in range(n) if got[k] != expect[k]), default=first)
    bad = got[first:last + 1]
    return (f"len {len(got)} (expect {len(expect)}), differs in [{first}, {last}] ({last + 1 - first} bytes), "
            f"bad bytes all zero: {not any(bad)}, got[{first}:+16]={got[first:first + 16].hex()} "
            f"expect={expect[first:first + 16].hex()}")


async def per_replica(c: Any, path: str, expect: bytes) -> list[str]:
    """Each chunk of ``path`` read from every member of its chain, one by one (routing fresh
    from mgmtd): which replica holds which bytes."""
    from loomfs.client.storage_client import read_req
    from loomfs.wire.storage import READ, ChunkId
    from loomfs.wire.types import TargetState

    attr = (await c.meta.read(path)).attr
    layout, st = attr.layout, c.storage
    routing = await st.routing.refresh(min_version=0)
    grant = await st.read_grant(attr.inode)
    lines = [f"  routing v{routing.version}"]
    cs = layout.chunk_size
    for index in range(-(-attr.size // cs)):
        chain_id = layout.chains[index % len(layout.chains)]
        info = routing.chain(chain_id)
        want = min(cs, attr.size - index * cs)
        part = expect[index * cs:index * cs + want]
        for t in info.targets:
            state = TargetState(routing.targets[t].state).name if t in routing.targets else "?"
            where = f"  chunk {index} chain {chain_id} v{info.version} target {t} ({state})"
            try:
                req = read_req(grant, chain_id=chain_id, chain_version=info.version,
                               chunk=ChunkId(inode=attr.inode, index=index), offset=0, length=want, target_id=t)
                r = await st.rpc.call(routing.address_of(t), READ, req, timeout_s=3.0, retry=False)
                data = bytes(r.payload) if r.body.exists else b""
                lines.append(f"{where}: exists={r.body.exists} commit_ver={r.body.commit_ver} "
                             f"chunk_length={r.body.chunk_length} {diff(data.ljust(want, bytes(1)), part)}")
            except Exception as exc:
                lines.append(f"{where}: {type(exc).__name__}: {exc}")
    return lines


def describe(fs: object, path: str, got: bytes, expect: bytes) -> str:
    """Everything a reader of NAME.errors needs about one mismatch (never raises)."""
    lines = [f"  first read: {diff(got, expect)}"]
    try:
        lines.append(f"  info: {fs.info(path)}")  # type: ignore[attr-defined]
    except Exception as exc:
        lines.append(f"  info: {type(exc).__name__}: {exc}")
    try:
        rsp = fs._run(lambda c: c.meta.read(path))  # type: ignore[attr-defined]
        attr = rsp.attr
        lines.append(f"  meta READ: inline={attr.inline} size={attr.size} layout={attr.layout}")
    except Exception as exc:
        lines.append(f"  meta READ: {type(exc).__name__}: {exc}")
    try:
        lines += fs._run(lambda c: per_replica(c, path, expect))  # type: ignore[attr-defined]
    except Exception as exc:
        lines.append(f"  per replica: {type(exc).__name__}: {exc}")
    time.sleep(0.5)
    try:
        lines.append(f"  re-read after 0.5 s: {diff(fs.cat(path), expect)}")  # type: ignore[attr-defined]
    except Exception as exc:
        lines.append(f"  re-read after 0.5 s: {type(exc).__name__}: {exc}")
    try:
        import loomfs

        with loomfs.connect(sys.argv[1], consistency="strict") as fresh:  # no caches of this client
            lines.append(f"  fresh client read: {diff(fresh.cat(path), expect)}")
    except Exception as exc:
        lines.append(f"  fresh client read: {type(exc).__name__}: {exc}")
    return "\n".join(lines) + "\n"


def main() -> None:
    import loomfs

    cluster, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    fs = loomfs.connect(cluster)
    rng = random.Random(name)
    acked: list[int] = []
    counts = {"writes": 0, "reads": 0, "errors": 0, "mismatches": 0}
    fs.makedirs(f"/mh/{name}", exist_ok=True)
    with open(os.path.join(out, f"{name}.acked"), "a") as log, open(os.path.join(out, f"{name}.errors"), "a") as err:
        i = 0
        while not os.path.exists(os.path.join(out, "stop")):
            path = f"/mh/{name}/f{i}"
            data = content(name, i)
            try:
                fs.pipe(path, data)
            except Exception as exc:  # past the client's retries: recorded, the test judges
                counts["errors"] += 1
                err.write(f"{time.time():.3f} write {path}: {type(exc).__name__}: {exc}\n")
                err.flush()
                i += 1  # a failed write may still have landed: never reuse the name
                continue
            log.write(f"{path} {len(data)}\n")
            log.flush()
            acked.append(i)
            counts["writes"] += 1
            i += 1
            j = rng.choice(acked)
            try:
                got = fs.cat(f"/mh/{name}/f{j}")
            except Exception as exc:
                counts["errors"] += 1
                err.write(f"{time.time():.3f} read f{j}: {type(exc).__name__}: {exc}\n")
                err.flush()
                continue
            counts["reads"] += 1
            if got != content(name, j):
                counts["mismatches"] += 1
                err.write(f"{time.time():.3f} MISMATCH f{j}: {len(got)} bytes\n")
                err.write(describe(fs, f"/mh/{name}/f{j}", got, content(name, j)))
                err.flush()
    with open(os.path.join(out, f"{name}.done"), "w") as f:
        json.dump(counts, f)


if __name__ == "__main__":
    main()
