"""fsspec for LoomFS: ``loom://HOST:PORT/path`` (``loom:///path``: ``$LOOMFS_CLUSTER``).

Registered by the ``fsspec.specs`` entry point, so after ``pip install loomfs[fsspec]``
``fsspec.open("loom://...")``, ``fsspec.filesystem("loom")``, pandas, pyarrow and Hugging
Face datasets take ``loom://`` URLs. See docs/fsspec.md.
"""

from loomfs.fsspec._file import AsyncLoomFile, LoomBufferedFile
from loomfs.fsspec._filesystem import LoomFileSystem
from loomfs.fsspec._urls import close_clients

__all__ = ["AsyncLoomFile", "LoomBufferedFile", "LoomFileSystem", "close_clients"]
