"""Deprecated: this module is now :mod:`rollserve.fixtures.oci`."""

from rollserve.deprecation import moved

__getattr__ = moved(__name__, "rollserve.fixtures.oci")
