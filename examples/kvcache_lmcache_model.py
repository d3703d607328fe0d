"""Cache the attention KV of a small CPU transformer's prefill in LoomFS through the LMCache
plugin, then answer a second prompt with the same prefix by loading the cached KV chunks and
computing only the new tokens.

    python examples/kvcache_lmcache_model.py            # starts a local cluster in a temp dir
    python examples/kvcache_lmcache_model.py CLUSTER    # or uses yours (address or directory)

KV chunks are LMCache's KV_2LTD format ([2, layers, tokens, hidden]) of 16 tokens, keyed by a
hash of the whole token prefix up to the chunk's end (as LMCache keys them). With ``lmcache``
installed the backend is LMCache's own interface; the MemoryObj and allocator here are the
plugin's doubles (``loomfs.kvcache._lmcache_iface``), so the example runs without it.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
import time

import torch
from torch import nn

from loomfs.kvcache._lmcache_iface import (
    CacheEngineKey,
    CPUAllocator,
    EngineConfig,
    TensorMemoryObj,
)
from loomfs.kvcache.lmcache import LoomFSBackend

CHUNK_TOKENS = 16
LAYERS, HIDDEN, HEADS, VOCAB = 4, 128, 4, 512


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))
        self.n1, self.n2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)

    def forward(self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [new, hidden]; past_k/v: [past, hidden] -> (out, k, v) with k/v of the new tokens."""
        q, k, v = self.qkv(self.n1(x)).chunk(3, dim=-1)
        keys, values = torch.cat([past_k, k]), torch.cat([past_v, v])
        n_new, n_all = x.shape[0], keys.shape[0]
        split = lambda t: t.view(t.shape[0], HEADS, HIDDEN // HEADS).transpose(0, 1)  # noqa: E731
        mask = torch.ones(n_new, n_all, dtype=torch.bool).tril(diagonal=n_all - n_new)
        att = nn.functional.scaled_dot_product_attention(split(q), split(keys), split(values), attn_mask=mask)
        x = x + self.out(att.transpose(0, 1).reshape(n_new, HIDDEN))
        return x + self.mlp(self.n2(x)), k, v


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, past: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens: the new ones; past: KV_2LTD [2, layers, past, hidden] -> (logits, kv of all)."""
        past = past if past is not None else torch.zeros(2, LAYERS, 0, HIDDEN)
        x = self.emb(tokens)
        ks, vs = [], []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, past[0, i], past[1, i])
            ks.append(k)
            vs.append(v)
        new = torch.stack([torch.stack(ks), torch.stack(vs)])
        return self.head(x), torch.cat([past, new], dim=2)


def chunk_keys(tokens: torch.Tensor) -> list[CacheEngineKey]:
    """One key per whole chunk: a hash of every token up to the chunk's end."""
    keys, h = [], hashlib.blake2b(digest_size=8)
    for end in range(CHUNK_TOKENS, len(tokens) + 1, CHUNK_TOKENS):
        h.update(tokens[end - CHUNK_TOKENS : end].numpy().tobytes())
        keys.append(CacheEngineKey("tinylm", 1, 0, int.from_bytes(h.copy().digest(), "big"), torch.float32))
    return keys


def serve(model: TinyLM, backend: LoomFSBackend, tokens: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Logits of the last token, loading whatever prefix chunks the cache has; stores the
    chunks it computed. Returns (logits, tokens reused)."""
    keys = chunk_keys(tokens)
    hits = backend.batched_contains(keys)
    past = None
    if hits:
        objs = backend.batched_get_blocking(keys[:hits])
        hits = next((i for i, o in enumerate(objs) if o is None), hits)  # evicted meanwhile
        if hits:
            past = torch.cat([o.tensor for o in objs[:hits]], dim=2)
        for o in objs:
            if o is not None:
                o.ref_count_down()
    reused = hits * CHUNK_TOKENS
    logits, kv = model(tokens[reused:], past)
    new = [TensorMemoryObj(kv[:, :, i * CHUNK_TOKENS : (i + 1) * CHUNK_TOKENS].contiguous())
           for i in range(hits, len(keys))]
    for f in backend.batched_submit_put_task(keys[hits:], new) or []:
        f.result()
    return logits[-1], reused


def main(cluster: str) -> None:
    torch.manual_seed(0)
    model = TinyLM().eval()
    config = EngineConfig(extra_config={"loomfs.cluster": cluster, "loomfs.prefix": "/examples/lmcache"})
    backend = LoomFSBackend(config=config, dst_device="cpu", local_cpu_backend=CPUAllocator())
    try:
        system = torch.randint(0, VOCAB, (512,))  # a long shared prefix (a system prompt, a document)
        for i, question in enumerate(torch.randint(0, VOCAB, (3, 24))):
            prompt = torch.cat([system, question])
            t0 = time.perf_counter()
            logits, reused = serve(model, backend, prompt)
            took = time.perf_counter() - t0
            full, _ = model(prompt)
            same = torch.allclose(logits, full[-1], atol=1e-4)
            print(f"request {i}: {len(prompt)} tokens, {reused} from LoomFS, {took * 1e3:.1f} ms, "
                  f"logits match a full prefill: {same}")
            assert same and (i == 0 or reused == len(system))
        print(repr(backend))
    finally:
        backend.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        from loomfs.testing import LocalCluster

        with LocalCluster(tempfile.mkdtemp(prefix="loomfs-example-")) as c:
            main(str(c.root))
