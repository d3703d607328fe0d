"""Shard formats without a cluster: tar against Python's tarfile, TFRecord against the
``tfrecord`` package (both directions), the Example codec, record files, the index, the
splitting/shuffle/resume plans, globbing, and pack/unpack on local directories."""

from __future__ import annotations

import io
import os
import random
import struct
import tarfile
from pathlib import Path
from typing import Any

import pytest
from tfrecord.reader import tfrecord_loader
from tfrecord.writer import TFRecordWriter as TheirWriter

from loomfs.shards import (
    ByteReader,
    LocalStore,
    Manifest,
    RecordWriter,
    ShardCorrupt,
    ShardEntry,
    ShardError,
    ShardIndex,
    ShardTruncated,
    TarWriter,
    TFRecordWriter,
    decode_example,
    encode_example,
    iter_samples,
    location,
    masked_crc32c,
    pack,
    split_name,
    unpack,
)
from loomfs.shards.store import LoomStore, glob_regex
from loomfs.shards.tfrecord import iter_records
from loomfs.torch.plan import (
    Piece,
    ShuffleBuffer,
    loader_consumed,
    locate,
    replay_shuffle,
    skip_pieces,
    split_counted,
    split_uncounted,
    stream_rng,
)


def samples_of(fmt: str, data: bytes, name: str = "s.bin", block: int = 7) -> list[tuple[str, dict[str, Any], int, int]]:
    """Parse ``data`` fed in small blocks (so reads cross block edges)."""
    blocks = [data[i:i + block] for i in range(0, len(data), block)]
    return list(iter_samples(fmt, ByteReader(name, blocks)))


# --- tar --------------------------------------------------------------------------------------


def test_split_name_follows_webdataset() -> None:
    assert split_name("dir/abc.jpg") == ("dir/abc", "jpg")
    assert split_name("dir/abc.seg.png") == ("dir/abc", "seg.png")
    assert split_name("a.b/c.d/x.cls") == ("a.b/c.d/x", "cls")
    assert split_name("noext") == ("noext", "")


def test_tar_writer_is_read_by_tarfile_and_back() -> None:
    buf = io.BytesIO()
    w = TarWriter(buf)
    long_key = "deep/" + "k" * 150
    samples = {"a/0001": {"jpg": b"x" * 1000, "cls": b"3"}, long_key: {"txt": b""},
               "a/0002": {"jpg": os.urandom(513)}}
    spans = {k: w.write_sample(k, f) for k, f in samples.items()}
    w.close()
    data = buf.getvalue()
    assert len(data) % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        got = {m.name: t.extractfile(m).read() for m in t.getmembers()}  # type: ignore[union-attr]
    assert got == {f"{k}.{e}": v for k, f in samples.items() for e, v in f.items()}
    parsed = samples_of("tar", data)
    assert [(k, f) for k, f, _, _ in parsed] == list(samples.items())
    assert [(o, n) for _, _, o, n in parsed] == [spans[k] for k in samples]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_tarfile_archives_parse(fmt: int) -> None:
    buf = io.BytesIO()
    if fmt == tarfile.USTAR_FORMAT:  # ustar splits long names into prefix + name
        names = ["x/1.a", "x/1.b", "x/2.a", "y/" + "z" * 90 + "/3.a"]
    else:
        names = ["x/1.a", "x/1.b", "x/2.a", "y/" + "z" * 200 + ".a"]
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        t.addfile(tarfile.TarInfo("x"), None)  # an empty member without an extension
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        t.addfile(d)
        for i, n in enumerate(names):
            info = tarfile.TarInfo(n)
            payload = bytes([i]) * (100 * i + 1)
            info.size = len(payload)
            t.addfile(info, io.BytesIO(payload))
    got = samples_of("tar", buf.getvalue(), block=1000)
    assert [k for k, _, _, _ in got] == ["x", "x/1", "x/2", names[3].rsplit(".", 1)[0]]
    assert got[1][1] == {"a": b"\0" * 1, "b": b"\1" * 101}


