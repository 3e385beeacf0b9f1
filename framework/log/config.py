"""Topic configuration: the knobs of brief section 2, validated once, stored as JSON.

Names follow Kafka's topic configs with ``_`` for ``.`` (``retention.ms`` → ``retention_ms``);
both spellings are accepted on input. Unknown keys and bad values raise
:class:`~framework.errors.ConfigError` naming the key, and nothing is created.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from framework.errors import ConfigError
from framework.log.names import validate_topic_name

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


def _check_max(attribute: attrs.Attribute[int], value: int) -> None:
    limit = INT32_MAX if attribute.name in _INT32_KEYS else INT64_MAX
    if value > limit:
        raise ConfigError(f"config {attribute.name} must be at most {limit}, got {value}")


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"config {attribute.name} must be a positive integer, got {value!r}")
    _check_max(attribute, value)


def _non_negative(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"config {attribute.name} must be an integer >= 0, got {value!r}")
    _check_max(attribute, value)


def _minus_one_or_positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or (value <= 0 and value != -1):
        raise ConfigError(
            f"config {attribute.name} must be a positive integer or -1 (unbounded), got {value!r}"
        )
    _check_max(attribute, value)


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(_: object, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in choices:
            raise ConfigError(
                f"config {attribute.name} must be one of {', '.join(choices)}, got {value!r}"
            )

    return check


@attrs.frozen(kw_only=True)
class TopicConfig:
    """A topic's configuration. Immutable; :meth:`evolve` makes altered copies.

    ``flush_policy``: ``always`` fsyncs every appended batch before acknowledging it (the
    high-water mark covers only fsynced records); ``os`` acknowledges after the write reaches
    the OS page cache (survives a process crash, not a power loss), as Kafka does by default.
    """

    cleanup_policy: str = attrs.field(default="delete", validator=_one_of(CLEANUP_POLICIES))
    retention_ms: int = attrs.field(default=7 * DAY_MS, validator=_minus_one_or_positive)
    retention_bytes: int = attrs.field(default=-1, validator=_minus_one_or_positive)
    segment_bytes: int = attrs.field(default=1 << 30, validator=_positive)
    segment_ms: int = attrs.field(default=7 * DAY_MS, validator=_positive)
    min_compaction_lag_ms: int = attrs.field(default=0, validator=_non_negative)
    delete_retention_ms: int = attrs.field(default=DAY_MS, validator=_non_negative)
    max_record_bytes: int = attrs.field(default=1_048_588, validator=_positive)
    timestamp_type: str = attrs.field(default="CreateTime", validator=_one_of(TIMESTAMP_TYPES))
    flush_policy: str = attrs.field(default="always", validator=_one_of(FLUSH_POLICIES))
    index_interval_bytes: int = attrs.field(default=4096, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.segment_bytes >= 1 << 32:
            raise ConfigError(f"config segment_bytes must be < 4 GiB, got {self.segment_bytes}")

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
        framework.errors.ConfigError: unknown topic config key 'retention.hours'; known keys: ...
        """
        if not isinstance(values, Mapping):
            raise ConfigError(f"topic config must be a mapping, not {type(values).__name__}")
        fields = {f.name: f for f in attrs.fields(cls)}
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
        return attrs.evolve(base or cls(), **changes)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        return attrs.asdict(self)


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
