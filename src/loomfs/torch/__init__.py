"""PyTorch datasets over LoomFS (``pip install loomfs[torch]``).

* ``LoomFileDataset``: map-style, one whole file per sample; batches read with one call.
* ``LoomShardDataset``: iterable over WebDataset ``.tar``, TFRecord and ``.rec`` shards (see
  ``loomfs pack``), split by rank and worker, shuffled, prefetched, resumable.

Both pickle without a live client (each process connects on first use), so DataLoader
workers may be forked or spawned. See docs/ml.md.
"""

from loomfs.torch.files import LoomFileDataset
from loomfs.torch.shards import LoomShardDataset

__all__ = ["LoomFileDataset", "LoomShardDataset"]