def test_truncated_tar_names_shard_member_and_offset() -> None:
    buf = io.BytesIO()
    w = TarWriter(buf)
    w.write_sample("k0", {"bin": b"a" * 600})  # header 512 + data 1024 padded
    w.write_sample("k1", {"bin": b"b" * 2000})
    data = buf.getvalue()
    with pytest.raises(ShardTruncated) as e:
        samples_of("tar", data[:1536 + 512 + 100], "loom:///d/shard-3.tar")
    assert e.value.shard == "loom:///d/shard-3.tar" and e.value.offset == 1536
    assert "loom:///d/shard-3.tar at byte 1536" in str(e.value) and "'k1.bin'" in str(e.value)
    with pytest.raises(ShardTruncated, match=r"at byte 1536: tar header"):
        samples_of("tar", data[:1536 + 100])


def test_corrupt_tar_header_is_a_checksum_error() -> None:
    buf = io.BytesIO()
    w = TarWriter(buf)
    w.write_sample("k0", {"bin": b"a" * 10})
    w.write_sample("k1", {"bin": b"b" * 10})
    data = bytearray(buf.getvalue())
    data[1024 + 3] ^= 0xFF
    with pytest.raises(ShardCorrupt, match="at byte 1024: tar header checksum") as e:
        samples_of("tar", bytes(data), "s.tar")
    assert isinstance(e.value, OSError) and e.value.offset == 1024


def test_repeated_field_in_a_sample_is_refused() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for _ in range(2):
            t.addfile(tarfile.TarInfo("k.jpg"), io.BytesIO(b""))
    with pytest.raises(ShardCorrupt, match="two 'jpg' members"):
        samples_of("tar", buf.getvalue())


# --- TFRecord ---------------------------------------------------------------------------------


def test_masked_crc_matches_the_tfrecord_package() -> None:
    for n in (0, 1, 8, 1000):
        data = os.urandom(n)
        assert struct.pack("<I", masked_crc32c(data)) == TheirWriter.masked_crc(data)


def test_our_tfrecords_read_by_the_tfrecord_package(tmp_path: Path) -> None:
    path = tmp_path / "ours.tfrecord"
    fields = [{"jpg": os.urandom(50 + i), "cls": str(i).encode(), "ids": [i, -i, 2**40], "w": [0.5, float(i)]}
              for i in range(20)]
    with open(path, "wb") as f:
        w = TFRecordWriter(f)
        for i, fd in enumerate(fields):
            w.write_sample(f"k{i:03d}", fd)
    desc = {"__key__": "byte", "jpg": "byte", "cls": "byte", "ids": "int", "w": "float"}
    theirs = list(tfrecord_loader(str(path), None, desc))
    assert len(theirs) == 20
    for i, ex in enumerate(theirs):
        assert bytes(ex["__key__"]) == f"k{i:03d}".encode()
        assert bytes(ex["jpg"]) == fields[i]["jpg"] and bytes(ex["cls"]) == fields[i]["cls"]
        assert list(ex["ids"]) == [i, -i, 2**40] and list(ex["w"]) == [0.5, float(i)]
    # every CRC in the file is what their writer would have written
    raw = path.read_bytes()
    pos = 0
    while pos < len(raw):
        (n,) = struct.unpack_from("<Q", raw, pos)
        assert raw[pos + 8:pos + 12] == TheirWriter.masked_crc(raw[pos:pos + 8])
        assert raw[pos + 12 + n:pos + 16 + n] == TheirWriter.masked_crc(raw[pos + 12:pos + 12 + n])
        pos += 16 + n
    assert pos == len(raw)


def test_tfrecord_package_files_read_by_us(tmp_path: Path) -> None:
    path = tmp_path / "theirs.tfrecord"
    w = TheirWriter(str(path))
    for i in range(15):
        w.write({"img": (os.urandom(i + 1), "byte"), "label": (i, "int"), "score": ([1.5, -2.0], "float")})
    w.close()
    data = path.read_bytes()
    got = samples_of("tfrecord", data, "theirs.tfrecord", block=33)
    assert len(got) == 15
    for i, (key, fields, _, _) in enumerate(got):
        assert key == f"theirs/{i}"  # no __key__ feature: STEM/INDEX
        assert len(fields["img"]) == i + 1 and fields["label"] == [i] and fields["score"] == [1.5, -2.0]
    assert sum(n for _, _, _, n in got) == len(data)


