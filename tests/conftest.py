"""Shared fixtures: a controllable clock and a ``LogStore`` on a fresh temporary directory.

The test run is an entry point: it configures eventlane's logging once (warnings and above
on standard error, ``EVENTLANE_LOG_LEVEL`` to change it), as the ``eventlane`` command does;
``import eventlane`` itself configures nothing.

Hypothesis profiles: ``default`` (what the suite runs) and ``soak`` (many more examples and
longer stateful runs), picked with ``HYPOTHESIS_PROFILE=soak``.

``make test`` runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``): most
tests wait on real processes and servers, so two workers overlap those waits. Each test that
uses a session-scoped fixture of ours (a JetStream cluster, a Kafka cluster, the SparkSession)
is grouped with every other user of that fixture (``SHARED_SERVERS``), so each is started
once per run, on one worker (a PostgreSQL server is cheap: one per worker); a test using a
module- or class-scoped fixture stays with its module, and a module that asks for such a
fixture by name (``getfixturevalue``) says its group itself (``pytestmark``). Everything else
is spread one test at a time. ``pytest`` without ``-n`` runs everything in one process, as
before.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, settings

from eventlane.log import LogStore
from eventlane.observability import configure_logging
from eventlane.testing.clock import FakeClock
from eventlane.testing.postgres import PostgresServer

configure_logging()


SHARED_SERVERS = frozenset({"cluster", "kafka_cluster", "spark"})
"""Session fixtures too heavy to start on both workers: 3 nats-servers, 3 Kafka JVMs, Spark."""


def _xdist_group(item: pytest.Item) -> str | None:
    """The work unit a test must share a worker with (see the module docstring)."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:  # a module that requests a module fixture by name says so itself
        return str(mark.args[0] if mark.args else mark.kwargs["name"])
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    shared = None
    for name in sorted(info.names_closure):
        definitions = info.name2fixturedefs.get(name)
        if not definitions:
            continue
        fixture = definitions[-1]  # the definition in effect for this test
        if not fixture.baseid:  # pytest's own and plugins' fixtures (tmp_path_factory...)
            continue
        if fixture.scope == "session":
            if name in SHARED_SERVERS:
                return f"session-{name}"
            continue  # cheap to start once per worker (a PostgreSQL server)
        if fixture.scope in ("package", "module", "class"):
            shared = item.nodeid.split("::")[0]
    return shared


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        group = _xdist_group(item)
        if group is None:
            continue
        item.add_marker(pytest.mark.xdist_group(group))
        if getattr(config.option, "loadgroup", False) and "@" not in item.nodeid:  # a worker
            _suffix_group(item, group)


def _suffix_group(item: pytest.Item, group: str) -> None:
    """Give ``item`` the ``@group`` node-id suffix that loadgroup schedules by.

    pytest-xdist 3.8 adds it by writing ``item._nodeid``, which pytest 9 no longer reads (the
    id lives in ``item._id``): without this every test was scheduled alone and each worker
    started its own clusters and SparkSession (tests/test_conftest_grouping.py checks it)."""
    from _pytest.nodeid import coerce_node_id  # noqa: PLC0415

    item._id = coerce_node_id(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """An in-process CLI run configures the root logger, a docs example the ``eventlane``
    logger (handlers, level, propagation): put both back."""
    loggers = [logging.getLogger(), logging.getLogger("eventlane")]
    saved = [(list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for logger, (handlers, level, propagate) in zip(loggers, saved, strict=True):
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


settings.register_profile(
    "soak",
    max_examples=2000,
    stateful_step_count=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# The default run: Hypothesis' own example counts, without its timing checks (a 200 ms
# deadline per example and the too-slow health check fail on a loaded 2-core CI machine:
# speed is measured in benchmarks/, never asserted here).
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(data_dir: Path, clock: FakeClock) -> Iterator[LogStore]:
    """A ``LogStore`` on a fresh directory, driven by the ``clock`` fixture."""
    log = LogStore(data_dir, clock=clock)
    yield log
    log.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A temporary PostgreSQL cluster (Debian's ``postgresql``: ``make test-deps``) on a free
    loopback port, for the whole session; stopped by its PID, its directory removed. Not
    under pytest's temporary root: pytest makes that private to root, and the cluster runs
    as the ``postgres`` user."""
    server = PostgresServer.start(Path(tempfile.mkdtemp(prefix="eventlane-pg-")))
    yield server
    server.stop()
    shutil.rmtree(server.directory, ignore_errors=True)


_databases = iter(range(1, 1_000_000))


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database of the session's cluster (its URL)."""
    name = f"t{next(_databases)}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_server.url.rsplit("/", 1)[0] + f"/{name}"
