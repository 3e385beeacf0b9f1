"""Item 12: an ``App`` may declare a namespace, so two apps (or two deployments of one app)
share one data directory without seeing each other's topics, groups, read models, dead
letters, snapshots and keys; and an app without one keeps today's names exactly.

The CLI tests run the real ``eventlane`` command and real worker processes from a user's
project directory (``tests/newcomer/kit.py``); the keys test runs in-process on a real data
directory."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import ClassVar

import pytest
from attrs import frozen

from eventlane import Aggregate, App, applies
from eventlane.app.namespace import Namespace
from eventlane.console.data import ConsoleData
from eventlane.domain import DomainEvent, event, personal
from eventlane.engine import open_log
from eventlane.errors import AggregateNotFoundError, ConfigError
from eventlane.replay.forget import forget
from tests.newcomer.kit import EVENTLANE, child_env, eventlane, python, stop

TENANTS = """
from eventlane import App
from library.app import app as library


def deployment(namespace):
    return App("library", aggregates=library.aggregates,
               projectors=library.projectors.values(), registry=library.registry,
               partitions=2, namespace=namespace)


staging = deployment("staging")
prod = deployment("prod")
"""


APPS = {"plain": "library.app:app", "staging": "tenants:staging", "prod": "tenants:prod"}

SEED = """
import tenants
from library.app import app as plain
from library.domain import Loan
for app, prefix, loans in ((plain, "m", 3), (tenants.staging, "s", 6), (tenants.prod, "p", 4),
                           (tenants.prod, "p-bad", 2)):
    with app.open("d") as rt:
        for i in range(loans):
            rt.execute(Loan, f"loan-{prefix}-{i}",
                       lambda loan: loan.request(f"{prefix}-{i}", "book-1"), create=True)
"""

CAUGHT_UP = """
import json, time
import tenants
from library.app import app as plain
apps = {"plain": plain, "staging": tenants.staging, "prod": tenants.prod}
runtimes = {k: a.open("d", create_topics=False) for k, a in apps.items()}
deadline = time.monotonic() + 150
while True:
    docs = {k: rt.status("loans_view") for k, rt in runtimes.items()}
    if all(d["lag"] == 0 and any(m["alive"] for m in d["members"]) for d in docs.values()):
        break
    assert time.monotonic() < deadline, docs
    time.sleep(0.3)
print(json.dumps(docs))
"""

PLAIN_AGAIN = """
from library.app import app
from library.domain import Loan
with app.open("d") as rt:
    print(app.namespace, rt.load(Loan, "loan-m-2").status, rt.status("loans_view")["lag"],
          rt.readmodel_path("loans_view").name, rt.status("loans_view")["group"])
