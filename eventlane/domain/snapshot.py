"""Snapshots: an aggregate's state captured at a version, as plain domain values.

A snapshot is what :meth:`Aggregate.take_snapshot` returns and
:meth:`Aggregate.from_snapshot` restores. It holds domain objects, not bytes; the codec
(:mod:`eventlane.codec.snapshot`) turns it into a record for the ``<topic>.snapshots``
topic.

Invariants: ``aggregate_version >= 0`` is the number of events the state reflects, so
loading = snapshot + the events with versions ``> aggregate_version``; ``snapshot_version``
is the aggregate class's ``snapshot_version`` when it was taken, and a snapshot whose
``snapshot_version`` differs from the class's is stale: ignored and rebuilt, never read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import field, frozen, validators

__all__ = ["Snapshot"]


@frozen
class Snapshot:
    """State of aggregate ``aggregate_id`` after ``aggregate_version`` events."""

    aggregate_id: str
    aggregate_version: int = field(validator=validators.ge(0))
    snapshot_version: int = field(validator=validators.ge(1))
    state: Mapping[str, Any]
