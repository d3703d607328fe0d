"""MetaStore engines, chosen by URL. Importing this package registers the built-in ones:
``sqlite:///path`` always, ``postgresql://...`` when asyncpg is installed."""

from loomfs.meta.store.base import DentryRow, GcEntry, MetaStore, MetaTxn, TxnConflict
from loomfs.meta.store.sqlite import SqliteStore

try:
    from loomfs.meta.store.postgres import PostgresStore
except ImportError:  # asyncpg missing: postgresql:// URLs are refused as unknown
    PostgresStore = None  # type: ignore[assignment,misc]

__all__ = ["DentryRow", "GcEntry", "MetaStore", "MetaTxn", "PostgresStore", "SqliteStore", "TxnConflict"]
