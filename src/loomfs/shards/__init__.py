"""Shard formats for datasets: WebDataset ``.tar``, TFRecord (length + masked CRC32C
framing, ``tf.train.Example`` samples), plain length-prefixed ``.rec`` files; the packer's
index (``index.json`` + ``.idx`` per shard); ``pack``/``unpack``.

Everything here reads and writes through a ``Store`` (a local directory or LoomFS) and needs
no torch; ``loomfs.torch`` builds its datasets on it.
"""

from loomfs.shards.errors import ShardCorrupt, ShardError, ShardTruncated
from loomfs.shards.example import decode_example, encode_example
from loomfs.shards.formats import SUFFIXES, format_of, iter_samples, writer_for
from loomfs.shards.index import MANIFEST_NAME, Manifest, ShardEntry, ShardIndex
from loomfs.shards.io import iter_shard
from loomfs.shards.pack import PackResult, pack, unpack
from loomfs.shards.reader import ByteReader
from loomfs.shards.records import RecordWriter
from loomfs.shards.store import LocalStore, LoomStore, Store, location
from loomfs.shards.tar import TarWriter, split_name
from loomfs.shards.tfrecord import TFRecordWriter, masked_crc32c

__all__ = [
    "MANIFEST_NAME",
    "SUFFIXES",
    "ByteReader",
    "LocalStore",
    "LoomStore",
    "Manifest",
    "PackResult",
    "RecordWriter",
    "ShardCorrupt",
    "ShardEntry",
    "ShardError",
    "ShardIndex",
    "ShardTruncated",
    "Store",
    "TFRecordWriter",
    "TarWriter",
    "decode_example",
    "encode_example",
    "format_of",
    "iter_samples",
    "iter_shard",
    "location",
    "masked_crc32c",
    "pack",
    "split_name",
    "unpack",
    "writer_for",
]
