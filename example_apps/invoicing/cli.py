"""The invoicing app's commands, plugged into ``eventlane`` through entry points.

* ``eventlane invoicing invoice-for ORDER_ID [--timeout S]``: request/reply over the log.
* ``eventlane invoicing serve``: run a query responder until Ctrl-C.
* ``eventlane demo invoicing [--cluster]``: the demo (:mod:`.demo`, :mod:`.cluster_demo`).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console

from example_apps.invoicing.cluster_demo import run_cluster_demo
from example_apps.invoicing.demo import run_demo
from example_apps.invoicing.queries import ask_invoice_for, serve_queries
from framework import Runtime, rebuild
from framework.cli.plugins import data_dir, data_option, open_log
from framework.replay import compare, file_checksums


@click.group()
def invoicing() -> None:
    """The invoicing sample app (example_apps.invoicing)."""


@invoicing.command("invoice-for")
@click.argument("order_id")
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for a reply.")
@data_option
def invoice_for(order_id: str, timeout: float) -> None:
    """Ask a running responder which invoice ORDER_ID has (request/reply over the log)."""
    log = open_log()
    try:
        answer = ask_invoice_for(log, order_id, timeout=timeout)
    except TimeoutError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(orjson.dumps(answer).decode())


@invoicing.command("serve")
@click.option("--seconds", type=float, default=None, help="Stop after this long (default: never).")
@data_option
def serve(seconds: float | None) -> None:
    """Answer invoice queries from the invoices read model until Ctrl-C."""
    log = open_log()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if seconds is not None:
        threading.Timer(seconds, stop.set).start()
    try:
        answered = serve_queries(log, str(log.local.readmodel("invoices")), stop)
    except KeyboardInterrupt:
        answered = 0
    click.echo(f"answered {answered} queries", err=True)


def spark_rebuild(runtime: Runtime, name: str, console: Console) -> dict[str, Any]:
    """Rebuild ``name`` with Spark and compare it, table by table, with the live model."""
    console.print(
        "rebuilding [bold]invoices[/] with Spark (local mode; the session takes a"
        " few seconds to start) …"
    )
    started = time.perf_counter()
    result = rebuild(runtime, name, engine="spark")
    live = file_checksums(runtime.log.local.readmodel(name))
    rebuilt = file_checksums(Path(result.path))
    diffs = compare(live, rebuilt)
    identical = all(d.equal for d in diffs)
    for d in diffs:
        console.print(f"  table {d.table}: {'identical' if d.equal else 'DIFFERENT'}")
    return {
        "identical": identical,
        "events_per_s": result.events_per_second,
        "seconds": time.perf_counter() - started,
    }


@click.command("invoicing")
@click.option("--orders", default=1000, show_default=True, help="Orders to generate.")
@click.option("--workers", default=2, show_default=True, help="Worker processes per projector.")
@click.option("--seed", default=7, show_default=True, help="Workload seed (deterministic).")
@click.option("--no-spark", is_flag=True, help="Skip the Spark rebuild and its verification.")
@click.option(
    "--cluster",
    is_flag=True,
    help="On a local 3-node JetStream cluster, workers on two simulated hosts.",
)
@data_option
def demo(orders: int, workers: int, seed: int, no_spark: bool, cluster: bool) -> None:
    """The invoicing demo: workload, workers, a kill -9, lag, Spark rebuild, summary."""
    data = data_dir()
    run = run_cluster_demo if cluster else run_demo
    summary = run(
        data, orders=orders, workers=workers, seed=seed, spark=not no_spark, rebuild=spark_rebuild
    )
    if summary["invoices"] != summary["confirmed"]:
        raise click.ClickException("invoices differ from confirmed orders")
    if not no_spark and not summary.get("rebuild", {}).get("identical"):
        raise click.ClickException("the Spark rebuild differs from the live read model")
