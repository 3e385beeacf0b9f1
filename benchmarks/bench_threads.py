"""Durable commands from N threads of one process on distinct aggregates (group commit).

Each thread runs ``runtime.execute`` (load, decide, conditional save with fsync) on its own
aggregates (5 commands each, as in ``bench_peer.py``); the concurrent saves of one partition share an fsync (``Partition.append(...,
combine=True)``). Prints commands/s for 1 thread and for N threads on fresh data
directories, and their ratio, median of ``--runs``. ``--peer`` runs the same workload, in
the same rounds, on the ``eventsourcing`` library (9.5.6, SQLite file, WAL,
``synchronous=FULL``: one fsync per save), the peer of ``bench_peer.py``.

    python benchmarks/bench_threads.py --threads 8 --commands 2000 --runs 5 [--peer]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

from attrs import frozen

from eventlane import Aggregate, App, DomainEvent, applies, event


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
                runtime.execute(Account, f"acc-{t}-{i // 5}", lambda a: a.deposit(1), create=True)

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        start.wait()
        t0 = time.perf_counter()
        for th in pool:
            th.join()
        return per * threads / (time.perf_counter() - t0)


_PEER: list[type] = []


def _peer_account() -> type:
    """The peer's account class, defined once (the library registers classes by name)."""
    if _PEER:
        return _PEER[0]
    from uuid import NAMESPACE_URL, uuid5  # noqa: PLC0415

    from eventsourcing.domain import Aggregate as EsAggregate  # noqa: PLC0415
    from eventsourcing.domain import event as es_event  # noqa: PLC0415

    class EsAccount(EsAggregate):  # type: ignore[misc]
        @staticmethod
        def create_id(name: str) -> object:
            return uuid5(NAMESPACE_URL, name)

        @es_event("Opened")
        def __init__(self, name: str) -> None:
            self.balance = 0

        @es_event("Deposited")
        def deposit(self, amount: int) -> None:
            self.balance += amount

    _PEER.append(EsAccount)
    return EsAccount


def run_peer(threads: int, commands: int) -> float:
    """The same workload on the ``eventsourcing`` library: commands/s."""
    from uuid import NAMESPACE_URL, uuid5  # noqa: PLC0415

    from eventsourcing.application import AggregateNotFoundError  # noqa: PLC0415
    from eventsourcing.application import Application as Bank  # noqa: PLC0415

    account_cls = _peer_account()
    per = commands // threads
    with tempfile.TemporaryDirectory() as data:
        env = {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": f"{data}/peer.sqlite",
            "SQLITE_LOCK_TIMEOUT": "30",
        }
        bank = Bank(env=env)
        start = threading.Barrier(threads + 1)

        def work(t: int) -> None:
            start.wait()
            for i in range(per):
                name = f"acc-{t}-{i // 5}"
                try:
                    account = bank.repository.get(uuid5(NAMESPACE_URL, name))
                    account.deposit(1)
                except AggregateNotFoundError:
                    account = account_cls(name)
                bank.save(account)

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        start.wait()
        t0 = time.perf_counter()
        for th in pool:
            th.join()
        rate = per * threads / (time.perf_counter() - t0)
        assert bank.repository.get(uuid5(NAMESPACE_URL, "acc-0-0")).version == 5
        bank.close()
        return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--commands", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--peer", action="store_true", help="also run the eventsourcing peer")
    args = parser.parse_args()
    series: dict[str, list[float]] = {}
    for _ in range(args.runs):
        series.setdefault("eventlane 1 thread", []).append(run(1, args.commands))
        series.setdefault(f"eventlane {args.threads} threads", []).append(
            run(args.threads, args.commands)
        )
        if args.peer:
            series.setdefault("peer 1 thread", []).append(run_peer(1, args.commands))
            series.setdefault(f"peer {args.threads} threads", []).append(
                run_peer(args.threads, args.commands)
            )
    medians = {name: statistics.median(values) for name, values in series.items()}
    for name, value in medians.items():
        print(f"{name}: {value:,.0f} commands/s (median of {args.runs})")
    el1, eln = medians["eventlane 1 thread"], medians[f"eventlane {args.threads} threads"]
    print(f"eventlane {args.threads} threads / 1 thread: {eln / el1:.2f}x")
    if args.peer:
        peer = medians[f"peer {args.threads} threads"]
        print(f"eventlane {args.threads} threads / peer {args.threads} threads: {eln / peer:.2f}x")


if __name__ == "__main__":
    main()
