"""Positions on the log, and their tokens: what a write returns for read-your-writes.

A :class:`Position` is a mapping ``TopicPartition -> next offset``: a reader (a projection,
a consumer) *has reached* it when, on every partition it names, it has applied everything
below that offset. Every write of the command side returns one (``save``, ``execute``,
``issue``), and ``Runtime.wait_for`` waits for it.

Its :attr:`~Position.token` is a short, URL- and header-safe string (characters
``[A-Za-z0-9._~-]`` only, nothing to escape in a query parameter or an HTTP header), to hand
to a client and get back with its next request::

    >>> p = Position.of([RecordMetadata("orders", 3, 16, 0), RecordMetadata("orders", 3, 17, 0)])
    >>> p.token
    'p1~orders~3~16-18'
    >>> Position.parse('p1~orders~3~16-18') == p, p[TopicPartition("orders", 3)]
    (True, 18)
    >>> (p | Position({TopicPartition("invoices", 0): 5})).token
    'p1~invoices~0~5~orders~3~16-18'

A position made from a write also names the records written (``16-18``: offsets 16 and 17):
a *causal* wait starts from them (``Runtime.wait_causal``), following what policies did
because of them. :meth:`Position.written` lists them.

Invariants: ``parse(p.token) == p``; a token names each partition once (the furthest
position wins when positions are joined); topics are legal topic names (``[A-Za-z0-9._-]``),
so ``~`` never occurs inside one. A string that is not a token raises
:class:`~eventlane.errors.InvalidPositionError` saying why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

from eventlane.errors import InvalidPositionError
from eventlane.log.record import RecordMetadata, TopicPartition

__all__ = ["Position", "Written"]

_PREFIX = "p1"
_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_NUMBER = re.compile(r"[0-9]{1,18}")
"""A partition or an offset in a token: ASCII digits (``str.isdigit`` takes ``²`` too), at
most 18 of them (below 2**63, Kafka's offsets)."""
_MAX_TOKEN = 4096


class Position(Mapping[TopicPartition, int]):
    """Partition -> next offset to reach (see the module docstring). Immutable."""

    __slots__ = ("_first", "_offsets")

    def __init__(
        self,
        offsets: Mapping[TopicPartition, int] | None = None,
        first: Mapping[TopicPartition, int] | None = None,
    ) -> None:
        self._offsets: dict[TopicPartition, int] = {
            TopicPartition(*tp): int(off) for tp, off in (offsets or {}).items()
        }
        self._first: dict[TopicPartition, int] = {
            tp: off
            for tp, off in ((TopicPartition(*t), int(o)) for t, o in (first or {}).items())
            if tp in self._offsets and off < self._offsets[tp]
        }

    @classmethod
    def of(cls, written: Iterable[RecordMetadata]) -> Position:
        """The position just after the records ``written`` (what an append returned),
        naming them."""
        out: dict[TopicPartition, int] = {}
        first: dict[TopicPartition, int] = {}
        for meta in written:
            tp = TopicPartition(meta.topic, meta.partition)
            out[tp] = max(out.get(tp, 0), meta.offset + 1)
            first[tp] = min(first.get(tp, meta.offset), meta.offset)
        return cls(out, first)

    def written(self) -> dict[TopicPartition, range]:
        """The offsets of the records this position was made from, per partition (empty
        for a position that names none): everything from the first record written to the
        position, records of other writers in between included."""
        return {tp: range(first, self._offsets[tp]) for tp, first in self._first.items()}

    def __getitem__(self, tp: TopicPartition) -> int:
        return self._offsets[tp]

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)

    def __or__(self, other: Mapping[TopicPartition, int]) -> Position:
        """Both positions: the furthest offset of each partition."""
        out = dict(self._offsets)
        first = dict(self._first)
        for tp, off in other.items():
            out[tp] = max(out.get(tp, 0), off)
        if isinstance(other, Position):
            for tp, off in other._first.items():
                first[tp] = min(first.get(tp, off), off)
        return Position(out, first)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Position):
            return self._offsets == other._offsets and self._first == other._first
        return isinstance(other, Mapping) and dict(self._offsets) == dict(other)

    def __hash__(self) -> int:
        return hash(frozenset(self._offsets.items()))

    def __repr__(self) -> str:
        return f"Position({self.token!r})"

    @property
    def token(self) -> str:
        """The position as a short string (see the module docstring)."""
        parts = [_PREFIX]
        for tp in sorted(self._offsets):
            first = self._first.get(tp)
            end = str(self._offsets[tp])
            parts += [tp.topic, str(tp.partition), end if first is None else f"{first}-{end}"]
        return "~".join(parts)

    def __str__(self) -> str:
        return self.token

    @classmethod
    def parse(cls, token: str) -> Position:
        """The position a token names; :class:`InvalidPositionError` when it is not one."""
        if not isinstance(token, str) or len(token) > _MAX_TOKEN:
            raise InvalidPositionError(f"not a position token: {str(token)[:80]!r}")
        parts = token.split("~")
        if parts[0] != _PREFIX:
            raise InvalidPositionError(
                f"not a position token: {token[:80]!r} (tokens start with {_PREFIX + '~'!r})"
            )
        fields = parts[1:]
        if len(fields) % 3:
            raise InvalidPositionError(
                f"position token {token[:80]!r} is cut short: expected topic~partition~offset"
                " groups"
            )
        out: dict[TopicPartition, int] = {}
        firsts: dict[TopicPartition, int] = {}
        for i in range(0, len(fields), 3):
            topic, partition, offset = fields[i : i + 3]
            first, _, end = offset.rpartition("-")
            if not _TOPIC.fullmatch(topic):
                raise InvalidPositionError(f"position token {token[:80]!r}: bad topic {topic!r}")
            numbers = (partition, end, first) if first else (partition, end)
            if not all(_NUMBER.fullmatch(n) for n in numbers) or (first and int(first) >= int(end)):
                raise InvalidPositionError(
                    f"position token {token[:80]!r}: partition and offset must be numbers,"
                    f" got {partition!r} and {offset!r}"
                )
            tp = TopicPartition(topic, int(partition))
            if tp in out:
                raise InvalidPositionError(
                    f"position token {token[:80]!r} names {topic}-{partition} twice"
                )
            out[tp] = int(end)
            if first:
                firsts[tp] = int(first)
        return cls(out, firsts)


class Written(list[RecordMetadata]):
    """What a write returns: the records' metadata (a list, as before), and their
    :attr:`position` (its :attr:`~Position.token` for a client)."""

    @property
    def position(self) -> Position:
        return Position.of(self)

    @property
    def token(self) -> str:
        return self.position.token
