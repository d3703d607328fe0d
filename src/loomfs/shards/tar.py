"""WebDataset ``.tar`` shards: a ustar writer and a streaming parser that groups members into
samples by key (``dir/abc.jpg`` + ``dir/abc.cls`` -> key ``dir/abc``, fields ``jpg``, ``cls``).

The parser reads ustar, pax (``x``: long paths and sizes) and GNU long names (``L``), checks
every header's checksum, and reports a bad or cut-off shard with the byte offset of the
header or member where it happened.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from loomfs.shards.errors import ShardCorrupt, ShardTruncated
from loomfs.shards.reader import ByteReader, Sink

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_OCTAL_SIZE_MAX = 8**11 - 1
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$", re.DOTALL)  # WebDataset's rule
_REGULAR = (b"0", b"\0", b"7")


def split_name(name: str) -> tuple[str, str]:
    """``'dir/abc.seg.png'`` -> ``('dir/abc', 'seg.png')``: the key is everything up to the first
    dot of the base name (WebDataset's rule); a name without a dot is all key."""
    m = _KEY_EXT.match(name)
    if m is None:
        return name, ""
    return m.group(1), m.group(2)


def member_name(key: str, field: str) -> str:
    return f"{key}.{field}" if field else key


# --- writing --------------------------------------------------------------------------------


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _header(name: bytes, size: int, typeflag: bytes, mtime: int) -> bytes:
    h = bytearray(BLOCK)
    h[0:len(name)] = name
    h[100:108] = _octal(0o644, 8)
    h[108:116] = _octal(0, 8)
    h[116:124] = _octal(0, 8)
    h[124:136] = _octal(size, 12)
    h[136:148] = _octal(mtime, 12)
    h[148:156] = b" " * 8
    h[156:157] = typeflag
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    checksum = sum(h)
    h[148:156] = b"%06o\0 " % checksum
    return bytes(h)


def _pax_record(keyword: str, value: str) -> bytes:
    body = f" {keyword}={value}\n".encode()
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n = len(str(n)) + len(body)
    return str(n).encode() + body


def encode_member(name: str, data: bytes | bytearray | memoryview, mtime: int = 0) -> list[bytes]:
    """The blocks of one tar member (a pax header first when the name or size needs it)."""
    raw = name.encode()
    out: list[bytes] = []
    pax = b""
    if len(raw) > 100:
        pax += _pax_record("path", name)
        raw = raw[:100]
    size = len(data)
    if size > _OCTAL_SIZE_MAX:
        pax += _pax_record("size", str(size))
    if pax:
        out.append(_header(b"././@PaxHeader", len(pax), b"x", mtime))
        out.append(pax + bytes(-len(pax) % BLOCK))
    out.append(_header(raw, min(size, _OCTAL_SIZE_MAX), b"0", mtime))
    out.append(bytes(data))
    pad = -size % BLOCK
    if pad:
        out.append(bytes(pad))
    return out


class TarWriter:
    """Writes samples as tar members into a binary file; ``write_sample`` returns the
    sample's (offset, length) in the file, for the index."""

    suffix = ".tar"

    def __init__(self, f: Sink, *, mtime: int = 0):
        self._f = f
        self.offset = 0
        self.mtime = mtime
        self.samples = 0

    def write_sample(self, key: str, fields: dict[str, bytes]) -> tuple[int, int]:
        if not fields:
            raise ValueError(f"sample {key!r} has no fields")
        start = self.offset
        for field, data in fields.items():
            for block in encode_member(member_name(key, field), data, self.mtime):
                self._f.write(block)
                self.offset += len(block)
        self.samples += 1
        return start, self.offset - start

    def close(self) -> None:
        """Write the end-of-archive marker (two zero blocks); the caller closes the file."""
        self._f.write(_ZERO_BLOCK * 2)
        self.offset += 2 * BLOCK

    def __repr__(self) -> str:
        return f"TarWriter(samples={self.samples} offset={self.offset})"


# --- reading --------------------------------------------------------------------------------


def _number(field: bytes, shard: str, offset: int, what: str) -> int:
    if field and field[0] & 0x80:  # GNU base-256
        value = int.from_bytes(field[1:], "big")
        return -value if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise ShardCorrupt(shard, offset, f"tar header {what} field {text!r} is not a number") from None


def _parse_pax(data: bytes, shard: str, offset: int) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        try:
            n = int(data[pos:space])
        except ValueError:
            raise ShardCorrupt(shard, offset, "malformed pax header record") from None
        if space < 0 or n <= 0:
            raise ShardCorrupt(shard, offset, "malformed pax header record")
        record = data[space + 1:pos + n - 1]
        k, _, v = record.partition(b"=")
        out[k.decode("utf-8", "replace")] = v.decode("utf-8", "surrogateescape")
        pos += n
    return out


def iter_members(r: ByteReader) -> Iterator[tuple[str, bytes, int, int]]:
    """Regular members as ``(name, data, header_offset, end_offset)`` up to the end-of-archive
    marker or the end of the bytes (a cut exactly between members is not detectable here; the
    index's sample counts catch it)."""
    shard = r.shard
    long_name: str | None = None
    pax: dict[str, str] = {}
    start: int | None = None  # header offset of the member being assembled (pax/L first)
    while not r.at_end():
        here = r.offset
        header = r.read_exact(BLOCK, "tar header")
        if header == _ZERO_BLOCK:
            if start is not None:
                raise ShardCorrupt(shard, here, "end-of-archive block after an extended header")
            return
        stored = _number(header[148:156], shard, here, "checksum")
        unsigned = sum(header[:148]) + 256 + sum(header[156:])
        if stored != unsigned:
            signed = sum(b - 256 if b > 127 else b for b in header[:148] + header[156:]) + 256
            if stored != signed:
                raise ShardCorrupt(shard, here, "tar header checksum mismatch (not a tar file, or corrupt)")
        size = _number(header[124:136], shard, here, "size")
        typeflag = header[156:157]
        if start is None:
            start = here
        if "size" in pax:
            size = int(pax["size"])
        padded = size + (-size % BLOCK)
        if typeflag in (b"x", b"L"):
            if size > 1 << 20:
                raise ShardCorrupt(shard, here, f"extended header of {size} bytes (over 1 MiB)")
            data = r.read_exact(padded, "tar extended header")[:size]
            if typeflag == b"x":
                pax.update(_parse_pax(data, shard, here))
            else:
                long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            continue
        if typeflag not in _REGULAR:  # directories, links, global pax headers...
            r.skip(padded, "tar member")
            start, long_name, pax = None, None, {}
            continue
        if "path" in pax:
            name = pax["path"]
        elif long_name is not None:
            name = long_name
        else:
            name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if header[257:262] == b"ustar":
                prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                if prefix:
                    name = prefix + "/" + name
        try:
            data = r.read_exact(size, f"tar member {name!r}")
            if padded > size:
                r.skip(padded - size, f"padding of tar member {name!r}")
        except ShardTruncated as exc:
            raise ShardTruncated(shard, start, f"tar member {name!r} of {size} bytes is cut off "
                                 f"at byte {r.offset} (the shard is truncated)") from exc
        yield name, data, start, r.offset
        start, long_name, pax = None, None, {}
    if start is not None:
        raise ShardTruncated(shard, start, "shard ends after an extended header")


def iter_tar_samples(r: ByteReader) -> Iterator[tuple[str, dict[str, bytes], int, int]]:
    """Samples as ``(key, {field: bytes}, offset, length)``: consecutive members with the same
    key form one sample (the WebDataset convention)."""
    key: str | None = None
    fields: dict[str, bytes] = {}
    begin = end = 0
    for name, data, start, stop in iter_members(r):
        k, field = split_name(name)
        if k != key:
            if key is not None:
                yield key, fields, begin, end - begin
            key, fields, begin = k, {}, start
        if field in fields:
            raise ShardCorrupt(r.shard, start, f"sample {k!r} has two {field!r} members")
        fields[field] = data
        end = stop
    if key is not None:
        yield key, fields, begin, end - begin
