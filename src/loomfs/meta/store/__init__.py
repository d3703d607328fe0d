"""MetaStore engines, chosen by URL. Importing this package registers the built-in ones."""

from loomfs.meta.store.base import DentryRow, GcEntry, MetaStore, MetaTxn
from loomfs.meta.store.sqlite import SqliteStore

__all__ = ["DentryRow", "GcEntry", "MetaStore", "MetaTxn", "SqliteStore"]