def test_corrupt_tfrecord_crc_names_record_offset() -> None:
    buf = io.BytesIO()
    w = TFRecordWriter(buf)
    spans = [w.write(os.urandom(100)) for _ in range(3)]
    data = bytearray(buf.getvalue())
    data[spans[1][0] + 12 + 50] ^= 1  # a byte of record 1's data
    with pytest.raises(ShardCorrupt, match=rf"s.tfrecord at byte {spans[1][0]}: TFRecord data CRC mismatch"):
        list(iter_records(ByteReader("s.tfrecord", [bytes(data)])))
    data = bytearray(buf.getvalue())
    data[spans[2][0] + 3] ^= 1  # record 2's length
    with pytest.raises(ShardCorrupt, match=f"at byte {spans[2][0]}: TFRecord length CRC"):
        list(iter_records(ByteReader("s.tfrecord", [bytes(data)])))
    with pytest.raises(ShardTruncated, match=f"at byte {spans[2][0]}: TFRecord of 100 bytes"):
        list(iter_records(ByteReader("s.tfrecord", [buf.getvalue()[:spans[2][0] + 40]])))


def test_non_example_records_are_refused_unless_raw() -> None:
    buf = io.BytesIO()
    TFRecordWriter(buf).write(b"\xff\xff\xff")
    with pytest.raises(ShardCorrupt, match="not a tf.train.Example"):
        samples_of("tfrecord", buf.getvalue())
    raw = list(iter_samples("tfrecord", ByteReader("r.tfrecord", [buf.getvalue()]), parse_examples=False))
    assert raw[0][:2] == ("r/0", {"data": b"\xff\xff\xff"})


def test_example_codec_round_trip() -> None:
    ex = {"b": b"\x00\x01", "s": "text", "many": [b"a", b"b"], "i": [1, -1, 2**62], "f": [0.25], "one": 7}
    got = decode_example(encode_example(ex))
    assert got == {"b": b"\x00\x01", "s": b"text", "many": [b"a", b"b"], "i": [1, -1, 2**62],
                   "f": [0.25], "one": [7]}


# --- records, index, manifest ------------------------------------------------------------------


def test_record_files_round_trip_and_truncation() -> None:
    buf = io.BytesIO()
    w = RecordWriter(buf)
    payloads = [os.urandom(i * 10) for i in range(6)]
    for p in payloads:
        w.write(p)
    got = samples_of("records", buf.getvalue(), "part-7.rec")
    assert [(k, f["data"]) for k, f, _, _ in got] == [(f"part-7/{i}", p) for i, p in enumerate(payloads)]
    with pytest.raises(ShardTruncated, match="part-7.rec at byte"):
        samples_of("records", buf.getvalue()[:-3], "part-7.rec")


def test_shard_index_encoding() -> None:
    entries = [(f"key{i}/é", i * 1000, 512 + i) for i in range(100)]
    idx = ShardIndex.build("s.tar", entries)
    back = ShardIndex.decode("s.tar.idx", idx.encode())
    assert back.keys() == [e[0] for e in entries] and list(back.offsets) == [e[1] for e in entries]
    assert back.position("key42/é") == 42 and back.position("nope") is None
    assert back.span(10, 20) == (10000, 19000 + 531)
    with pytest.raises(ShardCorrupt, match="s.tar.idx at byte 0: not a LoomFS shard index"):
        ShardIndex.decode("s.tar.idx", b"X" + idx.encode()[1:])
    with pytest.raises(ShardCorrupt, match="index should be"):
        ShardIndex.decode("s.tar.idx", idx.encode()[:-1])


def test_manifest_round_trip_and_key_lookup() -> None:
    m = Manifest("/d", "tar", [ShardEntry("a.tar", 3, 100, "a", "c"), ShardEntry("b.tar", 2, 50, "d", "f")],
                 keys_sorted=True)
    back = Manifest.decode("/d", "index.json", m.encode())
    assert back == m and back.samples == 5
    assert [back.shard_of_key(k) for k in ("a", "b", "c", "cc", "d", "f", "g", "0")] == [0, 0, 0, None, 1, 1, None, None]
    with pytest.raises(ShardError, match="index.json: not a LoomFS shard manifest"):
        Manifest.decode("/d", "index.json", b"{}")


# --- plans --------------------------------------------------------------------------------------


def test_counted_split_gives_every_sample_once_for_any_stream_count() -> None:
    rng = random.Random(5)
    for _ in range(200):
        counts = [rng.randrange(0, 20) for _ in range(rng.randrange(1, 8))]
        order = list(range(len(counts)))
        rng.shuffle(order)
        streams = rng.randrange(1, 12)
        seen: list[tuple[int, int]] = []
        sizes = []
        for g in range(streams):
            n = 0
            for p in split_counted(order, counts, g, streams):
                assert p.count is not None
                seen.extend((p.shard, p.first + i) for i in range(p.count))
                n += p.count
            sizes.append(n)
        assert sorted(seen) == sorted((s, i) for s in range(len(counts)) for i in range(counts[s]))
        assert max(sizes) - min(sizes) <= 1
        assert [s for s, _ in seen] == [s for s in order for _ in range(counts[s])]  # contiguous runs


