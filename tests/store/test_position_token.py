"""Position tokens: what every write returns, as a short string and back.

A Hypothesis model: positions built from arbitrary written records round-trip through their
token, join as "furthest offset per partition" (the model: a plain dict), and every token is
header- and URL-safe. Bad tokens fail with InvalidPositionError saying why.
"""

from __future__ import annotations

import re
import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlane.errors import InvalidPositionError
from eventlane.log import RecordMetadata, TopicPartition
from eventlane.log.position import Position

topics = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)
records = st.lists(
    st.builds(
        RecordMetadata,
        topics,
        st.integers(0, 63),
        st.integers(0, 2**50),
        st.integers(0, 2**41),
    ),
    max_size=12,
)


def model(written: list[RecordMetadata]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for m in written:
        tp = TopicPartition(m.topic, m.partition)
        out[tp] = max(out.get(tp, 0), m.offset + 1)
    return out


@given(records, records)
def test_tokens_round_trip_and_join_like_the_model(
    a: list[RecordMetadata], b: list[RecordMetadata]
) -> None:
    pa, pb = Position.of(a), Position.of(b)
    assert dict(pa) == model(a)
    for p in (pa, pb, pa | pb):
        token = p.token
        assert re.fullmatch(r"[A-Za-z0-9._~-]+", token)
        assert urllib.parse.quote(token, safe="") == token  # nothing to escape in a URL
        assert Position.parse(token) == p
    joined = model(a)
    for tp, off in model(b).items():
        joined[tp] = max(joined.get(tp, 0), off)
    assert dict(pa | pb) == joined
    for tp, offsets in pa.written().items():
        assert offsets.stop == model(a)[tp]
        assert all(
            offsets.start <= m.offset < offsets.stop
            for m in a
            if TopicPartition(m.topic, m.partition) == tp
        )
    for tp, offsets in (pa | pb).written().items():  # the join names both writes' records
        assert offsets.stop == joined[tp]
        assert all(
            offsets.start <= m.offset
            for m in [*a, *b]
            if TopicPartition(m.topic, m.partition) == tp
        )


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("", "tokens start with"),
        ("orders~3~18", "tokens start with"),
        ("p1~orders~3", "cut short"),
        ("p1~orders~x~18", "must be numbers"),
        ("p1~orders~3~18-5", "must be numbers"),
        ("p1~ord ers~3~18", "bad topic"),
        ("p1~orders~3~18~orders~3~19", "twice"),
        ("p1~" + "a" * 5000, "not a position token"),
        ("p1~orders~\u00b2~18", "must be numbers"),  # str.isdigit() takes it; int() does not
        ("p1~orders~0~\u00b9-\u00b3", "must be numbers"),
        ("p1~orders~" + "9" * 20 + "~5", "must be numbers"),  # past Kafka's 64-bit offsets
    ],
)
def test_a_bad_token_says_what_is_wrong(token: str, why: str) -> None:
    with pytest.raises(InvalidPositionError, match=why):
        Position.parse(token)
