"""Standard output carries data only: every data-printing command of the ``eventlane`` CLI,
run as a real process on the embedded log and on a real 3-node JetStream cluster, prints
exactly its data (one JSON document with ``--json``, JSON lines for ``consume``, the
documented plain lines otherwise), and every diagnostic goes to standard error.

The commands are enumerated from the click command tree (plugins included), so a new
command fails :func:`test_every_command_is_classified` until it is given a run here (or a
reason why it prints no data). The runs use ``EVENTLANE_LOG_LEVEL=debug``: every log call
is emitted, so a log line that reached standard output breaks the parse of its command.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest

from eventlane.cli import main

BOTH = frozenset({"embedded", "jetstream"})
EMBEDDED = frozenset({"embedded"})
JETSTREAM = frozenset({"jetstream"})
ROOT = Path(__file__).resolve().parents[2]
EVENTLANE = Path(sys.executable).parent / "eventlane"
APP = "tests.cli.stdout_app:app"
TIMEOUT_S = 120.0

Parse = Callable[[str], None]


def json_doc(out: str) -> None:
    """One JSON document, nothing else."""
    json.loads(out)


def json_lines(*keys: str) -> Parse:
    """At least one line; each a JSON object with ``keys`` (a JSON log line lacks them)."""

    def parse(out: str) -> None:
        lines = out.splitlines()
        assert lines, "no records printed"
        for line in lines:
            body = json.loads(line)
            assert isinstance(body, dict) and set(keys) <= set(body), f"not a record: {line!r}"

    return parse


def plain(*patterns: str) -> Parse:
    """Every line matches one of ``patterns`` (the documented plain output); no pattern:
    nothing printed."""

    def parse(out: str) -> None:
        for line in out.splitlines():
            assert any(re.fullmatch(p, line) for p in patterns), f"stray line {line!r}"

    return parse


@dataclass(frozen=True)
class Run:
    """One command line: ``path`` names the command, ``args`` follow it (a callable: computed
    when the command runs)."""

    path: tuple[str, ...]
    args: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    parse: Parse = json_doc
    stdin: bytes | None = None
    before: Callable[[], None] | None = None
    """Set-up run just before the command."""
    until: Callable[[], bool] | None = None
    """A command that runs until SIGTERM: it is stopped once ``until()`` holds."""
    where: tuple[str, ...] | None = None
    """``--data``/``--log`` options instead of the engine's."""
    engines: frozenset[str] = BOTH
    env: dict[str, str] = field(default_factory=dict)


NO_DATA: dict[tuple[str, ...], str] = {
    ("console",): "a web server: its address goes to stderr, its pages are served over HTTP",
    ("serve",): "a Kafka-protocol server: its address goes to stderr",
    ("demo", "log"): "a narrated tour for a terminal, not data (docs/cli.md)",
    ("demo", "invoicing"): "a narrated tour for a terminal, not data (docs/cli.md)",
    ("project", "worker"): "started by `project run` (hidden); run by its run here",
    ("invoicing", "invoice-for"): "the example app's plugin: needs that app's data",
    ("invoicing", "serve"): "the example app's plugin: a server",
    ("invoicing", "serve-http"): "the example app's plugin: a web server (tests/web runs it)",
    ("kafka", "up"): "starts a 3-broker Kafka cluster (~50 s): tests/kafka_engine/conftest.py"
    " runs it as a real process and checks its stdout is exactly the cluster's URL",
    ("kafka", "down"): "stops that cluster: the same fixture runs it and checks no PID survives",
}
"""Commands that print no data on stdout, and why (every other command has a run below)."""


def leaves(group: click.Group, ctx: click.Context) -> Iterator[tuple[str, ...]]:
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        assert sub is not None, name
        if isinstance(sub, click.Group):
            sub_ctx = click.Context(sub, parent=ctx, info_name=name)
            yield from ((name, *rest) for rest in leaves(sub, sub_ctx))
        else:
            yield (name,)


def every_command() -> set[tuple[str, ...]]:
    return set(leaves(main, click.Context(main, info_name="eventlane")))


