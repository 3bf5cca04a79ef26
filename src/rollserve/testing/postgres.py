"""Deprecated: this module is now :mod:`rollserve.fixtures.postgres`."""

from rollserve.deprecation import moved

__getattr__ = moved(__name__, "rollserve.fixtures.postgres")
