"""Upcasters: functions that rewrite an event's stored data one schema version up.

An upcaster for ``(name, v)`` takes the ``data`` object of an event stored as version ``v``
of type ``name`` and returns the data of version ``v + 1``. A chain runs the upcasters
``v → v+1 → … → current`` in order, on every read path, before the data is structured into
the current class. Upcasters work on plain JSON-shaped dicts (never on classes), so old
versions need no Python class at all. They may mutate and return their argument.

Rules, checked by :func:`check_upcasters` at start-up (``EventRegistry.validate``):

* an upcaster names a registered current type name (not an alias) and a ``from_version``
  with ``1 <= from_version < current version``;
* the upcasters of a type cover every version from the lowest one registered up to the
  current version, without a gap (duplicates are refused when registered).

Data stored with a version below the lowest upcaster, or above the current version, is
unknown: decoding it fails loudly rather than guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import frozen

from eventlane.errors import UpcastError

__all__ = ["UpcastChain", "Upcaster", "check_upcasters", "lowest_upcastable"]

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
"""``data`` of version v → ``data`` of version v + 1."""


def check_upcasters(
    current: Mapping[str, int],
    upcasters: Mapping[tuple[str, int], Upcaster],
    aliases: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`~eventlane.errors.UpcastError` unless every chain is complete.

    ``current`` maps each registered type name to its current version.

    >>> up = lambda d: d
    >>> check_upcasters({"OrderPlaced": 3}, {("OrderPlaced", 1): up, ("OrderPlaced", 2): up})
    >>> check_upcasters({"OrderPlaced": 4}, {("OrderPlaced", 1): up, ("OrderPlaced", 3): up})
    Traceback (most recent call last):
    ...
    eventlane.errors.UpcastError: upcaster chain of OrderPlaced has a gap: no upcaster from \
version 2 to 3 (chain 1 → 4) (type=OrderPlaced, version=2)
    """
    aliases = aliases or {}
    by_name: dict[str, list[int]] = {}
    for name, from_version in upcasters:
        if name in aliases:
            raise UpcastError(
                f"upcaster registered for {name!r}, which is an alias of {aliases[name]!r}: "
                "register it under the current type name",
                type_name=name,
                version=from_version,
            )
        if name not in current:
            raise UpcastError(
                f"upcaster registered for unknown event type {name!r}",
                type_name=name,
                version=from_version,
            )
        if not 1 <= from_version < current[name]:
            raise UpcastError(
                f"upcaster of {name} from version {from_version} is out of range: the "
                f"current version is {current[name]}, so upcasters go from 1 to "
                f"{current[name] - 1}",
                type_name=name,
                version=from_version,
            )
        by_name.setdefault(name, []).append(from_version)
    for name, versions in by_name.items():
        lowest = min(versions)
        present = set(versions)
        for version in range(lowest, current[name]):
            if version not in present:
                raise UpcastError(
                    f"upcaster chain of {name} has a gap: no upcaster from version {version} "
                    f"to {version + 1} (chain {lowest} → {current[name]})",
                    type_name=name,
                    version=version,
                )


def lowest_upcastable(name: str, upcasters: Mapping[tuple[str, int], Upcaster]) -> int | None:
    """The lowest version of ``name`` an upcaster starts from, or ``None``."""
    versions = [version for (n, version) in upcasters if n == name]
    return min(versions) if versions else None


@frozen
class UpcastChain:
    """The upcasters taking ``type_name`` data from ``from_version`` to ``to_version``.

    ``steps[i]`` upcasts version ``from_version + i``. Call it with the stored data.
    """

    type_name: str
    from_version: int
    to_version: int
    steps: tuple[Upcaster, ...]

    def __call__(
        self,
        data: dict[str, Any],
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> dict[str, Any]:
        """Run the steps in order; any failure is an :class:`~eventlane.errors.UpcastError`."""
        version = self.from_version
        for step in self.steps:
            try:
                data = step(data)
            except Exception as exc:
                raise UpcastError(
                    f"upcaster of {self.type_name} from version {version} to {version + 1} "
                    f"({getattr(step, '__qualname__', step)!s}) failed: {exc!r}",
                    type_name=self.type_name,
                    version=version,
                    topic=topic,
                    partition=partition,
                    offset=offset,
                ) from exc
            if type(data) is not dict:
                raise UpcastError(
                    f"upcaster of {self.type_name} from version {version} returned "
                    f"{type(data).__name__}, expected a dict",
                    type_name=self.type_name,
                    version=version,
                    topic=topic,
                    partition=partition,
                    offset=offset,
                )
            version += 1
        return data