class Env:
    """Runs ``eventlane`` as a child process on one engine, checking what it prints."""

    def __init__(self, engine: str, data: Path, url: str | None) -> None:
        self.engine, self.data, self.url = engine, data, url
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "EVENTLANE_LOG_LEVEL": "debug",
            "EVENTLANE_LOG_FORMAT": "console",
            "EVENTLANE_DATA": "",
            "EVENTLANE_LOG": "",
        }
        self.ran: set[tuple[str, ...]] = set()

    def argv(self, *args: str, where: tuple[str, ...] | None = None) -> list[str]:
        if where is None:
            where = ("--data", str(self.data), *(("--log", self.url) if self.url else ()))
        return [str(EVENTLANE), *where, *args]

    def run(self, step: Run) -> None:
        if self.engine not in step.engines:
            return
        if step.before is not None:
            step.before()
        args = step.args() if callable(step.args) else step.args
        argv = self.argv(*step.path, *args, where=step.where)
        if step.until is None:
            done = subprocess.run(
                argv,
                input=step.stdin,
                capture_output=True,
                timeout=TIMEOUT_S,
                env={**self.env, **step.env},
                cwd=ROOT,
                check=False,
            )
            out, err, rc = done.stdout, done.stderr, done.returncode
        else:
            out, err, rc = self._run_until(argv, step.until)
        what = f"{' '.join(step.path)} on {self.engine}"
        assert rc == 0, f"{what} exited {rc}: {err.decode()[-2000:]}"
        try:
            step.parse(out.decode())
        except (AssertionError, ValueError) as exc:
            pytest.fail(f"{what}: stdout is not its data ({exc}):\n{out.decode()[:3000]}")
        self.ran.add(step.path)

    def _run_until(self, argv: list[str], until: Callable[[], bool]) -> tuple[bytes, bytes, int]:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=ROOT,
        )
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while not until() and proc.poll() is None:
                assert time.monotonic() < deadline, "never got there"
                time.sleep(0.2)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return out, err, proc.returncode

    def json(self, *args: str) -> object:
        done = subprocess.run(
            self.argv(*args),
            capture_output=True,
            timeout=TIMEOUT_S,
            env=self.env,
            cwd=ROOT,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        return json.loads(done.stdout)

    def seed(self) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.cli.stdout_app",
                str(self.data),
                *filter(None, [self.url]),
            ],
            check=True,
            capture_output=True,
            timeout=TIMEOUT_S,
            env=self.env,
            cwd=ROOT,
        )


def scenario(env: Env, tmp: Path) -> list[Run]:
    """Every data-printing command once, in an order where each has something to print."""

    def caught_up() -> bool:
        doc = env.json("project", "status", APP, "--projection", "balances", "--json")
        assert isinstance(doc, dict)
        [status] = doc["projectors"]
        return bool(status["lag"] == 0 and status["partitions"])

    def balances_joined() -> bool:  # `run` is up (its handlers installed) once its worker joined
        groups = env.json("groups", "list", "--json")
        assert isinstance(groups, list)
        return any(str(g["group"]).endswith("balances") and g["members"] for g in groups)

    def scheduler_up() -> bool:
        groups = env.json("groups", "list", "--json")
        assert isinstance(groups, list)
        return any(str(g["group"]).endswith(".scheduler") for g in groups)  # it joined

    def segment() -> tuple[str, ...]:
        biggest = max((env.data / "topics" / "t").glob("*/*.log"), key=lambda p: p.stat().st_size)
        return (str(biggest), "--json")

    embedded_copy = tmp / "copy-from"

    def embedded_topic() -> None:
        subprocess.run(
            env.argv("topics", "create", "m", where=("--data", str(embedded_copy))),
            check=True,
            capture_output=True,
            env=env.env,
            timeout=TIMEOUT_S,
        )

    records = ("topic", "partition", "offset")
    cluster = ("--dir", str(tmp / "cluster"))
    balances = ("--projection", "balances")
    copy = (str(env.url).partition("?")[0], "--namespace", "c" + uuid.uuid4().hex[:8])
    return [
        Run(("topics", "create"), ("t", "--partitions", "2"), plain(r"topic t created: .*")),
        Run(
            ("topics", "alter"),
            ("t", "--config", "cleanup.policy=compact,delete"),
            plain(r"topic t altered: .*"),
        ),
        Run(
            ("produce",),
            ("t", "--print-offsets", "--key-separator", ":"),
            plain(r"\d+ \d+"),
            stdin=b"k1:a\nk2:b\nk1:c\nk2:d\n",
        ),
        Run(("consume",), ("t", "--max", "4"), json_lines(*records)),
        Run(("consume",), ("t", "--group", "g", "--max", "4"), json_lines(*records)),
        Run(("topics", "list"), ("--json",)),
        Run(("topics", "describe"), ("t", "--json")),
        Run(("groups", "list"), ("--json",)),
        Run(("groups", "describe"), ("g", "--json")),
        Run(("groups", "reset-offsets"), ("g", "--topic", "t", "--to-earliest", "--json")),
        Run(("groups", "delete"), ("g",), plain(r"consumer group g deleted .*")),
        Run(("compact",), ("t", "--json")),
        Run(("cleanup",), ("t", "--json")),
        Run(("verify",), ("--json",)),
        Run(("dump",), segment, json_lines("base_offset", "crc_valid"), engines=EMBEDDED),
        Run(("migrate",), (APP, "--json"), before=env.seed),
        Run(("project", "run"), (APP, *balances, "--no-live"), plain(), until=caught_up),
        Run(("project", "status"), (APP, "--json")),
        Run(("run",), (APP, "--only", "balances"), plain(), until=balances_joined),
        Run(("schedules", "run"), (APP, "--poll-interval", "0.1"), plain(), until=scheduler_up),
        Run(("schedules", "list"), (APP, "--state", "all", "--json")),
        Run(("dlq", "list"), (APP, *balances, "--json")),
        Run(("dlq", "show"), (APP, "1", *balances, "--json")),
        Run(("dlq", "retry"), (APP, *balances, "--json"), env={"STDOUT_APP_FIXED": "1"}),
        Run(("rebuild",), (APP, *balances, "--engine", "local", "--json")),
        Run(("forget",), (APP, "acct-3", "--json")),
        Run(("project", "remove"), ("balances", "--dry-run", "--json")),
        Run(("topics", "delete"), ("t",), plain(r"topic t deleted")),
        Run(("cluster", "up"), ("--nodes", "3", *cluster), plain(r"nats://\S+"), engines=JETSTREAM),
        Run(
            ("cluster", "check"),
            cluster,
            plain(r"http://\S+ ok: sync_interval: always \(fsync before every ack\)"),
            engines=JETSTREAM,
        ),
        Run(("cluster", "down"), cluster, plain(r"stopped 3 nodes"), engines=JETSTREAM),
        Run(
            ("migrate-log",),
            copy,
            plain(r"copied \d+ records in \d+ partitions", r"m\[\d+\] offsets .*: ok"),
            before=embedded_topic,
            where=("--data", str(embedded_copy)),
            engines=JETSTREAM,
        ),
    ]


