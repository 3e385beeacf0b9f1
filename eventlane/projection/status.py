"""Where a projection stands: per-partition position, high-water mark, lag, members; and
read-your-writes (wait until a projection has applied given offsets).

Both only read: the positions come from a read-only connection to the read model (the
truth: what was applied, committed with the events), the high-water marks from the log, the
members from the group's shared state. Nothing here needs a running worker.

:func:`projection_status` returns (and ``eventlane project status --json`` prints)::

    {"projector": NAME, "group": GROUP, "readmodel": PATH, "exists": bool,
     "generation": N | null,
     "partitions": [{"topic", "partition", "position", "lwm", "hwm", "lag", "owner"}],
     "lag": total, "members": [{"member_id", "pid", "host", "alive",
                                "assignment": ["topic-partition", ...]}],
     "dead_letters": {"dead": n, "parked": n, "retried": n},
     "pending_migrations": [name, ...], "breaker": null | BREAKER,
     "waiting": [{"topic", "partition", "offset", "event_type", "version",
                  "known_version", "since_ms", "message"}]}

``group`` is the projector's consumer group: its name in the app's namespace
(:mod:`eventlane.app.namespace`; ``Runtime.status`` fills both). ``breaker`` is the record
of a tripped poison-rate breaker (:mod:`.breaker`), ``null`` while none tripped since a
worker last started. ``waiting`` lists the partitions stopped at an event newer than the
workers' code (:mod:`.waiting`), with ``message`` as ``waiting for code that knows
GuestRegistered v2 ...``.

``position`` is the next offset to apply (``null``: never claimed, so the projection starts
at the low-water mark); ``lag = hwm - position`` (``hwm - lwm`` when null); ``owner`` the
member id owning the partition now (``null``: nobody).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from eventlane.consumer.admin import partition_lag
from eventlane.consumer.coordination import coordination_for
from eventlane.errors import UnknownTopicError
from eventlane.log import Log, RecordMetadata, TopicPartition
from eventlane.projection._sqlite_utils import Migrations
from eventlane.projection.breaker import load_tripped
from eventlane.projection.postgres import PgReadModelView
from eventlane.projection.readmodel import ReadModelView
from eventlane.projection.store import AnyReadModelView, Location, open_view
from eventlane.projection.waiting import current_waits

__all__ = ["notify_applied", "offsets_after", "projection_status", "wait_for_offsets"]


def offsets_after(
    written: Iterable[RecordMetadata] | Mapping[TopicPartition, int],
) -> dict[TopicPartition, int]:
    """The positions a projection must reach to have applied ``written``.

    ``written`` is what a save returned (records: each needs its ``offset + 1``) or already
    a mapping ``partition -> next offset``.

    >>> offsets_after([RecordMetadata("t", 0, 4, 0), RecordMetadata("t", 0, 5, 0)])
    {TopicPartition(topic='t', partition=0): 6}
    """
    if isinstance(written, Mapping):
        return {TopicPartition(*tp): int(o) for tp, o in written.items()}
    out: dict[TopicPartition, int] = {}
    for meta in written:
        tp = TopicPartition(meta.topic, meta.partition)
        out[tp] = max(out.get(tp, 0), meta.offset + 1)
    return out


def wait_for_offsets(
    log: Log, path: Location, offsets: Mapping[TopicPartition, int], timeout: float
) -> bool:
    """Wait until the read model at ``path`` (a file, or a PostgreSQL schema) has applied
    everything below ``offsets`` (positions ``>=`` each offset). Returns False on timeout.

    Workers wake waiters after every committed batch (the log's notifier), so this returns
    within a few milliseconds of the commit; it re-checks at least every 50 ms anyway.
    """
    deadline = time.monotonic() + timeout
    with open_view(path) as view:
        while True:
            seen = log.wait_seq()
            positions = view.positions()
            if all(positions.get(tp, -1) >= off for tp, off in offsets.items()):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            log.wait(seen, min(remaining, 0.05))


def notify_applied(log: Log) -> None:
    """Wake read-your-writes waiters (called by workers after each committed batch)."""
    log.wake()


def projection_status(
    log: Log,
    name: str,
    topics: Iterable[str],
    path: Path,
    migrations: Migrations | None = None,
    view: AnyReadModelView | None = None,
) -> dict[str, Any]:
    """The status document of projector ``name`` (see the module docstring); ``view``: the
    read model's view when it is not the SQLite file at ``path`` (PostgreSQL)."""
    members: list[dict[str, Any]] = []
    owners: dict[TopicPartition, str] = {}
    generation: int | None = None
    groups = coordination_for(log)
    if groups.has_state(name):
        coord = groups.coordinator(name)
        try:
            state = coord.current()
            alive = set(coord.alive(state))
        finally:
            coord.close()
        generation = state.generation
        for m in sorted(state.members.values(), key=lambda m: m.member_id):
            for tp in m.owned:
                owners[tp] = m.member_id
            members.append(
                {
                    "member_id": m.member_id,
                    "pid": m.pid,
                    "host": m.host,
                    "alive": m.member_id in alive,
                    "assignment": [f"{tp.topic}-{tp.partition}" for tp in sorted(m.owned)],
                }
            )
    reader = view if view is not None else ReadModelView(path)
    with reader:
        positions = reader.positions()
        dead = reader.dead_letter_counts()
        # A read model that does not exist yet is created at its latest schema: none pending.
        exists = reader.conn is not None
        pending = [] if migrations is None or not exists else reader.pending_migrations(migrations)
        waiting = current_waits(reader.conn)
    rows = []
    total = 0
    for topic in topics:
        try:
            count = log.partition_count(topic)
        except UnknownTopicError:
            continue
        for p in range(count):
            tp = TopicPartition(topic, p)
            offs = log.offsets(topic, p)
            position = positions.get(tp)
            lag = partition_lag(offs.hwm, offs.lwm, position)
            total += lag
            rows.append(
                {
                    "topic": topic,
                    "partition": p,
                    "position": position,
                    "lwm": offs.lwm,
                    "hwm": offs.hwm,
                    "lag": lag,
                    "owner": owners.get(tp),
                }
            )
    return {
        "projector": name,
        "group": name,
        "readmodel": str(reader.path),
        "exists": exists if isinstance(reader, PgReadModelView) else path.exists(),
        "generation": generation,
        "partitions": rows,
        "lag": total,
        "members": members,
        "dead_letters": dead,
        "pending_migrations": pending,
        "breaker": load_tripped(path),
        "waiting": waiting,
    }
