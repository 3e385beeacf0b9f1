"""Erasure you can trust (issue 27): one test per defect, on the ``club`` app
(``erasure_app``) with real logs, read-model files and worker processes.

The oracle for "plain text anywhere" is a raw byte search of every file under the data
directory (``grep``), with a positive control where it matters.
"""

from __future__ import annotations

import base64
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from attrs import frozen

from eventlane import App, EventContext, Projector, Worker, forget, handles, rebuild
from eventlane.codec import EventRegistry
from eventlane.domain import Aggregate, DomainEvent, applies, event, personal
from eventlane.domain.privacy import ERASED
from eventlane.errors import ConfigError
from eventlane.projection import readmodel_path
from eventlane.projection.breaker import breaker_path
from eventlane.projection.dead_letters import list_dead_letters
from eventlane.projection.readmodel import ReadModelView
from eventlane.replay.forget import JOURNAL
from tests.replay.erasure_app import Member, MemberJoined, app
from tests.replay.test_erasure_model import run_part, run_to_end

ROOT = Path(__file__).resolve().parents[2]


def grep(root: Path, needle: str) -> list[str]:
    raw = needle.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and raw in p.read_bytes()]


def join(rt, mid: str, name: str, plan: str = "basic") -> None:  # type: ignore[no-untyped-def]
    email = f"{name.split(maxsplit=1)[0].lower()}@mail.example"
    rt.execute(Member, mid, lambda m: m.join(name, email, plan), create=True)


