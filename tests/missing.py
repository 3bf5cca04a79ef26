"""A component a test needs is absent from this host: the test skips, naming it, except in CI
(``CI=true``), where every component is installed by ``make`` and a missing one fails."""

from __future__ import annotations

from typing import NoReturn

import pytest

from rollserve.settings import Settings


def missing(message: str, settings: Settings | None = None) -> NoReturn:
    """Skip with ``message``, or fail with it in CI (``settings``: the test's own, if any)."""
    if (settings or Settings()).ci:
        pytest.fail(message)
    pytest.skip(message)
