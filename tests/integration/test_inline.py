"""Inline small files on a real cluster: one meta round trip to create and to read, writes
through meta, growth into chunks, directory limits, GC and fsck."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

import loomfs
from loomfs.cli.fsck import fsck

pytestmark = pytest.mark.integration

LIMIT = 64 << 10  # the meta server's default inline limit
CAP = 512 << 10  # the most a directory may ask for (inline bytes travel in a frame header)


def test_small_file_create_and_read_are_one_round_trip(fs: loomfs.LoomFS, base: str, calls: Any) -> None:
    client = fs.client
    data = os.urandom(4096)
    p = f"{base}/one"
    fs.run(client.pipe(p, data))
    assert calls.methods == ["open"]  # the create carries the bytes; no storage, no CLOSE
    calls.methods.clear()
    assert fs.run(client.cat(p)) == data
    assert calls.methods == ["read"]
    calls.methods.clear()

    async def lazy() -> None:
        f = await client.open(f"{base}/lazy", "wb")
        for i in range(16):
            await f.write(bytes([i]) * 100)
        await f.flush()  # visible at close, like any LoomFS write: nothing to send yet
        await f.close()

    fs.run(lazy())
    assert calls.methods == ["open"]
    a = fs.attr(p)
    assert a.inline and a.size == 4096 and fs.cat(f"{base}/lazy") == b"".join(bytes([i]) * 100 for i in range(16))


def test_writes_to_inline_files_and_growth_into_chunks(fs: loomfs.LoomFS, base: str) -> None:
    p = f"{base}/grow"
    model = bytearray(os.urandom(1000))
    fs.pipe(p, bytes(model))
    with fs.open(p, "r+b") as f:
        assert f.read(10) == model[:10]
        f.seek(500)
        f.write(b"PATCH")
        model[500:505] = b"PATCH"
        f.seek(0)
        assert f.read() == model  # reads see this file's own writes
    assert fs.cat(p) == model and fs.attr(p).inline
    with fs.open(p, "ab") as f:
        f.write(b"tail")
        model += b"tail"
    assert fs.cat(p) == model
    fs.truncate(p, 300)
    del model[300:]
    assert fs.cat(p) == model and fs.attr(p).inline
    with fs.open(p, "r+b") as f:  # grows past the limit: meta moves it to chunks, then writes land there
        f.seek(100)
        f.write(b"x" * 10)
        model[100:110] = b"x" * 10
        f.seek(LIMIT + 7)
        f.write(b"far")
        model += bytes(LIMIT + 7 - len(model)) + b"far"
    a = fs.attr(p)
    assert not a.inline and a.size == len(model)
    assert fs.cat(p) == model
    with fs.open(p, "rb") as f:
        f.seek(95)
        assert f.read(20) == model[95:115]


def test_lazy_files_big_writes_fsync_and_errors(fs: loomfs.LoomFS, base: str) -> None:
    big = os.urandom(3 << 20)
    with fs.open(f"{base}/big", "wb") as f:
        f.write(big[:1000])
        f.write(big[1000:])  # past the buffer: created in chunks
    assert not fs.attr(f"{base}/big").inline and fs.cat(f"{base}/big") == big
    with fs.open(f"{base}/synced", "wb") as f:
        f.write(b"durable")
        f.fsync()  # created now (a reader sees it before the close)
        assert fs.cat(f"{base}/synced") == b"durable"
        f.write(b"+more")
    assert fs.cat(f"{base}/synced") == b"durable+more" and fs.attr(f"{base}/synced").inline
    f = fs.open(f"{base}/no/such/dir/x", "wb")
    f.write(b"lost?")
    with pytest.raises(FileNotFoundError):
        f.close()  # the create's error comes with the close that carries it
    with fs.open(f"{base}/sparse", "wb") as f:
        f.seek(5000)
        f.write(b"end")
    assert fs.cat(f"{base}/sparse") == bytes(5000) + b"end"


def test_directory_limit_and_rewrites(fs: loomfs.LoomFS, base: str) -> None:
    fs.makedirs(f"{base}/off")
    fs.set_layout(f"{base}/off", inline_max_bytes=0)
    fs.pipe(f"{base}/off/f", b"small but chunked")
    a = fs.attr(f"{base}/off/f")
    assert not a.inline and fs.cat(f"{base}/off/f") == b"small but chunked"
    fs.makedirs(f"{base}/tiny")
    fs.set_layout(f"{base}/tiny", inline_max_bytes=16)
    fs.pipe(f"{base}/tiny/a", b"0123456789")
    fs.pipe(f"{base}/tiny/b", b"0123456789abcdefXYZ")
    assert fs.attr(f"{base}/tiny/a").inline and not fs.attr(f"{base}/tiny/b").inline
    fs.pipe(f"{base}/tiny/b", b"short")  # a put over a file in chunks: inline again
    assert fs.attr(f"{base}/tiny/b").inline and fs.cat(f"{base}/tiny/b") == b"short"


def test_gc_and_fsck_with_inline_files(cluster: Any, fs: loomfs.LoomFS, base: str) -> None:
    before = fs.statfs().gc_pending
    for i in range(20):
        fs.pipe(f"{base}/g{i}", b"%d" % i)
    fs.link(f"{base}/g0", f"{base}/g0-link")
    fs.rename(f"{base}/g1", f"{base}/g1-moved")
    for i in range(2, 20):
        fs.unlink(f"{base}/g{i}")
    assert fs.statfs().gc_pending == before  # clean inline files leave nothing to collect
    assert fs.cat(f"{base}/g0-link") == b"0" and fs.cat(f"{base}/g1-moved") == b"1"
    rep = fsck(fs, lambda: cluster.chunks_of(0), cluster.routing())
    assert rep.inline_files >= 2 and not rep.bad_inline, rep




def test_lazy_w_truncate_extend_then_close_in_chunked_dir_keeps_length(fs: loomfs.LoomFS, base: str) -> None:
    """A lazy "w" file extended by truncate() and put where inline is off: the put falls back
    to chunks and only the write patches go there; the zero tail of the truncate is lost."""
    fs.makedirs(f"{base}/off")
    fs.set_layout(f"{base}/off", inline_max_bytes=0)
    p = f"{base}/off/f"
    with fs.open(p, "wb") as f:
        f.write(b"abc")
        assert f.truncate(10) == 10
    assert fs.attr(p).size == 10
    assert fs.cat(p) == b"abc" + bytes(7)


def test_lazy_w_truncate_extend_then_fsync_keeps_length(fs: loomfs.LoomFS, base: str) -> None:
    """Same in an inline directory: fsync materialises the lazy file and sends only the
    patches, so the extension by truncate() never reaches meta."""
    p = f"{base}/f"
    with fs.open(p, "wb") as f:
        f.write(b"abc")
        f.truncate(10)
        f.fsync()
        assert fs.attr(p).size == 10  # fsync: meta has the length this file object shows
    assert fs.cat(p) == b"abc" + bytes(7)


def test_inline_file_at_the_cap_stays_readable(fs: loomfs.LoomFS, base: str) -> None:
    """A directory may ask for the 1 MiB cap; a file of that size is kept inline and its
    bytes then travel in the frame *header* (max 1 MiB) of the READ/OPEN reply, which no
    longer fits: the file cannot be read."""
    d = f"{base}/big"
    fs.makedirs(d)
    fs.set_layout(d, inline_max_bytes=CAP)
    p = f"{d}/f"
    fs.pipe(p, b"seed")
    fs.truncate(p, CAP)  # within the limit: stays inline
    assert fs.attr(p).size == CAP and fs.attr(p).inline
    assert fs.cat(p) == b"seed" + bytes(CAP - 4)
    with fs.open(p, "rb") as f:
        assert len(f.read()) == CAP


def test_inline_put_at_the_cap_through_writes(fs: loomfs.LoomFS, base: str) -> None:
    """Growing an inline file to the 1 MiB cap with writes through meta (WRITE_INLINE) in
    two halves, then reading it back."""
    d = f"{base}/big"
    fs.makedirs(d)
    fs.set_layout(d, inline_max_bytes=CAP)
    p = f"{d}/f"
    fs.pipe(p, b"")
    half = CAP // 2
    with fs.open(p, "r+b") as f:
        f.write(b"a" * half)
        f.flush()
        f.write(b"b" * half)
    assert fs.attr(p).size == CAP and fs.attr(p).inline
    assert fs.cat(p) == b"a" * half + b"b" * half


def test_unlinked_while_open_inline_file_can_still_grow(fs: loomfs.LoomFS, base: str) -> None:
    """POSIX (and LoomFS files in chunks): a file unlinked while open stays writable through
    the open file object. An inline one raises ENOENT as soon as a write crosses the inline
    limit (MIGRATE of an inode that is gone), although small writes were accepted."""
    chunked = f"{base}/c"
    with fs.open(chunked, "xb") as f:  # sanity: the same on a file in chunks works
        f.write(b"x" * (100 << 10))  # in chunks from here
        fs.unlink(chunked)
        f.write(b"y" * (100 << 10))
    p = f"{base}/i"
    fs.pipe(p, b"small")
    assert fs.attr(p).inline
    with fs.open(p, "r+b") as f:
        fs.unlink(p)
        f.write(b"still fine")  # accepted (applied nowhere)
        f.flush()
        f.seek(100 << 10)
        f.write(b"past the limit")  # ENOENT here
        f.seek(0)
        assert f.read(10) == b"still fine"


def test_writer_in_chunks_after_file_became_inline_keeps_later_writes(fs: loomfs.LoomFS, base: str) -> None:
    """A writer in chunks learns at fsync that someone else rewrote the file (a small put:
    inline now, new truncate epoch). Per loomfs.meta.trim rule 2 its writes after that reply
    count. But the file object stays in chunk mode: its later writes go to chunks of an
    inline file, which meta ignores, and close succeeds: an acknowledged write is lost."""
    p = f"{base}/f"
    fs.pipe(p, b"x" * (100 << 10))
    assert not fs.attr(p).inline
    with fs.open(p, "r+b") as f:
        f.write(b"A" * 10)
        f.flush()  # on storage before the put (buffered bytes would land after it)
        fs.pipe(p, b"small")  # another client (this writer keeps it in chunks)
        f.fsync()  # the reply: new epoch, length 5
        f.seek(0)
        f.write(b"W")
    assert fs.cat(p) == b"Wmall"


def test_reader_in_chunks_after_file_became_inline_reads_the_files_bytes(fs: loomfs.LoomFS, base: str) -> None:
    """Same writer: after the fsync that told it the new length (5), reading through it
    returns bytes of the old chunks (cut: zeros), not the file's content."""
    p = f"{base}/f"
    fs.pipe(p, b"x" * (100 << 10))
    with fs.open(p, "r+b") as f:
        fs.pipe(p, b"small")
        f.write(b"")
        f.fsync()
        assert f.length == 5
        f.seek(0)
        assert f.read() == b"small"