def directory_worker(data: Path, sink: Any, **env: str) -> subprocess.Popen[bytes]:
    """A ``project worker`` process of the club app's ``directory`` projector on ``data``,
    its stdout and stderr to ``sink``, with ``env`` added to the environment."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventlane.cli",
            "--data",
            str(data),
            "project",
            "worker",
            "tests.replay.erasure_app:app",
            "directory",
        ],
        stdout=sink,
        stderr=sink,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
    )


def welcomes(rt) -> list[str]:  # type: ignore[no-untyped-def]
    if not rt.log.topic_exists("mail"):
        return []
    out = []
    for p in range(rt.log.partition_count("mail")):
        marks = rt.log.offsets("mail", p)
        records, _ = rt.log.read("mail", p, marks.lwm, upto=marks.hwm)
        out += [orjson.loads(r.value)["data"]["member_id"] for r in records]
    return sorted(out)


# ------------------------------------------------------------------ item 1 and item 8
def test_a_str_subject_is_one_subject_never_its_characters(tmp_path: Path) -> None:
    with app.open(tmp_path / "data") as rt:
        for mid, name in (("g1", "Gwendolyn Oneworth"), ("g", "Gustav Solo"), ("1", "Uno Primo")):
            join(rt, mid, name)
        report = forget(rt, "g1")
        assert report.subjects == ("g1",) and report.keys_destroyed == ("g1",)
        assert rt.load(Member, "g1").name == ERASED
        assert rt.load(Member, "g").name == "Gustav Solo"
        assert rt.load(Member, "1").name == "Uno Primo"
        with pytest.raises(ConfigError):
            forget(rt, b"g")  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            forget(rt, ["g", ""])


def test_unknown_subjects_are_reported_and_a_repeated_forget_changes_nothing(
    tmp_path: Path,
) -> None:
    with app.open(tmp_path / "data") as rt:
        join(rt, "m0", "Ottoline Twice")
        rt.execute(Member, "m0", lambda m: m.change_plan("gold"))  # version 2: a snapshot
        report = forget(rt, ["nobody"])
        assert report.unknown == ("nobody",) and report.keys_destroyed == ()
        first = forget(rt, "m0")
        assert first.keys_destroyed == ("m0",) and first.snapshots_removed == 1
        assert rt.load(Member, "m0").name == ERASED  # reading it writes no new snapshot/key
        marks = {t: rt.log.offsets(t, 0).hwm for t in ("club.keys", "members.snapshots")}
        again = forget(rt, "m0")
        assert again.keys_destroyed == () and again.already_forgotten == ("m0",)
        assert again.snapshots_removed == 0
        assert {t: rt.log.offsets(t, 0).hwm for t in marks} == marks  # no tombstone appended


# ------------------------------------------------------------------ item 5
@pytest.mark.parametrize("policy", ["stopped", "lagging"])
def test_forget_keeps_the_side_effects_of_a_stopped_or_lagging_policy(
    tmp_path: Path, policy: str
) -> None:
    with app.open(tmp_path / "data") as rt:
        for i in range(4):
            join(rt, f"m{i}", f"Early Member-{i}")
        if policy == "lagging":
            run_part(rt, "welcome")
        run_to_end(rt, "directory")
        for i in range(4, 7):
            join(rt, f"m{i}", f"Late Member-{i}")
        done = welcomes(rt)
        report = forget(rt, "m1")
        assert welcomes(rt) == done  # forget did no side effect itself
        run_to_end(rt, "welcome")
        assert welcomes(rt) == [f"m{i}" for i in range(7)]  # each member welcomed once
        assert report.ok, report


# ------------------------------------------------------------------ item 2
def test_dead_letters_hold_no_personal_values_and_forget_keeps_their_history(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with app.open(data) as rt:
        join(rt, "m0", "Petronella Poisonous", plan="poison")
        join(rt, "m1", "Quentin Kept")
        run_to_end(rt, "directory")
        worker = Worker(rt, "directory")  # publishes the letters to directory.dlq
        worker.run(until=lambda: rt.log.topic_exists("directory.dlq"))
        [letter] = list_dead_letters(ReadModelView(readmodel_path(data, "directory")))
        assert "cannot file [redacted] <[redacted]>" in letter.error
        assert grep(data, "Petronella") == []  # not in the row, the dlq topic, anything
        report = forget(rt, "m0")
        assert "directory" in report.rebuilt
        with ReadModelView(readmodel_path(data, "directory")) as view:
            kept = list_dead_letters(view)
        assert [(d.topic, d.offset, d.status) for d in kept] == [
            (letter.topic, letter.offset, "dead")
        ]  # the history survives forget's rebuild, its error text removed
        assert "removed by eventlane forget" in kept[0].error


def test_forget_scrubs_an_old_dead_letter_copy_in_the_dlq_topic(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with app.open(data) as rt:
        join(rt, "m0", "Rosalind Legacy")
        marks = rt.log.offsets("members", 0)
        [record], _ = rt.log.read("members", 0, marks.lwm, upto=marks.lwm + 1)
        # a copy written before errors were redacted: the name in its dlq-error header
        rt.log.create_topic("directory.dlq", 1, {"cleanup_policy": "compact"}, exist_ok=True)
        headers = (("dlq-error", b"ValueError: cannot file Rosalind Legacy"),)
        rt.log.append("directory.dlq", 0, [(b"members/0/0", record.value, headers, None)])
        assert grep(data, "Rosalind Legacy")
        report = forget(rt, "m0")
    assert grep(data, "Rosalind") == []
    assert report.ok and any("directory.dlq" in s for s in report.scrubbed), report


def test_breaker_records_hold_no_personal_values(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with app.open(data) as rt:
        for i in range(3):
            join(rt, f"m{i}", f"Sibylla Tripwire-{i}", plan="poison")
        run_to_end(rt, "strict")
        record = orjson.loads(breaker_path(readmodel_path(data, "strict")).read_bytes())
        assert "[redacted]" in record["error"]
        assert grep(data, "Tripwire") == []


def test_worker_log_lines_hold_no_personal_values_and_forget_scrubs_old_ones(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with app.open(data) as rt:
        join(rt, "m0", "Theodora Logline", plan="poison")
        join(rt, "m1", "Ulrich Fine")
    log_file = data / "readmodels" / "directory.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as sink:
        worker = directory_worker(data, sink, EVENTLANE_LOG_LEVEL="info")
        try:
            deadline = time.monotonic() + 60
            while b"event dead-lettered" not in log_file.read_bytes():
                assert time.monotonic() < deadline and worker.poll() is None, log_file.read_text()
                time.sleep(0.1)
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    text = log_file.read_text()
    assert "cannot file [redacted]" in text and "Theodora" not in text
    # a line an older eventlane wrote, with the plain text: forget removes it
    with log_file.open("a") as f:
        f.write("event dead-lettered error='ValueError: cannot file Theodora Logline'\n")
    with app.open(data) as rt:
        report = forget(rt, "m0")
    assert grep(data, "Theodora") == [] and grep(data, "Logline") == []
    assert report.ok and any("directory.log" in s for s in report.scrubbed), report


def test_forget_deletes_rebuild_outputs_and_partial_parts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with app.open(data) as rt:
        join(rt, "m0", "Valentina Rebuilt")
        join(rt, "m1", "Wilhelm Stays")
        result = rebuild(rt, "directory", engine="local")  # NAME.rebuild.sqlite
        parts = result.path.parent / f".{result.path.name}.parts-0123456789ab"
        parts.mkdir()
        shutil.copy(result.path, parts / "part-00000.sqlite")  # a killed Spark rebuild's
        assert len(grep(data, "Valentina")) == 2
        report = forget(rt, "m0")
    assert grep(data, "Valentina") == []
    assert not result.path.exists() and not parts.exists()
    assert report.ok and sum("deleted" in s for s in report.scrubbed) == 2, report.scrubbed


def test_forget_reports_a_shadow_model_left_by_an_interrupted_hand_off(tmp_path: Path) -> None:
    """A hand-off killed mid-way leaves ``NAME.shadow.sqlite`` (a full read model, personal
    values included). Forget must not pass over it in silence: another rebuild may be
    building it right now, so it is reported as not scrubbed (the run fails) with what to do."""
    data = tmp_path / "data"
    with app.open(data) as rt:
        join(rt, "m0", "Xaver Shadowed")
        result = rebuild(rt, "directory", engine="local")
        shadow = result.path.with_name("directory.shadow.sqlite")
        shutil.copy(result.path, shadow)  # as an interrupted hand-off leaves it
        report = forget(rt, "m0")
    assert not report.ok
    assert any(str(shadow) in line and "shadow" in line for line in report.not_scrubbed), (
        report.not_scrubbed
    )


# ------------------------------------------------------------------ items 3 and 4
def test_forget_with_a_read_model_held_open_leaves_a_journal_the_next_run_finishes(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with app.open(data) as rt:
        join(rt, "m0", "Xenia Heldopen")
        join(rt, "m1", "Yorick Other")
        run_to_end(rt, "directory")
        console = sqlite3.connect(readmodel_path(data, "directory"))  # like Datasette
        console.execute("SELECT count(*) FROM members").fetchall()
        try:
            report = forget(rt, "m0", swap_timeout=1.0)
            assert not report.ok and any("directory" in s for s in report.not_scrubbed)
            assert (data / JOURNAL).exists()
            assert rt.load(Member, "m0").name == ERASED  # the key is gone already
        finally:
            console.close()
        finished = forget(rt, [])  # no subject: the journal's
        assert finished.ok and finished.subjects == ("m0",) and "directory" in finished.rebuilt
        assert not (data / JOURNAL).exists()
    assert grep(data, "Xenia") == [] and grep(data, "Yorick")


def test_the_key_segment_is_not_held_open_after_forget(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with app.open(data) as rt:
        join(rt, "m0", "Zeno Keyholder")
        rebuild(rt, "directory", engine="local")  # another key store reads the key topic
        forget(rt, "m0")
        held = [os.readlink(fd) for fd in Path("/proc/self/fd").iterdir() if fd.exists()]
    assert not [t for t in held if "club.keys" in t and "(deleted)" in t], held


# ------------------------------------------------------------------ item 6
@event("MemberRegistered", version=1)
@frozen
class MemberRegisteredV1(DomainEvent):
    name: str = personal()


class MemberV1(Aggregate):
    topic: ClassVar[str] = "members"
    name: str

    def init_state(self) -> None:
        self.name = ""

    @applies
    def _registered(self, e: MemberRegisteredV1) -> None:
        self.name = e.name


@event("MemberRegistered", version=2)
@frozen
class MemberRegistered(DomainEvent):
    first_name: str = personal()
    last_name: str = personal()


class LibraryMember(Aggregate):
    topic: ClassVar[str] = "members"
    first_name: str

    def init_state(self) -> None:
        self.first_name = ""

    @applies
    def _registered(self, e: MemberRegistered) -> None:
        self.first_name = e.first_name


class Names(Projector):
    name = "names"
    topics = (LibraryMember,)

    def setup(self, db) -> None:  # type: ignore[no-untyped-def]
        db.execute("CREATE TABLE names (id TEXT PRIMARY KEY, first TEXT, last TEXT)")

    @handles
    def registered(self, e: MemberRegistered, ctx: EventContext) -> None:
        ctx.conn.execute(
            "INSERT INTO names VALUES (?, ?, ?)", (ctx.aggregate_id, e.first_name, e.last_name)
        )


def test_the_docs_upcaster_sees_the_placeholder_after_forget(tmp_path: Path) -> None:
    """events.md's ``split_name`` upcaster, on a personal field."""
    data = tmp_path / "data"
    with App("library", aggregates=[MemberV1], partitions=1).open(data) as rt:
        for i, name in enumerate(("Ada Lovelace", "Grace Hopper")):
            rt.execute(
                MemberV1,
                f"member-{i}",
                lambda m, n=name: m.record_that(MemberRegisteredV1(n)),
                create=True,
            )
    registry = EventRegistry()

    @registry.upcaster("MemberRegistered", 1)
    def split_name(data: dict) -> dict:  # type: ignore[type-arg]
        first, _, last = data["name"].partition(" ")
        return {"first_name": first, "last_name": last}

    library = App(
        "library", aggregates=[LibraryMember], projectors=[Names], registry=registry, partitions=1
    )
    with library.open(data) as rt:
        run_to_end(rt, "names")
        report = forget(rt, ["member-0"])
        assert rt.load(LibraryMember, "member-0").first_name == ERASED
        assert rt.load(LibraryMember, "member-1").first_name == "Grace"
        with sqlite3.connect(readmodel_path(data, "names")) as conn:
            rows = sorted(conn.execute("SELECT * FROM names"))
        assert rows == [("member-0", ERASED, ERASED), ("member-1", "Grace", "Hopper")]
        assert list_dead_letters(ReadModelView(readmodel_path(data, "names"))) == []
        assert report.ok and report.rebuilt == ("names",), report


