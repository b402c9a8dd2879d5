"""Notebook widgets (SPEC §7): the live cluster dashboard over the control server's REST API."""

from toolkit.widgets.dashboard import ClusterDashboard, NodeCard

__all__ = ["ClusterDashboard", "NodeCard"]
