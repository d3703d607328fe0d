"""Namespace operations: POSIX semantics written once above the MetaStore."""
