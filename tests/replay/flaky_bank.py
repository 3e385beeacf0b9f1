"""The projection tests' bank app (``tests.projection.bankapp``) with one more projector,
``flaky_balances``: ``balances`` whose first attempt of a Spark task on ``accounts/1``
kills its own Python worker (``os._exit``) 40 records into its range, as a lost executor
would; Spark retries the task (``local[2,4]``). Outside Spark it is ``balances``.
"""

from __future__ import annotations

import os

from eventlane.app import App
from eventlane.projection import EventContext
from tests.projection import bankapp

FAULT_AFTER = 40


class FlakyBalances(bankapp.Balances):
    name = "flaky_balances"

    def __init__(self) -> None:
        self.first: dict[int, int] = {}

    def _mark(self, ctx: EventContext) -> None:
        from pyspark import TaskContext  # noqa: PLC0415 - only Spark tasks get here

        task = TaskContext.get()
        if task is not None and task.attemptNumber() == 0 and ctx.partition == 1:
            first = self.first.setdefault(ctx.partition, ctx.offset)
            if ctx.offset - first >= FAULT_AFTER:
                os._exit(17)  # the Python worker dies mid-task
        super()._mark(ctx)


app = App(
    "bank",
    aggregates=[bankapp.Account, bankapp.Order, bankapp.Invoice],
    projectors=[bankapp.Balances, FlakyBalances],
    partitions={"accounts": 6, "orders": 4, "invoices": 4},
)
