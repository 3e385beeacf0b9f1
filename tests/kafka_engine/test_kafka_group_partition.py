"""Which partition of ``__consumer_offsets`` holds a group (so which broker coordinates it):
``kafka up`` waits for one probe group per partition (eventlane/log/kafka/cluster.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from eventlane.log.kafka.cluster import group_partition, probe_groups


def test_group_partition_is_javas_string_hash() -> None:
    # Java's "...".hashCode(): 99162322; Integer.MIN_VALUE (Kafka's abs gives 0); a character
    # outside the BMP hashes as its two UTF-16 code units 0xD83D, 0xDE00
    assert group_partition("hello", 1 << 30) == 99162322
    assert group_partition("polygenelubricants", 7) == 0
    assert group_partition("\U0001f600", 1 << 30) == 0xD83D * 31 + 0xDE00
    assert group_partition("", 50) == 0


@given(st.integers(min_value=1, max_value=200))
def test_probe_groups_cover_every_partition_once(partitions: int) -> None:
    groups = probe_groups(partitions)
    assert [group_partition(g, partitions) for g in groups] == list(range(partitions))
