"""``eventlane console``: the web console (docs/console.md).

    eventlane console [--data DIR | --log URL] [APP] [--host 127.0.0.1] [--port 8070]
                      [--read-write] [--token TOKEN] [--allow-host NAME ...]

Serves until SIGTERM / Ctrl-C. Read-only unless ``--read-write``; bound to loopback unless
``--host`` says otherwise. Beyond loopback every request needs an access token: ``--token``
or ``$EVENTLANE_CONSOLE_TOKEN``, else one is made up and printed, once, in the URL line
(``.../?token=...``); a token given on loopback is required too. Prints ``eventlane
console: http://HOST:PORT/ (read-only|read-write)`` on standard error once it listens.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from contextlib import ExitStack
from pathlib import Path

import click

from eventlane.cli.context import app as cli_app
from eventlane.cli.context import data_option, stderr_console
from eventlane.cli.metrics import export_metrics, metrics_options
from eventlane.observability import get_logger

log = get_logger("eventlane.console")

__all__ = ["console"]

LOOPBACK_NAMES = ("localhost",)
MIN_TOKEN = 16
"""Shortest access token accepted from --token / $EVENTLANE_CONSOLE_TOKEN."""
TOKEN_SHAPE = re.compile(rf"[A-Za-z0-9._~-]{{{MIN_TOKEN},}}")


def is_loopback(host: str) -> bool:
    """``True`` for 127.0.0.0/8, ::1 and ``localhost``.

    >>> is_loopback("127.0.0.1"), is_loopback("0.0.0.0"), is_loopback("localhost")
    (True, False, True)
    """
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.argument("app_spec", metavar="[APP]", required=False, envvar="EVENTLANE_APP")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8070, show_default=True, help="TCP port."
)
@click.option(
    "--read-write",
    is_flag=True,
    help="Allow state changes: offset resets, dead-letter retries, rebuilds, SQL on read models.",
)
@click.option(
    "--token",
    envvar="EVENTLANE_CONSOLE_TOKEN",
    default=None,
    metavar="TOKEN",
    help="Access token every request must carry (Bearer header, or ?token= once for a"
    " cookie). Made up and printed when --host is beyond loopback and none is given.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="A host name the browser may use for the console (e.g. a reverse proxy's); IP"
    " addresses and localhost always may. Repeatable.",
)
@click.option(
    "--lag-interval",
    type=click.FloatRange(0.2, 3600),
    default=5.0,
    show_default=True,
    metavar="S",
    help="Seconds between the console's lag samples (lag charts).",
)
@metrics_options
@data_option
def console(
    app_spec: str | None,
    host: str,
    port: int,
    read_write: bool,
    token: str | None,
    allow_hosts: tuple[str, ...],
    lag_interval: float,
    metrics_port: int | None,
    metrics_addr: str,
) -> None:
    """Serve the web console for the log (and APP's aggregates, projectors and codec)."""
    try:
        import uvicorn  # noqa: PLC0415  (the console extra is optional)

        from eventlane.console import ConsoleData, create_app, open_log  # noqa: PLC0415
    except ImportError as exc:
        raise click.ClickException(
            f"the console needs the console extra: pip install 'eventlane[console]' ({exc})"
        ) from None
    ctx = click.get_current_context()
    log_url = cli_app().log_url  # the shared --log option (root or subcommand)
    typed = click.core.ParameterSource.COMMANDLINE
    data_given = typed in (
        ctx.get_parameter_source("data"),
        ctx.find_root().get_parameter_source("data"),
    )
    # --log wins over a data directory that was not typed (default, $EVENTLANE_DATA)
    data_dir: Path | None = cli_app().data if data_given or log_url is None else None
    if token is not None and not TOKEN_SHAPE.fullmatch(token):
        raise click.BadParameter(
            f"use at least {MIN_TOKEN} characters among A-Z a-z 0-9 . _ ~ -"
            " (it goes into a URL and a cookie as it is)",
            param_hint="--token",
        )
    made_up = None
    if token is None and not is_loopback(host):
        token = made_up = secrets.token_urlsafe(32)
    data = ConsoleData(open_log(data_dir, log_url), app_spec)
    metrics = ExitStack()
    if metrics_port is not None:
        export_metrics(
            metrics, data.runtime, metrics_port, metrics_addr, log_=data.log, workers=False
        )
    web = create_app(
        data,
        read_write=read_write,
        lag_interval=lag_interval,
        token=token,
        hosts=[host, *allow_hosts],
    )
    err = stderr_console()
    if not is_loopback(host):
        log.warning("console bound to a non-loopback address", host=host)
        err.print(
            f"[yellow]warning:[/yellow] listening on {host}: anyone who can reach this address"
            " and has the access token can read every record"
            + (" and change offsets" if read_write else "")
            + "; the console speaks plain HTTP, so put TLS in front of it beyond a trusted"
            " network",
            highlight=False,
        )
    mode = "read-write" if read_write else "read-only"
    shown = f"?token={made_up}" if made_up else ""
    config = uvicorn.Config(web, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    original = server.startup

    async def startup(*args: object, **kwargs: object) -> None:
        await original(*args, **kwargs)  # type: ignore[arg-type]
        bound = port
        for s in server.servers:
            for sock in s.sockets:
                bound = sock.getsockname()[1]
        where = f"[{host}]" if ":" in host else host
        err.print(
            f"eventlane console: http://{where}:{bound}/{shown} ({mode})",
            highlight=False,
            soft_wrap=True,
        )

    server.startup = startup  # type: ignore[method-assign]
    with metrics:
        server.run()
