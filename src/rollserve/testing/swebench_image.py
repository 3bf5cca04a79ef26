"""Deprecated: this module is now :mod:`rollserve.fixtures.swebench_image`."""

from rollserve.deprecation import moved

__getattr__ = moved(__name__, "rollserve.fixtures.swebench_image")
