"""Deprecated: this module is now :mod:`rollserve.llm.local.server`."""

from rollserve.deprecation import moved

__getattr__ = moved(__name__, "rollserve.llm.local.server")
