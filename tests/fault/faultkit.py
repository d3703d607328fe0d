"""Fault-suite helpers: clusters with short leases, a continuous write+read workload, and a
rewrite/append/truncate workload checked against an exact model of each file."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c

import loomfs
from loomfs.client.layout import chunk_count
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.testing import LocalCluster
from loomfs.wire.storage import READ, ChunkId, ChunkMeta, ReadReq
from loomfs.wire.types import TargetState

HEARTBEAT_S = 0.3
LEASE_S = 1.5


def start_cluster(name: str, *, attempts: int = 3, **kw: object) -> LocalCluster:
    """A cluster with short leases. Start-up is retried once in a fresh directory: on this
    shared 2-core machine a service occasionally dies before it logs anything."""
    opts: dict[str, object] = {"heartbeat_interval_s": HEARTBEAT_S, "lease_s": LEASE_S, "gc_delay_s": 1.0,
                               "targets_per_node": 2}
    opts.update(kw)
    for attempt in range(attempts):
        root = tempfile.mkdtemp(prefix=f"loomfs-fault-{name}-")
        c = LocalCluster(root, **opts)  # type: ignore[arg-type]
        try:
            c.start(timeout_s=60)
            return c
        except Exception as exc:
            c.stop()
            dump_logs(c)
            print(f"[fault] cluster start attempt {attempt + 1} failed: {exc}")
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def log_lines(c: LocalCluster, pattern: str, limit: int = 40) -> list[str]:
    """Service log lines matching the regular expression ``pattern``, merged by time (the
    first ``limit``)."""
    rx = re.compile(pattern)
    out = []
    for s in c.services.values():
        if os.path.exists(s.log_path):
            with open(s.log_path, errors="replace") as f:
                out += [f"{line[:23]} {s.name}: {line[24:].rstrip()}" for line in f if rx.search(line)]
    return sorted(out)[:limit]


def dump_logs(c: LocalCluster, chars: int = 4000) -> None:
    for s in c.services.values():
        if os.path.exists(s.log_path):
            with open(s.log_path, errors="replace") as f:
                tail = f.read()[-chars:]
            print(f"----- {s.name} log tail -----\n{tail}")


@dataclass
class Stats:
    writes: int = 0
    reads: int = 0
    errors: list[str] = field(default_factory=list)
    max_op_s: float = 0.0  # the longest single operation (the stall a fault caused)
    slow_ops: list[tuple[float, float, str]] = field(default_factory=list)  # (start, duration, what)


class Workload:
    """Writes files of random sizes (several chunks each) and reads back random earlier ones,
    verifying content, until stopped. ``acked`` holds every file whose close() returned."""

    def __init__(self, fs: loomfs.LoomFS, base: str, seed: int, *, size_max: int = 600_000,
                 slow_s: float = 0.5):
        self.fs = fs
        self.base = base
        self.rng = random.Random(seed)
        self.size_max = size_max
        self.slow_s = slow_s
        self.acked: dict[str, str] = {}
        self.stats = Stats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-workload", daemon=True)

    def start(self) -> Workload:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> Stats:
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "workload did not stop"
        return self.stats

    def _timed(self, what: str, fn: object) -> object:
        t0 = time.monotonic()
        try:
            return fn()  # type: ignore[operator]
        finally:
            dt = time.monotonic() - t0
            self.stats.max_op_s = max(self.stats.max_op_s, dt)
            if dt > self.slow_s:
                self.stats.slow_ops.append((t0, dt, what))

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            try:
                if not self.acked or self.rng.random() < 0.6:
                    path = f"{self.base}/f{i:06d}"
                    data = self.rng.randbytes(self.rng.randrange(1, self.size_max))

                    def put(path: str = path, data: bytes = data) -> None:
                        with self.fs.open(path, "wb") as f:
                            f.write(data)

                    self._timed(f"write {path}", put)
                    self.acked[path] = hashlib.sha256(data).hexdigest()
                    self.stats.writes += 1
                else:
                    path = self.rng.choice(sorted(self.acked))
                    got = self._timed(f"read {path}", lambda p=path: self.fs.cat(p))
                    if hashlib.sha256(got).hexdigest() != self.acked[path]:  # type: ignore[arg-type]
                        self.stats.errors.append(f"read {path}: wrong content")
                    self.stats.reads += 1
            except Exception as exc:  # noqa: BLE001 - the test asserts there were none
                self.stats.errors.append(f"op {i}: {type(exc).__name__}: {exc}")
                time.sleep(0.05)

    def verify_all(self) -> list[str]:
        """Read every acknowledged file back; returns the paths that do not match."""
        bad = []
        for path, digest in sorted(self.acked.items()):
            if hashlib.sha256(self.fs.cat(path)).hexdigest() != digest:
                bad.append(path)
        return bad


# ---- rewrite / append / truncate workload with an exact model per file ----------------------

@dataclass(frozen=True)
class Version:
    """One content of a file: ``chunks`` hold its bytes cut at chunk boundaries (unchanged
    chunks are shared with the previous version); bytes past ``length`` read as zeros."""

    seq: int
    length: int
    chunks: tuple[bytes, ...]
    what: str

    def content(self) -> bytes:
        return b"".join(self.chunks)

    def chunk_view(self, index: int, n: int) -> bytes:
        """The first ``n`` bytes of chunk ``index`` as a reader sees them (zeros past the end)."""
        got = self.chunks[index][:n] if index < len(self.chunks) else b""
        return got + bytes(n - len(got))


class FileModel:
    """The expected content of a file that one writer changes: every version the writer
    started (``propose``) is kept in a bounded history, so a reader that ran concurrently can
    be checked chunk by chunk against each version current at some moment of its read (a
    chunk write is atomic; an operation touching several chunks is not)."""

    def __init__(self, path: str, chunk_size: int, history: int = 256):
        self.path = path
        self.chunk_size = chunk_size
        self._lock = threading.Lock()
        self._history: list[Version] = [Version(0, 0, (), "create")]
        self._history_max = history
        self.acked_seq = 0  # the newest version whose operation returned
        self.oplog: list[str] = []  # "HH:MM:SS.mmm-HH:MM:SS.mmm vN what -> length", to match service logs
        self._started = 0.0

    @property
    def current(self) -> Version:
        with self._lock:
            return next(v for v in reversed(self._history) if v.seq == self.acked_seq)

    def split(self, data: bytes, like: Version) -> tuple[bytes, ...]:
        cs = self.chunk_size
        out = []
        for i in range(0, len(data), cs):
            piece = data[i:i + cs]
            old = like.chunks[i // cs] if i // cs < len(like.chunks) else None
            out.append(old if old == piece else piece)  # share unchanged chunks
        return tuple(out)

    def propose(self, data: bytes, what: str) -> Version:
        """Publish the content the next operation will produce, before it starts."""
        with self._lock:
            base = self._history[-1]
            v = Version(base.seq + 1, len(data), self.split(data, base), what)
            self._history.append(v)
            if len(self._history) > self._history_max:
                del self._history[: len(self._history) - self._history_max]
            self._started = time.time()
            return v

    def ack(self, v: Version) -> None:
        with self._lock:
            self.acked_seq = v.seq
            self.oplog.append(f"{_clock(self._started)}-{_clock(time.time())} v{v.seq} {v.what} -> {v.length}")

    def window(self, since_seq: int) -> list[Version] | None:
        """Every version from ``since_seq`` on (None: part of it left the history)."""
        with self._lock:
            if self._history[0].seq > since_seq:
                return None
            return [v for v in self._history if v.seq >= since_seq]

    def check_read(self, since_seq: int, got: bytes) -> str | None:
        """Why ``got`` (a whole-file read that began when ``since_seq`` was acknowledged) is
        no possible state of the file; None if it is one (or too old to tell)."""
        window = self.window(since_seq)
        if window is None:
            return None
        lengths = sorted({v.length for v in window})
        if len(got) not in lengths:
            return f"{self.path}: read {len(got)} bytes, length is one of {lengths} (versions {since_seq}..)"
        cs = self.chunk_size
        for index in range(-(-len(got) // cs)):
            piece = got[index * cs:(index + 1) * cs]
            if not any(v.chunk_view(index, len(piece)) == piece for v in window):
                return (f"{self.path}: chunk {index} ({len(piece)} bytes of a {len(got)}-byte read) matches "
                        f"none of versions {window[0].seq}..{window[-1].seq} "
                        f"[{'; '.join(f'v{v.seq} {v.what}' for v in window[-4:])}]; "
                        f"{self.explain(index, piece, window)}")
        return None

    def explain(self, index: int, piece: bytes, window: list[Version]) -> str:
        """Which version this chunk's bytes are closest to, and where they differ."""
        with self._lock:
            history = list(self._history)
        older = [v for v in history if v.seq < window[0].seq and v.chunk_view(index, len(piece)) == piece]
        if older:
            return f"it is v{older[-1].seq}'s chunk ({older[-1].what}): a stale read"

        def diffs(v: Version) -> list[tuple[int, int]]:
            want, out, start = v.chunk_view(index, len(piece)), [], -1
            for i in range(len(piece) + 1):
                differs = i < len(piece) and piece[i] != want[i]
                if differs and start < 0:
                    start = i
                elif not differs and start >= 0:
                    out.append((start, i))
                    start = -1
            return out

        best = min(window + history[-len(window) - 8:], key=lambda v: sum(b - a for a, b in diffs(v)))
        ranges = diffs(best)
        zeros = all(not any(piece[a:b]) for a, b in ranges)
        return (f"closest v{best.seq} ({best.what}, length {best.length}) differs at chunk offsets "
                f"{ranges[:4]}{'...' if len(ranges) > 4 else ''}, read bytes there are "
                f"{'all zero' if zeros else 'not zero'}")

    def __repr__(self) -> str:
        return f"FileModel({self.path} v{self.acked_seq} len={self.current.length})"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def _first_diff(a: bytes, b: bytes) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@dataclass
