"""The shipped log contract kits (:mod:`framework.testing.contracts`) of the four roles run against the embedded
:class:`~framework.log.embedded.store.LogStore`."""

from __future__ import annotations

from pathlib import Path

from framework.log import Log, LogStore
from framework.testing.clock import FakeClock
from framework.testing.contracts import (
    FencedLogContract,
    KeyedLogContract,
    MaintainedLogContract,
)


class TestLogStoreContract(KeyedLogContract, MaintainedLogContract, FencedLogContract):
    def make_log(self, directory: Path, clock: FakeClock) -> Log:
        return LogStore(directory, clock=clock)
