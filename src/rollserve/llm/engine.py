"""Deprecated: this module is now :mod:`rollserve.llm.local.engine`."""

from rollserve.deprecation import moved

__getattr__ = moved(__name__, "rollserve.llm.local.engine")