class RewriteStats:
    ops: dict[str, int] = field(default_factory=dict)
    reads: int = 0
    reads_unchecked: int = 0
    errors: list[str] = field(default_factory=list)  # operations that raised (then retried)
    mismatches: list[str] = field(default_factory=list)  # reads that saw an impossible state
    max_op_s: float = 0.0


class RewriteWorkload:
    """One writer thread per file keeps rewriting it in place (overlapping pwrites across
    chunk boundaries), appending, and truncating (shrink and extend), updating its
    ``FileModel`` as each operation is acknowledged; reader threads read whole files and check
    each chunk against the versions current during the read. An operation that raises is
    retried as it was (all are idempotent: a pwrite at a fixed offset, a truncate to a size),
    so the model stays exact; the error is recorded for the test to assert on."""

    def __init__(self, fs: loomfs.LoomFS, paths: list[str], chunk_size: int, seed: int, *,
                 max_chunks: int = 3, readers: int = 2, op_deadline_s: float = 60.0,
                 remove_chunks: bool = True):
        """``remove_chunks=False``: shrinks stay inside the last chunk (a chunk TRUNCATE, never
        a REMOVE_CHUNKS of whole chunks)."""
        self.fs = fs
        self.remove_chunks = remove_chunks
        self.chunk_size = chunk_size
        self.max_len = max_chunks * chunk_size
        self.models = {p: FileModel(p, chunk_size) for p in paths}
        self.stats = RewriteStats()
        self.op_deadline_s = op_deadline_s
        self.phase = "start"  # what the test is doing now (named in errors)
        self._seed = seed
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._write_loop, args=(p, random.Random(seed + i)),
                                          name=f"rewrite-w{i}", daemon=True) for i, p in enumerate(paths)]
        self._threads += [threading.Thread(target=self._read_loop, args=(random.Random(seed + 1000 + i),),
                                           name=f"rewrite-r{i}", daemon=True) for i in range(readers)]

    def create(self) -> RewriteWorkload:
        """Create the files empty (their models start at version 0 = empty)."""
        for p in self.models:
            with self.fs.open(p, "wb"):
                pass
        return self

    def start(self) -> RewriteWorkload:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> RewriteStats:
        self._stop.set()
        end = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "rewrite workload did not stop"
        return self.stats

    def acked_ops(self) -> int:
        return sum(m.acked_seq for m in self.models.values())

    def wait_progress(self, ops: int, timeout_s: float, what: str) -> None:
        """Wait until every file had ``ops`` more operations acknowledged."""
        want = {p: m.acked_seq + ops for p, m in self.models.items()}
        end = time.monotonic() + timeout_s
        while any(m.acked_seq < want[p] for p, m in self.models.items()):
            if time.monotonic() > end:
                raise AssertionError(f"no progress while {what}: {list(self.models.values())}")
            time.sleep(0.02)

    # -- writers ---------------------------------------------------------------------------
    def _plan(self, rng: random.Random, old: bytes) -> tuple[str, bytes, Callable[[str], None]]:
        """(what, new content, operation) for the next change of a file holding ``old``."""
        cs, n = self.chunk_size, len(old)
        roll = rng.random()
        if roll < 0.45 and n > 0:  # overwrite in place, often across a chunk boundary
            if rng.random() < 0.5 and n > cs:
                off = max(0, rng.randrange(cs, n + 1, cs) - rng.randrange(1, 4096)) if n >= 2 * cs \
                    else max(0, cs - rng.randrange(1, 4096))
            else:
                off = rng.randrange(n)
            size = rng.randrange(1, min(cs + cs // 2, self.max_len - off) + 1)
            return self._pwrite(rng, old, off, size, "pwrite")
        if roll < 0.65 and n < self.max_len:  # append
            size = rng.randrange(1, min(cs, self.max_len - n) + 1)
            return self._pwrite(rng, old, n, size, "append")
        last_chunk_start = (n - 1) // cs * cs
        if roll < 0.85 and n > 0 and self.remove_chunks:  # shrink: to 0, to a chunk boundary, or anywhere
            pick = rng.random()
            size = 0 if pick < 0.1 else last_chunk_start if pick < 0.3 else rng.randrange(n)
            return self._truncate(rng, old, size, "shrink")
        if roll < 0.85 and n > 0 and n > last_chunk_start + 1:  # shrink inside the last chunk: no removal
            return self._truncate(rng, old, rng.randrange(last_chunk_start + 1, n), "shrink")
        size = rng.randrange(n, self.max_len + 1)  # extend with a hole (reads as zeros)
        return self._truncate(rng, old, size, "extend")

    def _pwrite(self, rng: random.Random, old: bytes, off: int, size: int, kind: str) -> tuple[str, bytes, Callable[[str], None]]:
        data = rng.randbytes(size)
        new = old[:off] + data + old[off + size:]

        def op(path: str) -> None:
            with self.fs.open(path, "r+b") as f:
                f.seek(off)
                f.write(data)

        return f"{kind} {size}@{off}", new, op

    def _truncate(self, rng: random.Random, old: bytes, size: int, kind: str) -> tuple[str, bytes, Callable[[str], None]]:
        new = old[:size] + bytes(max(0, size - len(old)))
        by_handle = rng.random() < 0.5

        def op(path: str) -> None:
            if by_handle:
                with self.fs.open(path, "r+b") as f:
                    f.truncate(size)
            else:
                self.fs.truncate(path, size)

        return f"{kind} {len(old)}->{size}{' (handle)' if by_handle else ''}", new, op

    def _write_loop(self, path: str, rng: random.Random) -> None:
        model = self.models[path]
        while not self._stop.is_set():
            what, new, op = self._plan(rng, model.current.content())
            v = model.propose(new, what)
            t0 = time.monotonic()
            while True:
                try:
                    op(path)
                    break
                except Exception as exc:  # noqa: BLE001 - recorded; the test asserts there were none
                    with self._lock:
                        self.stats.errors.append(f"{_clock(time.time())} [{self.phase}] {path} v{v.seq} "
                                                 f"{what}: {type(exc).__name__}: {exc}")
                    if time.monotonic() - t0 > self.op_deadline_s:
                        return  # the model keeps this version pending; verification will say so
                    time.sleep(0.05)
            model.ack(v)
            with self._lock:
                kind = what.split()[0]
                self.stats.ops[kind] = self.stats.ops.get(kind, 0) + 1
                self.stats.max_op_s = max(self.stats.max_op_s, time.monotonic() - t0)

    # -- readers ---------------------------------------------------------------------------
    def _read_loop(self, rng: random.Random) -> None:
        paths = sorted(self.models)
        while not self._stop.is_set():
            model = self.models[rng.choice(paths)]
            since = model.acked_seq
            try:
                got = self.fs.cat(model.path)
            except Exception as exc:  # noqa: BLE001 - recorded; the test asserts there were none
                with self._lock:
                    self.stats.errors.append(f"{_clock(time.time())} [{self.phase}] read {model.path}: "
                                             f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)
                continue
            problem = model.check_read(since, got)
            if problem:  # say when (to match the service logs), during what, and if it lasts
                try:
                    again = model.check_read(model.acked_seq, self.fs.cat(model.path))
                except Exception as exc:  # noqa: BLE001 - part of the report
                    again = f"{type(exc).__name__}: {exc}"
                problem = (f"{_clock(time.time())} [{self.phase}] {problem}; read again at once: "
                           f"{again or 'correct'}")
            with self._lock:
                self.stats.reads += 1
                if model.window(since) is None:
                    self.stats.reads_unchecked += 1
                if problem:
                    self.stats.mismatches.append(problem)

    def dump_oplogs(self, directory: str) -> list[str]:
        """Write each file's acknowledged operations (times match the service logs) under
        ``directory``; returns the paths."""
        out = []
        for path, model in sorted(self.models.items()):
            name = os.path.join(directory, "oplog" + path.replace("/", "_") + ".txt")
            with open(name, "w") as f:
                f.write("\n".join(model.oplog) + "\n")
            out.append(name)
        return out

    def verify_files(self) -> list[str]:
        """Each file read back whole equals its model's last acknowledged version."""
        bad = []
        for path, model in sorted(self.models.items()):
            want = model.current.content()
            got = self.fs.cat(path)
            if got != want:
                at = _first_diff(got, want)
                bad.append(f"{path}: {len(got)} bytes, model has {len(want)} (v{model.acked_seq}); "
                           f"first difference at {at} (chunk {at // self.chunk_size})")
        return bad


def replica_problems(c: LocalCluster, fs: loomfs.LoomFS, model: FileModel) -> list[str]:
    """Every chunk of the file on every serving replica of its chain, read directly from that
    target: same version, length and CRC everywhere, bytes equal to the model (zeros where the
    chunk is short or absent), no chunk past the end of file, no pending version left."""
    attr = fs.attr(model.path)
    layout = attr.layout
    assert layout is not None and layout.chains
    want = model.current
    cs = layout.chunk_size
    problems = []
    if attr.size != want.length:
        problems.append(f"{model.path}: meta length {attr.size}, model {want.length}")
    routing = c.routing()
    state = {t.target_id: t.state for t in routing.targets}
    node_of = {t.target_id: t.node_id for t in routing.targets}
    nodes = {n.node_id: n for n in routing.nodes}
    chains = {ch.chain_id: ch for ch in routing.chains}
    held: dict[int, dict[int, ChunkMeta]] = {}
    for tid, meta in c.chunks_of(attr.inode):
        assert meta.chunk is not None
        held.setdefault(meta.chunk.index, {})[tid] = meta
    count = chunk_count(layout, want.length)
    for index in sorted(i for i in held if i >= count):
        # a trimmed chunk stays as an empty version (its version numbers go on if it grows back)
        full = sorted(t for t, m in held[index].items() if m.length or m.update_ver > m.commit_ver)
        if full:
            problems.append(f"{model.path}: chunk {index} past EOF ({want.length} bytes) holds bytes on targets {full}")

    async def read_all() -> dict[tuple[int, int], bytes | str]:
        rpc = RpcClient(TcpTransport(), connect_timeout_s=1.0)
        out: dict[tuple[int, int], bytes | str] = {}
        try:
            for index in range(count):
                ch = chains[layout.chains[index % len(layout.chains)]]
                for tid in ch.targets:
                    if state.get(tid) != TargetState.SERVING:
                        continue
                    n = nodes[node_of[tid]]
                    req = ReadReq(chain_id=ch.chain_id, chain_version=ch.version,
                                  chunk=ChunkId(inode=attr.inode, index=index), offset=0, length=cs, target_id=tid)
                    try:
                        rsp = await rpc.call(Address(n.host, n.port), READ, req, timeout_s=5.0)
                        out[(index, tid)] = bytes(rsp.payload) if rsp.body.exists else b""
                    except Exception as exc:  # noqa: BLE001 - reported as a problem
                        out[(index, tid)] = f"{type(exc).__name__}: {exc}"
        finally:
            await rpc.close()
        return out

    loop = asyncio.new_event_loop()
    try:
        replicas = loop.run_until_complete(read_all())
    finally:
        loop.close()
    for index in range(count):
        ch = chains[layout.chains[index % len(layout.chains)]]
        serving = sorted(t for t in ch.targets if state.get(t) == TargetState.SERVING)
        metas = held.get(index, {})
        expect = want.chunk_view(index, min(cs, want.length - index * cs))
        where = f"{model.path} chunk {index} (chain {ch.chain_id})"
        if metas and sorted(metas) != serving:
            problems.append(f"{where}: held by {sorted(metas)}, serving {serving}")
        kinds = {(m.commit_ver, m.length, m.crc) for m in metas.values()}
        if len(kinds) > 1:
            problems.append(f"{where}: replicas differ (version, length, crc): "
                            f"{ {t: (m.commit_ver, m.length, m.crc) for t, m in metas.items()} }")
        for tid, m in metas.items():
            if m.update_ver > m.commit_ver:
                problems.append(f"{where}: target {tid} still has pending v{m.update_ver} "
                                f"over committed v{m.commit_ver}")
        for tid in serving:
            got = replicas.get((index, tid), "not read")
            if isinstance(got, str):
                problems.append(f"{where}: read from target {tid} failed: {got}")
                continue
            if len(got) > len(expect):
                problems.append(f"{where}: target {tid} holds {len(got)} bytes, EOF allows {len(expect)}")
            seen = got[:len(expect)] + bytes(max(0, len(expect) - len(got)))
            if seen != expect:
                problems.append(f"{where}: target {tid} bytes differ from the model at chunk offset "
                                f"{_first_diff(seen, expect)} (v{want.seq}: {want.what})")
            m = metas.get(tid)
            if m is not None and got and crc32c.crc32c(got) != m.crc:
                problems.append(f"{where}: target {tid} CRC {m.crc:#x} is not the CRC of its bytes")
    return problems