def test_uncounted_split_is_round_robin() -> None:
    assert split_uncounted([3, 1, 0, 2, 4], 1, 2) == [Piece(1, 0, None), Piece(2, 0, None)]


def test_skip_and_locate() -> None:
    pieces = [Piece(4, 10, 3), Piece(1, 0, 5)]
    assert skip_pieces(pieces, 4) == [Piece(1, 1, 4)]
    assert skip_pieces(pieces, 0) == pieces and skip_pieces(pieces, 8) == []
    assert [locate(pieces, i) for i in (0, 2, 3, 7)] == [(4, 10), (4, 12), (1, 0), (1, 4)]


def test_shuffle_replay_on_positions_matches_the_real_run() -> None:
    for total, size, k in [(100, 10, 0), (100, 10, 37), (100, 10, 95), (5, 10, 3), (100, 1, 50)]:
        full: list[int] = []
        buf: ShuffleBuffer[int] = ShuffleBuffer(size, stream_rng(1, 2, 3))
        for x in range(total):
            if buf.full:
                full.append(buf.swap(x))
            else:
                buf.add(x)
        while len(buf):
            full.append(buf.pop())
        assert sorted(full) == list(range(total))
        rbuf, pulled = replay_shuffle(size, stream_rng(1, 2, 3), total, k)
        rest: list[int] = []
        for x in range(pulled, total):
            if rbuf.full:
                rest.append(rbuf.swap(x))
            else:
                rbuf.add(x)
        while len(rbuf):
            rest.append(rbuf.pop())
        assert full[:k] + rest == full, (total, size, k)


def test_loader_consumed_follows_round_robin_batches() -> None:
    # workers with 5, 3 and 0 samples, batch 2: w0 b0, w1 b0, w0 b1, w1 b1(1), w0 b2(1)
    assert loader_consumed([5, 3, 0], 2, False, 4) == ([2, 2, 0], 2)
    assert loader_consumed([5, 3, 0], 2, False, 2) == ([2, 0, 0], 1)
    assert loader_consumed([5, 3, 0], 2, False, 7) == ([4, 3, 0], 2)
    assert loader_consumed([5, 3, 0], 2, False, 8) == ([5, 3, 0], 1)
    assert loader_consumed([5, 3, 0], 2, True, 6) == ([4, 2, 0], 1)
    with pytest.raises(ValueError, match="batch boundary"):
        loader_consumed([5, 3], 2, False, 3)
    with pytest.raises(ValueError, match="more than"):
        loader_consumed([5, 3], 2, False, 10)


# --- stores, glob, pack -------------------------------------------------------------------------


def test_locations() -> None:
    assert location("loom://h:1/a/b") == (LoomStore("h:1"), "/a/b")
    assert location("loom:///a", "/c") == (LoomStore("/c"), "/a")
    assert location("loom:/a") == (LoomStore(None), "/a")
    assert location("loom://a/b", "h:3") == (LoomStore("h:3"), "/a/b")
    assert location("file:/x/y") == (LocalStore(), "/x/y")
    assert location(Path("/x")) == (LocalStore(), "/x")
    assert location("/x", "h:2") == (LoomStore("h:2"), "/x")
    assert LoomStore("h:1").url("/a") == "loom://h:1/a" and LoomStore("/tmp/c").url("/a") == "loom:///a"


def test_glob_regex() -> None:
    rx = glob_regex("/d/**/*.jpg")
    assert rx.match("/d/a.jpg") and rx.match("/d/x/y/a.jpg") and not rx.match("/d/a.png")
    rx = glob_regex("/d/*/[ab]?.tar")
    assert rx.match("/d/x/a1.tar") and not rx.match("/d/x/y/a1.tar") and not rx.match("/d/x/c1.tar")
    assert glob_regex("/d/[!a]*").match("/d/b") and not glob_regex("/d/[!a]*").match("/d/a")


