"""Topic names and the paths they map to.

Kafka's rule, which eventlane keeps so a topic can move to Kafka unchanged: a name is 1 to 249
characters from ``[a-zA-Z0-9._-]`` and is neither ``.`` nor ``..``. Because no separator or
parent reference can pass the rule, a topic's directory can never resolve outside the data
directory; :func:`topic_dir` checks that again anyway.
"""

from __future__ import annotations

import re
from pathlib import Path

from framework.errors import InvalidTopicError

MAX_TOPIC_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: object) -> str:
    """Return ``name`` if it is a legal topic name, else raise :class:`InvalidTopicError`.

    >>> validate_topic_name("orders.v1")
    'orders.v1'
    >>> validate_topic_name("../etc")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    framework.errors.InvalidTopicError: topic name '../etc' is illegal: ...
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
    return name


def topic_dir(topics_root: Path, name: str) -> Path:
    """The directory of topic ``name`` under ``topics_root``, checked to stay inside it."""
    path = topics_root / validate_topic_name(name)
    if path.resolve().parent != topics_root.resolve():
        raise InvalidTopicError(f"topic {name!r} resolves outside the data directory", topic=name)
    return path
