"""Deprecated: this module is now :mod:`rollserve.llm.local.tiny_model`."""

from rollserve.deprecation import moved

__getattr__ = moved(__name__, "rollserve.llm.local.tiny_model")
