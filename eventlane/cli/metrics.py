"""``--metrics-port`` / ``--metrics-addr``: the commands that serve Prometheus' ``/metrics``
(``project run``, ``console``, ``serve --kafka``), and how they start the endpoint."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import click

from eventlane.observability import get_logger

if TYPE_CHECKING:
    from eventlane.app.application import Runtime
    from eventlane.log import Log

log = get_logger("eventlane.cli")


def metrics_options(f: Any) -> Any:
    f = click.option(
        "--metrics-addr",
        default="127.0.0.1",
        show_default=True,
        metavar="ADDR",
        help="Address of the /metrics endpoint.",
    )(f)
    return click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        metavar="PORT",
        help="Serve Prometheus metrics on this port (/metrics; needs the metrics extra).",
    )(f)


def export_metrics(
    stack: ExitStack,
    runtime: Runtime | None,
    port: int,
    addr: str,
    *,
    log_: Log | None = None,
    workers: bool = True,
) -> str:
    """Start ``/metrics`` for the life of ``stack``: the state of ``runtime``'s groups and
    projections (or ``log_``'s groups) read at each scrape, and, with ``workers``, the
    instruments of the worker processes started with ``PROMETHEUS_MULTIPROC_DIR`` set to the
    returned directory (removed when the stack closes; empty string without workers)."""
    try:
        import prometheus_client  # noqa: F401, PLC0415 - only with --metrics-port
    except ImportError:
        raise click.ClickException(
            "--metrics-port needs prometheus_client: pip install 'eventlane[metrics]'"
        ) from None
    from eventlane.app.metrics import StateCollector  # noqa: PLC0415
    from eventlane.metrics import serve  # noqa: PLC0415

    directory = tempfile.mkdtemp(prefix="eventlane-metrics-") if workers else None
    if directory is not None:
        stack.callback(shutil.rmtree, directory, ignore_errors=True)
    collectors = [StateCollector(runtime, log_)]
    endpoint = serve(port, addr=addr, collectors=collectors, multiproc_dir=directory)
    stack.callback(endpoint.stop)
    log.info("metrics served", url=f"http://{addr}:{endpoint.port}/metrics")
    return directory or ""
