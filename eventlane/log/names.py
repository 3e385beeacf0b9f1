"""Topic names and the paths they map to.

Kafka's rule, which eventlane keeps so a topic can move to Kafka unchanged: a name is 1 to 249
characters from ``[a-zA-Z0-9._-]`` and is neither ``.`` nor ``..``. Because no separator or
parent reference can pass the rule, a topic's directory can never resolve outside the data
directory; :func:`topic_dir` checks that again anyway.

One deliberate difference from Kafka: a name may not **start with** ``.``. The topics
directory reserves those names for its own transient entries (``.creating-<hex>`` while a
topic is created, ``.deleted-<hex>`` while one is removed, which recovery may delete), so a
topic named like them could be mistaken for one; Kafka has no such directory to share.

**Internal topics** (:data:`INTERNAL_TOPICS`) are written only by eventlane itself: users may
neither create them with another cleanup policy (``cleanup`` would then erase every group's
commits) nor produce to them (a forged commit).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from eventlane.errors import ConfigError, InvalidTopicError

MAX_TOPIC_LENGTH = 249
INTERNAL_TOPICS: dict[str, str] = {"__consumer_offsets": "compact"}
"""Internal topic name → the cleanup policy it must keep."""
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: object) -> str:
    """Return ``name`` if it is a legal topic name, else raise :class:`InvalidTopicError`.

    >>> validate_topic_name("orders.v1")
    'orders.v1'
    >>> validate_topic_name("../etc")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    eventlane.errors.InvalidTopicError: topic name '../etc' is illegal: ...
    """
    if not isinstance(name, str):
        raise InvalidTopicError(f"topic name must be a string, not {type(name).__name__}")
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}", topic=name)
    if len(name) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters; the limit is {MAX_TOPIC_LENGTH}",
            topic=name[:40] + "...",
        )
    if not _LEGAL.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} is illegal: only ASCII letters, digits, '.', '_' and '-' are"
            " allowed",
            topic=name.encode("unicode_escape").decode("ascii"),
        )
    if name.startswith("."):
        raise InvalidTopicError(
            f"topic name {name!r} is reserved: names starting with '.' are the topics"
            " directory's own (.creating-*, .deleted-*)",
            topic=name,
        )
    return name


def topic_dir(topics_root: Path, name: str) -> Path:
    """The directory of topic ``name`` under ``topics_root``, checked to stay inside it."""
    path = topics_root / validate_topic_name(name)
    # A legal name is one component, never "." or "..": only a symbolic link can lead out,
    # so the costly resolve (a stat per component, twice) is paid for links alone.
    if os.path.islink(path) and path.resolve().parent != topics_root.resolve():
        raise InvalidTopicError(f"topic {name!r} resolves outside the data directory", topic=name)
    return path


def check_internal_policy(name: str, cleanup_policy: str) -> None:
    """Refuse a cleanup policy an internal topic must not have (create or alter)."""
    required = INTERNAL_TOPICS.get(name)
    if required is not None and cleanup_policy != required:
        raise ConfigError(
            f"internal topic {name!r} must keep cleanup.policy={required}, got {cleanup_policy!r}",
            topic=name,
        )


def refuse_internal(name: str, action: str) -> None:
    """Raise :class:`InvalidTopicError` if ``name`` is an internal topic (users may not
    ``action`` it)."""
    if isinstance(name, str) and name in INTERNAL_TOPICS:
        raise InvalidTopicError(
            f"{name!r} is an internal topic, written only by eventlane: cannot {action}",
            topic=name,
        )