"""


def _cli(workdir: Path, *args: str, **env: str) -> str:
    done = eventlane("--data", "d", *args, cwd=workdir, timeout=300, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _workers(workdir: Path, app: str, **env: str) -> subprocess.Popen[bytes]:
    """``eventlane project run APP -p loans_view`` in the background (output in a file)."""
    log = (workdir / f"run-{app.replace(':', '-')}.log").open("a")
    return subprocess.Popen(
        [
            *(str(EVENTLANE), "--data", "d", "project", "run", app, "-p", "loans_view"),
            *("--no-live", "--session-timeout-ms", "2000"),
        ],
        cwd=workdir,
        stdout=log,
        stderr=log,
        env=child_env(**env),
    )


def _rows(path: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return sorted(conn.execute("SELECT loan_id, member_id FROM loans").fetchall())
    finally:
        conn.close()


def _three_apps_caught_up(workdir: Path) -> dict[str, dict]:
    """The library app without a namespace and two deployments of it (staging, prod) on one
    data directory, each run by its own workers (prod's handler buggy) until caught up."""
    (workdir / "tenants.py").write_text(TENANTS)
    python(SEED, cwd=workdir)  # prod's member ids "p-bad-N" make the buggy handler fail
    runs = [
        _workers(workdir, spec, **env)
        for spec, env in (
            (APPS["plain"], {}),
            (APPS["staging"], {}),
            (APPS["prod"], {"LIBRARY_BUGGY": "1"}),
        )
    ]
    try:
        return json.loads(python(CAUGHT_UP, cwd=workdir, timeout=200))
    finally:
        assert [stop(run) for run in runs] == [0, 0, 0]  # type: ignore[arg-type]


def test_namespaces_share_one_data_directory(workdir: Path) -> None:
    """An app without a namespace (the names eventlane always wrote) and two deployments of
    it, staging and prod, on one data directory: each sees only its own."""
    readmodels = workdir / "d" / "readmodels"
    docs = _three_apps_caught_up(workdir)
    staging, prod, plain = docs["staging"], docs["prod"], docs["plain"]
    assert (staging["projector"], staging["group"]) == ("loans_view", "staging.loans_view")
    assert (plain["projector"], plain["group"]) == ("loans_view", "loans_view")
    assert {r["topic"] for r in prod["partitions"]} == {"prod.loans"}
    assert Path(staging["readmodel"]).name == "staging.loans_view.sqlite"
    assert Path(plain["readmodel"]).name == "loans_view.sqlite"
    assert staging["dead_letters"] == plain["dead_letters"] == {}
    assert prod["dead_letters"] == {"dead": 2}
    started = " ".join((workdir / "run-tenants-staging.log").read_text().split())
    assert "projector loans_view (group staging.loans_view), 2 partition(s) (staging.loans-0" in (
        started
    )

    # topics and groups: the bare names for the plain app, prefixed ones for the others
    def topics(*args: str) -> set[str]:
        return {t["name"] for t in json.loads(_cli(workdir, "topics", "list", "--json", *args))}

    def groups(*args: str) -> set[str]:
        return {g["group"] for g in json.loads(_cli(workdir, "groups", "list", "--json", *args))}

    assert topics() == {
        *("loans", "members", "__consumer_offsets"),  # the last: the groups' commits
        *("staging.loans", "staging.members"),
        *("prod.loans", "prod.members", "prod.loans_view.dlq"),
    }
    assert topics("--namespace", "prod") == {"prod.loans", "prod.members", "prod.loans_view.dlq"}
    assert groups() == {"loans_view", "staging.loans_view", "prod.loans_view"}
    assert groups("--namespace", "prod") == {"prod.loans_view"}
    files = {p.name for p in readmodels.iterdir() if p.suffix == ".sqlite"}
    assert files == {"loans_view.sqlite", "staging.loans_view.sqlite", "prod.loans_view.sqlite"}

    # read models hold their own app's events only
    plain_rows = _rows(readmodels / "loans_view.sqlite")
    for name, prefix, count in (("", "m", 3), ("staging.", "s", 6), ("prod.", "p", 4)):
        got = [r[0] for r in _rows(readmodels / f"{name}loans_view.sqlite")]
        assert got == sorted(f"loan-{prefix}-{i}" for i in range(count)), name

    # dead letters: prod's only, reported with the full topic, in prod's dead-letter topic
    letters = json.loads(_cli(workdir, "dlq", "list", APPS["prod"], "-p", "loans_view", "--json"))
    assert sorted(d["key"] for d in letters) == ["loan-p-bad-0", "loan-p-bad-1"]
    assert {d["topic"] for d in letters} == {"prod.loans"}
    dlq = _cli(workdir, "consume", "prod.loans_view.dlq", "--max", "2")
    assert dlq.count("loan-p-bad-") == 2

    # the fixed code retries prod's letters; the others are untouched
    retried = json.loads(_cli(workdir, "dlq", "retry", APPS["prod"], "-p", "loans_view", "--json"))
    assert len(retried["succeeded"]) == 2 and retried["failed"] == {}
    assert len(_rows(readmodels / "prod.loans_view.sqlite")) == 6

    # prod's rebuild equals its live read model; staging's partitions replay and merge as a
    # Spark rebuild's tasks would (--check; the Spark rebuild itself: the soak test below)
    local = json.loads(
        _cli(
            workdir,
            "rebuild",
            APPS["prod"],
            "-p",
            "loans_view",
            "--engine",
            "local",
            "--verify",
            "--json",
        )
    )
    assert Path(local["rebuild"]["path"]).name == "prod.loans_view.rebuild.sqlite"
    assert [c["what"] for c in local["verify"] if c["skipped"] is None] == ["live"]
    assert all(c["ok"] for c in local["verify"])
    check = json.loads(
        _cli(workdir, "rebuild", APPS["staging"], "-p", "loans_view", "--check", "--json")
    )
    assert check["partials"] == 2 and check["merge"]["rows"] == 6

    # removing one deployment's projector leaves the others'
    removed = json.loads(_cli(workdir, "project", "remove", "prod.loans_view", "--json"))
    assert removed["group"] and removed["dlq_topic"] == "prod.loans_view.dlq"
    assert not (readmodels / "prod.loans_view.sqlite").exists()
    assert len(_rows(readmodels / "staging.loans_view.sqlite")) == 6

    # the app without a namespace reopens its data unchanged, under the same names
    assert _rows(readmodels / "loans_view.sqlite") == plain_rows
    assert python(PLAIN_AGAIN, cwd=workdir).split() == [
        *("None", "active", "0", "loans_view.sqlite", "loans_view")
    ]


@pytest.mark.soak
def test_spark_rebuilds_of_namespaced_apps_equal_their_live_models(workdir: Path) -> None:
    """The Spark rebuild (with --verify: against the local engine and the live model) of each
    deployment; the default suite checks the same tasks without Spark (``rebuild --check``)."""
    _three_apps_caught_up(workdir)
    _cli(workdir, "dlq", "retry", APPS["prod"], "-p", "loans_view")
    for app in (APPS["staging"], APPS["prod"]):
        spark = json.loads(
            _cli(
                workdir,
                "rebuild",
                app,
                "-p",
                "loans_view",
                "--engine",
                "spark",
                "--master",
                "local[1]",
                "--verify",
                "--json",
            )
        )
        assert [c["what"] for c in spark["verify"]] == ["local engine", "live"]
        assert all(c["ok"] and c["skipped"] is None for c in spark["verify"]), app
        live = workdir / "d" / "readmodels" / f"{app.split(':')[1]}.loans_view.sqlite"
        assert _rows(workdir / spark["rebuild"]["path"]) == _rows(live)


# ---------------------------------------------------------------- keys, snapshots, forget
@event("NsJoined")
@frozen
class Joined(DomainEvent):
    name: str = personal()


class Person(Aggregate):
    topic: ClassVar[str] = "people"
    snapshot_every: ClassVar[int] = 1
    snapshot_subject: ClassVar[str] = "id"
    name: str

    def init_state(self) -> None:
        self.name = ""

    def join(self, name: str) -> None:
        self.record_that(Joined(name))

    @applies(Joined)
    def _joined(self, e: Joined) -> None:
        self.name = e.name


CRM = {ns: App("crm", aggregates=[Person], namespace=ns) for ns in ("eu", "us")}
EU = CRM["eu"]  # what the console's APP names below


def test_keys_snapshots_and_forget_stay_in_their_namespace(tmp_path: Path) -> None:
    apps = CRM
    runtimes = {ns: app.open(tmp_path) for ns, app in apps.items()}
    try:
        for rt in runtimes.values():
            assert rt.execute(Person, "p-1", lambda p: p.join("Ada"), create=True).name == "Ada"
        names = set(runtimes["eu"].log.list_topics())
        assert {"eu.people", "eu.people.snapshots", "eu.crm.keys"} <= names
        assert {"us.people", "us.people.snapshots", "us.crm.keys"} <= names
        assert not {"people", "crm.keys", "people.snapshots"} & names

        # errors name the full topic; the partition count is declared by the bare name
        with pytest.raises(AggregateNotFoundError) as missing:
            runtimes["us"].load(Person, "nobody")
        assert missing.value.topic == "us.people"
        with pytest.raises(ConfigError, match=r"partitions=\{'people': 6\}") as count:
            App("crm", aggregates=[Person], namespace="eu", partitions=3).open(tmp_path)
        assert count.value.topic == "eu.people"

        # the console shows the namespaced app's aggregates under their full topic
        console = ConsoleData(open_log(tmp_path), f"{__name__}:EU")
        try:
            assert console.aggregate_types() == [{"name": "Person", "topic": "eu.people"}]
            doc = console.aggregate("Person", "p-1", None)
            assert (doc["topic"], doc["state"]["name"]) == ("eu.people", "Ada")
        finally:
            console.close()

        report = forget(runtimes["eu"], ["p-1"], scan=True, rebuild_readmodels=False)
        assert report.keys_destroyed == ("p-1",)
        assert report.unreadable == {"eu.people": 1}
    finally:
        for rt in runtimes.values():
            rt.close()
    for ns, want in (("eu", "[erased]"), ("us", "Ada")):
        with apps[ns].open(tmp_path) as rt:
            assert rt.load(Person, "p-1").name == want, ns


def test_a_namespace_is_checked() -> None:
    for bad in ("", "a.b", "-x", "_internal", "x" * 65, "a b"):
        with pytest.raises(ConfigError, match=r"namespace .* is illegal"):
            App("x", namespace=bad)
    assert Namespace("tenant-42_eu").topic("orders") == "tenant-42_eu.orders"
    done = eventlane("topics", "list", "--namespace", "a.b", cwd=Path.cwd())
    assert done.returncode == 2 and "is illegal" in done.stderr
