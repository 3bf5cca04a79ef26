"""Deprecated: this module is now :mod:`rollserve.fixtures.users`."""

from rollserve.deprecation import moved, run_moved

__getattr__ = moved(__name__, "rollserve.fixtures.users")

if __name__ == "__main__":
    run_moved("rollserve.testing.users", "rollserve.fixtures.users")
