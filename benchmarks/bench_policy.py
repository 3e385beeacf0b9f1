"""The invoicing policy with and without per-key parallelism, on the same log (issue 15).

    python benchmarks/bench_policy.py --orders 1000 --runs 5 --concurrency 16

A history of ``--orders`` orders, each placed and confirmed, is bulk-appended once to a
template data directory. Each run copies the template (same log, no invoices yet) and runs
the example app's ``InvoicingPolicy`` in one in-process :class:`~eventlane.projection.Worker`
until it has handled every order event, issuing one invoice per confirmed order (a durable,
conditional save each): once with ``concurrency = 1`` (strictly in partition order) and once
with ``--concurrency``. Prints confirmed orders invoiced per second, the median of the
runs, and the ratio; checks every run wrote exactly one invoice per order. ``--wait-ms``
makes the handler wait (a remote call, e.g. for tax rates) before it issues the invoice.

``--async-handlers``: the parallel run's handler is ``async def`` (it awaits the remote call
with ``asyncio.sleep`` and issues with ``await ctx.issue_async``; keys run as tasks on the
worker's loop), against the same policy sync and in order (issue 30's "an async policy with
a 10 ms remote call >= 10x the same policy in order")::

    python benchmarks/bench_policy.py --orders 300 --runs 5 --wait-ms 10 --async-handlers --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eventlane import App, EventContext, handles
from eventlane.codec import Envelope
from eventlane.log.partitioner import partition_for_key
from eventlane.projection import Worker
from example_apps.invoicing import app
from example_apps.invoicing.domain import Invoice, invoice_id_for
from example_apps.invoicing.events import Address, OrderConfirmed, OrderLine, OrderPlaced
from example_apps.invoicing.projections import InvoicingPolicy


def build(data: Path, orders: int) -> None:
    with app.open(data) as rt:
        batches: dict[int, list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...], None]]] = {}
        count = rt.log.partition_count("orders")
        line = OrderLine("sku-1", 1, 999)
        for i in range(orders):
            oid = f"order-{i:07d}"
            for version, ev in enumerate(
                (
                    OrderPlaced("cust-1", (line,), Address("1 Main St", "Oslo", "NO")),
                    OrderConfirmed("cust-1", 999),
                ),
                start=1,
            ):
                key, value, headers = rt.codec.encode(Envelope(ev, oid, version))
                batches.setdefault(partition_for_key(key, count), []).append(
                    (key, value, tuple(headers), None)
                )
        for p, records in batches.items():
            rt.log.append("orders", p, records)


def run(
    template: Path,
    scratch: Path,
    concurrency: int,
    orders: int,
    wait_ms: float,
    asynchronous: bool = False,
) -> float:
    """Orders invoiced per second by the policy at ``concurrency`` (``asynchronous``: with
    an ``async def`` handler)."""
    data = scratch / f"run-{concurrency}"
    shutil.rmtree(data, ignore_errors=True)
    shutil.copytree(template, data)
    attrs: dict[str, object] = {"concurrency": concurrency}
    if wait_ms:
        confirmed = InvoicingPolicy.confirmed

        @handles(OrderConfirmed)
        def waits(self: InvoicingPolicy, event: OrderConfirmed, ctx: EventContext) -> None:
            time.sleep(wait_ms / 1000)  # e.g. a remote call (tax rates) before the command
            confirmed(self, event, ctx)

        attrs["confirmed"] = waits
    if asynchronous:

        @handles(OrderConfirmed)
        async def awaits(self: InvoicingPolicy, event: OrderConfirmed, ctx: EventContext) -> None:
            await asyncio.sleep(wait_ms / 1000)  # the remote call, awaited
            await ctx.issue_async(
                Invoice,
                invoice_id_for(ctx.aggregate_id),
                lambda invoice: invoice.issue(
                    ctx.aggregate_id, event.customer_id, event.total_cents
                ),
            )

        attrs["confirmed"] = awaits
    policy = type("InvoicingPolicy", (InvoicingPolicy,), attrs)
    bench_app = App(
        app.name,
        aggregates=app.aggregates,
        projectors=[policy],
        partitions=app.partitions,
        registry=app.registry,
        commands=app.commands,  # the policy schedules CancelUnconfirmedOrder
    )
    with bench_app.open(data) as rt:
        worker = Worker(rt, "invoicing_policy", poll_timeout=0.05, max_poll_records=2000)
        try:
            t0 = time.perf_counter()
            handled = 0
            while handled < 2 * orders:
                handled += worker.run_once()
            elapsed = time.perf_counter() - t0
        finally:
            worker.close()
        invoices = sum(
            rt.log.offsets("invoices", p).hwm for p in range(rt.log.partition_count("invoices"))
        )
        assert invoices == orders, f"{invoices} invoices for {orders} orders"
    shutil.rmtree(data)
    return orders / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--wait-ms",
        type=float,
        default=0.0,
        help="the handler first waits this long (a remote call), then issues",
    )
    parser.add_argument(
        "--async-handlers",
        action="store_true",
        help="the parallel run's handler is async def (tasks), see the module docstring",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        template = scratch / "template"
        build(template, args.orders)
        serial, parallel = [], []
        for _ in range(args.runs):
            serial.append(run(template, scratch, 1, args.orders, args.wait_ms))
            parallel.append(
                run(
                    template,
                    scratch,
                    args.concurrency,
                    args.orders,
                    args.wait_ms,
                    args.async_handlers,
                )
            )
    a, b = statistics.median(serial), statistics.median(parallel)
    print(
        f"in partition order (concurrency=1): {a:,.0f} orders invoiced/s "
        f"(median of {args.runs}: {', '.join(f'{x:,.0f}' for x in serial)})"
    )
    print(
        f"per-key parallel (concurrency={args.concurrency}"
        f"{', async def handler, tasks' if args.async_handlers else ''}): {b:,.0f} orders"
        " invoiced/s "
        f"(median of {args.runs}: {', '.join(f'{x:,.0f}' for x in parallel)})"
    )
    print(f"ratio: {b / a:.1f}x")


if __name__ == "__main__":
    main()
