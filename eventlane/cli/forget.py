"""``eventlane forget APP SUBJECT...``: erase subjects' personal data (crypto-shredding).

See ``docs/privacy.md``: the subjects' keys are destroyed (a tombstone, then compaction of
the key topic), their snapshots dropped, the app's ``on_forget`` hooks run, and the read
models that hold personal fields rebuilt and swapped in; then it reports what became
unreadable.
"""

from __future__ import annotations

import click
import orjson

from eventlane.app import load_app
from eventlane.cli.context import app as cli_app
from eventlane.cli.context import data_option, json_option, stderr_console, stdout_console
from eventlane.cli.project import app_argument
from eventlane.log.port import keyed_log
from eventlane.replay.forget import ForgetReport
from eventlane.replay.forget import forget as forget_subjects
from eventlane.replay.rebuild import ENGINES


@click.command()
@app_argument
@click.argument("subjects", nargs=-1, metavar="[SUBJECT]...")
@click.option(
    "--engine",
    type=click.Choice(ENGINES),
    default="local",
    show_default=True,
    help="How the read models that held personal data are rebuilt.",
)
@click.option(
    "--no-scan",
    is_flag=True,
    help="Skip counting the records that carried the subjects' cipher texts.",
)
@click.option(
    "--no-rebuild",
    is_flag=True,
    help="Do not rebuild read models now (then they still show the erased values).",
)
@click.option(
    "--swap-timeout",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for a read model's workers to pause and its readers to let go.",
)
@data_option
@json_option
def forget(
    app_spec: str,
    subjects: tuple[str, ...],
    engine: str,
    no_scan: bool,
    no_rebuild: bool,
    swap_timeout: float,
    as_json: bool,
) -> None:
    """Forget SUBJECT... of APP: destroy their keys so their personal data is unreadable.

    APP is the application as module:attribute [env EVENTLANE_APP]. Without SUBJECT it
    finishes the subjects of an interrupted run (the journal in the data directory). Exits
    1 when a place may still hold their data (listed under "not scrubbed"): run it again.
    """
    application = load_app(app_spec)
    log = cli_app().open_log(create=False)
    with application.open(keyed_log(log, "eventlane forget"), create_topics=False) as runtime:
        report = forget_subjects(
            runtime,
            subjects,
            engine=engine,
            scan=not no_scan,
            rebuild_readmodels=not no_rebuild,
            swap_timeout=swap_timeout,
        )
    if as_json:
        click.echo(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        _print(report)
    if not report.ok:
        stderr_console().print(
            f"forget incomplete: {len(report.not_scrubbed)} place(s) not scrubbed; the journal"
            " is kept: run `eventlane forget APP` again"
        )
        raise SystemExit(1)


def _print(report: ForgetReport) -> None:
    console = stdout_console()
    for subject in report.subjects:
        if subject in report.keys_destroyed:
            state = "key destroyed"
        elif subject in report.already_forgotten:
            state = "already forgotten (nothing destroyed)"
        else:
            state = "unknown subject (no key record)"
        console.print(f"{subject}: {state}")
    for topic, count in sorted(report.unreadable.items()):
        console.print(
            f"  {count:,} records of {topic} carry personal fields that are now unreadable"
        )
    if report.snapshots_removed:
        console.print(f"  {report.snapshots_removed} snapshots removed")
    if report.rebuilt:
        console.print(f"  read models rebuilt: {', '.join(report.rebuilt)}")
    for line in report.scrubbed:
        console.print(f"  scrubbed: {line}")
    for line in report.not_scrubbed:
        console.print(f"  not scrubbed: {line}")