def make_tree(root: Path, n: int) -> dict[str, bytes]:
    files = {}
    for i in range(n):
        sub = root / f"c{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        for ext in ("jpg", "cls"):
            data = os.urandom(i * 37 % 700) if ext == "jpg" else str(i).encode()
            (sub / f"{i:04d}.{ext}").write_bytes(data)
            files[f"c{i % 3}/{i:04d}.{ext}"] = data
    return files


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_pack_unpack_round_trip_local(tmp_path: Path, fmt: str) -> None:
    files = make_tree(tmp_path / "src", 60)
    st = LocalStore()
    res = pack(st, str(tmp_path / "src"), st, str(tmp_path / "out"), fmt=fmt, shard_bytes=8 << 10)
    m = res.manifest
    assert m.samples == 60 and len(m.shards) > 3 and m.keys_sorted
    assert [s.first_key for s in m.shards] == sorted(s.first_key for s in m.shards)
    assert not list((tmp_path / "out").glob("*.partial"))
    with pytest.raises(FileExistsError):
        pack(st, str(tmp_path / "src"), st, str(tmp_path / "out"), fmt=fmt)
    assert unpack(st, str(tmp_path / "out"), st, str(tmp_path / "back")) == 60
    back = {str(p.relative_to(tmp_path / "back")): p.read_bytes()
            for p in (tmp_path / "back").rglob("*") if p.is_file()}
    assert back == files


def test_pack_glob_and_unpack_of_bare_shards(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", 12)
    st = LocalStore()
    pack(st, str(tmp_path / "src/*/*.jpg"), st, str(tmp_path / "out"), shard_bytes=2 << 10)
    os.unlink(tmp_path / "out" / "index.json")  # unpack also takes shards without an index
    assert unpack(st, str(tmp_path / "out"), st, str(tmp_path / "back")) == 12
    assert sorted(p.name for p in (tmp_path / "back").rglob("*.jpg")) == [f"{i:04d}.jpg" for i in range(12)]


def test_unpack_refuses_unsafe_names(tmp_path: Path) -> None:
    with open(tmp_path / "evil.tar", "wb") as f:
        w = TarWriter(f)
        w.write_sample("../escape", {"txt": b"x"})
        w.close()
    with pytest.raises(ShardCorrupt, match=r"evil.tar at byte 0: unsafe sample name '\.\./escape'"):
        unpack(LocalStore(), str(tmp_path / "evil.tar"), LocalStore(), str(tmp_path / "out"))
    assert not (tmp_path / "escape.txt").exists()


def test_store_glob_prunes_and_matches(tmp_path: Path) -> None:
    for p in ("a/1.tar", "a/2.rec", "a/b/3.tar", "c/4.tar"):
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_bytes(b"")
    st = LocalStore()
    assert st.glob(f"{tmp_path}/*/*.tar") == [f"{tmp_path}/a/1.tar", f"{tmp_path}/c/4.tar"]
    assert st.glob(f"{tmp_path}/**/*.tar") == [f"{tmp_path}/a/1.tar", f"{tmp_path}/a/b/3.tar", f"{tmp_path}/c/4.tar"]
    with pytest.raises(FileNotFoundError, match="no files match"):
        st.expand(f"{tmp_path}/*.none")


def test_prefetcher_reads_ranges_in_order_with_backpressure_and_stops(tmp_path: Path) -> None:
    from loomfs.torch.prefetch import Prefetcher, Range

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(bytes(range(256)) * 40)
    b.write_bytes(b"B" * 5000)
    pf = Prefetcher(LocalStore(), [Range(str(a), 100, 9000), Range(str(b)), Range(str(tmp_path / "gone.rec"))],
                    max_bytes=2048, block_bytes=1024)
    try:
        first = pf.blocks(0)
        assert next(first) == a.read_bytes()[100:1124]  # the rest of range 0 is dropped
        assert b"".join(pf.blocks(1)) == b"B" * 5000
        with pytest.raises(FileNotFoundError) as e:
            list(pf.blocks(2))
        assert "gone.rec" in str(e.value.filename)
        with pytest.raises(RuntimeError, match="in order"):
            next(pf.blocks(0))
    finally:
        pf.close()
    assert "next=3" in repr(pf)
    stopped = Prefetcher(LocalStore(), [Range(str(a))] * 50, max_bytes=1024, block_bytes=512)
    next(stopped.blocks(0))
    stopped.close()  # the reader is blocked on a full queue: close still ends it
    assert not stopped._thread.is_alive()
