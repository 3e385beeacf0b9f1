"""Item 12: an ``App`` may declare a namespace, so two apps (or two deployments of one app)
share one data directory without seeing each other's topics, groups, read models, dead
letters, snapshots and keys; and an app without one keeps today's names exactly.

The CLI tests run the real ``eventlane`` command and real worker processes from a user's
project directory (``tests/newcomer/kit.py``); the keys test runs in-process on a real data
directory."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import ClassVar

import pytest
from attrs import frozen

from framework import Aggregate, App, applies
from framework.app.namespace import Namespace
from framework.domain import DomainEvent, event, personal
from framework.errors import ConfigError
from framework.replay.forget import forget
from tests.newcomer.kit import child_env, eventlane, python, stop, wait_until

TENANTS = """
from framework import App
from library.app import app as library


def deployment(namespace):
    return App("library", aggregates=library.aggregates,
               projectors=library.projectors.values(), registry=library.registry,
               partitions=2, namespace=namespace)


staging = deployment("staging")
prod = deployment("prod")
"""


def _cli(workdir: Path, *args: str, **env: str) -> str:
    done = eventlane("--data", "d", *args, cwd=workdir, timeout=300, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _status(workdir: Path, app: str) -> dict:
    [doc] = json.loads(_cli(workdir, "project", "status", app, "-p", "loans_view", "--json"))[
        "projectors"
    ]
    return doc


def _run_until_caught_up(workdir: Path, app: str, **env: str) -> dict:
    import subprocess  # noqa: PLC0415

    from tests.newcomer.kit import EVENTLANE  # noqa: PLC0415

    log = (workdir / f"run-{app.replace(':', '-')}.log").open("a")
    proc = subprocess.Popen(
        [
            *(str(EVENTLANE), "--data", "d", "project", "run", app, "-p", "loans_view"),
            *("--no-live", "--session-timeout-ms", "2000"),
        ],
        cwd=workdir,
        stdout=log,
        stderr=log,
        env=child_env(**env),
    )
    try:
        wait_until(lambda: _status(workdir, app)["lag"] == 0, 90, f"{app} lag 0")
        doc = _status(workdir, app)
        assert {m["alive"] for m in doc["members"]} == {True}
        return doc
    finally:
        assert stop(proc) == 0  # type: ignore[arg-type]


SEED = """
import tenants
from library.domain import Loan
for app, prefix, loans in (("staging", "s", 6), ("prod", "p", 4), ("prod", "p-bad", 2)):
    with getattr(tenants, app).open("d") as rt:
        for i in range(loans):
            rt.execute(Loan, f"loan-{prefix}-{i}",
                       lambda loan: loan.request(f"{prefix}-{i}", "book-1"), create=True)
