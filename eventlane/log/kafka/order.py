"""Validation by log order: the one rule that decides which conditional appends on Kafka
happened (docs/scale-out.md, "The event store on Kafka").

Kafka has no conditional append. eventlane's conditional append on Kafka (``append(expect=
Expect(key, last))``) writes its records *with the expectation in their headers*, like any
append; whether it happened is then decided by the partition's order, by this rule, which
every eventlane reader applies the same way (the log's reads, per-key reads and key heads,
the group consumer, Spark through the log's reads, the console):

* a **plain record** (no rule header) is always visible;
* the first record of a conditional append (the *lead*) carries :data:`EXPECT`: ``b"<n>"``
  ("the key's last visible record is at offset n") or ``b"-<l>"`` ("the key has no visible
  record at or above offset l", l being the low-water mark the writer saw). It is visible
  iff that holds just before it, counting visible records only. The key checked is the
  lead's key, or :data:`EXPECT_KEY` where the expectation names another key;
* the other records of that append carry :data:`FOLLOWS` (``b"<i>"``: i records after the
  lead; an atomic append is one Kafka batch, so the lead is at ``offset - i``) and are
  visible iff the lead is.

The writer learns its outcome by reading the partition up to its own records and applying
the rule (:mod:`.keyed`). The verdict is a function of the partition's records from the
first conditional record's expectation on, so two readers that read the same records judge
them the same, whatever process, host or time: a rejected append is never visible to
anyone, and no stream can fork. A reader whose view starts above an expectation (records
deleted below the low-water mark) judges that record by what it can see
(:class:`Verdicts`, ``start``); event topics never delete records.

This module is pure (no I/O): the tests' oracle applies its own copy of the rule to the raw
partition read with confluent-kafka.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter, itemgetter

from eventlane.log.record import Record
from eventlane.log.types import Expect, RecordTuple

__all__ = ["EXPECT", "EXPECT_KEY", "FOLLOWS", "Verdicts", "any_conditional", "conditional", "stamp"]

EXPECT = "eventlane.expect"
EXPECT_KEY = "eventlane.expect.key"
FOLLOWS = "eventlane.follows"
_RULE_HEADERS = frozenset((EXPECT, FOLLOWS))
_name, _headers = itemgetter(0), attrgetter("headers")


def stamp(records: Sequence[RecordTuple], expect: Expect, lwm: int) -> list[RecordTuple]:
    """``records`` with the rule's headers: the expectation on the first, the position on
    the others. ``lwm``: the low-water mark the writer's check saw (for "no record yet")."""
    want = b"-%d" % lwm if expect.last_offset is None else b"%d" % expect.last_offset
    out: list[RecordTuple] = []
    for i, (key, value, headers, ts) in enumerate(records):
        if i == 0:
            extra: tuple[tuple[str, bytes | None], ...] = ((EXPECT, want),)
            if expect.key != key:
                extra += ((EXPECT_KEY, expect.key),)
        else:
            extra = ((FOLLOWS, b"%d" % i),)
        out.append((key, value, (*headers, *extra), ts))
    return out


def conditional(record: Record) -> bool:
    """Whether the rule may reject ``record`` (it carries a rule header)."""
    return not _RULE_HEADERS.isdisjoint(map(_name, record.headers))


def any_conditional(records: Sequence[Record]) -> bool:
    """Whether the rule may reject any of ``records``: a record without headers is plain,
    so a batch of such records (any topic no conditional append writes to) costs one
    C-level pass and no header is looked at."""
    return any(map(_headers, records)) and any(map(conditional, records))


class Verdicts:
    """The rule applied to one partition, record after record in offset order, from
    ``start`` (the first offset this reader sees).

    Invariant: ``heads[key]`` is the offset of ``key``'s last visible record judged so far;
    :meth:`judge` is called once per record, in offset order, and never revised."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.heads: dict[bytes, int] = {}
        self._lead = (-1, False)  # the last lead judged: (offset, visible)

    def judge(
        self, offset: int, key: bytes | None, headers: Sequence[tuple[str, bytes | None]]
    ) -> bool:
        """Whether the record at ``offset`` is visible (and remember it if so)."""
        expect: bytes | None = None
        expect_key = key
        follows = 0
        for name, value in headers:
            if name == EXPECT:
                expect = value or b""
            elif name == EXPECT_KEY:
                expect_key = value
            elif name == FOLLOWS:
                follows = int(value or b"0")
        if follows:
            lead_at, lead_ok = self._lead
            # a lead below this reader's view: judged visible (the writer saw it succeed
            # before anyone could delete below it)
            visible = lead_ok if lead_at == offset - follows else offset - follows < self.start
        elif expect is not None:
            visible = self._holds(expect, expect_key)
            self._lead = (offset, visible)
        else:
            visible = True
        if visible and key is not None:
            self.heads[key] = offset
        return visible

    def _holds(self, expect: bytes, key: bytes | None) -> bool:
        head = None if key is None else self.heads.get(key)
        if expect.startswith(b"-"):  # "no visible record at or above this offset"
            return head is None or head < int(expect[1:])
        want = int(expect)
        if head is None:
            return want < self.start  # the expected record lies below what this reader sees
        return head == want
