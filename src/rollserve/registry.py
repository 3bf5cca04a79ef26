"""A registry of plug-ins by name, owned by whoever builds it (no module-level state)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from rollserve.errors import UnknownNameError

T = TypeVar("T")
A = TypeVar("A")


class Registry(Generic[T]):
    """Plug-ins of one kind (sandbox backends, task handlers, agents) registered by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T, *, replace: bool = False) -> None:
        """Add ``item`` under ``name``; re-registering a name needs ``replace=True``."""
        if name in self._items and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item

    def get(self, name: str) -> T:
        """The plug-in called ``name``; an unknown name raises an error listing the known ones."""
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, list(self._items)) from None

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)


def made(factories: Registry[Callable[[A], T]], arg: A) -> Registry[T]:
    """The plug-ins ``factories`` make from ``arg`` (a node's settings), under the same names
    and in the same order."""
    registry: Registry[T] = Registry(factories.kind)
    for name in factories:
        registry.register(name, factories.get(name)(arg))
    return registry