def run_scenario(env: Env, tmp: Path) -> None:
    steps = scenario(env, tmp)
    for step in steps:
        env.run(step)
    assert env.ran == {s.path for s in steps if env.engine in s.engines}


def test_library_modules_log_through_framework_observability() -> None:
    """The root cause of log lines on stdout: a module logging through structlog directly
    gets structlog's default (print to stdout) whenever the process has not configured it.
    ``eventlane.observability.get_logger`` is a standard-library logger: it never prints to
    stdout (the host's handlers, or the last resort on stderr)."""
    direct = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "eventlane").rglob("*.py")
        if path.name != "observability.py"
        and re.search(r"structlog\.(get_logger|wrap_logger|PrintLogger)", path.read_text())
    )
    assert not direct, direct


def test_every_command_is_classified(tmp_path: Path) -> None:
    """Each command of the tree has a run in :func:`scenario` or a reason in NO_DATA."""
    ran = {s.path for s in scenario(Env("embedded", tmp_path, None), tmp_path)}
    assert ran.isdisjoint(NO_DATA)
    tree = every_command()
    assert tree - ran - set(NO_DATA) == set(), "give each new command a Run or a NO_DATA reason"
    assert ran <= tree  # NO_DATA may name plugins that are not installed here


def test_stdout_is_data_on_the_embedded_log(tmp_path: Path) -> None:
    run_scenario(Env("embedded", tmp_path / "data", None), tmp_path)


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real 3-node JetStream cluster on loopback (as in tests/jetstream), stopped by PID."""
    pytest.importorskip("nats", reason="the nats extra is not installed")
    from eventlane.log.jetstream.cluster import LocalCluster  # noqa: PLC0415 - nats extra

    cluster = LocalCluster.create(tmp_path_factory.mktemp("nats"), nodes=3)
    cluster.start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.mark.jetstream
def test_stdout_is_data_on_jetstream(tmp_path: Path, nats_cluster: str) -> None:
    url = f"{nats_cluster}?namespace=s{uuid.uuid4().hex[:10]}"
    run_scenario(Env("jetstream", tmp_path / "data", url), tmp_path)
