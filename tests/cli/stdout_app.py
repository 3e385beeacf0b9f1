"""The application of ``test_stdout_is_data.py``: one aggregate with a personal field, one
projector whose handler dead-letters the deposit with memo ``"poison"`` (unless
``STDOUT_APP_FIXED=1``: the "code fix" that lets ``dlq retry`` apply it).

``python -m tests.cli.stdout_app DATA [URL]`` writes a few accounts through a runtime on the
embedded log in DATA (or on the log at URL, DATA its local directory), so that every command
has something to print. Importable as ``tests.cli.stdout_app:app`` (repository root on
``PYTHONPATH``).
"""

from __future__ import annotations

import os
import sys
from typing import ClassVar

from attrs import frozen
from sqlite_utils import Database

from eventlane import Aggregate, App, DomainEvent, EventContext, Projector, applies, event
from eventlane.domain import personal
from eventlane.projection import handles

ACCOUNTS = 30
POISON = "acct-7"
"""The account whose deposit the projector refuses (one dead letter)."""


@event("Opened")
@frozen
class Opened(DomainEvent):
    owner: str = personal()


@event("Deposited")
@frozen
class Deposited(DomainEvent):
    amount: int
    memo: str = ""


class Account(Aggregate):
    topic: ClassVar[str] = "accounts"

    def init_state(self) -> None:
        self.total = 0

    def open(self, owner: str) -> None:
        self.record_that(Opened(owner))

    def deposit(self, amount: int, memo: str = "") -> None:
        self.record_that(Deposited(amount, memo))

    @applies(Opened)
    def _opened(self, e: Opened) -> None:
        pass

    @applies(Deposited)
    def _deposited(self, e: Deposited) -> None:
        self.total += e.amount


class Balances(Projector):
    name = "balances"
    topics = ("accounts",)
    handler_attempts = 1

    def setup(self, db: Database) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS balances (id TEXT PRIMARY KEY, total INTEGER)")

    @handles(Deposited)
    def deposited(self, e: Deposited, ctx: EventContext) -> None:
        if e.memo == "poison" and not os.environ.get("STDOUT_APP_FIXED"):
            raise ValueError("a poison deposit")
        ctx.conn.execute(
            "INSERT INTO balances VALUES (?, ?)"
            " ON CONFLICT(id) DO UPDATE SET total = total + excluded.total",
            (ctx.aggregate_id, e.amount),
        )


app = App("stdout", aggregates=[Account], projectors=[Balances], partitions=2)


def seed(data: str, url: str | None) -> None:
    from eventlane.engine import open_log  # noqa: PLC0415

    log = open_log(url or data, data_dir=data)
    try:
        with app.open(log) as runtime:
            for i in range(ACCOUNTS):
                account = Account(f"acct-{i}")
                account.open(f"owner {i}")
                account.deposit(10 + i, "poison" if account.id == POISON else "")
                runtime.save(account)
    finally:
        log.close()


if __name__ == "__main__":
    seed(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
