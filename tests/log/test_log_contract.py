"""The shipped log contract kits (:mod:`eventlane.testing.contracts`) of the four roles run against the embedded
:class:`~eventlane.log.embedded.store.LogStore`."""

from __future__ import annotations

from pathlib import Path

from eventlane.log import Log, LogStore
from eventlane.testing.clock import FakeClock
from eventlane.testing.contracts import (
    FencedLogContract,
    KeyedLogContract,
    MaintainedLogContract,
)


class TestLogStoreContract(KeyedLogContract, MaintainedLogContract, FencedLogContract):
    def make_log(self, directory: Path, clock: FakeClock) -> Log:
        return LogStore(directory, clock=clock)
