"""Topic configuration: the knobs of brief section 2, validated once, stored as JSON.

Names follow Kafka's topic configs with ``_`` for ``.`` (``retention.ms`` → ``retention_ms``);
both spellings are accepted on input. Unknown keys and bad values raise
:class:`~eventlane.errors.ConfigError` naming the key, and nothing is created.

:class:`TopicConfig` is a frozen standard-library dataclass, not an ``attrs`` class: every
command that opens a log (``eventlane topics list`` included) imports this module, and
``attrs`` alone cost about a quarter of that command's start-up (issue 15).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

from eventlane.errors import ConfigError
from eventlane.log.names import validate_topic_name
from eventlane.observability import get_logger

DAY_MS = 24 * 60 * 60 * 1000
MAX_PARTITIONS = 10_000
"""The most partitions a topic may have."""
CleanupPolicy = Literal["delete", "compact", "compact,delete"]
CLEANUP_POLICIES: tuple[str, ...] = ("delete", "compact", "compact,delete")
TIMESTAMP_TYPES: tuple[str, ...] = ("CreateTime", "LogAppendTime")
FLUSH_POLICIES: tuple[str, ...] = ("always", "os")
INT64_MAX = 2**63 - 1
"""Largest value of an integer config (Kafka's ``long``; stored as a JSON int64)."""
INT32_MAX = 2**31 - 1
"""Largest value of a size that a batch header or index entry holds (Kafka's ``int``)."""
_INT32_KEYS = ("max_record_bytes", "index_interval_bytes")


def _check_max(name: str, value: int) -> None:
    limit = INT32_MAX if name in _INT32_KEYS else INT64_MAX
    if value > limit:
        raise ConfigError(f"config {name} must be at most {limit}, got {value}")


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"config {name} must be a positive integer, got {value!r}")
    _check_max(name, value)


def _non_negative(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"config {name} must be an integer >= 0, got {value!r}")
    _check_max(name, value)


def _minus_one_or_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or (value <= 0 and value != -1):
        raise ConfigError(
            f"config {name} must be a positive integer or -1 (unbounded), got {value!r}"
        )
    _check_max(name, value)


def _one_of(choices: tuple[str, ...]) -> Callable[[str, object], None]:
    def check(name: str, value: object) -> None:
        if value not in choices:
            raise ConfigError(f"config {name} must be one of {', '.join(choices)}, got {value!r}")

    return check


