"""Read-only cluster views: the model shared with ``loomfs top`` and the web dashboard."""

from loomfs.dashboard.model import History, build_view, health_of
from loomfs.dashboard.poller import ClusterPoller

__all__ = ["ClusterPoller", "History", "build_view", "health_of"]
