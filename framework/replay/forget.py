"""Forgetting subjects: destroy their keys, drop their snapshots, rebuild what read them.

:func:`forget` is the one operation behind ``eventlane forget APP SUBJECT...`` (see
``docs/privacy.md``). For each subject, in this order:

1. its key record in the app's key topic gets a tombstone (every process stops decrypting
   the subject within the key store's refresh interval);
2. snapshots keyed by the subject id get tombstones (sealed snapshots of other aggregates
   became unreadable with the key already);
3. the app's ``on_forget`` hooks run (copies the app made itself, e.g. entity-state
   topics);

then, once for all subjects:

4. the key topic (and every snapshot topic that got a tombstone) has its active segment
   closed and is compacted, so the old key and snapshot bytes are gone from the files;
5. every projector that handles an event class with personal fields is rebuilt from the log
   and handed to its live workers (:func:`~framework.replay.handoff.rebuild_and_swap`), or
   swapped in directly when no read model exists yet, so the live read models agree with a
   rebuild;
6. optionally, the event topics are scanned for records that carry the subjects' cipher
   texts, so the report says what became unreadable.

Forgetting is idempotent: forgetting a subject twice destroys nothing the second time and
rebuilds the read models again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import orjson
from attrs import frozen

from framework.codec.privacy import CIPHER_MARK, LogKeyStore
from framework.domain.privacy import personal_fields
from framework.errors import ConfigError
from framework.log.partitioner import partition_for_key
from framework.observability import get_logger
from framework.replay.handoff import rebuild_and_swap
from framework.replay.progress import NO_PROGRESS, Progress

if TYPE_CHECKING:
    from framework.app import Runtime

log = get_logger("eventlane.replay")

__all__ = ["ForgetReport", "forget", "personal_projectors"]


@frozen
class ForgetReport:
    """What :func:`forget` did."""

    subjects: tuple[str, ...]
    keys_destroyed: tuple[str, ...]
    """Subjects that had a key (the others were unknown or already forgotten)."""
    snapshots_removed: int
    unreadable: dict[str, int]
    """Records per topic that carry cipher texts of the subjects (empty without ``scan``)."""
    rebuilt: tuple[str, ...]
    """Read models rebuilt and swapped in."""

    def to_dict(self) -> dict[str, object]:
        return {
            "subjects": list(self.subjects),
            "keys_destroyed": list(self.keys_destroyed),
            "snapshots_removed": self.snapshots_removed,
            "unreadable": dict(self.unreadable),
            "rebuilt": list(self.rebuilt),
        }


def personal_projectors(runtime: Runtime) -> list[str]:
    """Names of the app's projectors that handle an event class with personal fields."""
    return [
        name
        for name, cls in runtime.app.projectors.items()
        if any(personal_fields(event_cls) for event_cls in cls.handled_types())
    ]


def forget(
    runtime: Runtime,
    subjects: Iterable[str],
    *,
    engine: str = "local",
    scan: bool = True,
    rebuild_readmodels: bool = True,
    progress: Progress = NO_PROGRESS,
) -> ForgetReport:
    """Forget ``subjects`` (see the module docstring); returns a :class:`ForgetReport`."""
    subjects = tuple(dict.fromkeys(subjects))
    keys = runtime.codec.keys
    if not isinstance(keys, LogKeyStore):
        raise ConfigError(
            f"app {runtime.app.name!r} keeps no keys in its log: no event class declares "
            "personal fields (framework.personal), so there is nothing to forget"
        )
    if not subjects or any(not s for s in subjects):
        raise ConfigError("forget needs one or more non-empty subject ids")
    destroyed = tuple(s for s in subjects if keys.forget(s))
    for subject in subjects:
        log.warning("subject forgotten: its key is destroyed", subject=subject, topic=keys.topic)
    snapshot_topics, removed = _drop_snapshots(runtime, subjects)
    for hook in runtime.app.on_forget:
        for subject in subjects:
            hook(runtime, subject)
    keys.erase_history()
    for topic in snapshot_topics:
        for p in range(runtime.log.partition_count(topic)):
            runtime.log.roll(topic, p)
        runtime.log.compact(topic)
    # Other processes stop decrypting the subjects once their key stores catch up: let them
    # before rebuilding, so no worker writes a just-forgotten value into a live read model.
    time.sleep(keys.refresh_seconds * 2)
    rebuilt: list[str] = []
    if rebuild_readmodels:
        for name in personal_projectors(runtime):
            rebuild_and_swap(runtime, name, engine=engine, progress=progress)
            rebuilt.append(name)
    unreadable = _scan(runtime, subjects) if scan else {}
    report = ForgetReport(subjects, destroyed, removed, unreadable, tuple(rebuilt))
    log.info("forget done", **report.to_dict())
    return report


def _drop_snapshots(runtime: Runtime, subjects: tuple[str, ...]) -> tuple[list[str], int]:
    """Tombstones for snapshots keyed by a subject id; the snapshot topics touched."""
    from framework.store.repository import snapshot_topic  # noqa: PLC0415

    touched: list[str] = []
    removed = 0
    log_ = runtime.log
    for cls in runtime.app.aggregates:
        topic = snapshot_topic(runtime.names.aggregate_topic(cls))
        if not log_.topic_exists(topic):
            continue
        count = log_.partition_count(topic)
        for subject in subjects:
            key = subject.encode()
            p = partition_for_key(key, count)
            if log_.key_head(topic, p, key) is None:
                continue
            log_.append(topic, p, [(key, None, (), None)])
            removed += 1
            if topic not in touched:
                touched.append(topic)
    return touched, removed


def _scan(runtime: Runtime, subjects: tuple[str, ...]) -> dict[str, int]:
    """Records per event topic whose value holds a cipher object of one of ``subjects``."""
    needles = [  # how the codec writes them: b'"$eventlane":["enc3","<subject>"' (enc3),
        # b'"$eventlane":"enc2","s":"<subject>"' (enc2 and enc1 objects)
        *(orjson.dumps({CIPHER_MARK: ["enc3", s]})[1:-2] for s in subjects),
        *(
            orjson.dumps({CIPHER_MARK: scheme, "s": s})[1:-1]
            for s in subjects
            for scheme in ("enc2", "enc1")
        ),
    ]
    found: dict[str, int] = {}
    log_ = runtime.log
    for topic in sorted({runtime.names.aggregate_topic(c) for c in runtime.app.aggregates}):
        if not log_.topic_exists(topic):
            continue
        n = 0
        for p in range(log_.partition_count(topic)):
            offsets = log_.offsets(topic, p)
            position = offsets.lwm
            while position < offsets.hwm:
                records, _ = log_.read(topic, p, position, upto=offsets.hwm)
                if not records:
                    break
                for record in records:
                    value = record.value
                    if value is not None and any(needle in value for needle in needles):
                        n += 1
                position = records[-1].offset + 1
        if n:
            found[topic] = n
    return found