def test_lazy_w_open_truncates_at_open(fs: loomfs.LoomFS, base: str) -> None:
    """O_TRUNC takes effect at open: after open(p, "wb") other calls see an empty file. A
    lazy "w" open leaves the old content visible (stat, cat) until its close."""
    p = f"{base}/f"
    fs.pipe(p, b"old content")
    with fs.open(p, "wb") as f:
        f.write(b"new")
        assert fs.attr(p).size == 0  # old: 11
        assert fs.cat(p) == b""


def test_lazy_w_unlinked_before_close_is_not_recreated(fs: loomfs.LoomFS, base: str) -> None:
    """open(p, "wb"); unlink(p); write; close: the file is gone (POSIX, and LoomFS files in
    chunks). The lazy put at close creates p again."""
    p = f"{base}/f"
    fs.pipe(p, b"old")
    f = fs.open(p, "wb")
    fs.unlink(p)
    f.write(b"scratch data")
    f.close()
    assert not fs.exists(p)


def test_lazy_w_renamed_before_close_keeps_data_under_new_name(fs: loomfs.LoomFS, base: str) -> None:
    """open(tmp, "wb"); write; rename(tmp, final); close: the bytes are final's. With the lazy
    create, the rename moves the *old* file (or fails: ENOENT for a new tmp) and the close
    writes the bytes to tmp again."""
    tmp, final = f"{base}/tmp", f"{base}/final"
    fs.pipe(tmp, b"old")
    f = fs.open(tmp, "wb")
    f.write(b"new data")
    f.flush()
    fs.rename(tmp, final)
    f.close()
    assert fs.cat(final) == b"new data"
    assert not fs.exists(tmp)


