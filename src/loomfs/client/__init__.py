"""LoomFS client library: the async core and its blocking facade."""

from loomfs.client.core import AsyncClient
from loomfs.client.file import AsyncFile
from loomfs.client.storage_client import StorageClient
from loomfs.client.sync import LoomFS, connect
from loomfs.client.syncfile import LoomFile

__all__ = ["AsyncClient", "AsyncFile", "LoomFS", "LoomFile", "StorageClient", "connect"]
