"""The meta service: the namespace over a MetaStore (service -> ops -> store -> gc)."""
