"""``eventlane serve --kafka HOST:PORT``: speak Kafka's wire protocol on the embedded log.

Kafka clients (confluent-kafka/librdkafka, kafka-python, aiokafka, kcat, Spark's Kafka
source) then produce, fetch, create topics and run consumer groups against the data
directory. See ``docs/kafka-protocol.md``. Runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import sys
from contextlib import ExitStack

import click

from eventlane.cli.context import app, data_option
from eventlane.cli.metrics import export_metrics, metrics_options
from eventlane.errors import ConfigError
from eventlane.observability import get_logger

log = get_logger("eventlane.cli")


def _host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT (e.g. 127.0.0.1:9092), got {text!r}")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _interrupt(signum: int, frame: object) -> None:
    # SIGTERM does what Ctrl-C does: asyncio's runner cancels the listener's main task, which
    # closes the server and its connections in order (a KeyboardInterrupt raised here would
    # land in whichever connection's task was running, and be logged there as a crash)
    signal.raise_signal(signal.SIGINT)


@click.command()
@click.option(
    "--kafka",
    "listen",
    metavar="HOST:PORT",
    default="127.0.0.1:9092",
    show_default=True,
    help="Where the Kafka listener binds (loopback by default: there is no TLS or SASL).",
)
@click.option(
    "--advertised",
    metavar="HOST:PORT",
    help="The address clients are told to connect to (default: the listen address).",
)
@click.option(
    "--auto-create-topics/--no-auto-create-topics",
    default=True,
    show_default=True,
    help="Create a topic (1 partition) when a client asks for an unknown one, as Kafka does.",
)
@metrics_options
@data_option
def serve(
    listen: str,
    advertised: str | None,
    auto_create_topics: bool,
    metrics_port: int | None,
    metrics_addr: str,
) -> None:
    """Serve the Kafka protocol for the data directory until interrupted."""
    from eventlane.kafka import serve as run  # noqa: PLC0415  (an optional extra)
    from eventlane.kafka.server import keep_freed_memory  # noqa: PLC0415

    keep_freed_memory()  # this process is the listener's: its request buffers are reused

    host, port = _host_port(listen, "--kafka")
    if advertised is not None:
        _host_port(advertised, "--advertised")
    if not _is_loopback(host):
        click.echo(
            f"WARNING: the Kafka listener binds {host}, not loopback: it has no TLS and no "
            "authentication, so anyone who can reach this address can read and write every "
            "topic.",
            err=True,
        )
    log_ = app().open_log(create=True)

    def ready(server: object) -> None:
        click.echo(f"kafka listener on {host}:{getattr(server, 'port', port)}", err=True)
        sys.stderr.flush()
        # while the loop runs, SIGTERM goes through it: the kernel may hand a signal to any
        # thread (the loop's executor threads too), and only the loop's wake-up descriptor,
        # which add_signal_handler sets, wakes a loop waiting in epoll then
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGTERM, signal.raise_signal, signal.SIGINT
        )

    signal.signal(signal.SIGTERM, _interrupt)
    metrics = ExitStack()
    if metrics_port is not None:
        export_metrics(metrics, None, metrics_port, metrics_addr, log_=log_, workers=False)
    try:
        run(
            log_,
            host,
            port,
            advertised=advertised,
            auto_create_topics=auto_create_topics,
            ready=ready,
        )
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    finally:
        metrics.close()
