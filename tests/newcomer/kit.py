"""The newcomer's kit: a small app package in a temporary directory, and the real
``eventlane`` console script run from that directory as a child process.

The child's ``PYTHONPATH`` holds only this repository (so ``eventlane`` is the tree under
test), never the app's directory: the app must be found because it is in the current
working directory, as a user runs it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EVENTLANE = Path(sys.executable).parent / "eventlane"

EVENTS = '''
"""Events of the library: MemberRegistered is at version 2 (v1 had one ``name``)."""

from attrs import frozen

from eventlane.domain import DomainEvent, event


@event("MemberRegistered", version=2)
@frozen
class MemberRegistered(DomainEvent):
    first_name: str
    last_name: str


@event("LoanRequested")
@frozen
class LoanRequested(DomainEvent):
    member_id: str
    book_id: str


@event("LoanReturned")
@frozen
class LoanReturned(DomainEvent):
    pass


@event("FinePaid")
@frozen
class FinePaid(DomainEvent):
    amount: int
'''

DOMAIN = '''
"""Aggregates: Member, Loan (and Fine, which a newcomer may forget to declare)."""

from typing import ClassVar

from eventlane.domain import Aggregate, applies

from library.events import FinePaid, LoanRequested, LoanReturned, MemberRegistered


class Member(Aggregate):
    topic: ClassVar[str] = "members"

    def init_state(self) -> None:
        self.name = ""

    def register(self, first: str, last: str) -> None:
        self.record_that(MemberRegistered(first, last))

    @applies(MemberRegistered)
    def _registered(self, e: MemberRegistered) -> None:
        self.name = f"{e.first_name} {e.last_name}"


class Loan(Aggregate):
    topic: ClassVar[str] = "loans"

    def init_state(self) -> None:
        self.status = ""

    def request(self, member_id: str, book_id: str) -> None:
        self.record_that(LoanRequested(member_id, book_id))

    def give_back(self) -> None:
        self.record_that(LoanReturned())

    @applies(LoanRequested)
    def _requested(self, e: LoanRequested) -> None:
        self.status = "active"

    @applies(LoanReturned)
    def _returned(self, e: LoanReturned) -> None:
        self.status = "returned"


class Fine(Aggregate):
    topic: ClassVar[str] = "fines"

    def init_state(self) -> None:
        self.paid = 0

    def pay(self, amount: int) -> None:
        self.record_that(FinePaid(amount))

    @applies(FinePaid)
    def _paid(self, e: FinePaid) -> None:
        self.paid += e.amount
'''

UPCASTERS = """
from eventlane.codec import EventRegistry

registry = EventRegistry()


@registry.upcaster("MemberRegistered", 1)
def split_name(data: dict) -> dict:
    first, _, last = data["name"].partition(" ")
    return {"first_name": first, "last_name": last}
"""

PROJECTIONS = '''
"""Read models: loans (with a handler that can be made to fail) and members."""

import os

from sqlite_utils import Database, Migrations

from eventlane import EventContext, Projector, handles

from library.events import LoanRequested, LoanReturned, MemberRegistered

schema = Migrations("library.loans")


@schema()
def m001_loans(db: Database) -> None:
    db.execute("CREATE TABLE loans (loan_id TEXT PRIMARY KEY, member_id TEXT, status TEXT)")


BUGGY = os.environ.get("LIBRARY_BUGGY") == "1"


class Loans(Projector):
    name = "loans_view"
    topics = ("loans",)
    migrations = schema
    handler_attempts = 1

    @handles(LoanRequested)
    def requested(self, e: LoanRequested, ctx: EventContext) -> None:
        if BUGGY:
            int(e.member_id.split("-")[1])  # the bug: assumes ids like "m-12"
        ctx.conn.execute(
            "INSERT INTO loans VALUES (?, ?, 'active')"
            " ON CONFLICT(loan_id) DO UPDATE SET member_id = excluded.member_id",
            (ctx.aggregate_id, e.member_id),
        )

    @handles(LoanReturned)
    def returned(self, e: LoanReturned, ctx: EventContext) -> None:
        ctx.conn.execute(
            "INSERT INTO loans (loan_id, status) VALUES (?, 'returned')"
            " ON CONFLICT(loan_id) DO UPDATE SET status = 'returned'",
            (ctx.aggregate_id,),
        )


class Members(Projector):
    name = "members_view"
    topics = ("members",)

    def setup(self, db: Database) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS members (member_id TEXT PRIMARY KEY, name TEXT)")

    @handles(MemberRegistered)
    def registered(self, e: MemberRegistered, ctx: EventContext) -> None:
        ctx.conn.execute(
            "INSERT OR REPLACE INTO members VALUES (?, ?)",
            (ctx.aggregate_id, f"{e.first_name} {e.last_name}"),
        )
'''

APP = """
from eventlane import App

