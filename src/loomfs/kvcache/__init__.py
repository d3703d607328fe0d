"""A KV cache for LLM inference on LoomFS: put/get of attention KV blocks keyed by bytes.

``KVCache(fs, prefix, capacity_bytes, ttl_s)`` (blocking) and ``AsyncKVCache`` (on the async
core). Values (bytes-like, numpy arrays, torch tensors) are packed into append-only segment
files, one writer per cache object; a per-key index entry lives inline in meta. See
docs/kvcache.md.
"""

from loomfs.kvcache._config import KVConfig, KVStats
from loomfs.kvcache._core import AsyncKVCache
from loomfs.kvcache._sync import KVCache

__all__ = ["AsyncKVCache", "KVCache", "KVConfig", "KVStats"]
