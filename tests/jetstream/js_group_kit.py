"""Helpers shared by the JetStream consumer-group tests (not a test module)."""

from __future__ import annotations

import sys
from pathlib import Path

from eventlane.consumer.jetstream import JetStreamCoordination
from eventlane.log.jetstream.log import JetStreamLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "consumer"))
import group_members
import pytest
from group_members import START_S, counts, union

members_fixture = pytest.fixture(name="members")(group_members.members_fixture)

__all__ = ["START_S", "OffsetWatch", "counts", "members_fixture", "union"]


class OffsetWatch(group_members.OffsetWatch):
    """The committed offsets of ``group`` in the cluster's KV, watched (see the base)."""

    def __init__(self, js: JetStreamLog, group: str) -> None:
        self.coordination = JetStreamCoordination(js)
        super().__init__(lambda: self.coordination.offsets.group_offsets(group))