from library.domain import Loan, Member
from library.projections import Loans, Members
from library.upcasters import registry

app = App(
    "library",
    aggregates=[Member, Loan],
    projectors=[Loans, Members],
    registry=registry,
    partitions=2,
)
"""

FILES = {
    "library/__init__.py": "",
    "library/events.py": EVENTS,
    "library/domain.py": DOMAIN,
    "library/upcasters.py": UPCASTERS,
    "library/projections.py": PROJECTIONS,
    "library/app.py": APP,
}


def write_app(root: Path, **overrides: str) -> Path:
    """Write the ``library`` package under ``root`` (``overrides``: path -> new source)."""
    for rel, text in {**FILES, **overrides}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: PYTHONPATH is this repository only, no EVENTLANE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLANE_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def eventlane(
    *args: str,
    cwd: Path,
    input: bytes | None = None,
    timeout: float = 120,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """Run ``eventlane ARGS`` in ``cwd`` (text output) and return the finished process."""
    return subprocess.run(
        [str(EVENTLANE), *args],
        cwd=cwd,
        input=input.decode() if input is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=child_env(**env),
    )


def python(code: str, *, cwd: Path, timeout: float = 120, **env: str) -> str:
    """Run ``python -c code`` in ``cwd`` (the app importable as a user's script sees it)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=child_env(**env),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The failure contract: exit status 1 and exactly one ``Error:`` line, no traceback."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    return errors[0]


def status(cwd: Path, projector: str, data: str = "d") -> dict:
    """``eventlane project status APP -p NAME --json`` of the library app."""
    done = eventlane(
        "--data", data, "project", "status", "library.app:app", "-p", projector, "--json", cwd=cwd
    )
    assert done.returncode == 0, done.stderr
    [doc] = json.loads(done.stdout)["projectors"]
    return doc


def start_workers(
    cwd: Path, projector: str, *args: str, data: str = "d", **env: str
) -> subprocess.Popen[str]:
    """``eventlane project run`` in the background (its output in ``cwd/run-NAME.log``)."""
    sink = (cwd / f"run-{projector}.log").open("a")
    return subprocess.Popen(
        [
            str(EVENTLANE),
            "--data",
            data,
            "project",
            "run",
            "library.app:app",
            "-p",
            projector,
            "--no-live",
            "--session-timeout-ms",
            "2000",
            *args,
        ],
        cwd=cwd,
        stdout=sink,
        stderr=sink,
        text=True,
        env=child_env(**env),
    )


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` every 0.3 s until it is true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.3)


def stop(proc: subprocess.Popen[str], timeout: float = 30) -> int:
    """SIGTERM ``proc`` (if still running) and wait for it; return its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout)


def run_until_caught_up(
    cwd: Path, projector: str, *args: str, timeout: float = 60, **env: str
) -> dict:
    """Run ``projector``'s workers until its lag is 0, stop them, return its status."""
    proc = start_workers(cwd, projector, *args, **env)
    try:
        wait_until(lambda: status(cwd, projector)["lag"] == 0, timeout, f"{projector} lag 0")
    finally:
        stop(proc)
    return status(cwd, projector)


def seed(cwd: Path, loans: int, *, members: int = 0, prefix: str = "m") -> None:
    """Append ``loans`` LoanRequested (member ids ``{prefix}-N``) and ``members``
    registrations, through the app as a user's script would (``python -c`` in ``cwd``)."""
    python(
        f"""
        from library.app import app
        from library.domain import Loan, Member
        with app.open("d") as rt:
            for i in range({members}):
                rt.execute(Member, f"member-{{i}}", lambda m: m.register("Ada", f"L{{i}}"),
                           create=True)
            for i in range({loans}):
                rt.execute(Loan, f"loan-{prefix}-{{i}}",
                           lambda loan: loan.request(f"{prefix}-{{i}}", "book-1"), create=True)
        """,
        cwd=cwd,
    )