_CHECKS: dict[str, Callable[[str, object], None]] = {
    "cleanup_policy": _one_of(CLEANUP_POLICIES),
    "retention_ms": _minus_one_or_positive,
    "retention_bytes": _minus_one_or_positive,
    "segment_bytes": _positive,
    "segment_ms": _positive,
    "min_compaction_lag_ms": _non_negative,
    "delete_retention_ms": _non_negative,
    "max_record_bytes": _positive,
    "timestamp_type": _one_of(TIMESTAMP_TYPES),
    "flush_policy": _one_of(FLUSH_POLICIES),
    "index_interval_bytes": _positive,
}
"""The check of every field (all of them: :meth:`TopicConfig.__post_init__` runs each)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfig:
    """A topic's configuration. Immutable; :meth:`evolve` makes altered copies.

    Every instance is valid: construction runs the check of each field (:data:`_CHECKS`) and
    raises :class:`~eventlane.errors.ConfigError` naming the first bad one.

    ``flush_policy``: ``always`` fsyncs every appended batch before acknowledging it (the
    high-water mark covers only fsynced records); ``os`` acknowledges after the write reaches
    the OS page cache (survives a process crash, not a power loss), as Kafka does by default.
    """

    cleanup_policy: str = "delete"
    retention_ms: int = 7 * DAY_MS
    retention_bytes: int = -1
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * DAY_MS
    min_compaction_lag_ms: int = 0
    delete_retention_ms: int = DAY_MS
    max_record_bytes: int = 1_048_588
    timestamp_type: str = "CreateTime"
    flush_policy: str = "always"
    index_interval_bytes: int = 4096

    def __post_init__(self) -> None:
        for name, check in _CHECKS.items():
            check(name, getattr(self, name))
        if self.segment_bytes >= 1 << 32:
            raise ConfigError(f"config segment_bytes must be < 4 GiB, got {self.segment_bytes}")

    def evolve(self, **changes: Any) -> TopicConfig:
        """A copy with ``changes`` applied (validated as a new config is)."""
        return dataclasses.replace(self, **changes)

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.timestamp_type == "LogAppendTime"

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, object], base: TopicConfig | None = None
    ) -> TopicConfig:
        """Build a config from user input (``retention.ms`` or ``retention_ms``; ints as text ok).

        >>> TopicConfig.from_mapping({"retention.ms": "-1", "cleanup.policy": "compact"}).compact
        True
        >>> TopicConfig.from_mapping({"retention.hours": 1})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        eventlane.errors.ConfigError: unknown topic config key 'retention.hours'; known keys: ...
        """
        if not isinstance(values, Mapping):
            raise ConfigError(f"topic config must be a mapping, not {type(values).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        changes: dict[str, object] = {}
        for raw_key, raw_value in values.items():
            if not isinstance(raw_key, str):
                raise ConfigError(f"topic config keys must be strings, got {raw_key!r}")
            key = raw_key.replace(".", "_").replace("-", "_")
            if key not in fields:
                raise ConfigError(
                    f"unknown topic config key {raw_key!r}; known keys: {', '.join(sorted(fields))}"
                )
            value: object = raw_value
            if fields[key].type in ("int", int) and isinstance(raw_value, str):
                try:
                    value = int(raw_value)
                except ValueError:
                    raise ConfigError(
                        f"config {key} must be an integer, got {raw_value!r}"
                    ) from None
            changes[key] = value
        return (base or cls()).evolve(**changes)

    def to_dict(self) -> dict[str, object]:
        """Every field by name, in declaration order (what ``topic.json`` stores)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def altered_partitions(name: str, current: int, wanted: int | None) -> int:
    """The partition count ``alter_topic(partitions=wanted)`` gives a topic of ``current``
    partitions (``current`` when ``wanted`` is None); refused with a
    :class:`~eventlane.errors.ConfigError` above :data:`MAX_PARTITIONS` or below ``current``
    (records would be lost). Every engine's ``alter_topic`` applies this one rule."""
    if wanted is None:
        return current
    if not isinstance(wanted, int) or wanted > MAX_PARTITIONS:
        raise ConfigError(f"partitions must be an integer <= {MAX_PARTITIONS}", topic=name)
    if wanted < current:
        raise ConfigError(
            f"cannot decrease partitions of {name!r} from {current} to {wanted}: records"
            " would be lost",
            topic=name,
        )
    return wanted


def warn_partitions_increased(name: str, old: int, new: int) -> None:
    """The warning every engine's ``alter_topic`` gives when it adds partitions: keys placed
    by hash may now land elsewhere than their older records."""
    get_logger("eventlane.log").warning(
        "partition count increased: new records with the same key may land"
        " in a different partition than older ones",
        topic=name,
        old=old,
        new=new,
    )


def new_topic_config(
    name: str, partitions: object, config: TopicConfig | Mapping[str, object] | None
) -> TopicConfig:
    """Check a create-topic request (the name, a partition count in [1, MAX_PARTITIONS]) and
    return its config: what every engine checks before it creates anything."""
    validate_topic_name(name)
    if (
        not isinstance(partitions, int)
        or isinstance(partitions, bool)
        or not (1 <= partitions <= MAX_PARTITIONS)
    ):
        raise ConfigError(
            f"partitions must be an integer in [1, {MAX_PARTITIONS}], got {partitions!r}",
            topic=name,
        )
    return config if isinstance(config, TopicConfig) else TopicConfig.from_mapping(config or {})
