"""``Namespace``: every meta operation, POSIX/Linux errno semantics, over one MetaStore.

Build one per meta process::

    ns = Namespace(store, routing=routing_client, clock=clock, rng=random.Random(seed),
                   default_layout=Layout(chunk_size=4 << 20, stripe=16, table_id=1))
    await ns.init()
"""

from __future__ import annotations

from loomfs.meta.ops.dirs import DirOps, Statfs
from loomfs.meta.ops.exchange import ExchangeOps
from loomfs.meta.ops.files import FileOps, Opened, SetattrResult
from loomfs.meta.ops.special import SpecialOps
from loomfs.meta.ops.tenants import TenantOps
from loomfs.meta.ops.xattrs import XattrOps

__all__ = ["Namespace", "Opened", "SetattrResult", "Statfs"]


class Namespace(DirOps, FileOps, ExchangeOps, SpecialOps, XattrOps, TenantOps):
    """All namespace operations (directory shape in DirOps, file data bookkeeping in FileOps,
    small files' bytes in InlineOps, extended attributes in XattrOps)."""
