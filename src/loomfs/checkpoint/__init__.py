"""torch.distributed.checkpoint on LoomFS: atomic, parallel, optionally tiered saves.

    import torch.distributed.checkpoint as dcp
    from loomfs.checkpoint import LoomStorageReader, LoomStorageWriter

    dcp.save(state, storage_writer=LoomStorageWriter("/runs/a", fs, step=100))
    dcp.load(state, storage_reader=LoomStorageReader("/runs/a", fs))   # the latest one

``LoomStorageWriter``/``LoomStorageReader`` import torch; the layout, retention and verify
helpers do not (``loomfs ckpt`` uses them). See docs/checkpoints.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomfs.checkpoint._layout import CheckpointInfo, list_checkpoints, read_latest, resolve
from loomfs.checkpoint._retention import PrunePlan, VerifyReport, plan_prune, prune, verify
from loomfs.checkpoint._upload import Progress, Uploader

if TYPE_CHECKING:
    from loomfs.checkpoint._reader import LoomStorageReader
    from loomfs.checkpoint._staging import Stager, release_staging
    from loomfs.checkpoint._writer import LoomStorageWriter

__all__ = [
    "CheckpointInfo", "LoomStorageReader", "LoomStorageWriter", "Progress", "PrunePlan", "Stager", "Uploader",
    "VerifyReport", "list_checkpoints", "plan_prune", "prune", "read_latest", "release_staging", "resolve",
    "verify",
]


def __getattr__(name: str) -> Any:  # torch only when the DCP classes are used
    if name == "LoomStorageWriter":
        from loomfs.checkpoint._writer import LoomStorageWriter

        return LoomStorageWriter
    if name == "LoomStorageReader":
        from loomfs.checkpoint._reader import LoomStorageReader

        return LoomStorageReader
    if name in ("Stager", "release_staging"):
        from loomfs.checkpoint import _staging

        return getattr(_staging, name)
    raise AttributeError(name)
