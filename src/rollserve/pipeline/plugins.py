"""Deprecated: the built-in plug-ins are :func:`rollserve.node.default_plugins`."""

from rollserve.deprecation import moved

__getattr__ = moved(__name__, "rollserve.node")
