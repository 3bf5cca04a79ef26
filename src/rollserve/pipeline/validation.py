"""Deprecated: this module is now :mod:`rollserve.validation`."""

from rollserve.deprecation import moved

__getattr__ = moved(__name__, "rollserve.validation")