"""


def _rows(path: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return sorted(conn.execute("SELECT loan_id, member_id FROM loans").fetchall())
    finally:
        conn.close()


def test_two_deployments_share_one_data_directory(workdir: Path) -> None:
    (workdir / "tenants.py").write_text(TENANTS)
    for app in ("tenants:staging", "tenants:prod"):
        _cli(workdir, "migrate", app)
    python(SEED, cwd=workdir)  # prod's member ids "p-bad-N" make the buggy handler fail

    # topics: every name in its namespace, nothing bare; `topics list --namespace` filters
    def topics(*args: str) -> set[str]:
        return {t["name"] for t in json.loads(_cli(workdir, "topics", "list", "--json", *args))}

    assert topics() == {"staging.loans", "staging.members", "prod.loans", "prod.members"}
    assert topics("--namespace", "prod") == {"prod.loans", "prod.members"}

    # live workers (real processes); prod's handler is buggy
    staging = _run_until_caught_up(workdir, "tenants:staging")
    prod = _run_until_caught_up(workdir, "tenants:prod", LIBRARY_BUGGY="1")
    assert (staging["projector"], staging["group"]) == ("loans_view", "staging.loans_view")
    assert {r["topic"] for r in prod["partitions"]} == {"prod.loans"}
    assert Path(staging["readmodel"]).name == "staging.loans_view.sqlite"
    assert staging["dead_letters"] == {} and prod["dead_letters"] == {"dead": 2}

    groups = {g["group"] for g in json.loads(_cli(workdir, "groups", "list", "--json"))}
    assert groups == {"staging.loans_view", "prod.loans_view"}
    only = json.loads(_cli(workdir, "groups", "list", "--json", "--namespace", "prod"))
    assert [g["group"] for g in only] == ["prod.loans_view"]

    # read models hold their own deployment's events only
    readmodels = workdir / "d" / "readmodels"
    assert [r[0] for r in _rows(readmodels / "staging.loans_view.sqlite")] == sorted(
        f"loan-s-{i}" for i in range(6)
    )
    assert [r[0] for r in _rows(readmodels / "prod.loans_view.sqlite")] == sorted(
        f"loan-p-{i}" for i in range(4)
    )

    # dead letters: prod's only, reported with the full topic, in prod's dead-letter topic
    letters = json.loads(_cli(workdir, "dlq", "list", "tenants:prod", "-p", "loans_view", "--json"))
    assert sorted(d["key"] for d in letters) == ["loan-p-bad-0", "loan-p-bad-1"]
    assert {d["topic"] for d in letters} == {"prod.loans"}
    assert topics("--namespace", "prod") == {"prod.loans", "prod.members", "prod.loans_view.dlq"}
    dlq = _cli(workdir, "consume", "prod.loans_view.dlq", "--max", "2")
    assert dlq.count("loan-p-bad-") == 2

    # the fixed code retries prod's letters; staging is untouched
    retried = json.loads(
        _cli(workdir, "dlq", "retry", "tenants:prod", "-p", "loans_view", "--json")
    )
    assert len(retried["succeeded"]) == 2 and retried["failed"] == {}
    assert len(_rows(readmodels / "prod.loans_view.sqlite")) == 6
    assert len(_rows(readmodels / "staging.loans_view.sqlite")) == 6

    # rebuilds equal the live read models: prod's locally, staging's with Spark (whose
    # --verify also compares it with the local engine's)
    def rebuild(app: str, *options: str) -> dict:
        return json.loads(
            _cli(workdir, "rebuild", app, "-p", "loans_view", "--verify", "--json", *options)
        )

    local = rebuild("tenants:prod", "--engine", "local")
    assert Path(local["rebuild"]["path"]).name == "prod.loans_view.rebuild.sqlite"
    assert [c["what"] for c in local["verify"] if c["skipped"] is None] == ["live"]
    assert all(c["ok"] for c in local["verify"])
    spark = rebuild("tenants:staging", "--engine", "spark", "--master", "local[1]")
    assert [c["what"] for c in spark["verify"]] == ["local engine", "live"]
    assert all(c["ok"] and c["skipped"] is None for c in spark["verify"])
    assert _rows(workdir / spark["rebuild"]["path"]) == _rows(
        readmodels / "staging.loans_view.sqlite"
    )

    # removing one deployment's projector leaves the other's
    _cli(workdir, "project", "remove", "prod.loans_view")
    assert {g["group"] for g in json.loads(_cli(workdir, "groups", "list", "--json"))} == {
        "staging.loans_view"
    }
    assert not (readmodels / "prod.loans_view.sqlite").exists()
    assert len(_rows(readmodels / "staging.loans_view.sqlite")) == 6


def test_no_namespace_keeps_todays_names(workdir: Path) -> None:
    """An app without a namespace writes exactly the names eventlane wrote before namespaces
    existed, and reopens such a data directory unchanged."""
    _cli(workdir, "migrate", "library.app:app")
    python(
        """
        from library.app import app
        from library.domain import Loan, Member
        assert app.namespace is None
        with app.open("d") as rt:
            rt.execute(Member, "member-1", lambda m: m.register("Ada", "L"), create=True)
            for i in range(3):
                rt.execute(Loan, f"loan-{i}", lambda l: l.request(f"m-{i}", "b"), create=True)
        """,
        cwd=workdir,
    )
    _run_until_caught_up(workdir, "library.app:app")
    data = workdir / "d"
    assert {t["name"] for t in json.loads(_cli(workdir, "topics", "list", "--json"))} == {
        "loans",
        "members",
        "__consumer_offsets",  # the workers' group commits
    }
    assert [g["group"] for g in json.loads(_cli(workdir, "groups", "list", "--json"))] == [
        "loans_view"
    ]
    files = {p.name for p in (data / "readmodels").iterdir() if p.suffix == ".sqlite"}
    assert files == {"loans_view.sqlite", "members_view.sqlite"}
    # reopened (a second process, the same names): the events and the read model are there
    out = python(
        """
        from library.app import app
        from library.domain import Loan
        with app.open("d") as rt:
            print(rt.load(Loan, "loan-2").status, rt.status("loans_view")["lag"],
                  rt.readmodel_path("loans_view").name, rt.status("loans_view")["group"])
        """,
        cwd=workdir,
    )
    assert out.split() == ["active", "0", "loans_view.sqlite", "loans_view"]


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


def test_keys_snapshots_and_forget_stay_in_their_namespace(tmp_path: Path) -> None:
    apps = {ns: App("crm", aggregates=[Person], namespace=ns) for ns in ("eu", "us")}
    runtimes = {ns: app.open(tmp_path) for ns, app in apps.items()}
    try:
        for rt in runtimes.values():
            assert rt.execute(Person, "p-1", lambda p: p.join("Ada"), create=True).name == "Ada"
        names = set(runtimes["eu"].log.list_topics())
        assert {"eu.people", "eu.people.snapshots", "eu.crm.keys"} <= names
        assert {"us.people", "us.people.snapshots", "us.crm.keys"} <= names
        assert not {"people", "crm.keys", "people.snapshots"} & names

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
