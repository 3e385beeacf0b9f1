"""The invoicing app's commands, plugged into ``eventlane`` through entry points.

* ``eventlane invoicing invoice-for ORDER_ID [--timeout S]``: request/reply over the log.
* ``eventlane invoicing serve``: run a query responder until Ctrl-C.
* ``eventlane invoicing serve-http``: the HTTP API (FastAPI + uvicorn; :mod:`.web`),
  with the projectors' workers and the scheduler (the orders' deadlines) unless
  ``--no-projectors``.
* ``eventlane demo invoicing [--cluster]``: the demo (:mod:`.demo`, :mod:`.cluster_demo`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console

from eventlane import Runtime, rebuild
from eventlane.cli.plugins import data_dir, data_option, open_log
from eventlane.projection import Runner
from eventlane.projection.supervisor import stop_runners
from eventlane.replay import compare, file_checksums
from example_apps.invoicing.app import app as invoicing_app
from example_apps.invoicing.cluster_demo import run_cluster_demo
from example_apps.invoicing.demo import run_demo
from example_apps.invoicing.queries import ask_invoice_for, serve_queries

APP_SPEC = "example_apps.invoicing:app"
SCHEDULER = "scheduler"

GRACE_S = 3.0
"""On SIGTERM the HTTP server stops accepting and lets requests in flight finish for at most
this long, then cancels them and exits (uvicorn waits for them forever by default: a request
that never ends kept a server alive after SIGTERM)."""


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


@invoicing.command("serve-http")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, help="TCP port.")
@click.option(
    "--projectors/--no-projectors",
    default=True,
    show_default=True,
    help="Also run one worker per projector and the scheduler (supervised, restarted).",
)
@data_option
def serve_http(host: str, port: int, projectors: bool) -> None:
    """Serve the invoicing HTTP API (OpenAPI at /docs) until Ctrl-C or SIGTERM."""
    import uvicorn  # noqa: PLC0415 - the web extra, loaded only here

    from example_apps.invoicing.web import create_app  # noqa: PLC0415

    data = data_dir()
    with contextlib.ExitStack() as held:
        runners: list[Runner] = []
        stop = threading.Event()
        if projectors:
            # the runners hold their groups (as `eventlane run` does): a worker that dies
            # has its member leave as soon as it is reaped, its partitions move at once
            log = open_log(create=True)
            held.callback(log.close)  # last: after the groups and the runtime on it
            runtime = held.enter_context(invoicing_app.open(log))

            def runner(name: str, **options: Any) -> Runner:
                group = runtime.group_coordinator(None if name == SCHEDULER else name)
                held.callback(group.close)
                return Runner(
                    APP_SPEC, name, data, workers=1, restart=True, coordinator=group, **options
                )

            runners = [runner(name) for name in invoicing_app.projectors]
            # the orders' deadlines (eventlane schedules run)
            runners.append(runner(SCHEDULER, argv=("schedules", "run", APP_SPEC)))
            for each in runners:
                each.start()

            def supervise() -> None:
                while not stop.wait(0.5):
                    for each in runners:
                        each.supervise_once()

            threading.Thread(target=supervise, name="supervise", daemon=True).start()
        click.echo(f"serving http://{host}:{port} (OpenAPI at /docs) on {data}", err=True)
        # uvicorn re-raises the SIGTERM it shut down on once it has restored this handler:
        # it ends the command through the `finally` below (the workers stopped, exit 0)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            # keep-alive longer than clients' pools keep idle connections (httpx: 5 s), so a
            # client never sends a request on a connection the server is closing
            uvicorn.run(
                create_app(data),
                host=host,
                port=port,
                log_level="warning",
                timeout_keep_alive=75,
                timeout_graceful_shutdown=GRACE_S,
            )
        finally:
            stop.set()
            stop_runners(runners)


def _exit_on_sigterm(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


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
@click.option(
    "--kafka",
    is_flag=True,
    help="On a local 3-broker Kafka cluster (in DATA/kafka), workers on two simulated hosts.",
)
@click.option(
    "--kafka-dir",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="With --kafka: the cluster `eventlane kafka up --dir DIR` started (left running).",
)
@data_option
def demo(
    orders: int,
    workers: int,
    seed: int,
    no_spark: bool,
    cluster: bool,
    kafka: bool,
    kafka_dir: Path | None,
) -> None:
    """The invoicing demo: workload, workers, a kill -9, lag, Spark rebuild, summary."""
    data = data_dir()
    if cluster and kafka:
        raise click.UsageError("--cluster (JetStream) or --kafka, not both")
    if kafka_dir is not None and not kafka:
        raise click.UsageError("--kafka-dir goes with --kafka")
    common: dict[str, Any] = {
        "orders": orders,
        "workers": workers,
        "seed": seed,
        "spark": not no_spark,
        "rebuild": spark_rebuild,
    }
    if kafka:
        summary = run_cluster_demo(data, kafka=kafka_dir or data / "kafka", **common)
    else:
        summary = (run_cluster_demo if cluster else run_demo)(data, **common)
    if summary["invoices"] != summary["confirmed"]:
        raise click.ClickException("invoices differ from confirmed orders")
    if not no_spark and not summary.get("rebuild", {}).get("identical"):
        raise click.ClickException("the Spark rebuild differs from the live read model")