def test_truncate_of_an_open_file_follows_it_across_a_rename(fs: loomfs.LoomFS, base: str) -> None:
    """ftruncate goes by inode: another client renaming the file (and writing a new one at the
    old name) does not make it cut the wrong file."""
    p, moved = f"{base}/t", f"{base}/t-moved"
    fs.pipe(p, b"x" * 5000)
    other = loomfs.connect(fs.address) if fs.address else fs
    with fs.open(p, "r+b") as f:
        other.rename(p, moved)
        other.pipe(p, b"newcomer")
        f.truncate(100)
    assert fs.cat(moved) == b"x" * 100 and fs.cat(p) == b"newcomer"
    if other is not fs:
        other.close()


def test_fallocate_of_an_inline_file_past_the_limit_moves_it_to_chunks(fs: loomfs.LoomFS, base: str) -> None:
    """Inline hunt (session 14): a grow (fallocate mode 0) of an inline file zero-filled a
    client buffer of the new size (64 MiB for a 64 MiB grow; MemoryError for 64 TiB). Past
    the inline limit the file goes to chunks first and only its length grows."""
    client = fs.client
    p = f"{base}/f"
    fs.run(client.pipe(p, b"hello"))

    async def grow(size: int) -> None:
        f = await client.open(p, "r+b")
        assert f.inline
        await f.grow(size)
        await f.close()

    fs.run(grow(1 << 46))
    a = fs.attr(p)
    assert a.size == 1 << 46 and not a.inline
    with fs.open(p, "rb") as f:
        assert f.read(8) == b"hello\0\0\0"
        f.seek((1 << 46) - 4)
        assert f.read() == bytes(4)


@pytest.mark.parametrize("limit", [0, 4096])
def test_a_lazy_files_shrinking_truncate_keeps_its_length_in_chunks(fs: loomfs.LoomFS, base: str, limit: int) -> None:
    """Inline hunt (session 14): a lazy "w" file cut by a truncate into a hole past its bytes
    lost that length when its put went to chunks (inline off, or past the directory's limit):
    the length came from the patches' ends only."""
    from loomfs.wire.types import Layout

    cur = fs.get_layout(base) or Layout()
    fs.set_layout(base, dataclasses.replace(cur, inline_max_bytes=limit))
    p = f"{base}/f"

    async def write() -> None:
        f = await fs.client.open(p, "wb")
        await f.write(b"abc")
        await f.seek(limit + 200)
        await f.write(b"x")
        await f.truncate(limit + 150)
        await f.close()

    fs.run(write())
    assert fs.stat(p).st_size == limit + 150
    assert fs.cat(p) == b"abc" + bytes(limit + 147)