class Picky(Projector):
    """Fails on erased names: forget's rebuild would dead-letter what the live model had."""

    name = "picky"
    topics = (Member,)

    def setup(self, db) -> None:  # type: ignore[no-untyped-def]
        db.execute("CREATE TABLE names (id TEXT PRIMARY KEY, name TEXT)")

    @handles
    def joined(self, e: MemberJoined, ctx: EventContext) -> None:
        if e.name == ERASED:
            raise ValueError("no name")
        ctx.conn.execute("INSERT INTO names VALUES (?, ?)", (ctx.aggregate_id, e.name))


def test_forget_never_swaps_in_a_rebuild_that_lost_a_row(tmp_path: Path) -> None:
    picky = App("club", aggregates=[Member], projectors=[Picky], partitions=1)
    data = tmp_path / "data"
    with picky.open(data) as rt:
        join(rt, "m0", "Adelheid Picked")
        run_to_end(rt, "picky")
        report = forget(rt, ["m0"])
        with sqlite3.connect(readmodel_path(data, "picky")) as conn:
            assert conn.execute("SELECT count(*) FROM names").fetchone() == (1,)  # not lost
        assert not report.ok and any("picky" in s for s in report.not_scrubbed), report
        assert (data / JOURNAL).exists()


def test_forget_with_a_worker_process_running_completes(tmp_path: Path) -> None:
    """A live ``directory`` worker process pauses for the swap and goes on; afterwards no
    file under the data directory, and no file the worker holds open (``/proc/PID/fd``,
    deleted ones included), has the forgotten member's name or key."""
    data = tmp_path / "data"
    with app.open(data) as rt:
        join(rt, "m0", "Bartholomew Running")
        join(rt, "m1", "Cordelia Stays")
        key = rt.codec.keys.current("m0")[1]
    worker = directory_worker(data, subprocess.DEVNULL)
    try:
        with app.open(data) as rt:
            deadline = time.monotonic() + 60
            while rt.status("directory")["lag"] or not readmodel_path(data, "directory").exists():
                assert time.monotonic() < deadline and worker.poll() is None
                time.sleep(0.1)
            report = forget(rt, "m0")
            assert report.ok and report.rebuilt == ("directory",), report
            join(rt, "m2", "Dorothea Later")  # the worker goes on after the swap
            while rt.status("directory")["lag"]:
                assert time.monotonic() < deadline and worker.poll() is None
                time.sleep(0.1)
        with sqlite3.connect(readmodel_path(data, "directory")) as conn:
            names = dict(conn.execute("SELECT id, name FROM members"))
        assert names == {"m0": ERASED, "m1": "Cordelia Stays", "m2": "Dorothea Later"}
        held = {}
        for fd in Path(f"/proc/{worker.pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith(str(data)) and Path(fd).is_file():
                held[target] = Path(fd).read_bytes()
        assert held  # the search sees the worker's files
        for needle in (b"Bartholomew", key, base64.b64encode(key)):
            assert not [t for t, raw in held.items() if needle in raw], needle
            assert not [p for p in data.rglob("*") if p.is_file() and needle in p.read_bytes()]
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_the_cli_exits_1_while_a_place_is_not_scrubbed_and_the_next_run_finishes(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with app.open(data) as rt:
        join(rt, "m0", "Eustace Commandline")
        run_to_end(rt, "directory")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "eventlane.cli", "--data", str(data), "forget"]
    console = sqlite3.connect(readmodel_path(data, "directory"))  # a console's connection
    console.execute("SELECT count(*) FROM members").fetchall()
    try:
        held = subprocess.run(
            [*base, "tests.replay.erasure_app:app", "m0", "--swap-timeout", "1"],
            check=False,
            capture_output=True,
            env=env,
            cwd=ROOT,
            timeout=120,
        )
    finally:
        console.close()
    assert held.returncode == 1, held.stderr
    assert b"m0: key destroyed" in held.stdout and b"not scrubbed: read model" in held.stdout
    assert b"forget incomplete" in held.stderr
    again = subprocess.run(
        [*base, "tests.replay.erasure_app:app", "--json"],
        check=False,
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    report = orjson.loads(again.stdout)
    assert report["subjects"] == ["m0"] and report["already_forgotten"] == ["m0"]
    assert report["rebuilt"] == ["directory"] and report["ok"] is True
    assert [p for p in data.rglob("*") if p.is_file() and b"Eustace" in p.read_bytes()] == []
