"""Durable commands from N threads of one process on distinct aggregates (group commit).

Each thread runs ``runtime.execute`` (load, decide, conditional save with fsync) on its own
aggregates; the concurrent saves of one partition share an fsync (``Partition.append(...,
combine=True)``). Prints commands/s for 1 thread and for N threads on fresh data
directories, and their ratio, median of ``--runs``.

    python benchmarks/bench_threads.py --threads 8 --commands 2000 --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

from attrs import frozen

from framework import Aggregate, App, DomainEvent, applies, event


@event("BenchDeposited")
@frozen
class Deposited(DomainEvent):
    amount: int


class Account(Aggregate, topic="bench_accounts"):
    balance: int = 0

    def deposit(self, amount: int) -> None:
        self.record_that(Deposited(amount))

    @applies
    def _deposited(self, e: Deposited) -> None:
        self.balance += e.amount


app = App("bench_threads", aggregates=[Account], partitions=1)


def run(threads: int, commands: int) -> float:
    """Commands/s of ``threads`` threads doing ``commands`` commands in all."""
    per = commands // threads
    with tempfile.TemporaryDirectory() as data, app.open(data) as runtime:
        start = threading.Barrier(threads + 1)

        def work(t: int) -> None:
            start.wait()
            for i in range(per):
                runtime.execute(Account, f"acc-{t}-{i % 50}", lambda a: a.deposit(1), create=True)

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        start.wait()
        t0 = time.perf_counter()
        for th in pool:
            th.join()
        return per * threads / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--commands", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    one, many = [], []
    for _ in range(args.runs):
        one.append(run(1, args.commands))
        many.append(run(args.threads, args.commands))
    a, b = statistics.median(one), statistics.median(many)
    print(f"1 thread:  {a:,.0f} commands/s (median of {args.runs})")
    print(f"{args.threads} threads: {b:,.0f} commands/s (median of {args.runs})")
    print(f"ratio: {b / a:.2f}x")


if __name__ == "__main__":
    main()
