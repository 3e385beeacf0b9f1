"""The async command path alone, without HTTP: commands/s and process CPU a command of
``await runtime.execute(...)`` from 64 tasks (issue 30: what the async endpoints of
``bench_web.py`` cost beyond uvicorn and FastAPI).

    python benchmarks/profile_async_commands.py [--jetstream] [--profile] [--commands 1000]

Places a new order (the invoicing sample: a personal field, so the key store is used) per
command; a warm-up round, then a measured one. ``--jetstream``: on a local 3-node JetStream
cluster started (and stopped, by PID) here, else on the embedded log in a temporary
directory. ``--profile``: the measured round under cProfile (the loop's thread only; about
3x slower), the top functions by own time to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from example_apps.invoicing.app import app  # noqa: E402
from example_apps.invoicing.domain import Order  # noqa: E402
from example_apps.invoicing.events import Address, OrderLine  # noqa: E402

LINE, HOME = OrderLine("sku-1", 1, 100), Address("1 Main St", "Oslo", "NO")


def place(order: Order) -> None:
    order.place("cust-1", [LINE], HOME)


async def rounds(data: str, commands: int, tasks: int, profile: cProfile.Profile | None) -> None:
    async with app.open_async(data) as runtime:
        for r in range(2):
            todo = iter(range(r * commands, (r + 1) * commands))

            async def worker(todo: Iterator[int]) -> None:
                for i in todo:
                    await runtime.execute(Order, f"o-{i}", place, create=True)

            cpu, wall = time.process_time(), time.perf_counter()
            if r == 1 and profile is not None:
                profile.enable()
            await asyncio.gather(*(worker(todo) for _ in range(tasks)))
            if r == 1 and profile is not None:
                profile.disable()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(
                f"{'warm-up' if r == 0 else 'measured'}: {commands / wall:,.0f} commands/s,"
                f" process CPU {cpu / commands * 1000:.2f} ms a command ({tasks} tasks)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jetstream", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--commands", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=64)
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory() as tmp:
        data, cluster = str(Path(tmp) / "data"), None
        if args.jetstream:
            from eventlane.log.jetstream.cluster import LocalCluster  # noqa: PLC0415

            cluster = LocalCluster.create(Path(tmp) / "nats", nodes=3)
            cluster.start()
            data = cluster.url
        try:
            asyncio.run(rounds(data, args.commands, args.tasks, profile))
        finally:
            if cluster is not None:
                cluster.stop()
    if profile is not None:
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
