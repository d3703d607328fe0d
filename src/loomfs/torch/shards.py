"""``LoomShardDataset``: an iterable dataset over WebDataset ``.tar``, TFRecord and ``.rec``
shards, split by rank and DataLoader worker, with a shuffle buffer, prefetch of the next
shard, resumable mid-epoch, and random access by key through the packer's index.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from loomfs.shards.formats import RawSample, format_of
from loomfs.shards.index import Manifest, ShardIndex, load_index
from loomfs.shards.io import check_count, iter_shard, read_ranges, sample_from_bytes
from loomfs.shards.pack import shard_list
from loomfs.torch.common import Source, check_rank, dist_rank_world, resolve
from loomfs.torch.plan import (
    Piece,
    ShuffleBuffer,
    loader_consumed,
    locate,
    replay_shuffle,
    shard_order,
    skip_pieces,
    split_counted,
    split_uncounted,
    stream_range,
    stream_rng,
)
from loomfs.torch.prefetch import Prefetcher, Range

logger = logging.getLogger(__name__)

STATE_VERSION = 1
INDEX_CACHE_MAX = 64
DEFAULT_PREFETCH_BYTES = 64 << 20


class LoomShardDataset(IterableDataset[Any]):
    """Samples from shards: ``{"__key__": KEY, "__url__": SHARD, FIELD: bytes, ...}`` (a tar
    sample's members by extension; a TFRecord ``tf.train.Example``'s features; a ``.rec``
    record as ``"data"``), or ``transform(sample)``.

    ``source``: a packed dataset (its directory or ``index.json``, from ``loomfs pack``), or a
    directory, glob or list of shard files. Paths are as for ``LoomFileDataset``.

    Splitting: each (rank, worker) is one stream. With the packer's index, stream ``g`` of
    ``G = world_size * num_workers`` reads samples ``[g*N//G, (g+1)*N//G)`` of the epoch's
    order, so any number of ranks and workers gets every sample exactly once; without it,
    whole shards go round-robin over the streams. Ranks come from ``rank``/``world_size``, else
    from ``torch.distributed`` once it is initialised.

    ``shuffle``: shard order is shuffled per epoch (the same on every rank) and samples pass a
    ``shuffle_buffer``-sample buffer; both seeded by ``seed`` and the epoch. Call
    ``set_epoch(e)`` before each epoch (as with ``DistributedSampler``); a dataset iterated
    again without it moves on to the next epoch by itself (persistent workers do this).

    Resuming: ``state_dict()``/``load_state_dict()`` follow torchdata's ``StatefulDataLoader``
    protocol (each worker's copy reports and restores its own stream). With a plain
    ``DataLoader``, ``state_after(samples_seen, ...)`` computes the same state from how many
    samples the loader delivered. ``get(key)`` reads one sample through the index.
    """

    def __init__(self, source: Source, *, address: str | None = None,
                 transform: Callable[[dict[str, Any]], Any] | None = None,
                 shuffle: bool = False, shuffle_buffer: int = 1000, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None,
                 parse_examples: bool = True, format: str | None = None,
                 prefetch_bytes: int = DEFAULT_PREFETCH_BYTES):
        check_rank(rank, world_size)
        if shuffle_buffer < 0:
            raise ValueError("shuffle_buffer must be >= 0")
        self.store, where = resolve(source, address)
        shards, manifest = shard_list(self.store, where)
        self.shards = shards
        self.manifest: Manifest | None = manifest
        if manifest is not None:
            self.formats = [manifest.format] * len(shards)
        else:
            self.formats = [format or format_of(p) for p in shards]
        self.counts: list[int] | None = [s.samples for s in manifest.shards] if manifest else None
        self.transform = transform
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.parse_examples = parse_examples
        self.prefetch_bytes = prefetch_bytes
        self.epoch = 0
        self._epoch_set = True  # the next iteration uses self.epoch as it is
        self._dist_hint = dist_rank_world()
        self._resume: dict[str, Any] | None = None
        self._progress: dict[str, Any] | None = None
        self._indexes: OrderedDict[int, ShardIndex] = OrderedDict()
        self._key_map: dict[str, tuple[int, int]] | None = None

    # --- pickling to workers ---------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_dist_hint"] = dist_rank_world() or self._dist_hint  # known here, maybe not there
        state["_indexes"] = OrderedDict()
        state["_key_map"] = None
        return state

    # --- splitting ------------------------------------------------------------------------

    def rank_world(self) -> tuple[int, int]:
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        return dist_rank_world() or self._dist_hint or (0, 1)

    def _streams(self, rotate: int = 0) -> tuple[int, int]:
        """(this stream, number of streams) in this process; ``rotate`` shifts which worker
        reads which stream (a resumed plain DataLoader, see ``state_after``)."""
        rank, world = self.rank_world()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * workers + (worker + rotate) % workers, world * workers

    def _pieces(self, stream: int, streams: int, epoch: int) -> list[Piece]:
        order = shard_order(len(self.shards), self.seed, epoch, self.shuffle)
        if self.counts is not None:
            return split_counted(order, self.counts, stream, streams)
        if streams > len(self.shards):
            logger.warning("%d shards for %d streams (ranks x workers): some read nothing; "
                           "pack with an index (loomfs pack) to split by sample", len(self.shards), streams)
        return split_uncounted(order, stream, streams)

    def __len__(self) -> int:
        """This rank's samples per epoch (needs the packer's index)."""
        if self.counts is None:
            raise TypeError("LoomShardDataset without an index has no length (pack with `loomfs pack`)")
        rank, world = self.rank_world()
        lo, hi = stream_range(sum(self.counts), rank, world)
        return hi - lo

    # --- epochs and state ------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration (seeds the shuffles). A state loaded for another
        epoch is dropped: that epoch starts from its beginning."""
        self.epoch = int(epoch)
        self._epoch_set = True
        if self._resume is not None and int(self._resume["epoch"]) != self.epoch:
            self._resume = None

    def _take_epoch(self) -> int:
        if self._epoch_set:
            self._epoch_set = False
        else:
            self.epoch += 1
        return self.epoch

    def _settings(self) -> dict[str, Any]:
        return {"seed": self.seed, "shuffle": self.shuffle,
                "shuffle_buffer": self.shuffle_buffer if self.shuffle else 0}

    def state_dict(self) -> dict[str, Any]:
        """Where this process's iteration is: ``{"epoch", "streams", "yielded": {stream:
        samples}, ...}``. In a DataLoader worker only that worker's stream is in it; states of
        several workers combine with ``merge_states``."""
        if self._progress is not None:
            p = self._progress
            return {"version": STATE_VERSION, "epoch": p["epoch"], "streams": p["streams"],
                    "yielded": dict(p["yielded"]), **self._settings()}
        if self._resume is not None:
            return dict(self._resume)
        return {"version": STATE_VERSION, "epoch": self.epoch, "streams": None, "yielded": {},
                **self._settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` on the next iteration (each stream skips what it had
        yielded). The number of ranks and workers, the seed and the shuffle settings must be
        those of the run that saved it."""
        if int(state.get("version", 0)) != STATE_VERSION:
            raise ValueError(f"unknown LoomShardDataset state version {state.get('version')!r}")
        mine, theirs = self._settings(), {k: state.get(k) for k in self._settings()}
        if mine != theirs:
            raise ValueError(f"state was saved with {theirs}, this dataset has {mine}")
        self.epoch = int(state["epoch"])
        self._epoch_set = True
        self._progress = None
        yielded = {int(k): int(v) for k, v in dict(state.get("yielded") or {}).items()}
        self._resume = {**state, "yielded": yielded} if yielded else None

    @staticmethod
    def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
        """One state from the states of several workers (or ranks) of one epoch."""
        if not states:
            raise ValueError("no states to merge")
        out = dict(states[0])
        out["yielded"] = {}
        for s in states:
            if s["epoch"] != out["epoch"] or (s["streams"] not in (None, out["streams"])):
                raise ValueError("states of different epochs or stream counts")
            out["yielded"].update({int(k): int(v) for k, v in s["yielded"].items()})
        return out

    def state_after(self, samples_seen: int, *, num_workers: int, batch_size: int | None = 1,
                    drop_last: bool = False, epoch: int | None = None) -> dict[str, Any]:
        """The state of this rank after a plain (in-order) ``DataLoader`` with these settings
        delivered ``samples_seen`` samples of ``epoch`` (default: ``self.epoch``); needs the
        packer's index. Load it, build the DataLoader again, and it continues from there."""
        if self.counts is None:
            raise ValueError("state_after needs sample counts: pack the shards with `loomfs pack`")
        rank, world = self.rank_world()
        workers = max(1, num_workers)
        streams = world * workers
        total = sum(self.counts)
        lengths = []
        for w in range(workers):
            lo, hi = stream_range(total, rank * workers + w, streams)
            lengths.append(hi - lo)
        consumed, due = loader_consumed(lengths, batch_size or 1, drop_last, samples_seen)
        # the new loader starts with its worker 0: give it the stream whose batch was due,
        # so the rest of the epoch comes in the order it would have
        return {"version": STATE_VERSION, "epoch": self.epoch if epoch is None else epoch,
                "streams": streams, **self._settings(), "rotate": due,
                "yielded": {rank * workers + w: n for w, n in enumerate(consumed)}}

    # --- iteration ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        resume, self._resume = self._resume, None
        stream, streams = self._streams(int(resume.get("rotate", 0)) if resume else 0)
        epoch = self._take_epoch()
        skip = 0
        if resume is not None:
            if resume.get("streams") not in (None, streams):
                raise ValueError(f"state was saved with {resume['streams']} streams (ranks x workers), "
                                 f"this run has {streams}")
            skip = resume["yielded"].get(stream, 0)
        progress = {"epoch": epoch, "streams": streams, "yielded": {stream: skip}}
        self._progress = progress
        return self._run(stream, streams, epoch, skip, progress)

    def _run(self, stream: int, streams: int, epoch: int, skip: int,
             progress: dict[str, Any]) -> Iterator[Any]:
        pieces = self._pieces(stream, streams, epoch)
        counted = self.counts is not None
        total = sum(p.count or 0 for p in pieces) if counted else None
        rng = stream_rng(self.seed, epoch, stream)
        buf: ShuffleBuffer[dict[str, Any]] | None = None
        if self.shuffle and self.shuffle_buffer > 1:
            buf = ShuffleBuffer(self.shuffle_buffer, rng)
        replay = 0
        if skip and total is not None:
            if skip > total:
                raise ValueError(f"state says {skip} samples were read of a stream of {total}")
            pulled = skip
            if buf is not None:
                positions, pulled = replay_shuffle(self.shuffle_buffer, rng, total, skip)
                buf.items = self._fetch(pieces, positions.items)
            pieces = skip_pieces(pieces, pulled)
        elif skip:
            replay = skip  # no index: read again, drop what was already yielded
        raw = self._read(pieces)
        yielded = progress["yielded"]
        try:
            for sample in raw:
                if buf is not None:
                    if not buf.full:
                        buf.add(sample)
                        continue
                    sample = buf.swap(sample)
                if replay:
                    replay -= 1
                    continue
                yielded[stream] += 1
                yield self._finish(sample)
            while buf is not None and len(buf):
                sample = buf.pop()
                if replay:
                    replay -= 1
                    continue
                yielded[stream] += 1
                yield self._finish(sample)
        finally:
            raw.close()

    def _finish(self, sample: dict[str, Any]) -> Any:
        return self.transform(sample) if self.transform is not None else sample

    def _sample(self, shard: int, raw: RawSample) -> dict[str, Any]:
        key, fields, _, _ = raw
        return {"__key__": key, "__url__": self.store.url(self.shards[shard]), **fields}

    def _read(self, pieces: list[Piece]) -> Generator[dict[str, Any], None, None]:
        """Raw samples of ``pieces`` in order, the bytes read ahead on a thread."""
        plan: list[tuple[Piece, Range, int | None]] = []
        for p in pieces:
            path = self.shards[p.shard]
            whole = self.counts is None or (p.first == 0 and p.count == self.counts[p.shard])
            if whole:
                plan.append((p, Range(path), self.counts[p.shard] if self.counts else None))
            else:
                assert p.count is not None
                start, end = self._index(p.shard).span(p.first, p.first + p.count)
                plan.append((p, Range(path, start, end), p.count))
        pf = Prefetcher(self.store, [r for _, r, _ in plan], max_bytes=self.prefetch_bytes) \
            if self.prefetch_bytes > 0 and plan else None
        try:
            for i, (p, r, want) in enumerate(plan):
                blocks = pf.blocks(i) if pf is not None else None
                n, end = 0, r.start
                for raw in iter_shard(self.store, r.path, self.formats[p.shard], start=r.start,
                                      end=r.end, first_index=p.first,
                                      parse_examples=self.parse_examples, blocks=blocks):
                    n += 1
                    end = raw[2] + raw[3]
                    yield self._sample(p.shard, raw)
                if want is not None:
                    check_count(self.store.url(r.path), n, want, end)
        finally:
            if pf is not None:
                pf.close()

    # --- the index: random access ------------------------------------------------------------

    def _index(self, shard: int) -> ShardIndex:
        idx = self._indexes.get(shard)
        if idx is not None:
            self._indexes.move_to_end(shard)
            return idx
        if self.manifest is None:
            raise ValueError("random access needs the packer's index (index.json): pack with `loomfs pack`")
        idx = load_index(self.store, self.manifest, shard)
        self._indexes[shard] = idx
        while len(self._indexes) > INDEX_CACHE_MAX:
            self._indexes.popitem(last=False)
        return idx

    def _read_at(self, where: list[tuple[int, int]]) -> list[dict[str, Any]]:
        """Samples by (shard, index in shard), each read on its own (grouped per shard)."""
        out: list[Any] = [None] * len(where)
        by_shard: dict[int, list[int]] = {}
        for k, (s, _) in enumerate(where):
            by_shard.setdefault(s, []).append(k)
        for s, ks in by_shard.items():
            idx = self._index(s)
            ranges = [(idx.offsets[where[k][1]], idx.lengths[where[k][1]]) for k in ks]
            url = self.store.url(self.shards[s])
            for k, (off, _), data in zip(ks, ranges, read_ranges(self.store, self.shards[s], ranges), strict=True):
                raw = sample_from_bytes(url, self.formats[s], data, off, where[k][1], self.parse_examples)
                out[k] = self._sample(s, raw)
        return out

    def _fetch(self, pieces: list[Piece], positions: list[int]) -> list[dict[str, Any]]:
        return self._read_at([locate(pieces, pos) for pos in positions])

    def _find(self, key: str) -> tuple[int, int] | None:
        if self.manifest is None:
            raise ValueError("random access needs the packer's index (index.json): pack with `loomfs pack`")
        if self.manifest.keys_sorted:
            s = self.manifest.shard_of_key(key)
            if s is None:
                return None
            i = self._index(s).position(key)
            return None if i is None else (s, i)
        if self._key_map is None:
            self._key_map = {}
            for s in range(len(self.shards)):
                idx = load_index(self.store, self.manifest, s)
                for i, k in enumerate(idx.keys()):
                    self._key_map.setdefault(k, (s, i))
        return self._key_map.get(key)

    def get(self, key: str) -> Any:
        """The sample with ``key`` (``KeyError`` if there is none), read through the index."""
        return self.get_many([key])[0]

    def get_many(self, keys: list[str]) -> list[Any]:
        where: list[tuple[int, int]] = []
        for key in keys:
            found = self._find(key)
            if found is None:
                raise KeyError(key)
            where.append(found)
        return [self._finish(s) for s in self._read_at(where)]

    def __repr__(self) -> str:
        kind = f"samples={sum(self.counts)}" if self.counts is not None else "no index"
        return (f"LoomShardDataset({self.store!r} shards={len(self.shards)} {kind} "
                f"epoch={self.epoch} shuffle={self.shuffle})")
