"""``LoomFileSystem``: fsspec's ``AsyncFileSystem`` over the one async client core.

Its parts: ``_base`` (the client and its loop, URLs, attributes), ``_namespace``
(listings, removes, renames), ``_data`` (reads, writes, transfers, file objects),
``_xattrs`` (user.* extended attributes).
"""

from __future__ import annotations

from loomfs.fsspec._data import DataOps
from loomfs.fsspec._namespace import NamespaceOps
from loomfs.fsspec._xattrs import XattrOps


class LoomFileSystem(DataOps, NamespaceOps, XattrOps):
    """fsspec filesystem for ``loom://HOST:PORT/path`` (``loom:///path``: ``$LOOMFS_CLUSTER``).

    ``cluster``: mgmtd address(es) or a local cluster directory (default ``$LOOMFS_CLUSTER``);
    ``consistency``: "strict" or "relaxed" (see docs/consistency.md; "relaxed" suits
    read-mostly datasets); ``auto_mkdir``: writes create missing parent directories (as on
    object stores; default True); ``client``: an existing ``LoomFS`` to use (see
    ``from_client``). Instances are cached per set of options, and all instances for one
    cluster share one client.
    """
